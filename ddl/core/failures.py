"""A failed collective, said for people: which ranks died and on which hosts, which ranks never reached the
call (ddl.core.rollcall), and the flight recorder written. Used by the communicator's ``execute`` and by the
host memory level's calls, whichever path failed."""
from __future__ import annotations

import sys
import time

from ..errors import RankFailure, TransportError
from . import flight, rollcall

KEPT_AFTER_FAILURE: list = []  # MPI communicators of failed calls (see Communicator.close), requests left pending


def is_deadline(e: BaseException) -> bool:
    """The executor's "made no progress for N s (DDL_TIMEOUT)" (native/src/executor.cpp, fail())."""
    return isinstance(e, TransportError) and not isinstance(e, RankFailure) and "(DDL_TIMEOUT)" in str(e)


def name_failure(comm, e: RankFailure, label: str, plan) -> RankFailure:
    """The native failure, said for people: which ranks died, on which hosts, in which call. A rank that saw
    only the revoke asks MPI who failed for up to a second (the runtime's notice is on its way)."""
    ranks = list(e.ranks)
    deadline = time.monotonic() + 1.0
    mpi = comm.mpi_comm
    while not ranks and mpi is not None and hasattr(mpi, "Get_failed") and time.monotonic() < deadline:
        ranks = failed_ranks(mpi)
        if not ranks:  # the notice arrives through MPI's progress engine: turn it (measured: 10-35 ms)
            from mpi4py import MPI

            MPI.COMM_SELF.Iprobe()
            time.sleep(0.005)
    e = RankFailure(str(e), ranks)
    if e.ranks:
        hosts = comm.hosts or []
        dead = ", ".join(f"{r} ({hosts[r]})" if r < len(hosts) else str(r) for r in e.ranks)
        who = f"rank{'s' if len(e.ranks) > 1 else ''} {dead} failed"
    else:
        who = "a rank failed (a peer revoked the communicator; which one is not known here yet)"
    step = "its agreement round" if plan.phases and plan.phases[0][0] < 0 else f"its {plan.algorithm} plan"
    return RankFailure(f"rank {comm.rank}: {who} during {label} ({step}); MPI said: {e}", e.ranks)


def name_absent(comm, roll, e: TransportError, label: str, seq: int) -> TransportError:
    """A deadline's error, with the ranks that never reached the call (ddl.core.rollcall, on ``roll``)."""
    if roll is None:
        return e
    seconds = rollcall.window(comm.options.timeout)
    try:
        missing = rollcall.absent(roll, comm.rank, comm.size, f"{seq} {label}", seconds)
    except Exception as why:  # the deadline's own error matters more
        return type(e)(f"{e}; (no roll call: {why})")
    return type(e)(f"{e}{rollcall.said(missing, comm.size, comm.hosts, seconds)}")


def write_flight_recorder(rank: int, error: BaseException, verbose: bool) -> None:
    try:
        written = flight.dump(f"rank {rank}: {error}")
    except OSError as e:  # the collective's own error matters more: say why there is no file, go on
        print(f"ddl: rank {rank}: cannot write the flight recorder: {e}", file=sys.stderr, flush=True)
        return
    if written is not None and verbose:
        print(f"ddl: rank {rank}: flight recorder written to {written}", file=sys.stderr, flush=True)


def ranks_in(group, comm) -> list[int]:
    """The rank in ``comm`` of each member of ``group`` (an mpi4py Group, freed here), in the group's order;
    members not in ``comm`` are left out."""
    everyone = comm.Get_group()
    try:
        ranks = type(group).Translate_ranks(group, list(range(group.size)), everyone)
    finally:
        everyone.Free()
        group.Free()
    return [r for r in ranks if r >= 0]


def world_ranks(mpi_comm) -> list[int] | None:
    """The MPI_COMM_WORLD rank of each rank of ``mpi_comm`` (None without one)."""
    if mpi_comm is None:
        return None
    from mpi4py import MPI

    return ranks_in(mpi_comm.Get_group(), MPI.COMM_WORLD)


def failed_ranks(mpi_comm) -> list[int]:
    """The ranks of ``mpi_comm`` its MPI knows to have failed (ULFM's MPI_Comm_get_failed)."""
    return sorted(ranks_in(mpi_comm.Get_failed(), mpi_comm))
