"""Generators of flat (single-level) schedules. Each takes (rank, nranks, count, ...) and returns that rank's
Program alone, so a rank never builds the world's schedule; ``schedule()`` assembles all ranks for the checker.

Names used below: p ranks; pof2 = the largest power of two <= p; rem = p - pof2. Non-powers of two are
handled by the usual fold: the first 2*rem ranks pair up, each even one hands its data to the odd one above
it (round 0) and gets the result back at the end, so pof2 "active" ranks run the power-of-two algorithm.
"""
from __future__ import annotations

from typing import Callable

from .ir import Collective, Op, Program, Schedule, Step, number_tags, shares


def split(count: int, parts: int) -> list[tuple[int, int]]:
    """(offset, count) of ``parts`` nearly equal pieces of ``count`` elements; the first pieces are never
    smaller than the last, and pieces may be empty when count < parts."""
    bounds = shares(count, parts)
    return [(bounds[i], bounds[i + 1] - bounds[i]) for i in range(parts)]


def _program(rank: int, rounds: int, steps: list[Step], keep_empty: bool = False) -> Program:
    """Empty messages are dropped (both sides drop the same ones), unless they carry something besides data:
    the agreement round's header rides in recursive doubling even when there is no payload."""
    return Program(rank, number_tags([s for s in steps if keep_empty or s.count > 0]), rounds)


# -- allreduce ---------------------------------------------------------------------------------------------


def ring_allreduce(rank: int, p: int, count: int) -> Program:
    """Reduce-scatter then allgather around the ring r -> r+1: 2(p-1) rounds, each moving count/p elements.
    After reduce-scatter round k, rank r holds chunk (r-k-1) reduced over k+2 ranks; after p-1 rounds it owns
    chunk (r+1) fully reduced, which the allgather passes on."""
    chunks = split(count, p)
    right, left = (rank + 1) % p, (rank - 1) % p
    steps = []
    for k in range(p - 1):
        send, recv = chunks[(rank - k) % p], chunks[(rank - k - 1) % p]
        steps += [Step(k, Op.SEND, right, *send), Step(k, Op.RECV_REDUCE, left, *recv)]
    for k in range(p - 1):
        send, recv = chunks[(rank + 1 - k) % p], chunks[(rank - k) % p]
        r = p - 1 + k
        steps += [Step(r, Op.SEND, right, *send), Step(r, Op.RECV_COPY, left, *recv)]
    return _program(rank, 2 * (p - 1), steps)


def _fold(rank: int, p: int) -> tuple[int, int, int]:
    """(pof2, rem, new rank among the pof2 active ranks or -1 for a rank that folded its data away)."""
    pof2 = 1 << (p.bit_length() - 1)
    rem = p - pof2
    if rank < 2 * rem:
        return pof2, rem, rank // 2 if rank % 2 else -1
    return pof2, rem, rank - rem


def _real_rank(new: int, rem: int) -> int:
    return 2 * new + 1 if new < rem else new + rem


def _fold_steps(rank: int, rem: int, count: int, last_round: int) -> list[Step]:
    """Round 0: even ranks below 2*rem hand their data up; round last_round: the result comes back."""
    if rank >= 2 * rem:
        return []
    if rank % 2 == 0:
        return [Step(0, Op.SEND, rank + 1, 0, count), Step(last_round, Op.RECV_COPY, rank + 1, 0, count)]
    return [Step(0, Op.RECV_REDUCE, rank - 1, 0, count), Step(last_round, Op.SEND, rank - 1, 0, count)]


def recursive_doubling_allreduce(rank: int, p: int, count: int, keep_empty: bool = False) -> Program:
    """Latency-optimal for small counts: log2(pof2) rounds, each exchanging the whole vector with the partner
    whose new rank differs in one bit (plus the fold rounds when p is not a power of two)."""
    pof2, rem, new = _fold(rank, p)
    shift = 1 if rem else 0
    levels = pof2.bit_length() - 1
    rounds = levels + 2 * shift
    steps = _fold_steps(rank, rem, count, rounds - 1)
    if new >= 0:
        for i in range(levels):
            peer = _real_rank(new ^ (1 << i), rem)
            steps += [Step(i + shift, Op.SEND, peer, 0, count), Step(i + shift, Op.RECV_REDUCE, peer, 0, count)]
    return _program(rank, rounds, steps, keep_empty)


def _reduce_to_first(mine: list[int], i: int, up: int, count: int) -> list[Step]:
    """Rounds 0..up-1: a binomial tree reduces the whole vector of a host's ranks (``mine``; this rank is
    mine[i]) to its first rank."""
    steps = []
    for k in range(up):
        mask = 1 << k
        if i % (2 * mask) == mask:
            steps.append(Step(k, Op.SEND, mine[i - mask], 0, count))
        elif i % (2 * mask) == 0 and i + mask < len(mine):
            steps.append(Step(k, Op.RECV_REDUCE, mine[i + mask], 0, count))
    return steps


