"""Who never arrived: after a collective passes its deadline, each rank that reached it tells every other one
so, over a communicator kept for this alone, and listens for a short while for the others' word. The ranks no
word came from never reached the call (they are elsewhere: computing, stuck, in another collective); the
deadline error names them. The executor alone can only name the peer it waited on, which may itself be waiting
on the rank behind (recursive doubling chains such waits); the flight recorder's files tell the same story
afterwards (ddl-trace), this tells it in the error.

A word is the call's name and its run's number on the communicator (the same on every rank), so a word left
over from an earlier deadline is not mistaken for this one's. Sends are small and never waited on: a rank
that never arrives never receives them, and its absence must not hold anyone up.
"""
from __future__ import annotations

import time

TAG = 17
_unfinished: list = []  # send requests nobody received (an absent rank's): kept so their buffers live on


def window(timeout: float) -> float:
    """How long to listen: ranks reach their deadline within moments of each other (each one counts from its
    last progress, and the waits chain), so two seconds, or the deadline itself where it is shorter."""
    return max(0.05, min(2.0, timeout))


def absent(comm, rank: int, size: int, word: str, seconds: float) -> list[int]:
    """The ranks of ``comm`` (an mpi4py communicator of its own) from which no ``word`` came within
    ``seconds``, while this rank sent its own to everyone."""
    from mpi4py import MPI

    data = word.encode()
    _unfinished[:] = [r for r in _unfinished if not r.Test()]
    _unfinished.extend(comm.Isend([data, MPI.BYTE], dest=r, tag=TAG) for r in range(size) if r != rank)
    heard = {rank}
    status = MPI.Status()
    deadline = time.monotonic() + seconds
    while len(heard) < size and time.monotonic() < deadline:
        if comm.Iprobe(MPI.ANY_SOURCE, TAG, status):
            got = bytearray(status.Get_count(MPI.BYTE))
            comm.Recv([got, MPI.BYTE], status.Get_source(), TAG)
            if got.decode(errors="replace") == word:
                heard.add(status.Get_source())
        else:
            time.sleep(0.002)
    return sorted(set(range(size)) - heard)


def said(missing: list[int], size: int, hosts: list[str] | None, seconds: float) -> str:
    """The sentence the deadline error gains."""
    if not missing:
        return f"; every rank reached this call (each said so within {seconds:g} s): none is missing"
    names = ", ".join(f"{r} ({hosts[r]})" if hosts and r < len(hosts) else str(r) for r in missing)
    return (f"; rank{'s' if len(missing) > 1 else ''} {names} never reached this call (no word within "
            f"{seconds:g} s of this rank's deadline, while {size - len(missing)} of {size} said they were in it)")
