"""ddl's own TCP connections, for communicators that span several hosts (native TcpTransport).

Why: MPI moves bytes only while polled, so a collective that waits beside training either spins a core or
sleeps blind between polls; over its own sockets a waiting rank blocks in epoll until bytes arrive or room
frees up, and large messages leave and land in few system calls, straight from and into ddl's buffers (on the
emulated T1, a 26 MB allreduce cost the 8 ranks 0.62-0.68 CPU-seconds over MPI's TCP). One connection per pair
of ranks, a Unix socket between ranks of one host (loopback TCP where that fails: on the emulated T1 a small
call's sendmsg, with the receiving side's TCP the kernel runs in it, was 31 % of a rank's CPU), and through
shared memory over it (native SharedPipe: the Unix socket only wakes a rank that sleeps, and tells when a peer
leaves; an 8 B broadcast's receive over the socket cost a rank 8-14 us of system time on the emulated T1); set up
once, through the MPI communicator.

DDL_TRANSPORT: ``auto`` (ddl's TCP where the ranks span several hosts, up to MAX_RANKS of them, and the job is
not elastic: ULFM's failure notices travel through MPI), ``mpi`` (always MPI), ``tcp`` (ddl's TCP wherever there
are several ranks). DDL_TCP_IFACE: the interface whose address the ranks connect to (default: every address a
rank has but loopback and the ones its peer has too, in the order the system lists them). DDL_TCP_UNIX=0: ranks
of one host over loopback TCP; DDL_TCP_SHM=0: over their Unix socket alone (no shared memory).
"""
from __future__ import annotations

import os
import secrets

from .. import _native, config
from ..errors import DDLError

MODES = ("auto", "mpi", "tcp")
MAX_RANKS = 256  # a connection per pair: 255 sockets a rank; larger jobs stay on MPI (lazy connections: not built)
LOOPBACK = "127.0.0.1"
# A shared pipe's bytes each way: what a rank's pipes to the other ranks of its host may hold in all, split
# between them, within [PIPE_BYTES_MIN, PIPE_BYTES_MAX] each (a message larger streams through in pieces).
PIPES_BYTES, PIPE_BYTES_MIN, PIPE_BYTES_MAX = 8 << 20, 64 << 10, 1 << 20
UNIX = "unix"  # a candidate address: the peer's Unix socket (named after its TCP port), on this host


def mode(environ=os.environ) -> str:
    value = (config.get("DDL_TRANSPORT", environ) or "auto").strip().lower()
    if value not in MODES:
        raise DDLError(f"DDL_TRANSPORT={value!r}: expected one of {', '.join(MODES)}")
    return value


def wanted(size: int, hosts: list[str] | None, environ=os.environ) -> bool:
    """Whether a communicator of ``size`` ranks on ``hosts`` (each rank's, in rank order) runs over ddl's TCP."""
    chosen = mode(environ)
    if size < 2 or chosen == "mpi":
        return False
    if chosen == "tcp":
        return True
    return len(set(hosts or ())) > 1 and size <= MAX_RANKS and environ.get("DDL_ELASTIC") != "1"


def candidates(me: int, hosts: list[str], published: list[list[tuple[str, str]]], iface: str | None,
               unix: bool = True) -> list[list[str]]:
    """Each rank's addresses as rank ``me`` should try them: its Unix socket, then loopback, on its own host
    (``DDL_TCP_UNIX=0``: loopback alone); otherwise the addresses of
    ``iface`` if given, else every address the peer published but those ``me`` has too (a docker bridge's
    172.17.0.1 is on every host and leads back to oneself)."""
    mine = {address for _, address in published[me]}
    out = []
    for peer, theirs in enumerate(published):
        if peer == me or hosts[peer] == hosts[me]:
            out.append([UNIX, LOOPBACK] if unix else [LOOPBACK])
            continue
        if iface:
            chosen = [address for name, address in theirs if name == iface]
            if not chosen:
                raise DDLError(f"rank {me}: DDL_TCP_IFACE={iface}: rank {peer} (host {hosts[peer]}) has no IPv4 "
                               f"address on it (it has {', '.join(f'{n} {a}' for n, a in theirs) or 'none'})")
        else:
            chosen = [address for _, address in theirs if address not in mine] or [a for _, a in theirs]
        if not chosen:
            raise DDLError(f"rank {me}: rank {peer} on host {hosts[peer]} has no IPv4 address to connect to")
        out.append(chosen)
    return out


def pipe_bytes(me: int, hosts: list[str], environ=os.environ) -> int:
    """Bytes each way of the shared pipe to each other rank of ``me``'s host (0: none, DDL_TCP_SHM=0)."""
    if config.get("DDL_TCP_SHM", environ) == "0":
        return 0
    neighbours = sum(1 for h in hosts if h == hosts[me]) - 1
    return max(PIPE_BYTES_MIN, min(PIPE_BYTES_MAX, PIPES_BYTES // max(1, neighbours)))


def executor(mpi_comm, hosts: list[str], timeout: float, yield_when_idle: bool):
    """An executor over ddl's TCP, connected to every rank of ``mpi_comm`` (collective over it)."""
    me = mpi_comm.rank
    transport, failed = None, None
    try:
        transport = _native.TcpTransport(me, mpi_comm.size, "", yield_when_idle)
        mine = (_native.TcpTransport.local_addresses(), transport.port)
    except DDLError as e:  # (told to every rank below: none waits for a rank that cannot listen)
        mine, failed = None, str(e)
    published = mpi_comm.allgather(mine)
    nonce = mpi_comm.bcast(secrets.randbits(63) if me == 0 else None)
    if transport is not None and all(p is not None for p in published):
        try:
            addresses = candidates(me, hosts, [p[0] for p in published], config.get("DDL_TCP_IFACE") or None,
                                   config.get("DDL_TCP_UNIX") != "0")
            # (pipes go with Unix sockets alone: DDL_TCP_UNIX=0 makes none)
            transport.connect(addresses, [p[1] for p in published], nonce, min(timeout, 60.0),
                              pipe_bytes(me, hosts))
        except DDLError as e:
            failed = str(e)
    # every rank learns whether every rank connected: none goes on with a transport another rank lacks
    failures = [f for f in mpi_comm.allgather(failed) if f]
    if failures or any(p is None for p in published):
        why = failures[0] if failures else "a rank could not listen"
        raise DDLError(f"rank {me}: ddl's TCP connections failed ({why}); DDL_TRANSPORT=mpi runs over MPI instead")
    return _native.Executor.tcp(transport)
