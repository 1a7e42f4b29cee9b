#include "ddl/tcp_transport.hpp"

#include "ddl/shared_pipe.hpp"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

namespace ddl {

namespace {

constexpr uint32_t kMagic = 0x44444c31;  // "DDL1": the first word of a connection's hello
constexpr size_t kHeader = 2 * sizeof(int64_t);
constexpr int kMaxIov = 32;
// While a run rests, it waits for the sockets this long at most (any byte in or room out wakes it sooner):
// an event-driven wait has no reason to be as short as a blind sleep, only short enough to notice a caller
// that starts waiting.
constexpr auto kLongestEventWait = std::chrono::milliseconds(1);
// A run its caller waits for polls this long after bytes last moved before it blocks as well. On the emulated
// T2 (8 ranks, 2 cores) a blocking 98 MiB allreduce took the same 1.70 s spinning throughout and blocking
// after 100 us, for 2.5 CPU-seconds over the ranks instead of 3.4. Since small calls run natively, blocking
// after 100 us cost them the wake-up: 400 us against 100, alternating in one job, an 8 B allreduce took 211
// against 301 us on T1 (213 / 247 on T2), an 8 B allgather 224 / 305 (253 / 282), 8 KiB 274-304 / 318-345;
// broadcasts no different; a 16 MiB allreduce on T2 the same 286 ms for 0.56 CPU-s over the ranks against 0.51.
// Counted from the end of a small message (kSpinAfterBytes at most: the next is likely as near), not from any
// byte: a large message trickles in at the link's speed, each poll finding a few KB, and polling for it
// throughout cost a 26 MB allreduce on T1 0.63-0.66 CPU-seconds over the 8 ranks; from any message's end,
// 0.47-0.52 (a large allreduce's blocks finish often enough, those between ranks of a host the oftenest); from
// a small one's, 0.27-0.31, gloo's 0.23-0.33 in the same jobs, all at the same 323-336 ms. That is CPU DDP's
// backward beside it needs. Alternating in one job, 8 B-4 MiB calls took the same time either way on T1
// (every collective), a 16 MiB allreduce on T2 276-281 ms against 283-300.
constexpr auto kSpinBeforeBlocking = std::chrono::microseconds(400);
// ... but no shorter than what the waits turn out to need: where a rank blocked and its message came within the
// window it had spun (the block was premature: a wake-up on the critical path, and on cores shared with other
// threads one sleeping rank delays the next, which then sleeps too), the window doubles, up to this; a wait
// longer than this (a peer really late) sets it back. On the emulated T1, 8 ranks on 2 cores, with gloo's
// threads in the same processes (torch.distributed's default group beside ddl's: its loop wakes ~100 times a
// second a rank), 8 B broadcasts in a row took 119-144 us a call blocking after 400 us, 71-74 after 5 ms, as
// MPI's 70-75 beside them; a 5 ms window throughout cost the ranks waiting for one 20 ms late 12.3 ms of CPU a
// call against 4.3.
constexpr auto kSpinAtMost = std::chrono::microseconds(3200);
constexpr size_t kSpinAfterBytes = 64 << 10;
// A run of this many bytes or more blocks as soon as it waits, even while its caller waits for it. A large
// allreduce's pieces are small where a plan has many levels (on the emulated T2, 26 MiB in blocks of 208 KiB:
// 26-104 KiB messages), so the spin above never ended: 8 ranks on 2 cores, 0.82-0.85 CPU-seconds over the ranks
// for 26 MiB, 33-51 thousand preemptions, against 0.40-0.53 and ~1000 blocking, at the same 452-459 ms. On
// T1 (jobs alternating): 8 MiB 107 against 114-116 ms for 0.12-0.15 CPU-s against 0.21; 16 MiB 214-215 ms
// both, 0.23-0.24 against 0.34-0.35; 4 MiB 56 against 54 ms (0.09 against 0.10), 2 MiB 30 against 28-29.
constexpr int64_t kBlockFromBytes = int64_t{8} << 20;
// A socket's read-ahead (Peer::inbox): a small message's header and body in one recv, not three (the third only
// to hear EAGAIN). On the emulated T1, an 8 B broadcast's receivers made 2.4 recv a message.
constexpr size_t kInboxBytes = 8 << 10;
// poll() where the caller awaits nothing on a socket: the sockets once in this long, the shared pipes every time.
// Where an 8 B broadcast's message was already in a rank's pipe, it took two epoll_wait a call; once in 50 us,
// one in 16 calls, and the receiving rank's CPU a call fell from 4.0 to 3.3 us (medians, alternating in one job,
// 2 ranks over DDL_TRANSPORT=tcp; MPI's 1.9). Such a rank's sockets bring it only the transport's own messages
// (notices, aborts), read that much later.
constexpr auto kQuietPoll = std::chrono::microseconds(50);
// Buffers of unexpected messages kept for the next (spare_): a rank behind takes every small message it reads
// into one, and a malloc and a free a message were a few percent of its CPU.
constexpr size_t kSpares = 256, kSpareBytes = 4096;
// A tag on the wire: [run | check | tag] (Transport::begin_run), the executor's tags below the top two.
constexpr int kTagBits = 24, kCheckBits = 20, kRunBits = 20;
constexpr uint64_t kTagMask = (uint64_t{1} << kTagBits) - 1, kCheckMask = (uint64_t{1} << kCheckBits) - 1,
                   kRunMask = (uint64_t{1} << kRunBits) - 1;
constexpr int64_t kNoticeTag = static_cast<int64_t>(kTagMask), kAbortTag = kNoticeTag - 1,
                  kOverTag = kNoticeTag - 2;  // starting over: its run field is the epoch
constexpr int64_t kRaisedIn = int64_t{1} << 62;  // a start-over's last run is one its sender raised in
constexpr size_t kNoticeBytes = 256;  // a notice: the call's hash and (the start of) its text
// Runs checked on receipt (see the header): one in kRunAhead waits for the previous rank's notice; a run that
// waits kAskAfter sends its notice to every rank. On the emulated T1 (8 ranks, 2 cores) a notice every run cost
// an 8 B broadcast 800-860 us a call against 280-310 without (its ride in the agreement round: 540-600).
constexpr auto kAskAfter = std::chrono::milliseconds(25);
// A rank that got a message of another call waits this long for its sender to name that call, then raises
// naming its own alone (the sender may not be calling ddl any more).
constexpr auto kForeignWait = std::chrono::milliseconds(200);
constexpr auto kStalled = std::chrono::milliseconds(200);  // (abandon_run)
// Runs remembered (to compare a late notice with): more than ranks ahead of each other by kRunAhead each, as in
// a chain of 64.
constexpr size_t kHistory = 64 * TcpTransport::kRunAhead;
const std::string kUnix = "unix";     // a candidate address: the peer's Unix socket on this host

struct Hello {
  uint32_t magic;
  int32_t rank;
  uint64_t nonce;
};

std::string errno_text(int e) { return std::string(std::strerror(e)); }

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, 1000)));
}