def leader_allreduce(rank: int, hosts: list[list[int]], count: int, keep_empty: bool = False) -> Program:
    """Latency-optimal across hosts with one message per host and round on the links between them: each host's
    ranks (``hosts``: the ranks of each host) reduce to its first rank along a binomial tree, the first ranks run
    recursive doubling, and each hands the result to the others of its host in one round. Flat recursive
    doubling sends every rank's message across those links instead (local-size times as many)."""
    mine = next(h for h in hosts if rank in h)
    i = mine.index(rank)
    up = (max(len(h) for h in hosts) - 1).bit_length()
    steps = _reduce_to_first(mine, i, up, count)
    leaders = [h[0] for h in hosts]
    across = recursive_doubling_allreduce(leaders.index(rank) if i == 0 else 0, len(hosts), count, keep_empty)
    if i == 0:
        steps += [Step(s.round + up, s.op, leaders[s.peer], s.offset, s.count) for s in across.steps]
    down = up + across.rounds
    if i == 0:
        steps += [Step(down, Op.SEND, r, 0, count) for r in mine[1:]]
    else:
        steps.append(Step(down, Op.RECV_COPY, mine[0], 0, count))
    return _program(rank, down + (1 if up else 0), steps, keep_empty)


def leader_allgather(rank: int, hosts: list[list[int]], part: int) -> Program:
    """leader_allreduce's messages (the same peers, rounds and tags, none left out), each carrying the parts
    its sender holds instead of the whole vector: the agreement round of an allgather, where every rank's part
    crosses each link once. Parts lie in host order (``hosts`` flattened: rank r's part is at r's index there,
    ``part`` elements each), so every message moves one contiguous range: a binomial subtree of a host's ranks,
    a recursive-doubling block of hosts, or the whole."""
    starts = [0]
    for h in hosts:
        starts.append(starts[-1] + len(h) * part)
    k = next(j for j, h in enumerate(hosts) if rank in h)
    mine, base = hosts[k], starts[k]
    i = mine.index(rank)
    up = (max(len(h) for h in hosts) - 1).bit_length()

    def ranks(lo: int, hi: int) -> tuple[int, int]:  # this host's ranks [lo, hi) as a range of the buffer
        hi = min(hi, len(mine))
        return base + lo * part, (hi - lo) * part

    steps = []
    for j in range(up):
        mask = 1 << j
        if i % (2 * mask) == mask:
            steps.append(Step(j, Op.SEND, mine[i - mask], *ranks(i, i + mask)))
        elif i % (2 * mask) == 0 and i + mask < len(mine):
            steps.append(Step(j, Op.RECV_COPY, mine[i + mask], *ranks(i + mask, i + 2 * mask)))
    leaders = [h[0] for h in hosts]
    pof2, rem, _ = _fold(0, len(hosts))
    shift = 1 if rem else 0
    levels = pof2.bit_length() - 1
    across = levels + 2 * shift
    whole = (0, starts[-1])
    if i == 0:
        def hosts_of(a: int, b: int) -> tuple[int, int]:  # the hosts of active leaders [a, b), as a range
            lo = 2 * a if a < rem else a + rem
            hi = 2 * b if b <= rem else b + rem
            return starts[lo], starts[hi] - starts[lo]
        li = k
        _, _, new = _fold(li, len(hosts))
        if li < 2 * rem:  # the fold: an even leader hands its host's parts up and gets the whole back
            if li % 2 == 0:
                steps += [Step(up, Op.SEND, leaders[li + 1], base, starts[li + 1] - base),
                          Step(up + across - 1, Op.RECV_COPY, leaders[li + 1], *whole)]
            else:
                steps += [Step(up, Op.RECV_COPY, leaders[li - 1], starts[li - 1], base - starts[li - 1]),
                          Step(up + across - 1, Op.SEND, leaders[li - 1], *whole)]
        if new >= 0:
            for b in range(levels):
                size, peer = 1 << b, new ^ (1 << b)
                ours, theirs = new & ~(size - 1), peer & ~(size - 1)
                real = _real_rank(peer, rem)
                steps += [Step(up + shift + b, Op.SEND, leaders[real], *hosts_of(ours, ours + size)),
                          Step(up + shift + b, Op.RECV_COPY, leaders[real], *hosts_of(theirs, theirs + size))]
    down = up + across
    if i == 0:
        steps += [Step(down, Op.SEND, r, *whole) for r in mine[1:]]
    else:
        steps.append(Step(down, Op.RECV_COPY, mine[0], *whole))
    return _program(rank, down + (1 if up else 0), steps, keep_empty=True)


