"""Emulated-cluster specs: a short text (or a topology file) -> the Topology the cluster is built from.

    4x2                      4 nodes x 2 ranks behind one switch
    2x2x2                    2 racks x 2 nodes x 2 ranks: a bridge per rack, a spine joining the racks
    2x2x2x1                  2 aisles x 2 racks x 2 nodes x 1 rank: racks under aisle switches under a core
    3,2,1                    uneven nodes (3, 2 and 1 ranks) behind one switch
    3,2/2,1                  racks of uneven nodes, separated by "/"
    ...:nic=1gbit:uplink=500mbit:aisle=100mbit:order=round-robin
    T1 .. T5                 the benchmark topologies (PRESETS): issue 4's T1-T4, T5 three tiers
    emulated-racks, a path   a topology file: its nodes, switches, link rates and placement

Rates are tc's (``1gbit``, ``500mbit``): ``uplink`` a rack's, ``aisle`` an aisle's (default: as ``uplink``); ``order`` numbers ranks packed by node (``node``, the default) or
round-robin across the nodes (``round-robin``). This module is pure: building namespaces is ddl.cluster's job.
"""
from __future__ import annotations

import re

from .. import topology as topo
from ..errors import TopologyError

PRESETS = {
    "T1": "4x2:nic=1gbit",
    "T2": "2x2x2:nic=1gbit:uplink=500mbit",
    "T3": "3,2,1:nic=1gbit",
    "T4": "4x2:nic=1gbit:order=round-robin",
    "T5": "2x2x2x1:nic=1gbit:uplink=500mbit:aisle=250mbit",
}
PRESET_TEXT = {
    "T1": "4 nodes x 2 ranks, NICs 1 Gbit/s, one switch",
    "T2": "2 racks x 2 nodes x 2 ranks, NICs 1 Gbit/s, rack uplinks 500 Mbit/s (oversubscribed)",
    "T3": "3 nodes with 3, 2 and 1 ranks, NICs 1 Gbit/s, one switch",
    "T4": "as T1, ranks numbered round-robin across the nodes",
    "T5": "2 aisles x 2 racks x 2 nodes x 1 rank, NICs 1 Gbit/s, rack uplinks 500 Mbit/s, aisle uplinks 250 Mbit/s",
}
DEFAULT_RATE = "1gbit"
_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
HOSTNAME = re.compile(r"[a-z][a-z0-9-]{0,30}")


def bits_per_second(rate: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?bit)", rate.strip().lower())
    if not m:
        raise TopologyError(f"bad rate {rate!r}: write it as tc does, e.g. 1gbit, 500mbit")
    bps = int(float(m.group(1)) * _UNITS[m.group(2)])
    if bps < 10**5:
        raise TopologyError(f"rate {rate!r} is below 100kbit: too slow to carry an MPI job")
    return bps


def is_spec(text: str) -> bool:
    """A preset or a shape (not a file or library name)."""
    return text.strip().upper() in PRESETS or bool(re.fullmatch(r"[\d,/x\s]+", text.partition(":")[0]))