// Moves all of buf through a non-blocking socket before the deadline; false if it closed, failed or ran out.
bool exchange_all(int fd, void* buf, size_t n, bool out, Clock::time_point deadline) {
  char* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    ssize_t k = out ? ::send(fd, p + done, n - done, MSG_NOSIGNAL) : ::recv(fd, p + done, n - done, 0);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
    if (Clock::now() > deadline) return false;
    pollfd pfd{fd, static_cast<short>(out ? POLLOUT : POLLIN), 0};
    ::poll(&pfd, 1, ms_left(deadline));
  }
  return true;
}

// A connected, non-blocking socket to address:port, or -1 (refused, unreachable, or not before the deadline).
int dial(const std::string& address, int port, Clock::time_point deadline) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.c_str(), &to.sin_addr) != 1) return -1;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  set_nonblocking(fd);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0) return fd;
  if (errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  while (Clock::now() < deadline) {
    pollfd pfd{fd, POLLOUT, 0};
    if (::poll(&pfd, 1, ms_left(deadline)) > 0) {
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == 0) return fd;
      break;
    }
  }
  ::close(fd);
  return -1;
}

// The abstract Unix socket name of the rank listening on TCP port `port` of this host (abstract: no file,
// gone with the socket; per network namespace, as 127.0.0.1 is).
sockaddr_un unix_name(int port, socklen_t& len) {
  sockaddr_un at{};
  at.sun_family = AF_UNIX;
  const std::string name = "ddl-tcp-" + std::to_string(port);
  std::memcpy(at.sun_path + 1, name.data(), name.size());  // (sun_path[0] = 0: the abstract namespace)
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return at;
}

// A connected, non-blocking Unix socket to the rank listening on TCP port `port` of this host, or -1.
int dial_unix(int port, Clock::time_point deadline) {
  socklen_t len = 0;
  sockaddr_un to = unix_name(port, len);
  while (Clock::now() < deadline) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&to), len) == 0) return fd;
    const int e = errno;
    ::close(fd);
    if (e != EAGAIN) return -1;  // (EAGAIN: its backlog is full for now)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return -1;
}

// After the hello on a Unix socket the dialing side hands over the memory of a shared pipe (one byte, with the
// memfd attached, or with none: the two then talk over the socket alone). False if it failed or ran out.
bool hand_over(int fd, int pipe_fd, Clock::time_point deadline) {
  char byte = pipe_fd >= 0 ? 1 : 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char space[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (pipe_fd >= 0) {
    msg.msg_control = space;
    msg.msg_controllen = sizeof space;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pipe_fd, sizeof(int));
  }
  while (Clock::now() < deadline) {
    if (::sendmsg(fd, &msg, MSG_NOSIGNAL) == 1) return true;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    pollfd pfd{fd, POLLOUT, 0};
    ::poll(&pfd, 1, ms_left(deadline));
  }
  return false;
}

// The accepting side's half: the pipe's memfd (-1: none handed over), or -2 if the socket failed or ran out.
int take_over(int fd, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    char byte = 0;
    iovec iov{&byte, 1};
    alignas(cmsghdr) char space[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space;
    msg.msg_controllen = sizeof space;
    const ssize_t k = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (k == 1) {
      int pipe_fd = -1;
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(&pipe_fd, CMSG_DATA(c), sizeof(int));
      if (byte == 1) return pipe_fd;
      if (pipe_fd >= 0) ::close(pipe_fd);
      return -1;
    }
    if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return -2;
    pollfd pfd{fd, POLLIN, 0};
    ::poll(&pfd, 1, ms_left(deadline));
  }
  return -2;
}

// One byte on the socket of a peer that sleeps on its shared pipe (epoll wakes it). Full: it has unread ones.
void nudge(int fd) {
  const char byte = 0;
  (void)::send(fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

TcpTransport::TcpTransport(int rank, int size, const std::string& bind_address, bool yield_when_idle)
    : rank_(rank),
      size_(size),
      yield_when_idle_(yield_when_idle),
      peers_(static_cast<size_t>(size)),
      history_(kHistory),
      told_peer_(static_cast<size_t>(size)) {
  spin_window_ = kSpinBeforeBlocking;
  const std::string me = "rank " + std::to_string(rank) + ": tcp transport: ";
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw TransportError(me + "socket: " + errno_text(errno));
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_ANY);
  if (!bind_address.empty() && inet_pton(AF_INET, bind_address.c_str(), &at.sin_addr) != 1)
    throw TransportError(me + "bad address to listen on: " + bind_address);
  socklen_t len = sizeof at;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&at), sizeof at) != 0 ||
      ::listen(listen_fd_, std::max(16, size)) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&at), &len) != 0) {
    const int e = errno;
    ::close(listen_fd_);
    throw TransportError(me + "cannot listen on " + (bind_address.empty() ? "any address" : bind_address) + ": " +
                         errno_text(e));
  }
  port_ = ntohs(at.sin_port);
  set_nonblocking(listen_fd_);
  // Ranks of one host connect over a Unix socket where they can (no TCP/IP in the kernel: on the emulated T1 a
  // small call's sendmsg, with the receiving side's TCP it runs, was 31 % of a rank's CPU); not fatal: loopback.
  socklen_t unix_len = 0;
  sockaddr_un unix_at = unix_name(port_, unix_len);
  unix_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (unix_fd_ >= 0 && (::bind(unix_fd_, reinterpret_cast<sockaddr*>(&unix_at), unix_len) != 0 ||
                        ::listen(unix_fd_, std::max(16, size)) != 0)) {
    ::close(unix_fd_);
    unix_fd_ = -1;
  }
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) throw TransportError(me + "epoll: " + errno_text(errno));
}

