"""The emulated cluster, end to end (root and network namespaces needed; skipped cleanly otherwise).

Topology awareness is proved by bytes, never by time: the tbf shapers count what crossed every link, and the
expected counts are closed forms of the algorithms (a two-rack allreduce moves n bytes each way over the
spine; one flat ring moves 2(p-1)/p * n over each of its two spine crossings).
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddl import cluster, planner

from ddl.cluster import spec as emulate

WHY = cluster.available()
pytestmark = [pytest.mark.skipif(WHY is not None, reason=str(WHY)), pytest.mark.timeout(300)]
JOB = str(Path(__file__).with_name("job.py"))
SIZE = 16 << 20


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def run_job(c: cluster.Cluster, tmp_path, *args) -> tuple[dict, dict]:
    """Runs job.py on the cluster; (rank 0's report, bytes each link carried during the job)."""
    report = tmp_path / f"report-{len(list(tmp_path.iterdir()))}.json"
    before = c.counters()
    done = c.mpirun([sys.executable, JOB, str(report), *map(str, args)], timeout=240, quiet=True, capture=True)
    after = c.counters()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    moved = {k: (after[k][0] - before[k][0], after[k][1] - before[k][1]) for k in after}
    return json.loads(report.read_text()), moved


def left_behind(*clusters) -> set[str]:
    """The namespaces of ``clusters`` still there (others' clusters may be up: tests run two at a time)."""
    return {ns for ns in namespaces() if any(ns.startswith(c.prefix) for c in clusters)}


def test_nodes_have_their_own_hostnames_and_everything_goes_on_exit():
    with cluster.Cluster("3,2,1") as c, cluster.Cluster("2x1") as d:  # two clusters side by side
        for i, host in enumerate(c.hosts):
            out = subprocess.run(c.exec_argv(host, ["hostname"]), capture_output=True, text=True, timeout=30)
            assert out.stdout.strip() == host
            # every node's name resolves on every node, to the i-th address (as gloo needs its own to)
            names = subprocess.run(c.exec_argv(host, ["getent", "hosts", *c.hosts]), capture_output=True,
                                   text=True, timeout=30).stdout.split()
            assert names == [w for k, h in enumerate(c.hosts) for w in (f"10.200.0.{k + 1}", h)]
        assert {c.ns(h) for h in c.hosts} | {d.ns(h) for h in d.hosts} <= namespaces()
        ping = subprocess.run(c.exec_argv("node2", ["ping", "-c", "1", "-W", "5", "10.200.0.1"]),
                              capture_output=True, text=True, timeout=30)
        assert ping.returncode in (0, 127), ping.stdout + ping.stderr  # 127: no ping installed
    assert left_behind(c, d) == set()
    assert not any(Path("/etc/netns", c.ns(h)).exists() for h in c.hosts)  # the name files go too


def test_an_error_inside_tears_the_cluster_down():
    c = cluster.Cluster("T1")
    with pytest.raises(RuntimeError, match="boom"):
        with c:
            assert left_behind(c)  # up
            raise RuntimeError("boom")
    assert left_behind(c) == set()


def test_a_job_past_its_deadline_is_killed_on_every_node():
    with cluster.Cluster("2x1") as c:
        started = time.monotonic()
        done = c.mpirun([sys.executable, "-c", "import time; time.sleep(600)"], timeout=3, quiet=True, capture=True)
        assert done.returncode != 0 and time.monotonic() - started < 60
        for h in c.hosts:
            pids = subprocess.run(["ip", "netns", "pids", c.ns(h)], capture_output=True, text=True).stdout.split()
            assert pids == [], f"{h} still runs {pids}"


@pytest.fixture(scope="module")
def racks(tmp_path_factory):
    with cluster.Cluster("T2") as c:
        yield c


def test_the_job_sees_the_emulated_hosts_and_switch_levels(racks, tmp_path):
    report, _ = run_job(racks, tmp_path)
    assert report["hosts"] == ["node0", "node0", "node1", "node1", "node2", "node2", "node3", "node3"]
    assert report["num_hosts"] == 4
    assert report["tree"] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert report["levels"] == ["node", "rack", "spine"]


def plan_bytes(spec: str, nbytes: int) -> list[float]:
    """What ddl's plan says one child sends over each level's links (node, rack, spine), for the whole call."""
    t = emulate.topology(spec)
    tree, levels = t.hierarchy(t.place(None, t.capacity()))
    plan = planner.choose(tree, levels, nbytes)
    _, phases = planner.predict(plan, nbytes)
    return planner.link_bytes(planner.Shape.of(tree), levels, phases)


def test_spine_bytes_match_the_plan_and_stay_far_below_a_flat_ring(racks, tmp_path):
    _, ddl_bytes = run_job(racks, tmp_path, SIZE, "auto")
    _, ring_bytes = run_job(racks, tmp_path, SIZE, "flat-ring")
    predicted = plan_bytes("T2", SIZE)
    for rack in ("rack0", "rack1"):
        up, down = ddl_bytes[rack]
        # The plan: one rack sends predicted[2] bytes up its uplink; closed form: two racks allreduce n.
        assert abs(up - predicted[2]) <= 0.10 * predicted[2], (rack, up, predicted[2])
        assert abs(up - SIZE) <= 0.10 * SIZE and abs(down - SIZE) <= 0.10 * SIZE, (rack, up, down)
        # One flat ring in rank order crosses the spine once each way, with 2(p-1)/p * n on each crossing.
        ring_up = ring_bytes[rack][0]
        assert ring_up >= 0.95 * 2 * 7 / 8 * SIZE, (rack, ring_up)
        assert up <= 0.65 * ring_up, (rack, up, ring_up)
    for node in ("node0", "node1", "node2", "node3"):
        # A node: the rack level's reduce-scatter and allgather (n/2 each) plus half of its rack's n: 1.5 n.
        assert abs(ddl_bytes[node][0] - predicted[1]) <= 0.10 * predicted[1], (node, ddl_bytes[node])
        assert abs(ddl_bytes[node][0] - 1.5 * SIZE) <= 0.10 * 1.5 * SIZE, (node, ddl_bytes[node])


def test_round_robin_numbering_does_not_grow_ddls_traffic(racks, tmp_path):
    _, packed = run_job(racks, tmp_path, SIZE, "auto")
    with cluster.Cluster("2x2x2:nic=1gbit:uplink=500mbit:order=round-robin") as rr:
        report, spread = run_job(rr, tmp_path, SIZE, "auto")
    assert report["hosts"] == ["node0", "node1", "node2", "node3"] * 2
    for link in packed:
        assert spread[link][0] <= 1.10 * packed[link][0] and spread[link][1] <= 1.10 * packed[link][1], \
            (link, spread[link], packed[link])


def test_uneven_nodes_carry_the_closed_form(tmp_path):
    """3, 2 and 1 ranks behind one switch: ddl reduces inside each node first, so every node sends
    2(3-1)/3 * n over its NIC whatever its rank count (each of its ranks a share)."""
    with cluster.Cluster("3,2,1") as c:
        report, moved = run_job(c, tmp_path, SIZE, "auto")
    assert report["levels"] == ["node", "switch"]
    for node in ("node0", "node1", "node2"):
        assert abs(moved[node][0] - 4 / 3 * SIZE) <= 0.10 * 4 / 3 * SIZE, (node, moved[node])


@pytest.mark.parametrize("shape", ["2x2", "3,2,1"])
def test_small_calls_cross_hosts_through_their_first_ranks_and_mismatches_raise_everywhere(shape, tmp_path):
    """The agreement round, which small collectives ride in, goes up to each host's first rank and across hosts
    between those only (ddl.schedule.algorithms.leader_allreduce; an allgather's parts each once in its messages,
    a reduce-scatter's vector halved between hosts); known calls give numpy's answers on their short path, uneven
    rows included, and a rank that calls differently makes every rank raise MismatchError naming both calls."""
    with cluster.Cluster(shape) as c:
        done = c.mpirun([sys.executable, str(Path(JOB).with_name("small_calls_job.py")), str(tmp_path / "r")],
                        timeout=240, quiet=True, capture=True)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        reports = [json.loads((tmp_path / f"r.{r}").read_text()) for r in range(c.nranks)]
    assert len({r["host"] for r in reports}) == len(c.hosts)
    for r in reports:
        assert r["agreement"] == "leader" and r["gathered"] == "leader allgather" and r["wrong"] == []
        assert r["scattered"] == "leader reduce-scatter"
        assert "broadcast(shape=(3,)" in r["raised"] and "allgather(shape=(*, 3)" in r["raised"], r["raised"]


def test_ddl_cluster_command_line(tmp_path):
    env = {**os.environ, "DDL_CLUSTER_STATE": str(tmp_path / "state")}
    cli = [sys.executable, "-m", "ddl.tools.cluster"]
    run = lambda *a: subprocess.run([*cli, *a], capture_output=True, text=True, timeout=120, env=env)
    up = run("up", "2x1", "--name", "clitest")
    assert up.returncode == 0, up.stderr
    try:
        assert "clitest" in run("status").stdout
        assert run("exec", "clitest", "node1", "--", "hostname").stdout.strip() == "node1"
        job = run("run", "clitest", "--", sys.executable, "-c",
                  "import sys; from mpi4py import MPI; "
                  "sys.stdout.write(f'{MPI.COMM_WORLD.rank} {MPI.Get_processor_name()}\\n')")  # one write a line
        assert sorted(job.stdout.splitlines()) == ["0 node0", "1 node1"], job.stdout + job.stderr
        assert run("up", "2x1", "--name", "clitest").returncode == 2  # the name is taken
    finally:
        down = run("down", "clitest")
    assert down.returncode == 0 and not any(ns.startswith("ddl-clitest-") for ns in namespaces())
    assert "no emulated clusters" in run("status").stdout


def test_ddlrun_emulate_runs_the_job_on_the_emulated_hosts():
    out = subprocess.run([sys.executable, "-m", "ddl.tools.ddlrun", "--emulate", "3,1", sys.executable, "-c",
                          "import sys, ddl; c = ddl.init(); "
                          "sys.stdout.write(f'hosts {ddl.num_hosts()} levels {len(c.levels)}\\n')"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("hosts 2 levels 2") == 4


def test_ddlrun_emulate_checks_the_hosts_and_gives_every_rank_its_place(tmp_path):
    report = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "launch", "rank_report.py")
    out = subprocess.run([sys.executable, "-m", "ddl.tools.ddlrun", "-v", "--emulate", "2x2", sys.executable, report,
                          str(tmp_path), "ok"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "check node0: {" in out.stderr and "check node1: {" in out.stderr  # probed through the agent
    got = {}
    for r in range(4):
        with open(tmp_path / f"rank{r}.json") as f:
            got[r] = json.load(f)
    for r, info in got.items():
        assert info["host"] == f"node{r // 2}" and info["LOCAL_RANK"] == str(r % 2)
        assert info["GROUP_RANK"] == str(r // 2) and info["LOCAL_WORLD_SIZE"] == "2"
        assert info["DDL_OPTIONS"] == "-mode p:2x2x1x1" and info["DDL_HOST_LIST"] == "node0:0,1;node1:2,3"
        assert info["DDL_TOPOLOGY"].endswith("topology.json") and info["sum"] == [10.0] * 4
