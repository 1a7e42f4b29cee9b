"""Slurm's `scontrol show topology`, recorded outputs: tree and block plugins, nested switches, bracketed
ranges, nodes outside the job, and malformed lines named."""
import pytest

from ddl.topology.scheduler import SchedulerError, expand_hostlist, parse

TREE = """\
SwitchName=s0 Level=0 LinkSpeed=1 Nodes=tux[0-3]
SwitchName=s1 Level=0 LinkSpeed=1 Nodes=tux[4-7]
SwitchName=s3 Level=0 LinkSpeed=1 Nodes=tux[8-11]
SwitchName=s4 Level=0 LinkSpeed=1 Nodes=tux[12-15]
SwitchName=s2 Level=1 LinkSpeed=1 Nodes=tux[0-7] Switches=s[0-1]
SwitchName=s5 Level=1 LinkSpeed=1 Nodes=tux[8-15] Switches=s[3-4]
SwitchName=s6 Level=2 LinkSpeed=1 Nodes=tux[0-15] Switches=s[2,5]
"""


def test_host_lists_expand_like_slurm():
    assert expand_hostlist("tux[0-2,7],gpu[01-02]-ib,login") == \
        ["tux0", "tux1", "tux2", "tux7", "gpu01-ib", "gpu02-ib", "login"]
    assert expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    with pytest.raises(ValueError, match="unbalanced"):
        expand_hostlist("tux[0-3")


def test_nested_switches_give_levels_for_the_jobs_hosts():
    hosts = [f"tux{i}" for i in (0, 1, 4, 5, 8, 9, 12, 13)]
    r = parse(TREE, hosts, 1.25e9, 15e-6)
    assert r.tree == [[["tux0", "tux1"], ["tux4", "tux5"]], [["tux8", "tux9"], ["tux12", "tux13"]]]
    assert len(r.levels) == 3 and r.source == "scheduler"


def test_nodes_outside_the_job_are_ignored_and_empty_switches_dropped():
    r = parse(TREE, ["tux0", "tux2", "tux5"], 1.25e9, 15e-6)
    assert r.tree == [["tux0", "tux2"], ["tux5"]]  # s5's side holds none of the job


def test_block_plugin_is_read_as_one_level():
    text = "BlockName=b0 BlockIndex=0 Nodes=tux[0-3] BlockSize=4\nBlockName=b1 BlockIndex=1 Nodes=tux[4-7] BlockSize=4\n"
    assert parse(text, ["tux1", "tux2", "tux6"], 1e9, 1e-5).tree == [["tux1", "tux2"], ["tux6"]]


@pytest.mark.parametrize("text, words", [
    ("SwitchName=s0 Level=x Nodes=tux0\n", "line 1"),
    ("SwitchName=s0 Level=0 Nodes=tux[0-3\n", "line 1"),
    ("Switch s0 nodes tux0\n", "line 1: expected SwitchName"),
    ("SwitchName=s2 Level=1 Switches=s[0-1]\n", "not listed"),
    ("SwitchName=s0 Level=0 Nodes=tux[0-1]\n", "does not place host tux9"),
    ("", "lists no switches"),
])
def test_malformed_output_is_named(text, words):
    with pytest.raises(SchedulerError, match=words.replace("[", r"\[")):
        parse(text, ["tux0", "tux9"], 1e9, 1e-5)