TcpTransport::~TcpTransport() {
  for (Peer& p : peers_)
    if (p.fd >= 0) ::close(p.fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (unix_fd_ >= 0) ::close(unix_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

void TcpTransport::connect(const std::vector<std::vector<std::string>>& addresses, const std::vector<int>& ports,
                           uint64_t nonce, double timeout_s, size_t pipe_bytes) {
  const std::string me = "rank " + std::to_string(rank_) + ": tcp transport: ";
  if (addresses.size() != static_cast<size_t>(size_) || ports.size() != static_cast<size_t>(size_))
    throw TransportError(me + "connect needs every rank's addresses and port");
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  // Lower ranks first: rank 0 only accepts, so every dial is answered once the ranks below are accepting.
  for (int p = 0; p < rank_; ++p) {
    int fd = -1;
    std::string tried;
    while (fd < 0 && Clock::now() < deadline) {
      for (const std::string& a : addresses[static_cast<size_t>(p)]) {
        tried += (tried.empty() ? "" : ", ") + a;
        const auto soon = std::min(deadline, Clock::now() + std::chrono::seconds(5));
        int c = a == kUnix ? dial_unix(ports[static_cast<size_t>(p)], soon) : dial(a, ports[static_cast<size_t>(p)], soon);
        if (c < 0) continue;
        Hello hello{kMagic, rank_, nonce}, answer{};
        if (exchange_all(c, &hello, sizeof hello, true, deadline) &&
            exchange_all(c, &answer, sizeof answer, false, deadline) && answer.magic == kMagic &&
            answer.rank == p && answer.nonce == nonce) {
          if (a == kUnix) {  // a peer of this host: the memory of a shared pipe goes with the connection
            const int pipe_fd = pipe_bytes ? SharedPipe::create(pipe_bytes) : -1;
            if (!hand_over(c, pipe_fd, deadline)) {
              if (pipe_fd >= 0) ::close(pipe_fd);
              ::close(c);
              continue;
            }
            if (pipe_fd >= 0) peers_[static_cast<size_t>(p)].pipe = shared_pipe(pipe_fd, true, me);
          }
          fd = c;
          unix_peers_ += a == kUnix;
          break;
        }
        ::close(c);  // someone else's port, or the wrong rank behind this address
      }
      if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (fd < 0)
      throw TransportError(me + "could not reach rank " + std::to_string(p) + " at port " +
                           std::to_string(ports[static_cast<size_t>(p)]) + " of " + tried +
                           " before the deadline (a firewall, or the wrong interface: set DDL_TCP_IFACE)");
    peers_[static_cast<size_t>(p)].fd = fd;
  }
  int missing = size_ - 1 - rank_;
  while (missing > 0) {
    if (Clock::now() > deadline) {
      std::string who;
      for (int p = rank_ + 1; p < size_; ++p)
        if (peers_[static_cast<size_t>(p)].fd < 0) who += (who.empty() ? "" : ", ") + std::to_string(p);
      throw TransportError(me + "ranks " + who + " did not connect before the deadline");
    }
    pollfd pfd[2] = {{listen_fd_, POLLIN, 0}, {unix_fd_, POLLIN, 0}};  // (a negative fd is skipped)
    if (::poll(pfd, 2, ms_left(deadline)) <= 0) continue;
    const bool over_unix = (pfd[1].revents & POLLIN) != 0;
    int c = ::accept4(over_unix ? unix_fd_ : listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) continue;
    Hello hello{};
    const auto soon = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    if (!exchange_all(c, &hello, sizeof hello, false, soon) || hello.magic != kMagic || hello.nonce != nonce ||
        hello.rank <= rank_ || hello.rank >= size_ || peers_[static_cast<size_t>(hello.rank)].fd >= 0) {
      ::close(c);  // not one of this job's ranks (a stray connection): ignored
      continue;
    }
    Hello answer{kMagic, rank_, nonce};
    if (!exchange_all(c, &answer, sizeof answer, true, deadline)) {
      ::close(c);
      continue;
    }
    if (over_unix) {
      const int pipe_fd = take_over(c, soon);
      if (pipe_fd == -2) {
        ::close(c);
        continue;
      }
      if (pipe_fd >= 0) peers_[static_cast<size_t>(hello.rank)].pipe = shared_pipe(pipe_fd, false, me);
    }
    peers_[static_cast<size_t>(hello.rank)].fd = c;
    unix_peers_ += over_unix;
    --missing;
  }
  ::close(listen_fd_);
  listen_fd_ = -1;
  if (unix_fd_ >= 0) ::close(unix_fd_);
  unix_fd_ = -1;
  for (int p = 0; p < size_; ++p) {
    Peer& peer = peers_[static_cast<size_t>(p)];
    if (p == rank_) continue;
    int one = 1;
    setsockopt(peer.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small calls are latency
    set_nonblocking(peer.fd);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = static_cast<uint32_t>(p);
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, peer.fd, &ev) != 0)
      throw TransportError(me + "epoll_ctl: " + errno_text(errno));
    if (peer.pipe) piped_.push_back(p);
  }
}

std::unique_ptr<SharedPipe> TcpTransport::shared_pipe(int fd, bool dialer, const std::string& me) {
  try {
    return std::make_unique<SharedPipe>(fd, dialer);
  } catch (const std::runtime_error& e) {
    throw TransportError(me + e.what());
  }
}

std::vector<std::pair<std::string, std::string>> TcpTransport::local_addresses() {
  std::vector<std::pair<std::string, std::string>> out;
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return out;
  for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    out.emplace_back(i->ifa_name, text);
  }
  freeifaddrs(all);
  return out;
}

Handle TcpTransport::take_slot() {
  if (!free_.empty()) {
    Handle h = free_.back();
    free_.pop_back();
    slots_[static_cast<size_t>(h)] = Op{};
    return h;
  }
  slots_.emplace_back();
  return static_cast<Handle>(slots_.size() - 1);
}

void TcpTransport::finish(Handle h, std::string error) {
  Op& op = slots_[static_cast<size_t>(h)];
  op.done = true;
  op.error = std::move(error);
}

void TcpTransport::lost(int p, const std::string& why, bool surely) {
  Peer& peer = peers_[static_cast<size_t>(p)];
  if (!peer.closed && peer.fd >= 0) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, peer.fd, nullptr);
  peer.closed = true;
  // A peer that closed with nothing of ours pending left normally (its job ended first); otherwise this run
  // cannot finish (surely: a new send or receive for it).
  if (!surely && peer.sends.empty() && peer.posted.empty() && !peer.in_body && peer.header_got == 0) return;
  throw TransportError("rank " + std::to_string(rank_) + ": the connection with rank " + std::to_string(p) +
                       " was lost (" + why + "; did that rank exit or fail?)");
}

void TcpTransport::watch(int p, bool write) {
  Peer& peer = peers_[static_cast<size_t>(p)];
  if (peer.want_write == write || peer.closed) return;
  peer.want_write = write;
  if (peer.pipe) return;  // (room in a shared pipe is polled for, or woken for: wait_events)
  epoll_event ev{};
  ev.events = EPOLLIN | (write ? EPOLLOUT : 0u);
  ev.data.u32 = static_cast<uint32_t>(p);
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, peer.fd, &ev);
}

