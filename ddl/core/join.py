"""Join: a rank with no more data serves the others' allreduces with zeros until every rank has joined (uneven
data across ranks, as Horovod's ``hvd.join`` and torch's ``Join`` context).

No new protocol: the joined rank sits in an agreement round whose call is ``join()``; an allreduce beside it
mismatches on every rank, and the mismatch report says what each rank called. The ranks whose call was that
allreduce retry it; the joined ranks read its shape, dtype and op from the report and take part with zeros.
An Average still divides by every rank. Any other collective beside join fails as a mismatch on its ranks.
"""
from __future__ import annotations

import re

import numpy as np

from ..errors import MismatchError

JOIN_CALL = "join()"
# The text Communicator gives an allreduce call (its _signature): what a joined rank must take part in.
_ALLREDUCE_CALL = re.compile(r"allreduce\(shape=\(([\d, ]*)\), dtype=(\w+), op=(\w+)\)")


def beside_joined(error: MismatchError, rank: int, size: int) -> bool:
    """Whether ``error`` came only from ranks that joined: this rank's call should run again, with them."""
    calls = error.calls or []
    if len(calls) != size:
        return False
    mine = calls[rank]
    return mine != JOIN_CALL and JOIN_CALL in calls and all(c in (JOIN_CALL, mine) for c in calls)


def wait_for_all(comm, call: str, beside) -> None:
    """Agreement rounds of ``call`` (after the submitted collectives) until every rank of ``comm`` makes it.
    Each time the others called something else, the round mismatches on every rank (theirs raise there) and
    ``beside(calls)`` hears what each rank called: it may take part in the others' call; False stops the wait,
    raising the mismatch here too."""
    comm.drain()
    while True:
        try:
            comm.agree(call)
            return
        except MismatchError as e:
            if not beside(e.calls or []):
                raise


def serve_until_all_joined(comm) -> None:
    """Runs on a joined rank: agreement rounds of ``join()`` until every rank calls it, joining each allreduce
    the others make meanwhile with zeros."""
    def serve(calls: list[str]) -> bool:
        others = {c for c in calls if c != JOIN_CALL}
        call = _ALLREDUCE_CALL.fullmatch(others.pop()) if len(others) == 1 else None
        if call is not None:  # (otherwise the others raised; they come back with their next call)
            shape = tuple(int(n) for n in call.group(1).replace(" ", "").split(",") if n)
            comm.allreduce(np.zeros(shape, np.dtype(call.group(2))), call.group(3))
        return True

    wait_for_all(comm, JOIN_CALL, serve)
