// In-process transport: ranks are threads sharing a LoopbackHub. A send completes only when a matching
// receive takes it (rendezvous), the strictest ordering MPI allows, so executor tests catch ordering bugs.
#pragma once
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "ddl/transport.hpp"

namespace ddl {

class LoopbackHub {
 public:
  explicit LoopbackHub(int size) : size_(size) {}
  int size() const { return size_; }

  struct Op {
    void* data;
    size_t nbytes;
    std::atomic<bool> done{false};
    std::string error;  // set before done, on a size mismatch
  };
  // Matches op with the oldest opposite operation of (src, dst, tag), or queues it.
  void post(bool is_send, int src, int dst, int tag, std::shared_ptr<Op> op);
  // Drops every operation `rank` posted that is still unmatched (its buffers may go away).
  void forget(int rank);

 private:
  using Key = std::tuple<int, int, int>;  // src, dst, tag
  static void complete(Op& send, Op& recv, int src, int dst);
  int size_;
  std::mutex mu_;
  std::map<Key, std::deque<std::shared_ptr<Op>>> sends_, recvs_;
};

class LoopbackTransport final : public Transport {
 public:
  LoopbackTransport(std::shared_ptr<LoopbackHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  int max_tag() const override { return (1 << 30) - 1; }
  std::string name() const override { return "loopback"; }
  Handle isend(const void* data, size_t nbytes, int peer, int tag) override;
  Handle irecv(void* data, size_t nbytes, int peer, int tag) override;
  bool test(Handle h) override;
  void abandon() override {
    hub_->forget(rank_);
    slots_.clear();
    free_.clear();
  }
  void idle(Clock::duration, bool) override { std::this_thread::yield(); }

 private:
  Handle keep(std::shared_ptr<LoopbackHub::Op> op);
  std::shared_ptr<LoopbackHub> hub_;
  int rank_;
  std::vector<std::shared_ptr<LoopbackHub::Op>> slots_;
  std::vector<Handle> free_;
};

}  // namespace ddl
