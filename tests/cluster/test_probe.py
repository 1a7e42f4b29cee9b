"""The probe on emulated clusters, launched as a plain mpirun would be: no DDL_TOPOLOGY, no tiers. The grouping
it finds must be the cluster's own; a flat switch must stay one level. Rates are kept low enough that this
2-core machine carries every shaped link at full rate under the probe's concurrent rounds (checked: on a flat
switch of 8 nodes at 100 Mbit/s every pair measured 94-99 Mbit/s)."""
import json
import sys
from pathlib import Path

import pytest

from ddl import cluster
from ddl.cluster import spec as emulate

WHY = cluster.available()
pytestmark = [pytest.mark.skipif(WHY is not None, reason=str(WHY)), pytest.mark.timeout(300)]
JOB = str(Path(__file__).with_name("job.py"))


def host_groups(topology) -> list:
    """The spec's switch tree over hosts, innermost groups deepest (what the probe should find)."""
    t = topology

    def walk(v):
        kids = t.children(v)
        if t.kind(v) == "node":
            return t.graph.nodes[v].get("host", v)
        return [walk(k) for k in kids]
    return walk(t.roots()[0])


def found_by_probe(spec: str, tmp_path, extra_env=None, size=1 << 20, times=1) -> tuple[dict, str]:
    report = tmp_path / "report.json"
    env = {"DDL_PROBE_CACHE": str(tmp_path / "cache"), "DDL_PROBE_BUDGET": "40", "DDL_OPTIONS": "-dbg_level 1",
           **(extra_env or {})}
    with cluster.Cluster(spec) as c:
        done = c.mpirun([sys.executable, JOB, str(report), str(size), "auto", str(times)], timeout=240, quiet=True,
                        capture=True, tell_topology=False, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(report.read_text()), done.stderr


def rank_groups(tree, hosts_of_rank):
    """A tree of ranks as the same tree of host names (a node's ranks collapse to its host)."""
    if isinstance(tree, int):
        return hosts_of_rank[tree]
    kids = [rank_groups(t, hosts_of_rank) for t in tree]
    if all(isinstance(k, str) for k in kids) and len(set(kids)) == 1:
        return kids[0]  # one node's ranks (however the tree pads them)
    return kids


def canonical(tree):
    """A group of one is its member (a switch over one node adds no level)."""
    if isinstance(tree, str):
        return tree
    kids = [canonical(t) for t in tree]
    return kids[0] if len(kids) == 1 else kids


@pytest.mark.parametrize("spec", [
    "2x2x1:nic=200mbit:uplink=100mbit",                      # two racks behind a slower uplink
    "2x2x2x1:nic=100mbit:uplink=100mbit:aisle=25mbit",       # three tiers: aisles of racks, 8 nodes
    "3,1/2:nic=100mbit:uplink=50mbit",                       # racks of unequal size
    "2x2x2:nic=200mbit:uplink=200mbit:order=round-robin",    # 2:1 oversubscribed, ranks round-robin
])
def test_probe_finds_the_clusters_switch_levels(spec, tmp_path):
    report, log = found_by_probe(spec, tmp_path)
    want = host_groups(emulate.topology(spec))
    assert canonical(rank_groups(report["tree"], report["hosts"])) == canonical(want), log
    assert "probe measured" in log


def test_flat_switch_stays_one_level_and_the_cache_serves_the_next_job(tmp_path):
    report, log = found_by_probe("8x1:nic=100mbit", tmp_path)
    assert report["tree"] == list(range(8)) and "1 level(s)" in log, log
    again, log2 = found_by_probe("8x1:nic=100mbit", tmp_path)
    assert again["tree"] == report["tree"] and "probe cached, verified against the network" in log2, log2


@pytest.mark.full  # CI runs the doubted cache measured again (test_a_plan_far_below_its_prediction...)
def test_a_cache_from_another_network_with_the_same_names_is_measured_again(tmp_path):
    """Issue 31's stale memory: a job on four hosts behind one switch, then four hosts of the same names in two
    racks behind a slower uplink. The second job must not plan over the flat tree it finds in the cache."""
    flat, _ = found_by_probe("4x1:nic=200mbit", tmp_path, {"DDL_PROBE": "1"})
    assert canonical(rank_groups(flat["tree"], flat["hosts"])) == ["node0", "node1", "node2", "node3"]
    racks = "2x2x1:nic=200mbit:uplink=50mbit"
    want = canonical(host_groups(emulate.topology(racks)))
    report, log = found_by_probe(racks, tmp_path, {"DDL_PROBE": "1"})
    assert "does not match the network" in log and "measuring again" in log and "probe measured" in log, log
    assert canonical(rank_groups(report["tree"], report["hosts"])) == want, log
    again, log = found_by_probe(racks, tmp_path, {"DDL_PROBE": "1"})  # the new result serves the next job
    assert "verified against the network" in log and canonical(rank_groups(again["tree"], again["hosts"])) == want


def test_a_probe_past_its_budget_falls_back_to_hosts(tmp_path):
    report, log = found_by_probe("2x2x1:nic=200mbit:uplink=100mbit", tmp_path, {"DDL_PROBE_BUDGET": "0.05"})
    assert "past its budget" in log and "falling back" in log
    assert report["tree"] == [0, 1, 2, 3]  # hosts alone: one switch


def test_a_plan_far_below_its_prediction_says_so_and_its_cache_is_measured_again(tmp_path):
    """A cached result claiming links 20x faster than they are, trusted as it is (DDL_PROBE=trust: no
    verification): the job's first allreduces run far below what its plan predicts, rank 0 says so and marks the
    cache doubtful; the next job measures afresh instead of verifying it, and plans right."""
    spec = "2x2x1:nic=200mbit:uplink=100mbit"
    first, _ = found_by_probe(spec, tmp_path)
    (entry,) = (tmp_path / "cache").glob("probe-*.json")
    cached = json.loads(entry.read_text())
    for level in cached["levels"]:
        level["bandwidth"] *= 20
    entry.write_text(json.dumps(cached))
    report, log = found_by_probe(spec, tmp_path, {"DDL_PROBE": "trust", "DDL_OPTIONS": ""}, 4 << 20, 8)
    assert "plan check: allreduce of 4 MiB" in log and "far below the prediction" in log, log
    assert "is marked doubtful: the next job over them measures afresh" in log, log
    assert "plan check: allreduce of 4 MiB" in json.loads(entry.read_text())["doubtful"]
    again, log = found_by_probe(spec, tmp_path, {"DDL_PROBE": "1"}, 4 << 20, 8)
    assert "was marked doubtful by a job" in log and "probe measured" in log, log
    assert "far below" not in log and again["tree"] == first["tree"], log
    assert "plan check: allreduce of 4 MiB" in log  # -dbg_level 1: the check reported when it holds too
