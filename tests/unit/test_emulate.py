"""Emulated-cluster specs, launch command lines and the cluster's wiring plan: pure, no root needed."""
import types

import pytest

from ddl import cluster

from ddl.tools import ddlrun

from ddl.cluster import emulated, spec as emulate

from ddl.runner import mpirun, supervise
from ddl.errors import DDLError, TopologyError


def hosts_of(t):
    return [t.host_of(p) or p for p in t.placement]


@pytest.mark.parametrize("spec,placement", [
    ("T1", ["node0", "node0", "node1", "node1", "node2", "node2", "node3", "node3"]),
    ("T4", ["node0", "node1", "node2", "node3"] * 2),
    ("T3", ["node0"] * 3 + ["node1"] * 2 + ["node2"]),
    ("3,2,1:order=round-robin", ["node0", "node1", "node2", "node0", "node1", "node0"]),
    ("2x3", ["node0"] * 3 + ["node1"] * 3),
    ("1x2", ["node0", "node0"]),
])
def test_specs_place_ranks_packed_or_round_robin(spec, placement):
    assert hosts_of(emulate.topology(spec)) == placement


def test_racks_get_a_spine_and_the_rates_given():
    t = emulate.topology("T2")
    g = t.graph
    assert t.parent("rack0") == "spine" and t.parent("node2") == "rack1"
    assert g.edges["node0", "rack0"]["bandwidth"] == pytest.approx(1e9 / 8 / 1e9)
    assert g.edges["rack1", "spine"]["bandwidth"] == pytest.approx(500e6 / 8 / 1e9)
    tree, levels = t.hierarchy(t.place(None, 8))
    assert tree == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert [lv.name for lv in levels] == ["node", "rack", "spine"]
    uneven = emulate.topology("3,2/1:nic=100mbit")
    assert [uneven.parent(n) for n in uneven.nodes()] == ["rack0", "rack0", "rack1"]
    assert uneven.graph.edges["rack1", "spine"]["bandwidth"] == pytest.approx(100e6 / 8e9)  # uplink = nic


def test_a_library_file_is_a_spec_too():
    assert hosts_of(emulate.topology("emulated-uneven")) == ["node0", "node1", "node2", "node0", "node1", "node0"]
    assert hosts_of(emulate.topology("emulated-2x2")) == ["node0", "node0", "node1", "node1"]


@pytest.mark.parametrize("text,bps", [("1gbit", 10**9), ("500mbit", 5 * 10**8), ("2.5gbit", 25 * 10**8),
                                      ("100 kbit", 10**5)])
def test_rates_read_as_tc_writes_them(text, bps):
    assert emulate.bits_per_second(text) == bps


@pytest.mark.parametrize("spec,message", [
    ("2x2x2x2x2", "the shape is"), ("0x2", "every rack needs"), ("2,0", "every rack needs"),
    ("4x2:nic=fast", "bad rate"), ("4x2:speed=1gbit", "bad option"), ("4x2:order=random", "order is"),
    ("4x2:nic=10kbit", "too slow"), ("65x1", "more than 64"), ("no-such-machine", "no topology file"),
    ("emulated-racks:nic=1gbit", "options"),
])
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(TopologyError, match=message):
        emulate.topology(spec)


def test_open_mpi_command_follows_the_placement(monkeypatch):
    monkeypatch.setattr(mpirun, "flavor", lambda exe: "openmpi")
    cmd, env = mpirun.cluster_command("/v/bin/mpiexec", ["n0", "n1", "n0"], "/w/agent.sh", ["python", "x.py"],
                                      forward=["DDL_TOPOLOGY"], timeout=60)
    assert cmd == ["/v/bin/mpiexec", "-n", "3", "--host", "n0,n1,n0", "--map-by", "seq", "--bind-to", "none",
                   "--prtemca", "plm_ssh_agent", "/w/agent.sh", "--prtemca", "oob_tcp_if_include", "eth0",
                   "--mca", "pml", "ob1", "--mca", "btl", "self,sm,tcp", "--mca", "btl_tcp_if_include", "eth0",
                   "--mca", "mpi_yield_when_idle", "1", "-x", "DDL_TOPOLOGY", "--timeout", "60", "python", "x.py"]
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"


