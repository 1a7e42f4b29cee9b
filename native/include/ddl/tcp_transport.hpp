// Transport over TCP sockets of its own, one connection per peer (gloo's way across hosts; a Unix socket to a
// peer on this host where it can: the same stream, without TCP/IP in the kernel, its bytes through a SharedPipe
// where connect() is given the pipes' size: no system call per message, the socket only waking a rank that sleeps). Why not MPI's TCP:
// MPI progresses only while polled, so a run either spins a core or sleeps blind; here a rank that waits
// blocks in epoll and the kernel wakes it when bytes arrive or room frees up, and large messages go out and
// come in with few, large system calls straight from and into the caller's buffers.
//
// Messages are [tag int64 | bytes int64 | data]. Order per (peer, tag) is MPI's: a message matches the oldest
// receive posted for it; one that arrives first waits in a buffer of its own until one is posted. A receive may
// be posted larger than the message (the executor's header mode does), never smaller.
//
// Runs checked on receipt (Transport::begin_run): the tag on the wire is [run 20 bits | check 20 | tag 24], so a
// message is only read by the run, and the call, that sent it; one of an earlier run is dropped. Every rank
// remembers its last runs' calls (hash and text). Ranks that called differently find out three ways; a quick
// run of calls that agree sends none of their messages:
//  - a message of this run (or of one this rank finished) whose check is not this rank's call's: this rank
//    sends the sender its notice (its call's hash and text) for that run (and, without an answer within
//    kForeignWait, raises naming its own call alone: the sender may have stopped calling ddl);
//  - a run still waiting kAskAfter after it began sends its notice to every rank (a rank whose call has no
//    message for this one, or which waits for one that never comes);
//  - every kRunAhead-th checked run sends its notice to the next rank and ends only once the previous rank's
//    has come: a rank runs at most that many calls ahead of the rank before it (a broadcast's root would
//    otherwise never wait for anyone), so where calls differ it raises within that many.
// A rank that gets a notice compares it with its own call of that run (now, or when it begins that run); the
// one that finds a difference (or a notice in a run that has none, which an agreement round began) tells every
// rank (an abort), and each raises CallMismatch in that run, or, having finished it (a broadcast's rank may),
// in the run it is in or at its next. Of two calls whose plans differ, one waits for a message the other does
// not send, or gets one it did not expect (each plan reaches every rank), so one of the first two ways always
// fires. Then they start over: each one's next run first tells every rank its last run number (and whether it
// raised in that run or finished it) and takes the largest, so that a run one rank had begun and the others never
// will is read by nobody. A rank behind, in a run or about to begin one that every rank that started over had
// finished, finishes it first (they raised in a later call, where it starts over too).
//
// Waiting (idle): a run nobody waits for (rest > 0) blocks in epoll up to 1 ms, or rest where longer; a run its
// caller waits for (rest 0) polls for a window after a small message (64 KiB at most) last finished going out or
// coming in, then blocks the same way (400 us at first; doubled, to 3.2 ms, after a block that turned out
// premature, back to 400 us after a long wait: next_spin_window); a run of 8 MiB or more blocks at once. While
// blocks wait on their hooks (the GPU's staging), never longer than rest.
//
// Set-up is two-step, so that Python decides where to connect: the constructor listens; connect() gets every
// peer's candidate addresses (already chosen: loopback for a peer on this host) and port, and the job's nonce
// that both sides of a connection check.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ddl/shared_pipe.hpp"
#include "ddl/transport.hpp"

namespace ddl {

class TcpTransport final : public Transport {
 public:
  // Listens on bind_address (empty: every interface), a port the kernel picks.
  TcpTransport(int rank, int size, const std::string& bind_address, bool yield_when_idle);
  ~TcpTransport() override;
  // One in this many checked runs waits for the previous rank's notice (see above). Each such run waits for the
  // tree's last rank to catch up (a root otherwise runs ahead): on the emulated T1 an 8 B broadcast took 63-77 us
  // a call at 16 against 45-77 at 128 and 51-59 at 256 (medians of jobs alternating the builds).
  static constexpr int kRunAhead = 128;
  int port() const { return port_; }
  int unix_peers() const { return unix_peers_; }  // peers connected over a Unix socket (ranks of this host)
  int shared_peers() const { return static_cast<int>(piped_.size()); }  // ... of which talk through a SharedPipe
  // Waits of runs a caller waited for that polled on instead of blocking (see Waiting; what the tests can check).
  int64_t spins() const { return spins_; }
  // How long a waiting caller polls before it blocks now, in microseconds (it adapts: finished_small).
  int64_t spin_window_us() const {
    return std::chrono::duration_cast<std::chrono::microseconds>(spin_window_).count();
  }
  // The window after a stretch of waiting that spun `spun` (from the last small message) and then blocked for
  // `blocked` until the next: doubled where the block was premature, back to the first where the wait was long.
  static Clock::duration next_spin_window(Clock::duration window, Clock::duration spun, Clock::duration blocked);
  // Connects to every peer: lower ranks are dialed, higher ranks accepted. addresses[p]: peer p's candidate
  // addresses, tried in order ("unix": its Unix socket, for a peer on this host); ports[p] its TCP port (which
  // also names its Unix socket). pipe_bytes > 0: a peer reached over its Unix socket is read and written through
  // a SharedPipe of that many bytes each way, which the dialing side makes (0: the socket alone). Throws
  // TransportError naming the peer after timeout_s.
  void connect(const std::vector<std::vector<std::string>>& addresses, const std::vector<int>& ports,
               uint64_t nonce, double timeout_s, size_t pipe_bytes = 0);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int max_tag() const override { return (1 << 24) - 3; }  // (the top two tags: notices, aborts)
  std::string name() const override { return "tcp"; }
  Handle isend(const void* data, size_t nbytes, int peer, int tag) override;
  Handle irecv(void* data, size_t nbytes, int peer, int tag) override;
  void poll() override;
  bool test(Handle h) override;
  void idle(Clock::duration rest, bool messages_only) override;
  void abandon() override;
  void begin_run(int64_t check, const std::string& label, double timeout_s, int64_t bytes) override;
  bool settled() override;
  const std::string& mismatch() const override { return mismatch_; }
  void end_run() override { in_run_ = false; }
  void abandon_run() override;