std::deque<TcpTransport::Recv>::iterator TcpTransport::posted_for(Peer& peer, int64_t tag) {
  return std::find_if(peer.posted.begin(), peer.posted.end(), [&](const Recv& r) { return r.tag == tag; });
}

int64_t TcpTransport::wire(int64_t run, int64_t check, int64_t tag) const {
  const uint64_t c = check ? ((static_cast<uint64_t>(check) & kCheckMask) | 1) : 0;  // (a checked run's is never 0)
  return static_cast<int64_t>(((static_cast<uint64_t>(run) & kRunMask) << (kTagBits + kCheckBits)) |
                              (c << kTagBits) | (static_cast<uint64_t>(tag) & kTagMask));
}

int64_t TcpTransport::run_of(int64_t w) const {
  const uint64_t theirs = (static_cast<uint64_t>(w) >> (kTagBits + kCheckBits)) & kRunMask;
  int64_t d = static_cast<int64_t>((theirs - static_cast<uint64_t>(run_)) & kRunMask);
  if (d >= int64_t{1} << (kRunBits - 1)) d -= int64_t{1} << kRunBits;  // behind this rank's run, or ahead
  return run_ + d;
}

Handle TcpTransport::isend(const void* data, size_t nbytes, int peer, int tag) {
  const Handle h = send_wire(data, nbytes, peer, wire(run_, check_, tag));
  mark_socket_wait(h, peer);
  return h;
}

Handle TcpTransport::irecv(void* data, size_t nbytes, int peer, int tag) {
  const Handle h = recv_wire(data, nbytes, peer, wire(run_, check_, tag));
  mark_socket_wait(h, peer);
  return h;
}

void TcpTransport::mark_socket_wait(Handle h, int peer) {
  Op& op = slots_[static_cast<size_t>(h)];
  if (op.done || peer == rank_ || peers_[static_cast<size_t>(peer)].pipe) return;
  op.socket = true;
  ++socket_waits_;
}

Handle TcpTransport::send_wire(const void* data, size_t nbytes, int peer, int64_t tag, std::vector<char> own) {
  check_peer(peer, size_, rank_);
  const Handle h = own.empty() ? take_slot() : -1;  // (the transport's own messages: nobody tests them)
  if (!own.empty()) data = own.data();  // (a vector's storage stays where it is when the vector moves)
  Peer& to = peers_[static_cast<size_t>(peer)];
  if (peer == rank_) {  // to itself: straight to the oldest matching receive, or kept until one is posted
    auto match = posted_for(to, tag);
    if (match == to.posted.end()) {
      const char* c = static_cast<const char*>(data);
      stash(to, tag, std::vector<char>(c, c + nbytes));
    } else if (nbytes > match->capacity) {
      finish(match->h, truncation(nbytes, rank_, match->capacity, rank_));
      to.posted.erase(match);
    } else {
      if (nbytes) std::memcpy(match->data, data, nbytes);
      finish(match->h);
      to.posted.erase(match);
    }
    if (h >= 0) finish(h);
    return h;
  }
  if (to.closed) lost(peer, "closed before this send", true);
  to.sends.push_back(Send{h, static_cast<const char*>(data), nbytes, 0, {tag, static_cast<int64_t>(nbytes)},
                          std::move(own)});
  if (!to.want_write) flush(peer);  // on the wire at once where the socket has room
  return h;
}

void TcpTransport::flush(int p) {
  Peer& peer = peers_[static_cast<size_t>(p)];
  Moved moved(*this);
  while (!peer.sends.empty()) {
    iovec iov[kMaxIov];
    int n = 0;
    for (auto it = peer.sends.begin(); it != peer.sends.end() && n + 2 <= kMaxIov; ++it) {
      size_t skip = it->sent;
      if (skip < kHeader) {
        iov[n++] = {reinterpret_cast<char*>(it->header) + skip, kHeader - skip};
        skip = 0;
      } else {
        skip -= kHeader;
      }
      if (it->nbytes > skip) iov[n++] = {const_cast<char*>(it->data) + skip, it->nbytes - skip};
    }
    ssize_t k;
    if (peer.pipe) {
      k = static_cast<ssize_t>(peer.pipe->write(iov, n));
      if (k == 0) {
        k = -1;
        errno = EAGAIN;
      } else if (peer.pipe->wake_after_write()) {
        nudge(peer.fd);
      }
    } else {
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n);
      k = ::sendmsg(peer.fd, &msg, MSG_NOSIGNAL);
    }
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        watch(p, true);  // the socket is full: EPOLLOUT says when it has room again (a pipe: polled)
        return;
      }
      lost(p, errno_text(errno));
      return;
    }
    size_t wrote = static_cast<size_t>(k);
    moved.any = true;
    while (wrote > 0 && !peer.sends.empty()) {
      Send& s = peer.sends.front();
      const size_t left = kHeader + s.nbytes - s.sent;
      const size_t now = std::min(left, wrote);
      s.sent += now;
      wrote -= now;
      if (s.sent == kHeader + s.nbytes) {
        if (s.h >= 0) finish(s.h);
        if (s.nbytes <= kSpinAfterBytes) moved.small = true;
        peer.sends.pop_front();
      }
    }
  }
  watch(p, false);
}

bool TcpTransport::begin_body(int p) {
  Peer& peer = peers_[static_cast<size_t>(p)];
  const int64_t tag = peer.header[0];
  const size_t n = static_cast<size_t>(peer.header[1]);
  peer.in_body = true;
  peer.body = n;
  peer.body_got = 0;
  auto match = posted_for(peer, tag);
  if (match != peer.posted.end()) {
    if (n > match->capacity) throw TransportError(truncation(n, p, match->capacity, rank_));
    peer.into = match->data;
    peer.target = match->h;
    peer.posted.erase(match);
  } else {
    if (peer.unexpected.capacity() < n && !spare_.empty()) {  // (a small message's buffer, used before)
      peer.unexpected = std::move(spare_.back());
      spare_.pop_back();
    }
    peer.unexpected.resize(n);
    peer.into = peer.unexpected.data();
    peer.target = -1;
  }
  return n == 0;
}

