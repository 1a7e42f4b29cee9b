"""Topology files: machine descriptions (topology/*.json, compact, expanded here) and graph dumps, loaded from a
path, a library machine name, a dict or JSON text. The library ships as ddl.machines (the repository's
topology/ folder)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from .compact import CompactTopology, is_compact
from .graph import Topology
from .validate import check_graph, check_machine
from ..errors import TopologyError

MACHINES = Path(__file__).resolve().parent.parent / "machines"  # the installed copy of topology/


def from_dict(d: dict, where: str = "topology") -> Topology:
    """A graph dump (format ddl-topology/1) or a machine description, validated first (ddl.topology.validate)."""
    if isinstance(d, dict) and "format" in d:
        check_graph(d, where)
        return Topology.from_dict(d)
    check_machine(d, where)
    try:
        if is_compact(d):  # planned from its numbers; expanded only where asked (ddl.topology.compact)
            return CompactTopology(d, _expand)
        return from_spec(d)
    except TopologyError as e:  # what only the expansion finds (two vertices of one name, ...)
        raise TopologyError(f"{where}: {e}") from None



def from_spec(d: dict) -> Topology:
    """Expands a machine description (see topology/README.md) into a Topology."""
    try:
        return _expand(d).validate()
    except (KeyError, TypeError, IndexError) as e:
        raise TopologyError(f"machine description {d.get('name', '?')!r}: missing or malformed field: {e!r}") \
            from None


def _expand(d: dict) -> Topology:
    t = Topology(d.get("name", "machine"), placement=d.get("placement"))
    template = d.get("node", {})
    nodes = d.get("nodes", 1)
    if isinstance(nodes, int):
        fmt = d.get("hostnames", "node{index}")
        nodes = [{"name": fmt.format(index=i)} for i in range(nodes)]
    switches = d.get("switches", [])
    explicit = bool(switches) and "name" in switches[0]
    if explicit:
        for s in switches:
            t.add(s["name"], "switch", s.get("parent"), s.get("uplink"), level=s.get("level", "switch"))
        only = switches[0]["name"] if len(switches) == 1 else None
        for n in nodes:
            _add_node(t, {**template, **n}, n.get("switch", only))
        return t
    # Regular tree: nodes fill switches of each level in order, ``fanout`` children per switch.
    if not switches:
        if len(nodes) != 1:
            raise TopologyError(f"machine {t.name!r}: {len(nodes)} nodes need switches to join them")
        _add_node(t, {**template, **nodes[0]}, None)
        return t
    counts, n = [], len(nodes)
    for s in switches:
        n = math.ceil(n / s.get("fanout", n))
        counts.append(n)
    if counts[-1] != 1:
        raise TopologyError(f"machine {t.name!r}: the top switch level {switches[-1].get('level')!r} has "
                            f"{counts[-1]} switches; give it a fanout that joins them all")
    names: list[list[str]] = []
    for lvl in range(len(switches) - 1, -1, -1):
        s = switches[lvl]
        up = switches[lvl + 1] if lvl + 1 < len(switches) else None
        row = []
        for i in range(counts[lvl]):
            parent = names[0][i // up["fanout"]] if up else None
            name = s.get("names", s["level"] + "{index}").format(index=i)
            t.add(name, "switch", parent, s.get("uplink") if up else None, level=s["level"])
            row.append(name)
        names.insert(0, row)
    model: str | None = None
    for i, n in enumerate(nodes):
        switch = names[0][i // switches[0]["fanout"]]
        if model is not None and set(n) <= {"name"}:  # like the first node but for its name: copy it
            t.copy_node(model, n["name"], switch)
            continue
        _add_node(t, {**template, **n}, switch)
        if set(n) <= {"name"}:
            model = n["name"]
    return t


def _add_node(t: Topology, spec: dict, switch: str | None) -> None:
    """One node from its description: sockets, GPUs (under sockets, an NVSwitch or the node), peer links."""
    name = spec["name"]
    attrs = {"host": spec.get("host", name)}
    sockets, gpus = int(spec.get("sockets", 0)), int(spec.get("gpus", 0))
    slots = int(spec.get("slots", 0))
    if gpus == 0 and slots == 0:
        raise TopologyError(f"node {name!r}: needs gpus or slots (ranks per node without GPUs)")
    node_slots = slots if (gpus == 0 and sockets == 0) else 0
    t.add(name, "node", switch, spec.get("nic"), slots=node_slots, **attrs)
    cpus = []
    for s in range(sockets):
        per = slots // sockets + (1 if s < slots % sockets else 0) if gpus == 0 else 0
        cpus.append(t.add(f"{name}/cpu{s}", "cpu", name, spec.get("socket_uplink", {"kind": "shm"}), slots=per))
    for a, b in _pairs(spec.get("socket_links"), sockets):
        t.link(cpus[a], cpus[b], **spec.get("socket_link", {"kind": "upi"}))
    parent_kind = spec.get("gpu_parent", "socket" if sockets else "node")
    holders = {"socket": cpus, "node": [name]}.get(parent_kind)
    if parent_kind == "nvswitch":
        holders = [t.add(f"{name}/nvswitch", "switch", name, spec.get("nvswitch_uplink", {"kind": "pcie5"}),
                         level="nvswitch")]
    if holders is None or (gpus and not holders):
        raise TopologyError(f"node {name!r}: gpu_parent {parent_kind!r} is not one of socket, nvswitch, node "
                            f"(or the node has no sockets)")
    gids = []
    for g in range(gpus):
        holder = holders[g * len(holders) // gpus]
        gids.append(t.add(f"{name}/gpu{g}", "gpu", holder, spec.get("gpu_uplink", {"kind": "pcie3"})))
    for a, b, n in spec.get("gpu_links", []):
        t.link(gids[a], gids[b], **{**spec.get("gpu_link", {"kind": "nvlink2"}), "links": n})


def _pairs(given, n: int):
    """Socket pairs: as given, else every pair."""
    if given is not None:
        return [tuple(p) for p in given]
    return [(a, b) for a in range(n) for b in range(a + 1, n)]


def load(source) -> Topology:
    """A topology from a path, a machine name in the library (``summit``), a dict, or JSON text."""
    if isinstance(source, Topology):
        return source
    if isinstance(source, dict):
        return from_dict(source)
    text = str(source)
    if text.lstrip().startswith("{"):
        return from_dict(_parse(text, "the given JSON"), "the given JSON")
    path = Path(text)
    if not path.exists():
        path = machine_file(text) or path
    if not path.exists():
        raise TopologyError(f"no topology file {text!r} (and no machine of that name in the library: "
                            f"{', '.join(library())})")
    return from_dict(_parse(path.read_text(), str(path)), str(path))


def _parse(text: str, where: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TopologyError(f"{where}: not valid JSON: {e}") from None


def machine_file(name: str) -> Path | None:
    """The file of a library machine: installed with ddl, or in the source tree's topology/."""
    return next((c for c in (MACHINES / f"{name}.json", _source_machines() / f"{name}.json") if c.exists()), None)


def _source_machines() -> Path:
    return Path(__file__).resolve().parent.parent.parent / "topology"


def library() -> list[str]:
    """The machine names shipped in topology/."""
    names = set()
    for d in (MACHINES, _source_machines()):
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.json") if not p.name.endswith(".schema.json"))
    return sorted(names)
