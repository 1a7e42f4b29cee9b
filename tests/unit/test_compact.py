"""Compact machines (ddl.topology.compact) plan exactly as their full expansion does: the same tree, the same
level costs, the same plan for every size and the same program, step for step, on every rank checked. The
expected side is the expanded graph (ddl.topology.files.from_spec), the path every machine took before."""
import json

import pytest

from ddl import planner, topology
from ddl.errors import TopologyError
from ddl.topology.compact import CompactTopology
from ddl.topology.files import from_spec, machine_file
from ddl.topology.tree import Regular, nested

SIZES = (8, 1 << 20, 64 << 20)


def _gpu_node(gpus=4, sockets=2, parent="socket"):
    return {"sockets": sockets, "gpus": gpus, "gpu_parent": parent, "gpu_uplink": {"kind": "pcie4"},
            "gpu_link": {"kind": "nvlink3"}, "gpu_links": [[0, 1, 2]], "nic": {"kind": "ib_hdr"}}


SYNTHETIC = {
    # nodes x switches: whole, a last switch partly filled, a last switch of one node (padding), three levels
    "slots-whole": {"node": {"slots": 2, "nic": {"kind": "eth_25g"}}, "nodes": 6,
                    "switches": [{"level": "leaf", "fanout": 3, "uplink": {"kind": "eth_100g"}}, {"level": "top", "fanout": 3}]},
    "slots-partial": {"node": {"slots": 3, "nic": {"kind": "eth_25g"}}, "nodes": 8,
                      "switches": [{"level": "leaf", "fanout": 3, "uplink": {"kind": "eth_100g"}}, {"level": "top", "fanout": 3}]},
    "lone-node": {"node": {"slots": 2, "nic": {"kind": "eth_25g"}}, "nodes": 7,
                  "switches": [{"level": "leaf", "fanout": 3, "uplink": {"kind": "eth_10g"}}, {"level": "top", "fanout": 3}]},
    "sockets-slots": {"node": {"sockets": 2, "slots": 4, "nic": {"kind": "ib_edr"}}, "nodes": 4,
                      "switches": [{"level": "leaf", "fanout": 2, "uplink": {"kind": "ib_edr", "links": 2}},
                                   {"level": "spine", "fanout": 2, "uplink": {"kind": "ib_edr"}},
                                   {"level": "core", "fanout": 2}]},
    "gpus-named": {"node": _gpu_node(), "nodes": [{"name": f"gpu-host-{i}"} for i in range(5)],
                   "switches": [{"level": "rail", "fanout": 2, "uplink": {"kind": "ib_hdr", "links": 4},
                                 "names": "rail{index}"}, {"level": "spine", "fanout": 3}]},
    "nvswitch": {"node": _gpu_node(gpus=8, sockets=2, parent="nvswitch"), "nodes": 3,
                 "switches": [{"level": "leaf", "fanout": 3}]},
    "one-socket-gpus": {"node": _gpu_node(gpus=3, sockets=1), "nodes": 4,
                        "switches": [{"level": "leaf", "fanout": 4}]},
}


def _machines():
    out = {name: json.loads(machine_file(name).read_text()) for name in topology.library()}
    out.update({name: {"name": name, **d} for name, d in SYNTHETIC.items()})
    return out


MACHINES = _machines()