void TcpTransport::end_body(int p) {
  Peer& peer = peers_[static_cast<size_t>(p)];
  if (peer.body <= kSpinAfterBytes) small_finished_ = true;  // (drain reads the clock once for all it took)
  const int64_t tag = peer.header[0];
  peer.in_body = false;
  peer.header_got = 0;
  if (peer.target >= 0) {
    finish(peer.target);
    return;
  }
  // Unexpected when its header came; a receive posted since takes it now (the oldest such).
  auto match = posted_for(peer, tag);
  if (match == peer.posted.end()) {
    if (keep(p, tag, peer.unexpected)) stash(peer, tag, std::move(peer.unexpected));
    if (peer.unexpected.capacity() > kSpareBytes) peer.unexpected = {};
    peer.unexpected.clear();  // (moved from, or a small one's kept for the next)
    return;
  }
  if (peer.body > match->capacity) throw TransportError(truncation(peer.body, p, match->capacity, rank_));
  if (peer.body) std::memcpy(match->data, peer.unexpected.data(), peer.body);
  finish(match->h);
  peer.posted.erase(match);
}

void TcpTransport::drain(int p) {
  Peer& peer = peers_[static_cast<size_t>(p)];
  Moved moved(*this);
  peer.dry = false;
  while (!peer.closed) {
    char* at = peer.in_body ? peer.into + peer.body_got : reinterpret_cast<char*>(peer.header) + peer.header_got;
    const size_t want = peer.in_body ? peer.body - peer.body_got : kHeader - peer.header_got;
    const ssize_t k = take(peer, at, want);
    if (k > 0) {
      moved.any = true;
      if (!peer.in_body) {
        peer.header_got += static_cast<size_t>(k);
        if (peer.header_got == kHeader && begin_body(p)) end_body(p);
      } else {
        peer.body_got += static_cast<size_t>(k);
        if (peer.body_got == peer.body) end_body(p);
      }
      continue;
    }
    if (k == 0) {
      lost(p, "closed by the peer");
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    lost(p, errno_text(errno));
    return;
  }
  if (moved.any && peer.pipe && peer.pipe->wake_after_read()) nudge(peer.fd);  // its writer waits for room
}

ssize_t TcpTransport::take(Peer& peer, char* into, size_t n) {
  if (peer.pipe) {
    const size_t k = peer.pipe->read(into, n);
    if (k == 0) errno = EAGAIN;  // (a pipe's end is its socket's: woken)
    return k ? static_cast<ssize_t>(k) : -1;
  }
  if (peer.inbox_at == peer.inbox_end) {
    if (peer.dry) {
      errno = EAGAIN;
      return -1;
    }
    const bool direct = n >= kInboxBytes;
    if (!direct && peer.inbox.empty()) peer.inbox.resize(kInboxBytes);
    const size_t ask = direct ? n : kInboxBytes;
    const ssize_t k = ::recv(peer.fd, direct ? into : peer.inbox.data(), ask, 0);
    if (k > 0 && static_cast<size_t>(k) < ask) peer.dry = true;
    if (k <= 0 || direct) return k;
    peer.inbox_at = 0;
    peer.inbox_end = static_cast<size_t>(k);
  }
  const size_t k = std::min(n, peer.inbox_end - peer.inbox_at);
  std::memcpy(into, peer.inbox.data() + peer.inbox_at, k);
  peer.inbox_at += k;
  return static_cast<ssize_t>(k);
}

void TcpTransport::woken(int p) {
  Peer& peer = peers_[static_cast<size_t>(p)];
  char bytes[64];
  for (;;) {  // wake-ups: their bytes say nothing
    const ssize_t k = ::recv(peer.fd, bytes, sizeof bytes, 0);
    if (k > 0) continue;
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    const std::string why = k == 0 ? "closed by the peer" : errno_text(errno);
    drain(p);  // what it wrote before it left is still read
    if (!peer.closed) lost(p, why);
    return;
  }
}

Handle TcpTransport::recv_wire(void* data, size_t nbytes, int peer, int64_t tag) {
  check_peer(peer, size_, rank_);
  const Handle h = take_slot();
  Peer& from = peers_[static_cast<size_t>(peer)];
  auto match = std::find_if(from.arrived.begin(), from.arrived.end(), [&](const Arrived& a) { return a.tag == tag; });
  if (match != from.arrived.end()) {
    if (match->data.size() > nbytes) {
      finish(h, truncation(match->data.size(), peer, nbytes, rank_));
    } else {
      if (!match->data.empty()) std::memcpy(data, match->data.data(), match->data.size());
      finish(h);
    }
    if (match->data.capacity() <= kSpareBytes && spare_.size() < kSpares) spare_.push_back(std::move(match->data));
    from.arrived.erase(match);
    return h;
  }
  if (from.closed && peer != rank_) lost(peer, "closed before this receive", true);
  from.posted.push_back(Recv{h, static_cast<char*>(data), nbytes, tag});
  return h;
}

void TcpTransport::wait_events(Clock::duration timeout) {
  const int64_t timeout_us = std::chrono::duration_cast<std::chrono::microseconds>(timeout).count();
  epoll_event events[64];
  int n;
  // Before blocking, each peer of a shared pipe is told, then looked at once more: it may need no wait.
  bool blocks = timeout_us > 0;
  if (blocks)
    for (int p : piped_) {
      Peer& peer = peers_[static_cast<size_t>(p)];
      if (!peer.closed && peer.pipe->asleep(!peer.sends.empty())) blocks = false;
    }
  if (!blocks) {
    n = epoll_wait(epoll_fd_, events, 64, 0);
  } else {
    timespec ts{static_cast<time_t>(timeout_us / 1000000), static_cast<long>(timeout_us % 1000000) * 1000};
    n = epoll_pwait2(epoll_fd_, events, 64, &ts, nullptr);
    if (n < 0 && errno == ENOSYS) n = epoll_wait(epoll_fd_, events, 64, static_cast<int>((timeout_us + 999) / 1000));
  }
  last_socket_poll_ = Clock::now();
  if (timeout_us > 0)
    for (int p : piped_) peers_[static_cast<size_t>(p)].pipe->awake();
  for (int i = 0; i < n; ++i) {
    const int p = static_cast<int>(events[i].data.u32);
    if (peers_[static_cast<size_t>(p)].pipe) {
      if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) woken(p);
      continue;
    }
    if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) drain(p);
    if ((events[i].events & EPOLLOUT) && !peers_[static_cast<size_t>(p)].closed) flush(p);
  }
  look_at_pipes();
}

