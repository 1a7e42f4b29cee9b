"""The topology model, the machine library, discovery and ddl-topo: every machine loads, validates and
plans; level costs follow the files' figures; JSON round-trips; bad files and contradictions give clear
errors naming what and which rank."""
import json

import pytest

from ddl import planner, topology

from ddl.topology import discover

from ddl.topology import links

from ddl.tools import topo as topo_cli
from ddl.schedule.check import check
from ddl.errors import TopologyError
from ddl.topology.tree import leaves
from ddl.schedule import Collective, Schedule

SMALL = [m for m in topology.library() if m not in ("summit", "dgx-h100-superpod")]


@pytest.fixture(scope="module")
def summit():
    return topology.load("summit")


def test_the_library_holds_the_machines_the_issue_names():
    assert {"summit", "summit-node", "dgx1", "dgx-h100", "emulated-2x2", "emulated-uneven",
            "emulated-racks"} <= set(topology.library())


@pytest.mark.parametrize("name", topology.library())
@pytest.mark.parametrize("nbytes", [8, 1 << 20, 256 << 20])
@pytest.mark.timeout(600)  # Summit is planned at 27,648 ranks: slow on a busy 2-core machine
def test_every_machine_loads_validates_and_plans(name, nbytes, summit):
    t = summit if name == "summit" else topology.load(name)
    tree, levels = t.hierarchy(t.place(None, t.capacity()))
    assert sorted(leaves(tree)) == list(range(t.capacity()))
    plan = planner.choose(tree, levels, nbytes)
    seconds, _ = planner.predict(plan, nbytes)
    bound, _ = planner.lower_bound(planner.Shape.of(tree), levels, nbytes)
    assert seconds >= bound > 0


@pytest.mark.parametrize("name", SMALL)
def test_small_machines_plans_pass_the_checker(name):
    t = topology.load(name)
    p = t.capacity()
    tree, levels = t.hierarchy(t.place(None, p))
    for nbytes, count in ((8, 2), (1 << 20, 1001)):
        plan = planner.choose(tree, levels, nbytes)
        check(Schedule(Collective.ALLREDUCE, "x", p, count, tuple(planner.program(r, plan, count) for r in range(p))))


def test_summit_levels_follow_the_file():
    """Triads of V100 (2 NVLink bricks of 25 GB/s to each of 2 peers), X-Bus between sockets, dual-rail EDR
    per node, 18 nodes per rack, 256 racks."""
    t = topology.load("summit-node")
    tree, levels = t.hierarchy(t.place(None, 6))
    assert tree == [[0, 1, 2], [3, 4, 5]]
    assert [(lv.name, lv.link, lv.via) for lv in levels] == [("socket", "nvlink2", "peer"), ("node", "xbus", "peer")]
    assert levels[0].bandwidth == 2 * 2 * 25e9 and levels[1].bandwidth == 64e9


def test_summit_cluster_shape(summit):
    assert len(summit.nodes()) == 4608 and len(summit.devices()) == 27_648
    tree, levels = summit.hierarchy(summit.place(None, 27_648))
    shape = planner.Shape.of(tree)
    assert shape.sizes == ((3,), (2,), (18,), (256,))
    assert [lv.name for lv in levels] == ["socket", "node", "rack", "core"]
    assert levels[2].link == "ib_edr" and levels[2].bandwidth == 2 * 12.5e9 and levels[2].via == "uplink"
    text = summit.tree_text()
    assert "... and 15 more like summit0000" in text and "... and 253 more like rack" in text


