"""The topology model: a typed networkx graph of GPUs, CPU sockets, nodes and switches, and the links between.

Vertices have a ``kind`` (one of VERTEX_KINDS) and a ``parent`` (the vertex that contains them: a GPU's
socket, NVSwitch or node; a socket's node; a node's leaf switch; a switch's switch one level up), so the
graph holds a containment tree. Edges carry ``kind`` (ddl.topology.links), ``links``, ``bandwidth`` (GB/s per
direction) and ``latency`` (µs); ``uplink`` marks the edge from a vertex to its parent, the others are peer
links (NVLink between GPUs, X-Bus between sockets). Ranks run on *devices*: GPUs, or, on machines without
GPUs, sockets or nodes with ``slots`` ranks each.

This module builds and queries the graph and dumps it as JSON. Machine files are expanded by
ddl.topology.files, placement and level costs live in ddl.topology.placement, text and pictures in
ddl.topology.drawing.
"""
from __future__ import annotations

import json

import networkx as nx

from . import drawing, links, placement
from .costs import LevelCost
from ..errors import TopologyError

VERTEX_KINDS = ("gpu", "cpu", "node", "switch")
FORMAT = "ddl-topology/1"


class Topology:
    def __init__(self, name: str = "machine", graph: nx.Graph | None = None, placement=None):
        self.name = name
        self.graph = graph if graph is not None else nx.Graph()
        self.placement: list[str] | None = placement  # rank -> device (or node) id, from the file
        self._version = 0  # bumped by every change; derived indexes are cached per version
        self._cache: dict = {}
        self._templates: dict[str, list[str]] = {}  # copy_node's models, their vertices
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
             latency: float | None = None, uplink: bool = False, measured: bool | str = False, **extra) -> None:
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
        self.graph.add_edge(a, b, kind=kind, links=count, bandwidth=bw, latency=lat, uplink=uplink,
                            **({"measured": measured} if measured else {}))
        if not uplink:
            self._peer_edges.append((a, b))
        self._version += 1

    def copy_node(self, model: str, name: str, parent: str) -> None:
        """Adds node ``name`` under ``parent``, built like the (already validated) node ``model``, in bulk:
        large regular machines (Summit's 4,608 nodes) would spend most of their loading time checking the
        same template again."""
        g, adj = self.graph, self.graph._adj
        # The model's vertices, found once: each copy changes the graph, which would rebuild the children
        # index for the next copy's walk (quadratic: 50 s for Summit)
        inside = self._templates.get(model)
        if inside is None:
            inside = self._templates[model] = list(self.subtree(model))
        rename = {v: name + v[len(model):] for v in inside}
        rename[self.parent(model)] = parent
        for v in inside:
            d = dict(g.nodes[v])
            d["parent"] = rename[d["parent"]]
            if v == model:
                d["host"] = name
            g.add_node(rename[v], **d)
            self._parent[rename[v]], self._kind[rename[v]] = d["parent"], d["kind"]
        for v in inside:
            for u, e in adj[v].items():
                if u in rename and not g.has_edge(rename[v], rename[u]):  # inside, or the model's own uplink
                    g.add_edge(rename[v], rename[u], **e)
                    if not e["uplink"]:
                        self._peer_edges.append((rename[v], rename[u]))
        self._version += 1

    def _cached(self, name: str, build):
        """A derived index, rebuilt after any change."""
        hit = self._cache.get(name)
        if hit is None or hit[0] != self._version:
            hit = self._cache[name] = (self._version, build())
        return hit[1]

    # -- queries --------------------------------------------------------------------------------------------

    def kind(self, v: str) -> str:
        return self._kind[v]

    def parent(self, v: str) -> str | None:
        return self._parent[v]

    @property
    def parents(self) -> dict[str, str | None]:
        """Every vertex's parent (read-only by convention: change the graph through add and link)."""
        return self._parent

    def children(self, v: str) -> list[str]:
        return self.children_index().get(v, [])

    def children_index(self) -> dict[str, list[str]]:
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
        vs = list(self.subtree(under)) if under else list(self.graph.nodes)
        return [v for v in vs if self.slots(v) > 0]

    def slots(self, v: str) -> int:
        """Ranks v can host: 1 for a GPU, its slots for a socket or node without GPUs."""
        return 1 if self._kind[v] == "gpu" else int(self.graph.nodes[v].get("slots", 0))

    def capacity(self) -> int:
        """The ranks the machine runs when nothing else says: its placement's, else one per GPU or slot."""
        return len(self.placement) if self.placement is not None else sum(self.slots(d) for d in self.devices())

    def subtree(self, v: str):
        """v and every vertex below it, depth first."""
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
        seen = set(self.subtree(roots[0]))
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

    def peer_links(self) -> tuple[dict, dict]:
        """(across, leaving): across maps (container x, child c of x) to (GB/s of c's peer links to its
        siblings under x, the fastest such edge), each peer edge counted under the lowest vertex containing
        both ends; leaving maps a vertex to the GB/s of peer links from its subtree to the rest."""
        return self._cached("peers", self._index_peer_links)

    def _index_peer_links(self) -> tuple[dict, dict]:
        out: dict = {}
        leaving: dict[str, float] = {}
        adj, parent, depth = self.graph._adj, self._parent, self.depths()
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

    def depths(self) -> dict[str, int]:
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

    # -- JSON dump ------------------------------------------------------------------------------------------


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
        """A graph dump (``to_dict``); machine descriptions are read by ddl.topology.files.load."""
        if d.get("format") != FORMAT:
            raise TopologyError(f"not a {FORMAT} graph dump (machine descriptions: ddl.topology.load)")
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

    # -- the planner's view and pictures (ddl.topology.placement, ddl.topology.drawing) -----------------------

    def place(self, hosts: list[str] | None = None, nranks: int | None = None) -> list[str]:
        return placement.place(self, hosts, nranks)

    def hierarchy(self, ranks_placement: list[str]) -> tuple[list, list[LevelCost]]:
        return placement.hierarchy(self, ranks_placement)

    def tree_text(self, siblings: int = 3) -> str:
        return drawing.tree_text(self, siblings)

    def draw(self, path: str, siblings: int = 4) -> None:
        drawing.draw(self, path, siblings)


def _edge_fields(e: dict) -> dict:
    return {k: e[k] for k in ("kind", "links", "bandwidth", "latency", "measured") if k in e}
