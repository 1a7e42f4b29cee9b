"""In-place recovery after a rank failure (ULFM): the survivors revoke ddl's communicator, shrink it to
themselves, and make a new one on them, planned on the old topology narrowed to who is left (no probe, the
same planner). Collective over the survivors: every one of them gets RankFailure (the failing rank's
neighbours from MPI, the others from the revoke), and each calls this.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from .. import config
from ..core.failures import ranks_in
from ..errors import DDLError


class TooFewRanks(DDLError):
    """Fewer ranks are left than the job's minimum (ddlrun --min-np): it cannot go on in place."""


@dataclass
class Recovered:
    failed: list[int]        # ranks of the old communicator that are gone
    old_size: int
    new_size: int
    seconds: float           # from the start of recovery to the new communicator being ready


def min_ranks(environ=os.environ) -> int:
    return config.get_whole("DDL_ELASTIC_MIN_NP", environ, 1, " of ranks")


def shrink_world(environ=os.environ) -> Recovered:
    """Replaces ddl's world communicator by one on the survivors; returns who failed. Raises DDLError when
    fewer than DDL_ELASTIC_MIN_NP ranks are left (the job cannot go on in place), or when this MPI has no
    fault tolerance."""
    import ddl

    started = time.perf_counter()
    old = ddl.communicator()
    mpi = old.mpi_comm
    if mpi is None or not hasattr(mpi, "Shrink"):
        raise DDLError(f"rank {old.rank}: in-place recovery needs MPI's fault tolerance (ULFM: Open MPI under "
                       f"ddlrun --elastic); this communicator has none")
    old.close()  # what was submitted fails fast on the broken executor; the MPI communicator is kept
    try:
        mpi.Revoke()  # where this rank saw the failure first, the others learn it now
    except Exception:  # already revoked by a peer: that is what we wanted
        pass
    survivors = mpi.Shrink()
    try:
        kept = ranks_in(survivors.Get_group(), mpi)  # each survivor's rank in the old communicator
        failed = sorted(set(range(old.size)) - set(kept))
        floor = min_ranks(environ)
        if survivors.size < floor:
            raise TooFewRanks(f"rank {old.rank}: {len(failed)} rank(s) failed ({', '.join(map(str, failed))}); "
                           f"{survivors.size} left, fewer than the minimum of {floor} (--min-np): the job cannot "
                           f"go on in place")
        ddl._replace_world(old.on_members(survivors, kept))
    finally:
        survivors.Free()
    return Recovered(failed, old.size, len(kept), time.perf_counter() - started)


def say(text: str) -> None:
    print(f"ddl.elastic: {text}", file=sys.stderr, flush=True)