def scatter_positions(hosts: list[list[int]]) -> list[list[int]]:
    """The hosts at each position of a reduce-scatter's round (leader_reduce_scatter), in order. Its halving
    among the leaders pairs them as the agreement round does, lowest bit first, so the active leader numbered v
    keeps, round after round, the parts at position bit-reversed(v): every half it keeps is then one contiguous
    range. A folded pair of hosts (2j, 2j + 1) is the active leader j, the even host's parts first."""
    pof2, rem, _ = _fold(0, len(hosts))
    levels = pof2.bit_length() - 1
    members = [[2 * v, 2 * v + 1] if v < rem else [v + rem] for v in range(pof2)]
    return [members[v] for v in sorted(range(pof2), key=lambda v: int(f"{v:0{levels}b}"[::-1] or "0", 2))]


def scatter_layout(hosts: list[list[int]], counts: list[int]) -> list[tuple[int, int]]:
    """(offset, count) of each rank's part (``counts``: elements, in rank order) in a reduce-scatter's round:
    hosts as scatter_positions orders them, each host's ranks in its order."""
    layout: list[tuple[int, int]] = [(0, 0)] * len(counts)
    at = 0
    for k in (k for group in scatter_positions(hosts) for k in group):
        for r in hosts[k]:
            layout[r] = (at, counts[r])
            at += counts[r]
    return layout


def leader_reduce_scatter(rank: int, hosts: list[list[int]], counts: list[int]) -> Program:
    """leader_allreduce's messages (the same peers, rounds and tags, none left out) shaped as a reduce-scatter:
    each host's ranks reduce the whole to its first rank, the first ranks halve it between them (each round
    sends the half its partner keeps and reduces the half it keeps), and each hands the others of its host
    their own parts. Slow links carry half, a quarter, ... of the vector instead of all of it every round.
    Parts lie as scatter_layout says (``counts``: every rank's elements, in rank order)."""
    layout = scatter_layout(hosts, counts)
    total = sum(counts)
    whole = (0, total)

    def span(ranks: list[int]) -> tuple[int, int]:  # the parts of these ranks (one host's: contiguous)
        lo = min(layout[r][0] for r in ranks)
        return lo, sum(layout[r][1] for r in ranks)

    k = next(j for j, h in enumerate(hosts) if rank in h)
    mine = hosts[k]
    i = mine.index(rank)
    up = (max(len(h) for h in hosts) - 1).bit_length()
    steps = _reduce_to_first(mine, i, up, total)
    leaders = [h[0] for h in hosts]
    pof2, rem, new = _fold(k, len(hosts))
    shift = 1 if rem else 0
    levels = pof2.bit_length() - 1
    across = levels + 2 * shift
    if i == 0:
        if k < 2 * rem:  # the fold: an even leader hands the whole up and gets its host's parts back
            if k % 2 == 0:
                steps += [Step(up, Op.SEND, leaders[k + 1], *whole),
                          Step(up + across - 1, Op.RECV_COPY, leaders[k + 1], *span(mine))]
            else:
                steps += [Step(up, Op.RECV_REDUCE, leaders[k - 1], *whole),
                          Step(up + across - 1, Op.SEND, leaders[k - 1], *span(hosts[k - 1]))]
        if new >= 0:
            groups = scatter_positions(hosts)
            starts = [0]  # where each position's parts begin
            for g in groups:
                starts.append(starts[-1] + sum(counts[r] for h in g for r in hosts[h]))
            position = next(q for q, g in enumerate(groups) if k in g)
            a, b = 0, pof2
            for bit in range(levels):
                mid = (a + b) // 2
                keep, give = ((a, mid), (mid, b)) if position < mid else ((mid, b), (a, mid))
                peer = leaders[_real_rank(new ^ (1 << bit), rem)]
                rnd = up + shift + bit
                steps += [Step(rnd, Op.SEND, peer, starts[give[0]], starts[give[1]] - starts[give[0]]),
                          Step(rnd, Op.RECV_REDUCE, peer, starts[keep[0]], starts[keep[1]] - starts[keep[0]])]
                a, b = keep
    down = up + across
    if i == 0:
        steps += [Step(down, Op.SEND, r, *layout[r]) for r in mine[1:]]
    else:
        steps.append(Step(down, Op.RECV_COPY, mine[0], *layout[rank]))
    return _program(rank, down + (1 if up else 0), steps, keep_empty=True)