void TcpTransport::look_at_pipes() {
  for (int p : piped_) {
    Peer& peer = peers_[static_cast<size_t>(p)];
    if (peer.closed) continue;
    drain(p);
    if (!peer.sends.empty() && !peer.closed) flush(p);
  }
}

// A rank whose caller awaits nothing on a socket (a broadcast's root once its sends are out, a rank whose
// messages come through shared pipes) looks at the pipes every time and at the sockets once in kQuietPoll.
void TcpTransport::poll() {
  if (socket_waits_ > 0 || piped_.empty() || Clock::now() - last_socket_poll_ >= kQuietPoll)
    wait_events(Clock::duration::zero());
  else
    look_at_pipes();
}

bool TcpTransport::test(Handle h) {
  Op& op = slots_[static_cast<size_t>(h)];
  if (!op.done) return false;
  if (op.socket) --socket_waits_;
  std::string err = std::move(op.error);
  free_.push_back(h);
  if (!err.empty()) throw TransportError(err);
  return true;
}

void TcpTransport::idle(Clock::duration rest, bool messages_only) {
  if (in_run_ && !asked_all_) {  // (see the header: a run that waits)
    const auto now = Clock::now();
    if (run_began_ == Clock::time_point{}) {
      run_began_ = now;
    } else if (now - run_began_ > kAskAfter) {
      asked_all_ = true;
      for (int q = 0; q < size_; ++q) send_notice(q, run_);
    }
  }
  if (foreign_run_ >= 0 && Clock::now() - foreign_since_ > kForeignWait) {  // p has not answered: it may have
    const int64_t run = foreign_run_;                                       // stopped calling ddl
    foreign_run_ = -1;
    differs(foreign_peer_, "(a call whose messages are not this one's)", run);
  }
  if (!messages_only) {  // a block waits on something else too (the GPU's staging): never past the rest asked
    if (rest > Clock::duration::zero())
      wait_events(rest);
    else if (yield_when_idle_)
      sched_yield();
    return;
  }
  if (rest > Clock::duration::zero()) {
    wait_events(std::max(rest, Clock::duration(kLongestEventWait)));
    return;
  }
  // A caller waits: poll a while (the answer to a small call is usually that near), then block too; ranks
  // that share cores (and a late peer) would otherwise spin the cores the others need. A large run blocks at
  // once: its small messages are pieces of a stream that comes at the link's pace (kBlockFromBytes).
  if (run_bytes_ >= kBlockFromBytes) {
    wait_events(kLongestEventWait);
    return;
  }
  const auto now = Clock::now();
  if (now - last_finished_ > spin_window_) {
    if (blocked_since_ == Clock::time_point{}) blocked_since_ = now;
    wait_events(kLongestEventWait);
    return;
  }
  ++spins_;
  if (yield_when_idle_) sched_yield();
}

Clock::duration TcpTransport::next_spin_window(Clock::duration window, Clock::duration spun, Clock::duration blocked) {
  // (too soon only after spinning the window: a call begun long after the last small message blocks at once)
  if (spun <= 2 * window && blocked <= window) return std::min<Clock::duration>(2 * window, kSpinAtMost);
  if (blocked > kSpinAtMost) return kSpinBeforeBlocking;
  return window;
}

void TcpTransport::finished_small(Clock::time_point now) {
  if (blocked_since_ != Clock::time_point{}) {  // this rank had blocked: was it too soon, or was the wait long?
    spin_window_ = next_spin_window(spin_window_, blocked_since_ - last_finished_, now - blocked_since_);
    blocked_since_ = Clock::time_point{};
  }
  last_finished_ = now;
  small_finished_ = false;
}

void TcpTransport::abandon() {
  piped_.clear();
  for (Peer& p : peers_) {
    if (p.fd >= 0) ::close(p.fd);
    p = Peer{};
    p.closed = true;
  }
  slots_.clear();
  free_.clear();
}

// -- runs checked on receipt --------------------------------------------------------------------------------

void TcpTransport::begin_run(int64_t check, const std::string& label, double timeout_s, int64_t bytes) {
  run_bytes_ = bytes;
  blocked_since_ = Clock::time_point{};  // (a block of the last run's, which ended without a small message)
  socket_waits_ = 0;  // (the last run's operations were all tested done, or abandoned)
  poll();  // (an abort or a start-over already read is acted on before this run starts)
  // An earlier run that others raised for and this rank finished, or raised for itself: all ranks start over
  // (before this run takes a number); where this rank had not raised yet, it raises now.
  std::string missed, why;
  for (const auto& [run, what] : aborts_) {
    if (raised_.count(run)) continue;
    if (run <= run_ && missed.empty()) missed = what + " (a call this rank had finished; raised at its next)";
    if (run > run_ && why.empty()) why = what;  // (this very call, which others have begun and raised in)
  }
  // Others started over: this run starts over too, unless every one of them finished it (they raised in a later
  // call, which starts over when this rank begins it: this run's messages are all theirs).
  bool others = false;
  for (auto o = over_.upper_bound({epoch_, size_}); o != over_.end() && !others; ++o)
    others = unfinished(o->second, run_ + 1);
  if (start_over_ || others || !missed.empty()) {
    const bool raise = !start_over_;
    const std::string said = !missed.empty() ? missed : !why.empty() ? why :
                             "rank " + std::to_string(rank_) + ": " + told_;  // (what the others started over for)
    start_over(timeout_s);
    if (raise) throw CallMismatch(said);
  }
  ++run_;
  in_run_ = true, check_ = check, settled_ = true, timeout_s_ = timeout_s;
  mismatch_.clear();
  Past& now = history_[static_cast<size_t>(run_) % kHistory];
  now.run = run_, now.check = check, now.label = label;
  run_began_ = {}, asked_all_ = false;  // (the clock is read when the run first waits: idle)
  std::fill(told_peer_.begin(), told_peer_.end(), 0);
  while (!raised_.empty() && *raised_.begin() < run_ - 64) raised_.erase(raised_.begin());
  // What earlier runs left is read by none: only an abandoned run leaves messages (a whole run's were all
  // received); looked for once in kRunAhead runs as well. (Every run, the scan of a rank that runs behind, its
  // next runs' messages waiting, cost a few percent of its CPU.)
  if (stale_ || run_ % kRunAhead == 0) drop_runs_up_to(run_ - 1), stale_ = false;
  auto told = aborts_.find(run_);
  if (told != aborts_.end()) {  // a rank has already found this run's calls to differ
    mismatch_ = told->second;
    raised_.insert(run_);
    aborts_.erase(told);
    return;
  }
  if (size_ < 2) return;
  const int prev = (rank_ + size_ - 1) % size_, next = (rank_ + 1) % size_;
  if (check != 0 && run_ % kRunAhead == 0) {  // (posted first: it takes the previous rank's notice if here)
    settled_ = false;
    notice_in_.assign(kNoticeBytes, 0);
    notice_ = recv_wire(notice_in_.data(), kNoticeBytes, prev, wire(run_, 0, kNoticeTag));
    send_notice(next, run_);
  }
  // What came for this run before it began: notices compared with this call, a message of another call
  // answered with this rank's notice.
  for (int p = 0; p < size_ && mismatch_.empty(); ++p) {
    Peer& peer = peers_[static_cast<size_t>(p)];
    auto& arrived = peer.arrived;
    for (auto a = arrived.begin(); a != arrived.end();) {
      if (a->run > run_ && peer.arrived_in_order) break;  // (the rest are later runs': a rank behind has many)
      if (a->run != run_ || keep(p, a->tag, a->data)) {
        ++a;
      } else {
        a = arrived.erase(a);
      }
    }
  }
}

