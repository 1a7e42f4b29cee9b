"""Host lists from -H, host files, rankfiles and the schedulers (pure parsing; environments are mocked)."""
import pytest

from ddl.runner import hosts
from ddl.runner.hosts import Host, HostError


def test_host_list_with_and_without_slots():
    assert hosts.parse_host_list("a,b:4,c.example.org") == [Host("a"), Host("b", 4), Host("c.example.org")]
    assert hosts.parse_host_list("a:2,a:3") == [Host("a", 5)]  # a host named again adds its slots


@pytest.mark.parametrize("bad", ["a;rm -rf ~", "a b", "$(reboot)", "-oProxyCommand=x", "a,,b", "a:0", "a:x",
                                 "a`id`", "a|b", "ä"])
def test_bad_host_names_and_slots_are_refused(bad):
    with pytest.raises(HostError, match="-H"):
        hosts.parse_host_list(bad)


def test_hostfile_forms_comments_and_errors():
    text = "# cluster\nn1 slots=4\nn2:2   # two GPUs\n\nn3\nn4 slots=8 max_slots=8\n"
    assert hosts.parse_hostfile(text) == [Host("n1", 4), Host("n2", 2), Host("n3"), Host("n4", 8)]
    with pytest.raises(HostError, match="line 2: unknown field 'cpus=4'"):
        hosts.parse_hostfile("n1\nn2 cpus=4\n")
    with pytest.raises(HostError, match="line 1.*not a valid host name"):
        hosts.parse_hostfile("n1;ls slots=2\n")
    with pytest.raises(HostError, match="no hosts"):
        hosts.parse_hostfile("# nothing\n")


def test_hostfile_that_cannot_be_read_names_the_path(tmp_path):
    with pytest.raises(HostError, match="hostfile '.*missing'"):
        hosts.read_hostfile(str(tmp_path / "missing"))


def test_rankfile_gives_each_rank_its_host():
    text = "rank 1=n1 slot=0\nrank 0=n0 slot=0:1\nrank 2 = n0 slot=1\n"
    assert hosts.parse_rankfile(text) == ["n0", "n1", "n0"]
    with pytest.raises(HostError, match="missing \\[1\\]"):
        hosts.parse_rankfile("rank 0=a\nrank 2=b\n")
    with pytest.raises(HostError, match="placed twice"):
        hosts.parse_rankfile("rank 0=a\nrank 0=b\n")
    with pytest.raises(HostError, match="not a valid host name"):
        hosts.parse_rankfile("rank 0=a&&b\n")


@pytest.mark.parametrize("text,expected", [
    ("node1", ["node1"]),
    ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
    ("a[8-10]", ["a8", "a9", "a10"]),
    ("a[08-10]", ["a08", "a09", "a10"]),
    ("login1,r[1-2]n[1-2]", ["login1", "r1n1", "r1n2", "r2n1", "r2n2"]),
    ("c[1-2]-ib,d5", ["c1-ib", "c2-ib", "d5"]),
])
def test_slurm_node_lists_expand(text, expected):
    assert hosts.expand_nodelist(text) == expected


@pytest.mark.parametrize("bad", ["a[1-", "a]", "a[3-1]", "a[x]", "a,,b"])
def test_bad_slurm_node_lists_are_refused(bad):
    with pytest.raises(HostError, match="SLURM_JOB_NODELIST"):
        hosts.expand_nodelist(bad)


def test_slurm_job_hosts_and_tasks_per_node():
    env = {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "4(x2),2"}
    assert hosts.from_scheduler(env) == ("slurm", [Host("n1", 4), Host("n2", 4), Host("n3", 2)])
    assert hosts.from_scheduler({"SLURM_JOB_NODELIST": "n[1-2]"}) == ("slurm", [Host("n1"), Host("n2")])
    with pytest.raises(HostError, match="gives 2 nodes, SLURM_JOB_NODELIST 3"):
        hosts.from_scheduler({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "4(x2)"})


def test_lsf_job_hosts_drop_the_launch_node():
    env = {"LSB_MCPU_HOSTS": "batch1 1 g01 42 g02 42"}
    assert hosts.from_scheduler(env) == ("lsf", [Host("g01", 42), Host("g02", 42)])
    assert hosts.from_scheduler({"LSB_MCPU_HOSTS": "h1 4 h2 2"}) == ("lsf", [Host("h1", 4), Host("h2", 2)])
    with pytest.raises(HostError, match="pairs"):
        hosts.from_scheduler({"LSB_MCPU_HOSTS": "h1 4 h2"})


def test_lsf_and_pbs_host_files_list_one_line_per_slot(tmp_path):
    f = tmp_path / "nodes"
    f.write_text("h1\nh1\nh2\nh2\n")
    assert hosts.from_scheduler({"LSB_DJOB_HOSTFILE": str(f)}) == ("lsf", [Host("h1", 2), Host("h2", 2)])
    assert hosts.from_scheduler({"PBS_NODEFILE": str(f)}) == ("pbs", [Host("h1", 2), Host("h2", 2)])
    with pytest.raises(HostError, match="PBS_NODEFILE"):
        hosts.from_scheduler({"PBS_NODEFILE": str(tmp_path / "gone")})


def test_outside_a_scheduler_there_are_no_scheduler_hosts():
    assert hosts.from_scheduler({"HOME": "/root"}) is None
