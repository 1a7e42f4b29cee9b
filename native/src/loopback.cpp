#include "ddl/loopback.hpp"

#include <cstring>

namespace ddl {

void LoopbackHub::complete(Op& send, Op& recv, int src, int dst) {
  if (send.nbytes > recv.nbytes) {
    std::string e = truncation(send.nbytes, src, recv.nbytes, dst);
    send.error = recv.error = e;
  } else if (send.nbytes) {
    std::memcpy(recv.data, send.data, send.nbytes);
  }
  send.done.store(true, std::memory_order_release);
  recv.done.store(true, std::memory_order_release);
}

void LoopbackHub::post(bool is_send, int src, int dst, int tag, std::shared_ptr<Op> op) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& waiting = (is_send ? recvs_ : sends_)[{src, dst, tag}];  // the other side's queue
  if (waiting.empty()) {
    (is_send ? sends_ : recvs_)[{src, dst, tag}].push_back(std::move(op));
    return;
  }
  if (is_send)
    complete(*op, *waiting.front(), src, dst);
  else
    complete(*waiting.front(), *op, src, dst);
  waiting.pop_front();
}

void LoopbackHub::forget(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, queue] : sends_)
    if (std::get<0>(key) == rank) queue.clear();
  for (auto& [key, queue] : recvs_)
    if (std::get<1>(key) == rank) queue.clear();
}

Handle LoopbackTransport::keep(std::shared_ptr<LoopbackHub::Op> op) {
  if (!free_.empty()) {
    Handle h = free_.back();
    free_.pop_back();
    slots_[static_cast<size_t>(h)] = std::move(op);
    return h;
  }
  slots_.push_back(std::move(op));
  return static_cast<Handle>(slots_.size() - 1);
}

Handle LoopbackTransport::isend(const void* data, size_t nbytes, int peer, int tag) {
  check_peer(peer, size(), rank_);
  auto op = std::make_shared<LoopbackHub::Op>();
  op->data = const_cast<void*>(data);
  op->nbytes = nbytes;
  hub_->post(true, rank_, peer, tag, op);
  return keep(std::move(op));
}

Handle LoopbackTransport::irecv(void* data, size_t nbytes, int peer, int tag) {
  check_peer(peer, size(), rank_);
  auto op = std::make_shared<LoopbackHub::Op>();
  op->data = data;
  op->nbytes = nbytes;
  hub_->post(false, peer, rank_, tag, op);
  return keep(std::move(op));
}

bool LoopbackTransport::test(Handle h) {
  auto& op = slots_[static_cast<size_t>(h)];
  if (!op->done.load(std::memory_order_acquire)) return false;
  std::string err = op->error;
  op.reset();
  free_.push_back(h);
  if (!err.empty()) throw TransportError(err);
  return true;
}

}  // namespace ddl
