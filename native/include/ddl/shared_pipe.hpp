// A byte stream between two processes of one host through shared memory: two single-producer rings (one each
// way) in a memfd that the dialing side creates and hands over its Unix socket (SCM_RIGHTS). TcpTransport
// reads and writes a peer of its host through it instead of the socket: the same framed stream, without a
// system call per message (on the emulated T1, 8 ranks on 2 cores, the receive of an 8 B broadcast's message
// over a Unix socket cost a rank 8-14 us of system time, a third of the call).
//
// Wake-ups: a side that is about to block in epoll says so in the ring it waits on (asleep()), then checks the
// ring once more; the other side, after it moved bytes there, sees the flag and writes one byte on the Unix socket
// (wake_after_write(), wake_after_read()), which epoll reports. The socket stays the connection's life: its closing is the peer's
// leaving, as before. The flag and the ring's index are each stored, then the other read, both sequentially
// consistent: of a sleeper and a mover, at least one sees the other's store (no wake-up is lost).
#pragma once
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ddl {

class SharedPipe {
 public:
  // Makes the memory of a pipe with `capacity` bytes each way; returns its fd (-1 where the system has no memfd).
  static int create(size_t capacity);
  // Maps a pipe made by create(); `dialer`: this side created it (it writes ring 0, reads ring 1). Closes fd.
  // Throws std::runtime_error when the memory cannot be mapped.
  SharedPipe(int fd, bool dialer);
  ~SharedPipe();
  SharedPipe(const SharedPipe&) = delete;
  SharedPipe& operator=(const SharedPipe&) = delete;

  // Bytes copied out of iov (in order, as far as the ring has room); 0 when it is full.
  size_t write(const iovec* iov, int n);
  // Bytes copied into [dst, dst + n); 0 when nothing waits.
  size_t read(char* dst, size_t n);
  bool readable() const;   // bytes wait to be read
  bool writable() const;   // the outgoing ring has room

  // Before blocking: mark this side asleep on its incoming ring (and, where `writing`, on its outgoing ring's
  // room); returns whether anything can be done already (then the caller does not block). awake() unmarks.
  bool asleep(bool writing);
  void awake();
  // After moving bytes: whether the other side sleeps on what this side just did (the flag is cleared: one byte
  // on the socket wakes it).
  bool wake_after_write();
  bool wake_after_read();

 private:
  struct alignas(64) Index {
    std::atomic<uint64_t> value{0};
  };
  struct Ring {          // written by one side, read by the other
    Index tail;          // bytes ever written
    Index head;          // bytes ever read
    Index reader_asleep; // the reader blocks until bytes come
    Index writer_asleep; // the writer blocks until room frees up
  };
  Ring* ring(int i) const;
  char* data(int i) const;

  void* base_ = nullptr;
  size_t bytes_ = 0, capacity_ = 0;
  int out_ = 0, in_ = 1;
};

}  // namespace ddl