def _rank_counts(capacity: int, per_node: int) -> list[int]:
    wanted = {capacity, capacity - 1, capacity // 2 + 1, per_node + 1, 2, 1}
    return sorted(n for n in wanted if 1 <= n <= capacity)


def _same_plans(compact_tree, levels, expected_tree, expected_levels, nranks: int) -> None:
    assert nested(compact_tree) == expected_tree
    assert list(levels) == list(expected_levels)
    if not levels:
        return
    ranks = range(nranks) if nranks <= 64 else sorted({0, 1, nranks // 2, nranks - 2, nranks - 1})
    for n in SIZES:
        a, b = planner.choose(compact_tree, levels, n), planner.choose(expected_tree, expected_levels, n)
        assert (a.algorithms, a.shape, a.block_bytes, a.inflight) == (b.algorithms, b.shape, b.block_bytes,
                                                                      b.inflight)
        assert planner.explain(a, n).predicted == planner.explain(b, n).predicted
        count = max(1, a.block_bytes // 4)
        for r in ranks:
            assert planner.program(r, a, count) == planner.program(r, b, count), (n, r)


@pytest.mark.parametrize("name", [m for m in MACHINES if m != "summit"])
def test_compact_plans_equal_expanded(name):
    d = MACHINES[name]
    t, full = topology.load(d), from_spec(d)
    assert t.capacity() == full.capacity()
    if not isinstance(t, CompactTopology):  # explicit switches or a placement: expanded as before
        return
    per_node = t.capacity() // len(full.nodes())
    for nranks in _rank_counts(t.capacity(), per_node):
        tree, levels = t.hierarchy(t.place(None, nranks))
        expected_tree, expected_levels = full.hierarchy(full.place(None, nranks))
        _same_plans(tree, levels, expected_tree, expected_levels, nranks)
        assert list(t.place(None, nranks)) == full.place(None, nranks)


def test_summit_compact_equals_expanded_and_stays_compact():
    d = MACHINES["summit"]
    t, full = topology.load(d), from_spec(d)
    for nranks in (t.capacity(), 6 * 18 * 3 + 4):
        tree, levels = t.hierarchy(t.place(None, nranks))
        expected_tree, expected_levels = full.hierarchy(full.place(None, nranks))
        _same_plans(tree, levels, expected_tree, expected_levels, nranks)
    assert t.hierarchy(t.place(None, t.capacity()))[0] == Regular((3, 2, 18, 256))
    assert "graph" not in vars(t)  # planned from the numbers: nothing expanded
    assert t.graph.number_of_nodes() == full.graph.number_of_nodes()  # and expanded when asked


@pytest.mark.parametrize("order", ["packed", "round-robin", "skipping"])
def test_compact_follows_the_hosts_mpi_reports(order):
    d = MACHINES["gpus-named"]
    t, full = topology.load(d), from_spec(d)
    names = [f"gpu-host-{i}" for i in range(5)]
    hosts = {"packed": [h for h in names[:3] for _ in range(4)],
             "round-robin": [names[i % 3] for i in range(12)],
             "skipping": [h for h in (names[1], names[4]) for _ in range(3)]}[order]
    tree, levels = t.hierarchy(t.place(hosts, len(hosts)))
    expected_tree, expected_levels = full.hierarchy(full.place(hosts, len(hosts)))
    _same_plans(tree, levels, expected_tree, expected_levels, len(hosts))


def test_compact_refuses_what_the_expansion_refuses():
    base = {"name": "m", "node": {"slots": 2}, "nodes": 4, "switches": [{"level": "leaf", "fanout": 2}]}
    with pytest.raises(TopologyError, match="do not join 4 nodes"):
        topology.load(base)  # two leaf switches, nothing above to join them
    with pytest.raises(TopologyError, match="the same name"):
        topology.load({**base, "hostnames": "same", "switches": [{"level": "leaf", "fanout": 4}]})
    with pytest.raises(TopologyError, match="'a' is listed twice"):
        topology.load({**base, "nodes": [{"name": "a"}, {"name": "b"}, {"name": "a"}],
                       "switches": [{"level": "leaf", "fanout": 4}]})
    with pytest.raises(TopologyError, match="'x0' is defined twice"):  # a switch named like a node
        topology.load({**base, "hostnames": "x{index}", "switches": [{"level": "leaf", "fanout": 4,
                                                                      "names": "x{index}"}]})
    t = topology.load({**base, "switches": [{"level": "leaf", "fanout": 4}]})
    with pytest.raises(TopologyError, match="has 8 GPUs or slots for 9 ranks"):
        t.place(None, 9)
    with pytest.raises(TopologyError, match="rank 2: MPI runs it on host 'elsewhere'"):
        t.place(["node0", "node0", "elsewhere"], 3)
    with pytest.raises(TopologyError, match="rank 2: node 'node0' has no free GPU or slot"):
        t.place(["node0", "node0", "node0"], 3)


def test_a_placement_given_after_loading_is_followed():
    """ddl.cluster gives library machines a placement (rank -> node) after loading them; a compact machine then
    follows it as the expanded one does, round-robin included."""
    d = MACHINES["slots-whole"]
    t, full = topology.load(d), from_spec(d)
    order = [f"node{i % 6}" for i in range(12)]
    t.placement, full.placement = list(order), list(order)
    tree, levels = t.hierarchy(t.place(None, 12))
    expected_tree, expected_levels = full.hierarchy(full.place(None, 12))
    _same_plans(tree, levels, expected_tree, expected_levels, 12)
    assert tree == [[[0, 6], [1, 7], [2, 8]], [[3, 9], [4, 10], [5, 11]]]
