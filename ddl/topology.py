"""The topology model: a typed networkx graph of GPUs, CPU sockets, nodes and switches, and the links between.

Vertices have a ``kind`` (one of VERTEX_KINDS) and a ``parent`` (the vertex that contains them: a GPU's
socket, NVSwitch or node; a socket's node; a node's leaf switch; a switch's switch one level up), so the
graph holds a containment tree. Edges carry ``kind`` (ddl.links), ``links``, ``bandwidth`` (GB/s per
direction) and ``latency`` (µs); ``uplink`` marks the edge from a vertex to its parent, the others are peer
links (NVLink between GPUs, X-Bus between sockets). Ranks run on *devices*: GPUs, or, on machines without
GPUs, sockets or nodes with ``slots`` ranks each.

A topology comes from a machine file (topology/*.json, a compact description expanded here), from a graph
dump (``to_json``), or from discovery (ddl.discover). ``hierarchy`` turns it and a rank placement into what
the planner needs: the nested groups of ranks and the cost of each level.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

from . import links
from .errors import TopologyError
from .hierarchical import normalize

VERTEX_KINDS = ("gpu", "cpu", "node", "switch")
FORMAT = "ddl-topology/1"
MACHINES = Path(__file__).resolve().parent / "machines"  # the installed copy of topology/


@dataclass(frozen=True)
class LevelCost:
    """What the planner knows about one level of groups, innermost first. ``bandwidth``: bytes/s one child
    of a group (a rank, a socket, a node, a switch) can move to its siblings; ``alpha``: seconds per message
    across the level; ``gamma``: seconds per byte reduced by a rank; ``via``: "peer" when the children have
    links to each other (NVLink, X-Bus), "uplink" when they talk through their links into the container
    (a node's NICs): outer levels' traffic then crosses those links too; ``outside``: bytes/s of every link
    out of a child (peer links plus its uplink), what the lower bound may count on."""

    name: str
    link: str
    alpha: float
    bandwidth: float
    gamma: float
    via: str = "uplink"
    outside: float = 0.0  # 0: the same as bandwidth

    def to_dict(self) -> dict:
        return dict(name=self.name, link=self.link, alpha=self.alpha, bandwidth=self.bandwidth, gamma=self.gamma,
                    via=self.via, outside=self.outside)

    @property
    def escape(self) -> float:
        return max(self.outside, self.bandwidth)


def default_level(name: str, link: str) -> LevelCost:
    """A level priced from the nominal table alone (hierarchies given as nested lists or -mode dims)."""
    k = links.kind(link)
    return LevelCost(name, link, k.latency * 1e-6 + links.SOFTWARE_OVERHEAD, k.bandwidth * 1e9,
                     links.REDUCE_SECONDS_PER_BYTE["cpu"], "peer" if link == "shm" else "uplink")


class Topology:
    def __init__(self, name: str = "machine", graph: nx.Graph | None = None, placement=None):
        self.name = name
        self.graph = graph if graph is not None else nx.Graph()
        self.placement: list[str] | None = placement  # rank -> device (or node) id, from the file
        self._version = 0  # bumped by every change; derived indexes are cached per version
        self._cache: dict = {}
        self._parent: dict[str, str | None] = {}  # plain copies of two vertex fields: read in hot loops
        self._kind: dict[str, str] = {}
        for v, d in self.graph.nodes(data=True):
            self._parent[v], self._kind[v] = d.get("parent"), d.get("kind")
        self._peer_edges = [(a, b) for a, b, up in self.graph.edges(data="uplink") if not up]

    # -- building -------------------------------------------------------------------------------------------

    def add(self, vid: str, kind: str, parent: str | None = None, uplink: dict | None = None, **attrs) -> str:
        if kind not in VERTEX_KINDS:
            raise TopologyError(f"vertex {vid!r}: unknown kind {kind!r} (known: {', '.join(VERTEX_KINDS)})")
        if vid in self.graph:
            raise TopologyError(f"vertex {vid!r} is defined twice")
        self.graph.add_node(vid, kind=kind, parent=parent, **attrs)
        self._parent[vid], self._kind[vid] = parent, kind
        self._version += 1
        if parent is not None:
            if parent not in self.graph:
                raise TopologyError(f"vertex {vid!r}: parent {parent!r} is not defined (define parents first)")
            self.link(vid, parent, uplink=True, **(uplink or {"kind": "shm"}))
        return vid

    def link(self, a: str, b: str, kind: str, links_: int | None = None, bandwidth: float | None = None,
             latency: float | None = None, uplink: bool = False, **extra) -> None:
        count = int(extra.pop("links", links_ or 1))
        if extra:
            raise TopologyError(f"link {a}-{b}: unknown fields {sorted(extra)}")
        try:
            k = links.kind(kind)
        except ValueError as e:
            raise TopologyError(f"link {a}-{b}: {e}") from None
        for v in (a, b):
            if v not in self.graph:
                raise TopologyError(f"link {a}-{b}: vertex {v!r} is not defined")
        bw = float(bandwidth) if bandwidth is not None else k.bandwidth * count
        lat = float(latency) if latency is not None else k.latency
        if bw <= 0 or lat < 0 or count < 1:
            raise TopologyError(f"link {a}-{b}: bandwidth must be > 0, latency >= 0, links >= 1")
        self.graph.add_edge(a, b, kind=kind, links=count, bandwidth=bw, latency=lat, uplink=uplink)
        if not uplink:
            self._peer_edges.append((a, b))
        self._version += 1

    def _cached(self, name: str, build):
        hit = self._cache.get(name)
        if hit is None or hit[0] != self._version:
            hit = self._cache[name] = (self._version, build())
        return hit[1]

    # -- queries --------------------------------------------------------------------------------------------

    def kind(self, v: str) -> str:
        return self._kind[v]

    def parent(self, v: str) -> str | None:
        return self._parent[v]

    def children(self, v: str) -> list[str]:
        return self._children().get(v, [])

    def _children(self) -> dict[str, list[str]]:
        def build():
            kids: dict[str, list[str]] = {}
            for v, p in self._parent.items():
                if p is not None:
                    kids.setdefault(p, []).append(v)
            return kids
        return self._cached("children", build)

    def roots(self) -> list[str]:
        return [v for v, p in self._parent.items() if p is None]

    def level_name(self, v: str) -> str:
        d = self.graph.nodes[v]
        return d.get("level") or {"cpu": "socket"}.get(d["kind"], d["kind"])

    def devices(self, under: str | None = None) -> list[str]:
        """Where ranks can run, in order: GPUs, else vertices with slots."""
        vs = list(self._subtree(under)) if under else list(self.graph.nodes)
        return [v for v in vs if self.slots(v) > 0]

    def slots(self, v: str) -> int:
        """Ranks v can host: 1 for a GPU, its slots for a socket or node without GPUs."""
        return 1 if self._kind[v] == "gpu" else int(self.graph.nodes[v].get("slots", 0))

    def capacity(self) -> int:
        """The ranks the machine runs when nothing else says: its placement's, else one per GPU or slot."""
        return len(self.placement) if self.placement is not None else sum(self.slots(d) for d in self.devices())

    def _subtree(self, v: str):
        stack = [v]
        while stack:
            x = stack.pop()
            yield x
            stack.extend(reversed(self.children(x)))

    def nodes(self) -> list[str]:
        return [v for v, k in self.graph.nodes(data="kind") if k == "node"]

    def host_of(self, v: str) -> str | None:
        """The node containing v (None for switches)."""
        while v is not None and self.kind(v) != "node":
            v = self.parent(v)
        return v

    def validate(self) -> "Topology":
        g = self.graph
        roots = self.roots()
        if len(roots) != 1:
            raise TopologyError(f"topology {self.name!r}: expected one root (the top switch or the only node), "
                                f"found {len(roots)}: {roots[:5]}")
        seen = set(self._subtree(roots[0]))
        if len(seen) != g.number_of_nodes():
            raise TopologyError(f"topology {self.name!r}: the parent links form a cycle or leave vertices "
                                f"unreachable: {sorted(set(g.nodes) - seen)[:5]}")
        for v, d in g.nodes(data=True):
            if d["kind"] not in VERTEX_KINDS:
                raise TopologyError(f"vertex {v!r}: unknown kind {d['kind']!r}")
            if d["kind"] == "gpu" and self.host_of(v) is None:
                raise TopologyError(f"GPU {v!r} is not inside a node")
        if not self.devices():
            raise TopologyError(f"topology {self.name!r} has nowhere to run ranks (no GPUs and no slots)")
        return self

    # -- placement and the planner's view --------------------------------------------------------------------

    def place(self, hosts: list[str] | None = None, nranks: int | None = None) -> list[str]:
        """The device of every rank. With the file's placement: that, checked against ``hosts`` (MPI's view):
        ranks the file puts on one node must share a host. Without: each rank goes to the next free device of
        the node named like its host. Raises TopologyError naming the rank on any contradiction."""
        if self.placement is not None:
            if nranks is not None and len(self.placement) != nranks:
                raise TopologyError(f"topology {self.name!r} places {len(self.placement)} ranks but MPI runs "
                                    f"{nranks}")
            used: dict[str, list[str]] = {}
            devs = [self._device_for(r, p, used) for r, p in enumerate(self.placement)]
            if hosts is not None:
                first: dict[str, tuple[int, str]] = {}
                for r, d in enumerate(devs):
                    node = self.host_of(d) or d
                    r0, h0 = first.setdefault(node, (r, hosts[r]))
                    if hosts[r] != h0:
                        raise TopologyError(f"rank {r}: topology {self.name!r} places ranks {r0} and {r} on "
                                            f"node {node!r}, but MPI runs them on different hosts "
                                            f"({h0!r} and {hosts[r]!r}), which share no memory")
            return devs
        if hosts is None:
            if nranks is None:
                raise TopologyError("place() needs the hosts of the ranks or a placement in the file")
            free = self._free_slots(self.devices())
            if nranks > len(free):
                raise TopologyError(f"topology {self.name!r} has {len(free)} GPUs or slots for {nranks} ranks")
            return free[:nranks]
        by_host = {self.graph.nodes[n].get("host", n): n for n in self.nodes()}
        free_on: dict[str, list[str]] = {}
        out = []
        for r, h in enumerate(hosts):
            if h not in by_host:
                raise TopologyError(f"rank {r}: MPI runs it on host {h!r}, which topology {self.name!r} does "
                                    f"not have (its nodes: {', '.join(sorted(by_host)[:6])}"
                                    f"{', ...' if len(by_host) > 6 else ''})")
            node = by_host[h]
            if node not in free_on:
                free_on[node] = self._free_slots(self.devices(node))[::-1]
            if not free_on[node]:
                raise TopologyError(f"rank {r}: node {node!r} has no free GPU or slot left for it "
                                    f"(MPI runs {hosts.count(h)} ranks on host {h!r})")
            out.append(free_on[node].pop())
        return out

    def _free_slots(self, devices: list[str]) -> list[str]:
        return [d for d in devices for _ in range(self.slots(d))]

    def _device_for(self, rank: int, where: str, used: dict) -> str:
        if where not in self.graph:
            raise TopologyError(f"rank {rank}: placed on {where!r}, which topology {self.name!r} does not have")
        if where not in used:
            used[where] = self._free_slots(self.devices(where))[::-1]
        if not used[where]:
            raise TopologyError(f"rank {rank}: placed on {where!r}, which has no free GPU or slot left")
        return used[where].pop()

    def hierarchy(self, placement: list[str]) -> tuple[list, list[LevelCost]]:
        """(tree, levels): the nested groups of ranks (ddl.hierarchical's normalized form, innermost groups
        deepest) following the containment tree, and one LevelCost per level, innermost first."""
        ranks_on: dict[str, list[int]] = {}
        for r, d in enumerate(placement):
            ranks_on.setdefault(d, []).append(r)
        occupied: set = set()
        for d in ranks_on:
            while d is not None and d not in occupied:
                occupied.add(d)
                d = self.parent(d)

        kids = self._children()

        def build(v):  # (vertex, children) in containment order; ranks on v itself come last
            return (v, [build(c) for c in kids.get(v, ()) if c in occupied] + ranks_on.get(v, []))

        labeled = _simplify(build(self.roots()[0]))
        if isinstance(labeled, int):
            return [labeled], []
        by_depth: list[list[tuple]] = []
        _collect(labeled, 0, by_depth)
        levels = []
        for depth in range(len(by_depth) - 1, -1, -1):  # innermost first
            groups = by_depth[depth]
            costs = [self._group_cost(g, placement) for g in groups]
            worst = min(costs, key=lambda c: (c.bandwidth, -c.alpha))
            name = Counter(c.name for c in costs).most_common(1)[0][0]
            levels.append(LevelCost(name, worst.link, max(c.alpha for c in costs), worst.bandwidth,
                                    max(c.gamma for c in costs), worst.via, min(c.escape for c in costs)))
        return normalize(_strip(labeled)), levels

    def _group_cost(self, group: tuple, placement: list[str]) -> LevelCost:
        """Cost of one group (vertex X, children): the slowest child's bandwidth to its siblings, over peer
        links when the children have any between them, else up through X."""
        x, kids = group
        device = self.kind(placement[_first_rank(group)])
        gamma = links.REDUCE_SECONDS_PER_BYTE["gpu" if device == "gpu" else "cpu"]
        name = self.level_name(x)
        tops = [k[0] if isinstance(k, tuple) else placement[k] for k in kids]
        if any(t == x for t in tops):  # a rank on x itself: its siblings are reached in memory
            k = links.kind("shm")
            return LevelCost(name, "shm", k.latency * 1e-6 + links.SOFTWARE_OVERHEAD, k.bandwidth * 1e9, gamma,
                             "peer")
        (peers, leaving), adj, parent = self._peer_links(), self.graph._adj, self._parent
        worst = None
        for t in tops:
            lat, v = 0.0, t
            while parent[v] != x:
                lat += adj[v][parent[v]]["latency"]
                v = parent[v]
            across = peers.get((x, v))
            e = adj[v][x]
            outside = e["bandwidth"] + leaving.get(v, 0.0)
            if across is not None:  # links straight to the siblings
                cost = (across[0], across[1]["kind"], across[1]["latency"], "peer", outside)
            else:  # out through the edge into x (what lies below it was paid at lower levels) and back down
                cost = (e["bandwidth"], e["kind"], 2 * (lat + e["latency"]), "uplink", outside)
            if worst is None or cost[0] < worst[0]:
                worst = cost
        bw, kind, lat, via, outside = worst
        return LevelCost(name, kind, lat * 1e-6 + links.SOFTWARE_OVERHEAD, bw * 1e9, gamma, via, outside * 1e9)

    def _peer_links(self) -> tuple[dict, dict]:
        """(across, leaving): across maps (container x, child c of x) to (GB/s of c's peer links to its
        siblings under x, the fastest such edge), each peer edge counted under the lowest vertex containing
        both ends; leaving maps a vertex to the GB/s of peer links from its subtree to the rest."""
        return self._cached("peers", self._index_peer_links)

    def _index_peer_links(self) -> tuple[dict, dict]:
        out: dict = {}
        leaving: dict[str, float] = {}
        adj, parent, depth = self.graph._adj, self._parent, self._depths()
        for a, b in self._peer_edges:
            e = adj[a][b]
            bw = e["bandwidth"]
            path = []  # the vertices below the lowest common ancestor x, on both sides
            while depth[a] > depth[b]:
                path.append(a)
                a = parent[a]
            while depth[b] > depth[a]:
                path.append(b)
                b = parent[b]
            if a == b:
                continue  # one end contains the other
            while parent[a] != parent[b]:
                path += (a, b)
                a, b = parent[a], parent[b]
            path += (a, b)
            x = parent[a]
            for v in path:  # the edge leaves every subtree on the way up to x
                leaving[v] = leaving.get(v, 0.0) + bw
            for c in (a, b):  # a and b are now x's children holding the two ends
                total, best = out.get((x, c), (0.0, None))
                out[(x, c)] = (total + bw, e if best is None or bw > best["bandwidth"] else best)
        return out, leaving

    def _depths(self) -> dict[str, int]:
        def build():
            depth: dict[str, int] = {}
            for v in self._parent:
                chain = []
                while v is not None and v not in depth:
                    chain.append(v)
                    v = self._parent[v]
                d = -1 if v is None else depth[v]
                for u in reversed(chain):
                    d += 1
                    depth[u] = d
            return depth
        return self._cached("depths", build)

    # -- JSON, text, picture -----------------------------------------------------------------------------

    def to_dict(self) -> dict:
        g = self.graph
        vertices = [{"id": v, **{k: x for k, x in d.items() if x is not None}} for v, d in g.nodes(data=True)]
        edges = [{"a": b, "b": a, **d} if d["uplink"] and self._parent[b] == a else {"a": a, "b": b, **d}
                 for a, b, d in g.edges(data=True)]  # an uplink reads child -> parent
        out = {"format": FORMAT, "name": self.name, "vertices": vertices, "links": edges}
        if self.placement is not None:
            out["placement"] = self.placement
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=None, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "Topology":
        if d.get("format") != FORMAT:
            return from_spec(d)
        t = cls(d.get("name", "machine"), placement=d.get("placement"))
        vertices = {v["id"]: v for v in d["vertices"]}
        uplinks = {}
        for e in d["links"]:
            if e.get("uplink"):
                uplinks[e["a"]] = e
        done: set = set()

        def add(vid):  # parents first
            if vid in done:
                return
            v = vertices[vid]
            p = v.get("parent")
            if p is not None:
                if p not in vertices:
                    raise TopologyError(f"vertex {vid!r}: parent {p!r} is not defined")
                add(p)
            attrs = {k: x for k, x in v.items() if k not in ("id", "kind", "parent")}
            up = uplinks.get(vid)
            t.add(vid, v["kind"], p, None if up is None else _edge_fields(up), **attrs)
            done.add(vid)

        for vid in vertices:
            add(vid)
        for e in d["links"]:
            if not e.get("uplink"):
                t.link(e["a"], e["b"], **_edge_fields(e))
        return t.validate()

    def tree_text(self, siblings: int = 3) -> str:
        """The containment tree, one vertex per line; runs of siblings that look alike are folded into one
        line ("... and 4606 more like summit0001") after the first ``siblings``."""
        lines: list[str] = []
        root = self.roots()[0]

        def shape(v):
            return (self.kind(v), self.level_name(v), len(self.children(v)),
                    tuple(sorted(Counter(self.kind(c) for c in self.children(v)).items())))

        def label(v):
            d = self.graph.nodes[v]
            bits = [f"{v} [{self.level_name(v)}]"]
            p = d["parent"]
            if p is not None:
                e = self.graph[v][p]
                bits.append(f"up {e['kind']}x{e['links']} {e['bandwidth']:g} GB/s {e['latency']:g} us")
            peers = [(u, e) for u, e in self.graph[v].items() if not e["uplink"]]
            if peers:
                bits.append("peers " + ", ".join(f"{u.rsplit('/', 1)[-1]}:{e['kind']}x{e['links']}"
                                                  for u, e in peers))
            if d["kind"] != "gpu" and self.slots(v):
                bits.append(f"{self.slots(v)} slots")
            return "  ".join(bits)

        def walk(v, indent):
            lines.append("  " * indent + label(v))
            kids = self.children(v)
            i = 0
            while i < len(kids):
                j = i
                while j + 1 < len(kids) and shape(kids[j + 1]) == shape(kids[i]):
                    j += 1
                run = kids[i:j + 1]
                for c in run[:siblings]:
                    walk(c, indent + 1)
                if len(run) > siblings:
                    lines.append("  " * (indent + 1) + f"... and {len(run) - siblings} more like {run[0]}")
                i = j + 1

        walk(root, 0)
        return "\n".join(lines)

    def draw(self, path: str, siblings: int = 4) -> None:
        """A PNG of the containment tree and peer links (needs matplotlib: pip install ddl[draw]); large
        machines are drawn with the first ``siblings`` children of each vertex."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise TopologyError("drawing needs matplotlib: pip install 'ddl[draw]'") from None
        keep, stack = [], [self.roots()[0]]
        while stack:
            v = stack.pop()
            keep.append(v)
            stack.extend(self.children(v)[:siblings])
        sub = self.graph.subgraph(keep)
        depth = {}
        for v in keep:
            d, u = 0, v
            while self.parent(u) is not None:
                u, d = self.parent(u), d + 1
            depth[v] = d
        rows: dict[int, list[str]] = {}
        for v in keep:
            rows.setdefault(depth[v], []).append(v)
        pos = {v: ((i + 0.5) / len(vs), -d) for d, vs in rows.items() for i, v in enumerate(vs)}
        colors = {"gpu": "#76b900", "cpu": "#1f77b4", "node": "#ff7f0e", "switch": "#7f7f7f"}
        fig, ax = plt.subplots(figsize=(max(8, len(keep) * 0.25), 2 + 1.5 * len(rows)))
        ordered = [links.ORDER[e["kind"]] for _, _, e in sub.edges(data=True)]
        nx.draw_networkx_edges(sub, pos, ax=ax, edge_color=ordered, edge_cmap=plt.cm.viridis, width=1.5)
        nx.draw_networkx_nodes(sub, pos, ax=ax, node_size=120,
                               node_color=[colors[self.kind(v)] for v in sub.nodes])
        nx.draw_networkx_labels(sub, pos, ax=ax, font_size=6,
                                labels={v: v.rsplit("/", 1)[-1] for v in sub.nodes})
        ax.set_title(f"{self.name}: {self.graph.number_of_nodes()} vertices (first {siblings} children each)")
        ax.axis("off")
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)


def _edge_fields(e: dict) -> dict:
    return {k: e[k] for k in ("kind", "links", "bandwidth", "latency") if k in e}


# -- the labeled tree behind Topology.hierarchy ----------------------------------------------------------------


def _simplify(node):
    """Drop groups of one (their level carries nothing)."""
    if isinstance(node, int):
        return node
    v, kids = node
    kids = [_simplify(k) for k in kids]
    return kids[0] if len(kids) == 1 else (v, kids)


def _first_rank(node) -> int:
    while not isinstance(node, int):
        node = node[1][0]
    return node


def _collect(node, depth: int, by_depth: list) -> None:
    """Groups by their depth from the root: that is their level once normalize() pads short branches at
    the bottom (a shallow group keeps its place and gets singleton groups below it)."""
    if isinstance(node, int):
        return
    if len(by_depth) <= depth:
        by_depth.append([])
    by_depth[depth].append(node)
    for k in node[1]:
        _collect(k, depth + 1, by_depth)


def _strip(node):
    return node if isinstance(node, int) else [_strip(k) for k in node[1]]


# -- machine files ---------------------------------------------------------------------------------------------


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
    model: tuple[str, list[str]] | None = None
    for i, n in enumerate(nodes):
        switch = names[0][i // switches[0]["fanout"]]
        if model is not None and set(n) <= {"name"}:  # like the first node but for its name: copy it
            _copy_node(t, *model, n["name"], switch)
            continue
        _add_node(t, {**template, **n}, switch)
        if set(n) <= {"name"}:
            model = (n["name"], list(t._subtree(n["name"])))
    return t


def _copy_node(t: Topology, model: str, inside: list[str], name: str, switch: str) -> None:
    """A node built like ``model`` (already validated; ``inside``: its vertices), added in bulk: large
    regular machines (Summit's 4,608 nodes) would spend most of their loading time checking the same
    template again."""
    g, adj = t.graph, t.graph._adj
    rename = {v: name + v[len(model):] for v in inside}
    rename[t.parent(model)] = switch
    for v in inside:
        d = dict(g.nodes[v])
        d["parent"] = rename[d["parent"]]
        if v == model:
            d["host"] = name
        g.add_node(rename[v], **d)
        t._parent[rename[v]], t._kind[rename[v]] = d["parent"], d["kind"]
    for v in inside:
        for u, e in adj[v].items():
            if u in rename:  # inside the node, or the model's own uplink into its switch
                if not g.has_edge(rename[v], rename[u]):
                    g.add_edge(rename[v], rename[u], **e)
                    if not e["uplink"]:
                        t._peer_edges.append((rename[v], rename[u]))
    t._version += 1


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
        return Topology.from_dict(source)
    text = str(source)
    if text.lstrip().startswith("{"):
        return Topology.from_dict(_parse(text, "the given JSON"))
    path = Path(text)
    if not path.exists():
        path = machine_file(text) or path
    if not path.exists():
        raise TopologyError(f"no topology file {text!r} (and no machine of that name in the library: "
                            f"{', '.join(library())})")
    return Topology.from_dict(_parse(path.read_text(), str(path)))


def _parse(text: str, where: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TopologyError(f"{where}: not valid JSON: {e}") from None


def machine_file(name: str) -> Path | None:
    """The file of a library machine: installed with ddl, or in the source tree's topology/."""
    return next((c for c in (MACHINES / f"{name}.json", _source_machines() / f"{name}.json") if c.exists()), None)


def _source_machines() -> Path:
    return Path(__file__).resolve().parent.parent / "topology"


def library() -> list[str]:
    """The machine names shipped in topology/."""
    names = set()
    for d in (MACHINES, _source_machines()):
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.json"))
    return sorted(names)