def topology(spec: str) -> topo.Topology:
    """The Topology (with a placement: rank -> node) an emulated cluster of ``spec`` builds and plans over."""
    text = PRESETS.get(spec.strip().upper(), spec.strip())
    shape, _, rest = text.partition(":")
    if not is_spec(text):
        if rest:
            raise TopologyError(f"cluster spec {spec!r}: options (after ':') go with a shape such as 2x2x2")
        return _from_file(spec)
    opts = _options(spec, rest)
    racks, per_aisle = _racks(spec, shape)
    nic = bits_per_second(opts.get("nic", DEFAULT_RATE))
    uplink = bits_per_second(opts.get("uplink", opts.get("nic", DEFAULT_RATE)))
    aisle_rate = bits_per_second(opts.get("aisle", opts.get("uplink", opts.get("nic", DEFAULT_RATE))))
    order = opts.get("order", "node")
    if order not in ("node", "round-robin"):
        raise TopologyError(f"cluster spec {spec!r}: order is node or round-robin, not {order!r}")
    link = lambda bps: {"kind": "veth", "bandwidth": bps / 8e9}
    nodes, switches = [], []
    many = len(racks) > 1
    if many:
        switches.append({"name": "spine", "level": "spine"})
    for a in range(len(racks) // per_aisle if per_aisle else 0):
        switches.append({"name": f"aisle{a}", "level": "aisle", "parent": "spine", "uplink": link(aisle_rate)})
    for r, rack in enumerate(racks):
        sw = f"rack{r}" if many else "switch"
        above = f"aisle{r // per_aisle}" if per_aisle else "spine"
        switches.append({"name": sw, "level": "rack" if many else "switch",
                         **({"parent": above, "uplink": link(uplink)} if many else {})})
        for slots in rack:
            nodes.append({"name": f"node{len(nodes)}", "slots": slots, "switch": sw})
    desc = {"name": f"emulated {spec.strip()}", "description": f"emulated cluster {text}",
            "node": {"nic": link(nic)}, "nodes": nodes, "switches": switches,
            "placement": place([n["name"] for n in nodes], [n["slots"] for n in nodes], order)}
    if len(nodes) == 1:  # one node needs no switch
        desc["switches"] = []
        desc["nodes"] = [{k: v for k, v in nodes[0].items() if k != "switch"}]
    return topo.load(desc)


def place(names: list[str], slots: list[int], order: str) -> list[str]:
    """Rank -> node: packed (fill each node in turn) or round-robin (one rank per node with room, in turn)."""
    if order == "node":
        return [n for n, s in zip(names, slots) for _ in range(s)]
    left, out = list(slots), []
    while any(left):
        for i, n in enumerate(names):
            if left[i]:
                out.append(n)
                left[i] -= 1
    return out


def _options(spec: str, rest: str) -> dict[str, str]:
    opts = {}
    for item in filter(None, rest.split(":")):
        key, eq, value = item.partition("=")
        if not eq or key not in ("nic", "uplink", "aisle", "order"):
            raise TopologyError(f"cluster spec {spec!r}: bad option {item!r} (nic=RATE, uplink=RATE, "
                                f"aisle=RATE, order=node|round-robin)")
        opts[key] = value.strip().lower()
    return opts


def _racks(spec: str, shape: str) -> tuple[list[list[int]], int]:
    """The ranks of every node, rack by rack, and racks per aisle (0: no aisles)."""
    shape = shape.replace(" ", "")
    try:
        if "x" in shape:
            dims = [int(d) for d in shape.split("x")]
            if len(dims) == 2:
                dims = [1] + dims
            if len(dims) == 4:  # aisles x racks x nodes x ranks: racks listed aisle by aisle
                return [[dims[3]] * dims[2] for _ in range(dims[0] * dims[1])], dims[1]
            if len(dims) != 3:
                raise ValueError
            racks = [[dims[2]] * dims[1] for _ in range(dims[0])]
        else:
            racks = [[int(s) for s in rack.split(",")] for rack in shape.split("/")]
    except ValueError:
        raise TopologyError(f"cluster spec {spec!r}: the shape is AISLESxRACKSxNODESxRANKS, RACKSxNODESxRANKS, "
                            f"NODESxRANKS, or ranks per node like 3,2,1 (racks split by '/')") from None
    if not racks or any(not r for r in racks) or any(s < 1 for r in racks for s in r):
        raise TopologyError(f"cluster spec {spec!r}: every rack needs a node and every node a rank")
    if sum(len(r) for r in racks) > 64:
        raise TopologyError(f"cluster spec {spec!r}: more than 64 emulated nodes")
    return racks, 0


def _from_file(spec: str) -> topo.Topology:
    t = topo.load(spec)
    for n in t.nodes():
        host = t.graph.nodes[n].get("host", n)
        if not HOSTNAME.fullmatch(host):
            raise TopologyError(f"topology {t.name!r}: node host name {host!r} cannot name an emulated node "
                                f"(lower-case letters, digits and '-', at most 31)")
    t.placement = rank_nodes(t)
    return t


def rank_nodes(t: topo.Topology) -> list[str]:
    """The node of every rank: the topology's placement (which may name devices), else packed by node in
    the file's device order."""
    return [t.host_of(d) or d for d in (t.placement or t.place(None, t.capacity()))]