  // This machine's IPv4 addresses, interface by interface (loopback excluded): (interface, address).
  static std::vector<std::pair<std::string, std::string>> local_addresses();

 private:
  struct Op {
    bool done = false;
    bool socket = false;  // a caller's receive or send on a socket (socket_waits_), not yet tested done
    std::string error;
  };
  struct Send {
    Handle h;  // -1: nobody waits for it (a notice, an abort, a send of an abandoned run; -2 in abandon_run)
    const char* data;
    size_t nbytes;
    size_t sent = 0;  // of header and data together
    int64_t header[2];
    std::vector<char> own;  // the data, where the transport keeps its own copy
  };
  struct Recv {
    Handle h;
    char* data;
    size_t capacity;
    int64_t tag;
  };
  struct Arrived {  // a message no receive was posted for yet
    int64_t tag;
    std::vector<char> data;
    int64_t run;  // run_of(tag) as it came
  };
  struct Peer {
    int fd = -1;
    std::deque<Send> sends;
    bool want_write = false;       // EPOLLOUT registered: the socket was full
    std::deque<Recv> posted;       // receives in post order
    std::deque<Arrived> arrived;   // unexpected messages in arrival order
    bool arrived_in_order = true;  // ... which is run order (a peer's are, but for a notice it answers late;
                                   // kept by stash)
    // the message coming in now
    int64_t header[2] = {0, 0};
    size_t header_got = 0;
    bool in_body = false;
    char* into = nullptr;          // where its data goes: a posted receive's buffer or `unexpected`
    size_t body = 0, body_got = 0;
    Handle target = -1;            // the posted receive it completes (-1: unexpected)
    std::vector<char> unexpected;
    bool closed = false;
    std::unique_ptr<SharedPipe> pipe;  // a peer of this host: its bytes go through here, the socket wakes
    // A socket's bytes read ahead (take): one recv brings a small message's header, body and what follows;
    // bodies of kInboxBytes or more go straight into place. dry: a recv of this drain came back short, so the
    // socket was empty then (no recv just to hear EAGAIN; level-triggered epoll reports what came since).
    std::vector<char> inbox;
    size_t inbox_at = 0, inbox_end = 0;
    bool dry = false;
  };

  Handle take_slot();
  void finish(Handle h, std::string error = {});
  void flush(int p);
  void drain(int p);
  ssize_t take(Peer& peer, char* into, size_t n);  // recv's answer, from the socket or the shared pipe
  void woken(int p);  // a shared pipe's socket has bytes (wake-ups) or closed
  static std::unique_ptr<SharedPipe> shared_pipe(int fd, bool dialer, const std::string& me);
  std::deque<Recv>::iterator posted_for(Peer& peer, int64_t tag);  // the oldest receive posted for tag
  Handle send_wire(const void* data, size_t nbytes, int peer, int64_t wire, std::vector<char> own = {});
  Handle recv_wire(void* data, size_t nbytes, int peer, int64_t wire);
  int64_t wire(int64_t run, int64_t check, int64_t tag) const;
  int64_t run_of(int64_t wire) const;  // the run a message belongs to (its 24 bits, near this rank's)
  bool keep(int p, int64_t wire, const std::vector<char>& data);  // an unexpected message: kept, or dropped
  // ranks called differently in `run` (this one, or one this rank finished): raise here, tell every rank
  void differs(int p, const std::string& theirs, int64_t run);
  struct Past {  // a run this rank began since the ranks last started over
    int64_t run = -1, check = 0;
    std::string label;
  };
  const Past* past(int64_t run) const;       // nullptr: not begun, or too long ago, or before starting over
  void send_notice(int p, int64_t run);      // this rank's call of `run`, to rank p
  void compare(int p, int64_t run, const std::vector<char>& notice);  // rank p's call of `run` against this one's
  void foreign(int p, int64_t run);          // p sent a message of another call in `run`: tell p this rank's
  void start_over(double timeout_s);  // after a mismatch, with every rank: a first run number above all used
  void announce_over();  // tells every rank that this one starts over (once per epoch)
  // whether a rank that started over after `said` (its last run, kRaisedIn where it raised in that one) leaves
  // `run` unfinished: the ranks still in it, or about to begin it, start over instead
  static bool unfinished(int64_t said, int64_t run);
  void tell_others(int64_t wire, const std::vector<char>& what);  // a message of the transport's own, to each peer
  void drop_runs_up_to(int64_t last);  // unexpected messages of runs up to `last`: read by none
  void stash(Peer& peer, int64_t tag, std::vector<char> data);  // an unexpected message, kept (arrived)
  bool begin_body(int p);
  void end_body(int p);
  void wait_events(Clock::duration timeout);  // zero: poll once without waiting
  void look_at_pipes();                        // shared pipes have no events: drained, flushed each poll
  void mark_socket_wait(Handle h, int peer);   // h (not done yet) waits on a socket: socket_waits_
  void lost(int p, const std::string& why, bool surely = false);
  void watch(int p, bool write);

