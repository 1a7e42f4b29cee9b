"""A topology as text (the containment tree with alike siblings folded) and as a picture (matplotlib)."""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import networkx as nx

from . import links
from ..errors import TopologyError

if TYPE_CHECKING:
    from .graph import Topology


def tree_text(t: Topology, siblings: int = 3) -> str:
    """The containment tree, one vertex per line; runs of siblings that look alike are folded into one
    line ("... and 4606 more like summit0001") after the first ``siblings``."""
    lines: list[str] = []
    root = t.roots()[0]

    def shape(v):
        return (t.kind(v), t.level_name(v), len(t.children(v)),
                tuple(sorted(Counter(t.kind(c) for c in t.children(v)).items())))

    def label(v):
        d = t.graph.nodes[v]
        bits = [f"{v} [{t.level_name(v)}]"]
        p = d["parent"]
        if p is not None:
            e = t.graph[v][p]
            bits.append(f"up {e['kind']}x{e['links']} {e['bandwidth']:g} GB/s {e['latency']:g} us"
                        + ((" (calibrated)" if e["measured"] == "calibrated" else " (measured)") if e.get("measured") else ""))
        peers = [(u, e) for u, e in t.graph[v].items() if not e["uplink"]]
        if peers:
            bits.append("peers " + ", ".join(f"{u.rsplit('/', 1)[-1]}:{e['kind']}x{e['links']}"
                                              for u, e in peers))
        if d["kind"] != "gpu" and t.slots(v):
            bits.append(f"{t.slots(v)} slots")
        return "  ".join(bits)

    def walk(v, indent):
        lines.append("  " * indent + label(v))
        kids = t.children(v)
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

def draw(t: Topology, path: str, siblings: int = 4) -> None:
    """A PNG of the containment tree and peer links (needs matplotlib: pip install ddl[draw]); large
    machines are drawn with the first ``siblings`` children of each vertex."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TopologyError("drawing needs matplotlib: pip install 'ddl[draw]'") from None
    keep, stack = [], [t.roots()[0]]
    while stack:
        v = stack.pop()
        keep.append(v)
        stack.extend(t.children(v)[:siblings])
    sub = t.graph.subgraph(keep)
    depth = {}
    for v in keep:
        d, u = 0, v
        while t.parent(u) is not None:
            u, d = t.parent(u), d + 1
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
                           node_color=[colors[t.kind(v)] for v in sub.nodes])
    nx.draw_networkx_labels(sub, pos, ax=ax, font_size=6,
                            labels={v: v.rsplit("/", 1)[-1] for v in sub.nodes})
    ax.set_title(f"{t.name}: {t.graph.number_of_nodes()} vertices (first {siblings} children each)")
    ax.axis("off")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