def test_nodes_copied_from_the_first_equal_nodes_built_one_by_one():
    """Regular machines copy the first node in bulk; the graph must be what building each node gives."""
    copied = topology.load("emulated-racks")
    d = json.loads(topology.machine_file("emulated-racks").read_text())
    d["nodes"] = [{"name": f"node{i}", "slots": 2} for i in range(4)]  # an override: built one by one
    built = topology.load(d)
    assert dict(copied.graph.nodes(data=True)) == dict(built.graph.nodes(data=True))
    assert {frozenset(e[:2]): e[2] for e in copied.graph.edges(data=True)} == \
        {frozenset(e[:2]): e[2] for e in built.graph.edges(data=True)}
    gpus = topology.load(dict(json.loads(topology.machine_file("summit").read_text()),
                              nodes=3, switches=[{"level": "rack", "fanout": 3}]))
    one_by_one = topology.load(dict(json.loads(topology.machine_file("summit").read_text()),
                                    nodes=[{"name": f"summit{i:04d}", "gpus": 6} for i in range(3)],
                                    switches=[{"level": "rack", "fanout": 3}]))
    assert dict(gpus.graph.nodes(data=True)) == dict(one_by_one.graph.nodes(data=True))
    assert {frozenset(e[:2]): e[2] for e in gpus.graph.edges(data=True)} == \
        {frozenset(e[:2]): e[2] for e in one_by_one.graph.edges(data=True)}
    assert sorted(map(sorted, gpus._peer_edges)) == sorted(map(sorted, one_by_one._peer_edges))


def test_dgx1_hybrid_cube_mesh():
    t = topology.load("dgx1")
    for g in range(8):  # six NVLink bricks per V100
        assert sum(e["links"] for _, _, e in t.graph.edges(f"dgx1-0/gpu{g}", data=True) if e["kind"] == "nvlink2") == 6
    tree, levels = t.hierarchy(t.place(None, 8))
    assert tree == [[0, 1, 2, 3], [4, 5, 6, 7]] and levels[1].link == "nvlink2"


def test_round_robin_placement_is_followed():
    t = topology.load("emulated-uneven")
    tree, levels = t.hierarchy(t.place(None, 6))
    assert tree == [[0, 3, 5], [1, 4], [2]]
    assert [lv.link for lv in levels] == ["shm", "veth"]


def test_json_round_trip_keeps_the_graph_and_the_plan():
    for name in ("summit-node", "emulated-racks", "dgx-h100"):
        t = topology.load(name)
        again = topology.load(t.to_json())
        assert set(again.graph.nodes) == set(t.graph.nodes)
        assert sorted(map(sorted, again.graph.edges)) == sorted(map(sorted, t.graph.edges))
        assert all(again.graph.edges[e] == t.graph.edges[e] for e in t.graph.edges)
        n = t.capacity()
        assert again.hierarchy(again.place(None, n)) == t.hierarchy(t.place(None, n))