def rabenseifner_allreduce(rank: int, p: int, count: int) -> Program:
    """Recursive halving reduce-scatter, then recursive doubling allgather (Rabenseifner): 2*log2(pof2) rounds
    moving 2(pof2-1)/pof2 of the vector per active rank; the fold adds two rounds moving the whole vector."""
    pof2, rem, new = _fold(rank, p)
    shift = 1 if rem else 0
    levels = pof2.bit_length() - 1
    rounds = 2 * levels + 2 * shift
    steps = _fold_steps(rank, rem, count, rounds - 1)
    if new >= 0:
        chunks = split(count, pof2)
        for rnd, op, peer, lo, hi in halving_doubling(new, pof2, shift, levels + shift):
            start, end = chunks[lo][0], chunks[hi - 1][0] + chunks[hi - 1][1]
            steps.append(Step(rnd, op, _real_rank(peer, rem), start, end - start))
    return _program(rank, rounds, steps)


def halving_doubling(i: int, g: int, rs0: int, ag0: int):
    """Recursive halving among g ranks (a power of two), the top bit first picking the half kept, so rank i
    ends owning chunk i of g; then the mirror recursive doubling, lowest bit first. Yields (round, op, peer,
    first chunk, end chunk) with reduce-scatter rounds from rs0 and allgather rounds from ag0."""
    a, b = 0, g
    levels = g.bit_length() - 1
    for k in range(levels):
        mask = g >> (k + 1)
        mid = (a + b) // 2
        keep, give = ((a, mid), (mid, b)) if i & mask == 0 else ((mid, b), (a, mid))
        yield rs0 + k, Op.SEND, i ^ mask, *give
        yield rs0 + k, Op.RECV_REDUCE, i ^ mask, *keep
        a, b = keep
    for k in range(levels):
        mask = 1 << k
        w = b - a
        other = (a - w, a) if i & mask else (b, b + w)
        yield ag0 + k, Op.SEND, i ^ mask, a, b
        yield ag0 + k, Op.RECV_COPY, i ^ mask, *other
        a, b = min(a, other[0]), max(b, other[1])


ALLREDUCE: dict[str, Callable[[int, int, int], Program]] = {
    "ring": ring_allreduce,
    "rabenseifner": rabenseifner_allreduce,
    "recursive_doubling": recursive_doubling_allreduce,
}


# -- broadcast and allgather --------------------------------------------------------------------------------


def binomial_broadcast(rank: int, p: int, count: int, root: int) -> Program:
    """Binomial tree from root: in round i every rank that has the data sends it 2**i ranks further on."""
    return binomial_tree(rank, (rank - root) % p, p, count, lambda v: (v + root) % p)


def binomial_tree(rank: int, vr: int, p: int, count: int, real: Callable[[int], int]) -> Program:
    """A binomial broadcast over ranks renumbered so the root is 0: ``vr`` is this rank's number, ``real(v)``
    the rank numbered v. In round i every rank numbered below 2**i sends to the one 2**i further on."""
    rounds = (p - 1).bit_length()
    steps = []
    for i in range(rounds):
        mask = 1 << i
        if vr < mask and vr + mask < p:
            steps.append(Step(i, Op.SEND, real(vr + mask), 0, count))
        elif mask <= vr < 2 * mask:
            steps.append(Step(i, Op.RECV_COPY, real(vr - mask), 0, count))
    return _program(rank, rounds, steps)


def ring_allgather(rank: int, p: int, layout: tuple[tuple[int, int], ...]) -> Program:
    """Rank r's piece is layout[r] = (offset, count) of the output; in round k rank r forwards piece r-k to
    its right neighbour and receives piece r-k-1 from its left: p-1 rounds."""
    right, left = (rank + 1) % p, (rank - 1) % p
    steps = []
    for k in range(p - 1):
        steps += [Step(k, Op.SEND, right, *layout[(rank - k) % p]),
                  Step(k, Op.RECV_COPY, left, *layout[(rank - k - 1) % p])]
    return _program(rank, p - 1, steps)


def schedule(collective: Collective, algorithm: str, p: int, count: int, root: int = 0,
             layout: tuple[tuple[int, int], ...] = ()) -> Schedule:
    """Every rank's program, for the checker, the tests and dumps (ranks compile their own at run time)."""
    if collective is Collective.ALLREDUCE:
        gen = ALLREDUCE[algorithm]
        programs = tuple(gen(r, p, count) for r in range(p))
    elif collective is Collective.BROADCAST:
        programs = tuple(binomial_broadcast(r, p, count, root) for r in range(p))
    else:
        programs = tuple(ring_allgather(r, p, layout) for r in range(p))
    return Schedule(collective, algorithm, p, count, programs, root, layout)