def test_mpich_command_keeps_traffic_on_the_links(monkeypatch):
    monkeypatch.setattr(mpirun, "flavor", lambda exe: "mpich")
    cmd, env = mpirun.cluster_command("/v/bin/mpiexec", ["n0", "n0", "n1"], "/w/agent.sh", ["prog"], timeout=60)
    assert cmd == ["/v/bin/mpiexec", "-launcher", "ssh", "-launcher-exec", "/w/agent.sh", "-iface", "eth0",
                   "-hosts", "n0:2,n1:1", "-n", "3", "-genv", "MPICH_CH4_NETMOD", "ofi",
                   "-genv", "FI_PROVIDER", "tcp", "-genv", "FI_TCP_IFACE", "eth0", "prog"]
    assert env == {"MPIEXEC_TIMEOUT": "60"}


def test_mpich_over_ucx_keeps_ucx_on_tcp_over_the_links(monkeypatch):
    monkeypatch.setattr(mpirun, "flavor", lambda exe: "mpich")
    cmd, _ = mpirun.cluster_command("/v/bin/mpiexec", ["n0", "n1"], "/w/agent.sh", ["prog"], mpich_tcp="ucx")
    assert cmd[cmd.index("-n") + 2:] == ["-genv", "MPICH_CH4_NETMOD", "ucx", "-genv", "UCX_TLS", "tcp,self",
                                         "-genv", "UCX_NET_DEVICES", "eth0", "prog"]
    with pytest.raises(DDLError, match="'verbs': ofi or ucx"):
        mpirun.mpich_tcp_env("verbs", "eth0")


def test_mpich_gets_each_host_once():
    """Hydra makes a host named twice two nodes sharing no memory: round-robin goes as hosts without counts."""
    assert mpirun._hydra_hosts(["n0", "n1", "n0", "n1"]) == "n0,n1"
    assert mpirun._hydra_hosts(["n0", "n0", "n0", "n1"]) == "n0:3,n1:1"
    with pytest.raises(ValueError, match="use Open MPI"):
        mpirun._hydra_hosts(["n0", "n1", "n2", "n0", "n1", "n0"])  # round-robin over uneven nodes


def test_the_wiring_plan_shapes_every_link_at_its_rate_without_touching_the_system():
    c = cluster.Cluster("T2", name="unit")
    assert c.hosts == ["node0", "node1", "node2", "node3"] and c.nranks == 8
    assert c.rank_hosts == ["node0", "node0", "node1", "node1", "node2", "node2", "node3", "node3"]
    links = {link.child: link for link in c.links}
    assert set(links) == {"node0", "node1", "node2", "node3", "rack0", "rack1"}
    assert links["node2"].up == ("ddl-unit-node2", "eth0") and links["node2"].parent == "rack1"
    assert links["node2"].bps == 10**9 and links["rack0"].bps == 5 * 10**8
    assert links["rack0"].up[0] == links["rack0"].down[0] == "ddl-unit-sw"
    assert not c._up  # nothing was built
    with pytest.raises(cluster.ClusterError, match="lower-case"):
        cluster.Cluster("T1", name="Bad Name")
    with pytest.raises(cluster.ClusterError, match="has no host"):
        c.exec_argv("node9", ["true"])


def test_the_agent_refuses_odd_host_names():
    assert "*[!a-z0-9-]*" in cluster.AGENT  # a name such as 'a;rm -rf ~' never reaches the shell line