def test_png_drawing(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "dgx1.png"
    topology.load("dgx1").draw(str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def spec(**over):
    d = {"name": "t", "node": {"slots": 2, "nic": {"kind": "veth"}}, "nodes": 2, "hostnames": "h{index}",
         "switches": [{"level": "leaf", "fanout": 2}]}
    d.update(over)
    return d


@pytest.mark.parametrize("over, message", [
    ({"node": {"slots": 2, "nic": {"kind": "warp"}}}, "node.nic.kind: must be one of nvlink1, .*, not \"warp\""),
    ({"node": {"nic": {"kind": "veth"}}}, "needs gpus or slots"),
    ({"switches": []}, "2 nodes need switches"),
    ({"switches": [{"level": "leaf", "fanout": 1}]}, "switches: fanouts 1 do not join 2 nodes"),
    ({"node": {"slots": 2, "nic": {"kind": "veth", "bandwidth": -1}}}, "node.nic.bandwidth: must be > 0"),
    ({"nodes": [{"name": "a", "slots": 1, "switch": "nowhere"}], "switches": [{"name": "s", "level": "leaf"}]},
     r"nodes\[0\].switch: no switch named 'nowhere'"),
])
def test_bad_machine_files_are_refused_clearly(over, message):
    with pytest.raises(TopologyError, match=message):
        topology.load(spec(**over))


def test_bad_json_and_missing_files():
    with pytest.raises(TopologyError, match="not valid JSON"):
        topology.load("{nope")
    with pytest.raises(TopologyError, match="no topology file 'no-such-machine'"):
        topology.load("no-such-machine")


def test_contradictions_with_what_mpi_sees_name_the_rank():
    t = topology.load(spec())
    assert t.place(["h0", "h0", "h1", "h1"]) == ["h0", "h0", "h1", "h1"]
    with pytest.raises(TopologyError, match="rank 2: MPI runs it on host 'elsewhere'"):
        t.place(["h0", "h0", "elsewhere"])
    with pytest.raises(TopologyError, match="rank 2: node 'h0' has no free GPU or slot"):
        t.place(["h0", "h0", "h0"])
    placed = topology.load(spec(placement=["h0", "h1", "h0", "h1"]))
    with pytest.raises(TopologyError, match="places 4 ranks but MPI runs 3"):
        placed.place(None, 3)
    with pytest.raises(TopologyError, match="places ranks 0 and 2 on node 'h0', but MPI runs them on different"):
        placed.place(["a", "a", "b", "b"], 4)
    with pytest.raises(TopologyError, match="rank 1: placed on 'h9'"):
        topology.load(spec(placement=["h0", "h9"])).place(None, 2)


def test_discovery_builds_racks_and_aisles_from_the_launcher():
    reports = [{"host": f"h{r % 5}", "numa": None, "gpus": []} for r in range(10)]
    t = discover.build(reports, {"DDL_NODES": "2", "DDL_RACKS": "2"})
    tree, levels = t.hierarchy(t.place([r["host"] for r in reports], 10))
    assert [lv.name for lv in levels] == ["node", "rack", "aisle", "network"]
    assert tree[0] == [[[0, 5], [1, 6]], [[2, 7], [3, 8]]]
    with pytest.raises(TopologyError, match="DDL_AISLES=3"):
        discover.build(reports, {"DDL_NODES": "2", "DDL_RACKS": "2", "DDL_AISLES": "3"})
    with pytest.raises(TopologyError, match="DDL_NODES='x'"):
        discover.build(reports, {"DDL_NODES": "x"})


def test_discovery_uses_numa_and_nvml_reports():
    numa = [{"host": "a", "numa": r % 2, "gpus": []} for r in range(4)]
    t = discover.build(numa, {})
    tree, levels = t.hierarchy(t.place(None, 4))
    assert tree == [[0, 2], [1, 3]] and levels[-1].link == "upi"
    gpus = [{"bus": f"b{i}", "nvlink": {f"b{j}": 2 for j in range(4) if j != i}} for i in range(4)]
    t = discover.build([{"host": "g", "numa": None, "gpus": gpus}] * 4, {})
    tree, levels = t.hierarchy(t.place(None, 4))
    assert tree == [0, 1, 2, 3] and levels[0].link == "nvlink2" and levels[0].bandwidth == 3 * 2 * 25e9


def test_discovery_without_a_driver_is_clean():
    assert isinstance(discover.nvml_gpus(), list)  # [] here: no NVML, no error


def test_link_table_is_one_ordered_list():
    assert [k.name for k in links.LINK_KINDS] == list(links.ORDER)
    assert links.ORDER["nvlink2"] < links.ORDER["xbus"] < links.ORDER["pcie3"] < links.ORDER["ib_edr"]
    with pytest.raises(ValueError, match="unknown link kind"):
        links.kind("carrier-pigeon")


def test_ddl_topo_explains_dumps_and_loads(tmp_path, capsys):
    plan_file, graph_file = tmp_path / "plan.json", tmp_path / "graph.json"
    assert topo_cli.main(["summit-node", "--plan", "64M", "--dump-plan", str(plan_file),
                          "--dump", str(graph_file)]) == 0
    out = capsys.readouterr().out
    assert "lower bound" in out and "predicted efficiency" in out and "socket" in out and "xbus" in out
    plan = planner.Plan.from_dict(json.loads(plan_file.read_text()))
    assert plan.tree == [[0, 1, 2], [3, 4, 5]]
    assert topo_cli.main([str(graph_file), "--quiet", "--plan", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ranks"] == 6
    assert topo_cli.main(["no-such-machine"]) == 2
    assert "no topology file" in capsys.readouterr().err
