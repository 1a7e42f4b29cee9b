#include "ddl/shared_pipe.hpp"

#include <errno.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ddl {

namespace {
constexpr size_t kRings = 2;
constexpr size_t kIndexBytes = 4096;  // the rings' indices, a page of their own
}  // namespace

int SharedPipe::create(size_t capacity) {
#ifdef MFD_CLOEXEC
  const int fd = ::memfd_create("ddl-pipe", MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(kIndexBytes + kRings * capacity)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
#else
  (void)capacity;
  return -1;
#endif
}

SharedPipe::SharedPipe(int fd, bool dialer) : out_(dialer ? 0 : 1), in_(dialer ? 1 : 0) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) <= kIndexBytes) {
    const int e = errno;
    ::close(fd);
    throw std::runtime_error("shared pipe: the memory handed over has no rings (" + std::string(std::strerror(e)) +
                             ")");
  }
  bytes_ = static_cast<size_t>(st.st_size);
  capacity_ = (bytes_ - kIndexBytes) / kRings;
  base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    throw std::runtime_error("shared pipe: mmap failed: " + std::string(std::strerror(e)));
  }
  static_assert(kRings * sizeof(Ring) <= kIndexBytes, "the rings' indices fit their page");
}

SharedPipe::~SharedPipe() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

SharedPipe::Ring* SharedPipe::ring(int i) const { return static_cast<Ring*>(base_) + i; }

char* SharedPipe::data(int i) const {
  return static_cast<char*>(base_) + kIndexBytes + static_cast<size_t>(i) * capacity_;
}

size_t SharedPipe::write(const iovec* iov, int n) {
  Ring* r = ring(out_);
  const uint64_t tail = r->tail.value.load(std::memory_order_relaxed);  // (this side alone writes it)
  const uint64_t head = r->head.value.load(std::memory_order_acquire);
  size_t room = capacity_ - static_cast<size_t>(tail - head), done = 0;
  char* ring_data = data(out_);
  for (int i = 0; i < n && room > 0; ++i) {
    const char* from = static_cast<const char*>(iov[i].iov_base);
    size_t left = std::min(iov[i].iov_len, room);
    while (left > 0) {
      const size_t at = static_cast<size_t>((tail + done) % capacity_);
      const size_t piece = std::min(left, capacity_ - at);
      std::memcpy(ring_data + at, from, piece);
      from += piece;
      left -= piece;
      done += piece;
      room -= piece;
    }
  }
  if (done) r->tail.value.store(tail + done, std::memory_order_seq_cst);
  return done;
}

size_t SharedPipe::read(char* dst, size_t n) {
  Ring* r = ring(in_);
  const uint64_t head = r->head.value.load(std::memory_order_relaxed);  // (this side alone writes it)
  const uint64_t tail = r->tail.value.load(std::memory_order_acquire);
  const size_t take = std::min(n, static_cast<size_t>(tail - head));
  const char* ring_data = data(in_);
  size_t done = 0;
  while (done < take) {
    const size_t at = static_cast<size_t>((head + done) % capacity_);
    const size_t piece = std::min(take - done, capacity_ - at);
    std::memcpy(dst + done, ring_data + at, piece);
    done += piece;
  }
  if (done) r->head.value.store(head + done, std::memory_order_seq_cst);
  return done;
}

bool SharedPipe::readable() const {
  const Ring* r = ring(in_);
  return r->tail.value.load(std::memory_order_seq_cst) != r->head.value.load(std::memory_order_relaxed);
}

bool SharedPipe::writable() const {
  const Ring* r = ring(out_);
  return r->tail.value.load(std::memory_order_relaxed) - r->head.value.load(std::memory_order_seq_cst) < capacity_;
}

bool SharedPipe::asleep(bool writing) {
  ring(in_)->reader_asleep.value.store(1, std::memory_order_seq_cst);
  if (writing) ring(out_)->writer_asleep.value.store(1, std::memory_order_seq_cst);
  return readable() || (writing && writable());
}

void SharedPipe::awake() {
  ring(in_)->reader_asleep.value.store(0, std::memory_order_relaxed);
  ring(out_)->writer_asleep.value.store(0, std::memory_order_relaxed);
}

bool SharedPipe::wake_after_write() {
  std::atomic<uint64_t>& flag = ring(out_)->reader_asleep.value;
  return flag.load(std::memory_order_seq_cst) != 0 && flag.exchange(0) != 0;
}

bool SharedPipe::wake_after_read() {
  std::atomic<uint64_t>& flag = ring(in_)->writer_asleep.value;
  return flag.load(std::memory_order_seq_cst) != 0 && flag.exchange(0) != 0;
}

}  // namespace ddl