def test_ddlrun_dry_run_prints_the_emulated_command(capsys, monkeypatch):
    monkeypatch.setattr(mpirun, "flavor", lambda exe: "openmpi")
    assert ddlrun.main(["--emulate", "T4", "--dry-run", "-m", "p", "python", "train.py"]) == 0
    err = capsys.readouterr().err
    assert "--host node0,node1,node2,node3,node0,node1,node2,node3" in err and "-x 'DDL_OPTIONS=-mode p'" in err
    assert "DDL_HOST_LIST=node0:0,4;node1:1,5;node2:2,6;node3:3,7" in err and "-x DDL_TOPOLOGY" in err
    assert ddlrun.main(["--emulate", "T4", "-np", "3", "python", "x.py"]) == 2
    assert "runs 8 ranks; -np 3 disagrees" in capsys.readouterr().err


def test_without_root_every_entry_point_says_why(monkeypatch, capsys):
    monkeypatch.setattr(cluster.emulated.os, "geteuid", lambda: 1000)
    assert "needs root" in cluster.available()
    with pytest.raises(cluster.ClusterError, match="needs root"):
        cluster.Cluster("2x1").up()
    assert ddlrun.main(["--emulate", "2x1", "python", "x.py"]) == 2
    assert "needs root" in capsys.readouterr().err
    from ddl.tools import cluster as cluster_cli

    assert cluster_cli.main(["up", "2x1"]) == 2
    assert "needs root" in capsys.readouterr().err


def test_aisles_of_racks():
    t = emulate.topology("2x2x2x1:nic=100mbit:uplink=100mbit:aisle=25mbit")
    assert [t.parent(f"rack{r}") for r in range(4)] == ["aisle0", "aisle0", "aisle1", "aisle1"]
    assert t.graph.edges["aisle0", "spine"]["bandwidth"] == pytest.approx(25e6 / 8e9)
    assert t.graph.edges["rack0", "aisle0"]["bandwidth"] == pytest.approx(100e6 / 8e9)
    assert len(t.placement) == 8


def test_a_job_on_some_hosts_gets_the_topology_with_its_ranks_placed():
    from collections import Counter

    from ddl.cluster.emulated import Cluster, ClusterError

    c = Cluster("2x2x2")  # 2 racks x 2 nodes x 2 ranks; nothing is built until it is entered
    full = c.topology_for(c.rank_hosts)
    assert full.placement == c.topology.placement or full.placement == c.topology.place(None, 8)
    hosts = list(dict.fromkeys(c.rank_hosts))
    some = c.topology_for([hosts[0], hosts[0], hosts[3]])  # a launch after the middle hosts were lost
    assert [some.host_of(d) for d in some.placement] == [hosts[0], hosts[0], hosts[3]]
    assert not Counter(some.placement) - Counter(full.placement)  # each place of the cluster used once at most
    with pytest.raises(ClusterError, match=r"rank 2: host .* no place left"):
        c.topology_for([hosts[1]] * 3)


def test_a_job_whose_daemon_never_reported_back_starts_again_once(monkeypatch, tmp_path):
    """Open MPI's launcher losing a node's daemon before any rank ran (seen once in CI): the job starts again,
    once; any other failure is the job's and is returned as it is."""
    c = emulated.Cluster("2x1")  # (not brought up: no namespaces; supervise.run is faked)
    c._up, c.workdir = True, tmp_path
    monkeypatch.setattr(c, "kill_jobs", lambda: None)
    said = {"out": "A daemon failed to report back after being spawned.", "rc": 213}
    runs = []

    def run(argv, env, timeout, capture, cleanup):
        runs.append(timeout)
        return types.SimpleNamespace(returncode=said["rc"], stdout=said["out"], stderr="")

    monkeypatch.setattr(supervise, "run", run)
    assert c.mpirun(["true"], timeout=100, quiet=True, capture=True).returncode == 213
    assert len(runs) == 2 and runs[1] <= runs[0] <= 100  # once again, within the same deadline
    runs.clear()
    said.update(out="rank 0: wrong allreduce result", rc=1)
    assert c.mpirun(["true"], timeout=100, quiet=True, capture=True).returncode == 1 and len(runs) == 1
