"""An alltoall as a schedule: the pairwise exchange.

The buffer is this rank's input followed by its output. In round k (k = 1 .. p-1) rank r sends its rows for
rank r + k and receives rank r - k's rows for it (mod p), so every pair meets once, each rank sends and
receives one message per round, and no link carries a byte that is not its destination's. A rank's own rows
never leave it (the caller copies them). Ranges differ between the two sides of a message (the sender's in
its input, the receiver's in its output); lengths agree because every rank knows what each sends it.
"""
from __future__ import annotations

from .ir import Op, Program, Step, number_tags


def pairwise_exchange(rank: int, send: list[tuple[int, int]], recv: list[tuple[int, int]]) -> Program:
    """Rank ``rank``'s program. ``send[j]`` / ``recv[j]``: (offset, count) in the buffer of what goes to / comes
    from rank j; empty ranges make no message."""
    p = len(send)
    steps = []
    for k in range(1, p):
        to, frm = (rank + k) % p, (rank - k) % p
        if send[to][1]:
            steps.append(Step(k - 1, Op.SEND, to, send[to][0], send[to][1]))
        if recv[frm][1]:
            steps.append(Step(k - 1, Op.RECV_COPY, frm, recv[frm][0], recv[frm][1]))
    return Program(rank, number_tags(steps), max(p - 1, 0))
