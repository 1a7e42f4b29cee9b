"""Which flows each probe round runs, and what a probe costs as hosts grow.

Units are lists of host indices (a host alone at the first stage, a group of hosts later), in host order. A
pattern pairs units by reflection: with centre ``c``, unit ``u`` with unit ``c - u``, member ``m`` of one with
member ``m`` of the other, for the members both have; the survey runs each direction in a round of its own.
Every host then sends or receives one flow, so a NIC is never what slows a round; and the pairs of one round nest around the
centre, so the short pairs near a boundary cross it together: a rack uplink carries as many flows as the rack
has hosts beside the boundary, which is what makes oversubscription show (ring shifts would send a lone flow
across the boundary between neighbours, and a 2:1 uplink would pass it at full rate).

With at most ``window`` units every centre runs: every pair once. With more, the units are cut into blocks of
at most ``window`` in host order and each block reflects inside itself, all blocks at once; a second set of
blocks, shifted by half a block, joins neighbours across the first set's edges. A unit then meets its
neighbours in host order (clusters name hosts rack by rack), and groups larger than a block chain together.
"""
from __future__ import annotations

DEFAULT_WINDOW = 16


def patterns(units: int, window: int = DEFAULT_WINDOW) -> list[tuple[int, int]]:
    """(offset, centre) of every round of a stage over ``units`` units."""
    if window < 2:
        raise ValueError(f"probe window {window}: must be at least 2")
    if units <= window:
        return [(0, c) for c in range(units)] if units > 2 else [(0, 1)] if units == 2 else []
    return [(o, c) for o in (0, 1) for c in range(window)]


def _blocks(units: int, window: int, offset: int) -> list[list[int]]:
    """Contiguous blocks of at most ``window`` units covering 0..units-1 in ring order; offset 1 shifts
    them by half a block."""
    count = -(-units // window)
    bounds = [units * k // count for k in range(count + 1)]
    shift = (bounds[1] - bounds[0]) // 2 if offset else 0
    return [[(i + shift) % units for i in range(bounds[k], bounds[k + 1])] for k in range(count)]


def unit_pairs(units: int, pattern: tuple[int, int], window: int = DEFAULT_WINDOW) -> list[tuple[int, int]]:
    """(a, b), a < b in block order, of every pair of units that exchange in ``pattern``."""
    offset, c = pattern
    blocks = [list(range(units))] if units <= window else _blocks(units, window, offset)
    out = []
    for block in blocks:
        n = len(block)
        alone = []
        for p in range(n):
            q = (c - p) % n
            if p < q:
                out.append((block[p], block[q]))
            elif p == q:
                alone.append(block[p])
        if len(alone) == 2:  # an even block leaves the centre and its opposite: they exchange too
            out.append((alone[0], alone[1]))
    return out


def round_flows(units: list[list[int]], pattern: tuple[int, int],
                window: int = DEFAULT_WINDOW) -> list[tuple[int, int]]:
    """(sender host, receiver host) of every flow in ``pattern``: both directions of every pair."""
    out = []
    for a, b in unit_pairs(len(units), pattern, window):
        for m in range(min(len(units[a]), len(units[b]))):
            out += [(units[a][m], units[b][m]), (units[b][m], units[a][m])]
    return out


def cost(hosts: int, window: int = DEFAULT_WINDOW, group_size: int = 16, round_seconds: float = 0.02,
         repeats: int = 2) -> dict:
    """The probe's cost for ``hosts`` hosts in groups of ``group_size`` per level: stages, rounds, flows (host
    pairs measured, each direction) against all-pairs, and seconds at ``round_seconds`` per round."""
    stages, rounds, flows, units = 0, 0, 0, hosts
    while units > 1:
        stages += 1
        n = 2 * len(patterns(units, window))  # each pattern runs one direction per round
        rounds += n * repeats
        flows += n * repeats * hosts // 2  # a round moves one flow per pair of hosts
        units = -(-units // group_size)
    return {"hosts": hosts, "stages": stages, "rounds": rounds, "flows": flows,
            "all_pairs": hosts * (hosts - 1), "seconds": rounds * round_seconds}