  int rank_, size_;
  bool yield_when_idle_;
  int listen_fd_ = -1, unix_fd_ = -1, epoll_fd_ = -1, port_ = 0, unix_peers_ = 0;
  std::vector<Peer> peers_;
  std::vector<int> piped_;  // peers over a SharedPipe
  std::vector<Op> slots_;
  std::vector<Handle> free_;
  Clock::time_point last_moved_ = Clock::now();  // when bytes last went out or came in
  Clock::time_point last_finished_ = Clock::now();  // when a small message last finished going out or coming in
  Clock::time_point last_socket_poll_ = Clock::now();  // when epoll last looked at the sockets
  std::vector<std::vector<char>> spare_;  // buffers of unexpected messages, for the next (kSpares)
  bool small_finished_ = false;  // a small message came in since the clock was last read (Moved)
  // Bytes moved in one drain or flush: the clock is read once at its end (last_moved_, and last_finished_
  // where a small message finished), not per piece: a rank behind reads tens of messages from a pipe at once.
  struct Moved {
    TcpTransport& t;
    bool any = false, small = false;
    explicit Moved(TcpTransport& owner) : t(owner) {}
    ~Moved() {
      if (!any) return;
      const auto now = Clock::now();
      t.last_moved_ = now;
      if (small || t.small_finished_) t.finished_small(now);
    }
  };
  void finished_small(Clock::time_point now);  // a small message finished: last_finished_, the spin's length
  // How long a waiting caller's run polls after a small message before it blocks: kSpinBeforeBlocking, doubled
  // (to kSpinAtMost) each time a block turns out premature, back where a wait outlasts that (finished_small).
  Clock::duration spin_window_{};  // (set by the constructor)
  Clock::time_point blocked_since_{};  // when this stretch of waiting began to block (none: not blocked)
  int64_t socket_waits_ = 0;  // the caller's receives and sends on sockets not yet tested done (this run's)
  // runs checked on receipt
  int64_t run_ = 0, check_ = 0;  // this rank's latest run and its check (0: none)
  int64_t run_bytes_ = 0;          // ... and its buffer's size
  int64_t spins_ = 0;
  bool in_run_ = false, settled_ = true;
  double timeout_s_ = 60.0;        // the latest run's deadline (DDL_TIMEOUT)
  std::string mismatch_;
  Handle notice_ = -1;             // the previous rank's notice, this run's (every kRunAhead-th run)
  std::vector<char> notice_in_;
  std::vector<Past> history_;      // by run, modulo its size
  Clock::time_point run_began_;
  bool asked_all_ = false;         // this run waited long enough to send every rank its notice
  std::vector<char> told_peer_;    // ranks that have this run's notice from this rank
  int64_t foreign_run_ = -1;       // a run in which a message of another call came (-1: none waited on)
  int foreign_peer_ = -1;          // ... from this rank
  Clock::time_point foreign_since_;
  std::map<int64_t, std::string> aborts_;  // runs that others raised for, not yet raised for here
  std::set<int64_t> raised_;               // runs raised for here (a second abort of one is ignored)
  bool start_over_ = false;                // this rank raised in a run: its next starts over
  std::string told_;                       // what differed, as the ranks tell each other (since starting over)
  int64_t epoch_ = 0, announced_ = 0;      // times the ranks started over; the epoch this rank last announced
  int64_t dead_upto_ = 0;                  // runs up to this one were abandoned when the ranks last started over
  bool stale_ = false;                     // a run was abandoned: its messages may wait unread (drop_runs_up_to)
  std::map<std::pair<int64_t, int>, int64_t> over_;  // (epoch, rank) -> that rank's last run, as it started over
                                                      // (with kRaisedIn where it raised in that run)
};

}  // namespace ddl