bool TcpTransport::settled() {
  if (settled_) return true;
  if (notice_ < 0 || !slots_[static_cast<size_t>(notice_)].done) return false;
  free_.push_back(notice_);
  notice_ = -1;
  int64_t theirs = 0;
  std::memcpy(&theirs, notice_in_.data(), sizeof theirs);
  if (theirs == check_) return settled_ = true;
  const char* text = notice_in_.data() + sizeof theirs;
  differs((rank_ + size_ - 1) % size_, std::string(text, strnlen(text, kNoticeBytes - sizeof theirs)), run_);
  return false;
}

bool TcpTransport::keep(int p, int64_t tag, const std::vector<char>& data) {
  const int64_t local = tag & static_cast<int64_t>(kTagMask);
  if (local == kOverTag) {  // a rank starts over after a mismatch: one this rank may not have seen yet
    const int64_t epoch = static_cast<int64_t>((static_cast<uint64_t>(tag) >> (kTagBits + kCheckBits)) & kRunMask);
    int64_t said = 0;
    std::memcpy(&said, data.data(), std::min(sizeof said, data.size()));
    over_[{epoch_ + static_cast<int64_t>((static_cast<uint64_t>(epoch - epoch_)) & (kRunMask >> 1)), p}] = said;
    if (data.size() > sizeof said && told_.empty()) told_.assign(data.begin() + sizeof said, data.end());
    // The run this rank is in fails where p will not finish it: p raised in it or before it. (p may have finished
    // it and raised in a later call, or at the start of its next: this run is whole, the later one starts over.)
    if (in_run_ && mismatch_.empty() && unfinished(said, run_))
      mismatch_ = "rank " + std::to_string(rank_) + ": " + told_;
    return false;
  }
  const int64_t run = run_of(tag);
  if (local == kAbortTag) {  // a rank found this run's (or an earlier run's) calls to differ
    if (raised_.count(run) || run <= dead_upto_) return false;
    if (told_.empty()) told_.assign(data.begin(), data.end());
    const std::string what = "rank " + std::to_string(rank_) + ": " + std::string(data.begin(), data.end());
    if (in_run_ && run <= run_) {  // this run, or one this rank finished: raised here now
      mismatch_ = what + (run < run_ ? " (a call this rank had finished)" : "");
      raised_.insert(run);
    } else {
      aborts_.emplace(run, what);
    }
    return false;
  }
  if (run > run_) return true;  // a run this rank has not begun: looked at again when it does
  if (local == kNoticeTag) {    // a rank's call of this run, or of one this rank finished
    compare(p, run, data);
    return false;
  }
  const Past* mine = past(run);  // (none: a run abandoned when the ranks started over, whose messages are dropped)
  if (mine == nullptr) return false;
  auto check_of = [](int64_t w) { return (static_cast<uint64_t>(w) >> kTagBits) & kCheckMask; };
  if (check_of(tag) != check_of(wire(0, mine->check, 0))) {
    foreign(p, run);  // a message of another call: never read
    return false;
  }
  return run == run_ && in_run_;  // this call's, come before its receive was posted (a finished run's: dropped)
}

const TcpTransport::Past* TcpTransport::past(int64_t run) const {
  const Past& p = history_[static_cast<size_t>(run) % kHistory];
  return run > 0 && p.run == run ? &p : nullptr;
}

void TcpTransport::send_notice(int p, int64_t run) {
  const Past* was = past(run);
  if (was == nullptr || p == rank_ || peers_[static_cast<size_t>(p)].closed) return;
  if (run == run_) {
    if (told_peer_[static_cast<size_t>(p)]) return;
    told_peer_[static_cast<size_t>(p)] = 1;
  }
  std::vector<char> notice(sizeof(int64_t) + std::min(was->label.size(), kNoticeBytes - sizeof(int64_t)));
  std::memcpy(notice.data(), &was->check, sizeof(int64_t));
  std::memcpy(notice.data() + sizeof(int64_t), was->label.data(), notice.size() - sizeof(int64_t));
  const size_t bytes = notice.size();  // (before the move: arguments are evaluated in no set order)
  send_wire(nullptr, bytes, p, wire(run, 0, kNoticeTag), std::move(notice));
}

void TcpTransport::compare(int p, int64_t run, const std::vector<char>& notice) {
  const Past* mine = past(run);
  if (mine == nullptr || notice.size() < sizeof(int64_t)) return;  // (a run abandoned since: nothing to compare)
  int64_t theirs = 0;
  std::memcpy(&theirs, notice.data(), sizeof theirs);
  if (theirs != mine->check) differs(p, std::string(notice.begin() + sizeof theirs, notice.end()), run);
}

void TcpTransport::foreign(int p, int64_t run) {
  send_notice(p, run);  // p compares and tells every rank, naming both calls
  if (foreign_run_ < 0) foreign_run_ = run, foreign_peer_ = p, foreign_since_ = Clock::now();
}

