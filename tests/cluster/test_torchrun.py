"""torchrun on every node of an emulated two-rack cluster, meeting through a c10d rendezvous, no MPI launcher and
no topology given: ddl's ranks join through torchrun's store, learn their hosts, and the probe finds the racks,
as under mpirun (tests/cluster/test_probe.py). Only on MPICH 4, whose separately started processes can connect."""
import json
import sys
from pathlib import Path

import pytest

from ddl import cluster
from ddl.core import bootstrap
from test_probe import canonical, host_groups, rank_groups

WHY = cluster.available()
JOINS = bootstrap.can_join()
pytestmark = [pytest.mark.skipif(WHY is not None, reason=str(WHY)),
              pytest.mark.skipif(not JOINS, reason="separately started processes join only on MPICH 4"),
              pytest.mark.timeout(400)]
pytest.importorskip("torch")
JOB = str(Path(__file__).with_name("job.py"))


def unordered(tree):
    """The tree with every group's members sorted (c10d numbers the nodes in the order they arrive)."""
    return tree if isinstance(tree, str) else sorted((unordered(t) for t in tree), key=json.dumps)


def test_torchrun_on_each_node_finds_the_racks(tmp_path):
    spec = "2x2x2:nic=200mbit:uplink=100mbit"
    report = tmp_path / "report.json"
    env = {"DDL_PROBE_CACHE": str(tmp_path / "cache"), "DDL_PROBE_BUDGET": "40"}
    with cluster.Cluster(spec) as c:
        done = c.torchrun([JOB, str(report), str(1 << 20)], env=env, timeout=300)
        want = unordered(canonical(host_groups(c.topology)))
    assert [d.returncode for d in done] == [0] * len(done), "\n".join(d.stderr[-2000:] for d in done)
    seen = json.loads(report.read_text())
    assert sorted(seen["hosts"]) == sorted(c.rank_hosts) and seen["num_hosts"] == 4
    assert unordered(canonical(rank_groups(seen["tree"], seen["hosts"]))) == want
    assert seen["levels"] == ["node", "leaf", "spine"]