void TcpTransport::differs(int p, const std::string& theirs, int64_t run) {
  const Past* mine = past(run);
  // (once this rank has said it starts over, every rank will: an abort said after that could reach one that
  // has started over already, and be taken for one of its new runs')
  if (mine == nullptr || raised_.count(run) || aborts_.count(run) || announced_ == epoch_ + 1) return;
  if (run == run_ && in_run_ && !mismatch_.empty()) return;
  const std::string text = "ranks called ddl differently: ranks " + std::to_string(p) + ": " + theirs +
                           "; ranks " + std::to_string(rank_) + ": " + mine->label;
  const std::string what = "rank " + std::to_string(rank_) + ": " + text;
  if (in_run_ && run <= run_) {  // this run, or one this rank finished: raised here now
    mismatch_ = what + (run < run_ ? " (a call this rank had finished)" : "");
    raised_.insert(run);
  } else {  // a run this rank finished, between runs: raised at its next
    aborts_.emplace(run, what);
  }
  told_ = text + " (found by rank " + std::to_string(rank_) + ")";
  tell_others(wire(run, 0, kAbortTag), std::vector<char>(told_.begin(), told_.end()));
}

void TcpTransport::abandon_run() {
  for (Peer& peer : peers_) {
    for (const Recv& r : peer.posted) free_.push_back(r.h);
    peer.posted.clear();
    if (peer.in_body && peer.target >= 0) {  // coming into the caller's buffer: into one of ours instead (dropped)
      free_.push_back(peer.target);
      peer.unexpected.resize(peer.body);
      peer.into = peer.unexpected.data();
      peer.target = -1;
    }
    // The run's data not yet begun on the wire is dropped (every rank drops a past run's messages); one begun
    // is sent on from a copy (the stream must stay whole), the caller may reuse its buffers at once.
    for (Send& s : peer.sends)
      if (s.h >= 0) free_.push_back(s.h), s.h = -2;  // (-2: the run's own, -1: the transport's)
    peer.sends.erase(std::remove_if(peer.sends.begin(), peer.sends.end(),
                                    [](const Send& s) { return s.h == -2 && s.sent == 0; }),  // (only the first
                     peer.sends.end());                                                        // can have begun)
    for (Send& s : peer.sends) {
      if (s.own.empty() && s.nbytes) {
        s.own.assign(s.data, s.data + s.nbytes);
        s.data = s.own.data();
      }
      s.h = -1;
    }
  }
  notice_ = -1;
  stale_ = true;
  if (in_run_) {  // a run that took a number raised: the ranks' next runs start over; the others hear it now,
    start_over_ = true;  // so that one still in a run raises there instead of waiting for this rank
    announce_over();
  }
  in_run_ = false, settled_ = true;
  // What this rank tells the others (an abort, that it starts over) must reach them even if it never calls
  // again: its caller stops at the error, and nothing would move a message still queued behind a full socket
  // (over a Unix socket, whose buffer is small, 1 broadcast test in 10 waited for it until the deadline).
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(std::min(timeout_s_, 10.0)));
  // A peer that has raised too may be waiting in its start-over, reading (then its queue drains), or may have
  // stopped calling ddl until its next call (then it reads nothing now, and this rank writes the rest at its own
  // next call): its queue is waited for while its bytes move, not past kStalled without.
  try {  // (a queue that is not empty waits on EPOLLOUT: send_wire flushed it as far as the socket took)
    auto pending = [&] {
      bool any = false;
      for (int q = 0; q < size_; ++q) {
        const Peer& peer = peers_[static_cast<size_t>(q)];
        if (peer.sends.empty() || peer.closed) continue;
        if (!over_.count({epoch_ + 1, q})) return true;
        any = true;
      }
      return any && Clock::now() - last_moved_ < kStalled;
    };
    while (pending() && Clock::now() < until) wait_events(kLongestEventWait);
  } catch (const TransportError&) {  // a peer lost meanwhile: said at the next call
  }
}

bool TcpTransport::unfinished(int64_t said, int64_t run) {
  const int64_t last = said & ~kRaisedIn;
  return last < run || (last == run && (said & kRaisedIn));
}

void TcpTransport::announce_over() {
  if (announced_ == epoch_ + 1) return;
  announced_ = epoch_ + 1;
  const int64_t last = run_ | (in_run_ ? kRaisedIn : 0);  // (in a run: this rank raised in it, else finished it)
  std::vector<char> said(sizeof last + told_.size());  // [its last run, kRaisedIn | what differed]
  std::memcpy(said.data(), &last, sizeof last);
  std::memcpy(said.data() + sizeof last, told_.data(), told_.size());
  tell_others(wire(epoch_ + 1, 0, kOverTag), said);
}

void TcpTransport::tell_others(int64_t tag, const std::vector<char>& what) {
  for (int q = 0; q < size_; ++q)
    if (q != rank_ && !peers_[static_cast<size_t>(q)].closed) send_wire(nullptr, what.size(), q, tag, what);
}

void TcpTransport::drop_runs_up_to(int64_t last) {
  for (Peer& peer : peers_)
    peer.arrived.erase(std::remove_if(peer.arrived.begin(), peer.arrived.end(),
                                      [&](const Arrived& a) { return a.run <= last; }),
                       peer.arrived.end());
}

void TcpTransport::stash(Peer& peer, int64_t tag, std::vector<char> data) {
  const int64_t run = run_of(tag);
  // (removing messages keeps a queue in order; an empty one is in order again)
  peer.arrived_in_order = peer.arrived.empty() || (peer.arrived_in_order && run >= peer.arrived.back().run);
  peer.arrived.push_back(Arrived{tag, std::move(data), run});
}

void TcpTransport::start_over(double timeout_s) {
  announce_over();
  ++epoch_;
  const int64_t last = run_;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  int64_t highest = last;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    while (!over_.count({epoch_, q})) {
      if (Clock::now() > deadline)
        throw TransportError("rank " + std::to_string(rank_) + ": waited " + std::to_string(timeout_s) +
                             " s (DDL_TIMEOUT) for rank " + std::to_string(q) + " to start over after ranks called "
                             "ddl differently; did it stop calling collectives?");
      wait_events(kLongestEventWait);
    }
    highest = std::max(highest, over_[{epoch_, q}] & ~kRaisedIn);
  }
  over_.erase(over_.begin(), over_.upper_bound({epoch_, size_}));
  run_ = dead_upto_ = highest;  // every run so far is behind every rank now: its messages are dropped where
                                // they arrive, and what they told (a late abort of one) is not heard
  drop_runs_up_to(run_);
  aborts_.clear();
  raised_.clear();
  told_.clear();
  for (Past& p : history_) p.run = -1;  // (the runs abandoned: messages of theirs are compared with nothing)
  foreign_run_ = -1;
  start_over_ = false;
}

}  // namespace ddl
