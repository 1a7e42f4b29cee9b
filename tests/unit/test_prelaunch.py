"""The per-rank variables (ddl.runner.rankenv) and the pre-launch checks (ddl.runner.prelaunch) with stand-in ssh commands:
real subprocesses, fake remote hosts."""
import json
import os
import stat
import sys
import time

import pytest

from ddl.runner import prelaunch

from ddl.runner import rankenv


def test_rank_variables_from_open_mpi_and_the_host_list():
    env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "DDL_HOST_LIST": "a:0,2,4,6;b:1,3,5,7"}
    assert rankenv.rank_variables(env) == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "2",
                                           "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "MASTER_ADDR": "a",
                                           "MASTER_PORT": "29500", "OMP_NUM_THREADS": "1",
                                           "KERAS_DISTRIBUTION_PROCESS_ID": "5",
                                           "KERAS_DISTRIBUTION_NUM_PROCESSES": "8",
                                           "KERAS_DISTRIBUTION_JOB_ADDRESSES": "a:29500"}
    assert rankenv.rank_variables({**env, "OMP_NUM_THREADS": "4"}).get("OMP_NUM_THREADS") is None  # the user's
    alone = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "DDL_HOST_LIST": "a:0;b:1"}
    assert "OMP_NUM_THREADS" not in rankenv.rank_variables(alone)  # one rank per host: all its cores


def test_horovodrun_gives_each_rank_horovods_variables():
    env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "DDL_HOST_LIST": "a:0,2,4,6;b:1,3,5,7"}
    assert not any(k.startswith("HOROVOD_") for k in rankenv.rank_variables(env))  # ddlrun's own jobs: none
    got = rankenv.rank_variables({**env, "DDL_HOROVOD_VARIABLES": "1"})
    assert {k: v for k, v in got.items() if k.startswith("HOROVOD_") and k != "HOROVOD_HOSTNAME"} == {
        "HOROVOD_RANK": "5", "HOROVOD_SIZE": "8", "HOROVOD_LOCAL_RANK": "2", "HOROVOD_LOCAL_SIZE": "4",
        "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2"}


def test_rank_variables_from_hydra_without_a_host_list():
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert rankenv.rank_variables(env) == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                                           "LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
                                           "KERAS_DISTRIBUTION_PROCESS_ID": "3",
                                           "KERAS_DISTRIBUTION_NUM_PROCESSES": "4"}  # no address known: none


def test_keras_distribution_address_follows_the_users_master_and_keeps_the_users_own():
    env = {"PMI_RANK": "1", "PMI_SIZE": "2", "DDL_HOST_LIST": "a:0;b:1", "MASTER_ADDR": "m", "MASTER_PORT": "7"}
    assert rankenv.rank_variables(env)["KERAS_DISTRIBUTION_JOB_ADDRESSES"] == "m:7"
    mine = {**env, "KERAS_DISTRIBUTION_JOB_ADDRESSES": "c:9", "KERAS_DISTRIBUTION_PROCESS_ID": "0"}
    got = rankenv.rank_variables(mine)
    assert "KERAS_DISTRIBUTION_JOB_ADDRESSES" not in got and "KERAS_DISTRIBUTION_PROCESS_ID" not in got


def test_one_gpu_per_rank_by_local_rank_within_the_visible_ones():
    base = {"PMI_RANK": "3", "PMI_SIZE": "4", "DDL_HOST_LIST": "a:0,1;b:2,3", "DDL_BIND_GPU": "1",
            "MASTER_ADDR": "m"}
    assert rankenv.rank_variables(base)["CUDA_VISIBLE_DEVICES"] == "1"
    got = rankenv.rank_variables({**base, "CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert got["CUDA_VISIBLE_DEVICES"] == "5" and "MASTER_ADDR" not in got  # the user's MASTER_ADDR stays
    assert "CUDA_VISIBLE_DEVICES" not in rankenv.rank_variables({**base, "DDL_BIND_GPU": ""})


def test_rankenv_outside_a_launcher_says_so():
    with pytest.raises(RuntimeError, match="MPI launcher"):
        rankenv.rank_variables({})


def fake_ssh(tmp_path, body: str) -> list[str]:
    """An executable standing in for ssh: called as `ssh HOST COMMAND`."""
    path = tmp_path / "fake-ssh"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return [str(path)]


HERE = {"ddl": "1.0", "python": "3.11", "cpu": "Xeon", "cores": 8, "gpus": 4}


def test_hosts_that_match_pass(tmp_path):
    ssh = fake_ssh(tmp_path, f"echo '{json.dumps(HERE)}'")
    reports, problems = prelaunch.check(["a", "b"], HERE, ssh, sys.executable)
    assert problems == [] and [r.facts for r in reports] == [HERE, HERE]


def test_the_real_probe_runs_through_ssh_and_reports_this_host(tmp_path):
    ssh = fake_ssh(tmp_path, 'shift; exec sh -c "$*"')  # run the remote command here
    reports, problems = prelaunch.check(["a"], prelaunch.probe(), ssh, sys.executable)
    assert problems == [] and reports[0].facts["cores"] == os.cpu_count()


def test_differences_are_reported_per_host(tmp_path):
    other = {**HERE, "ddl": "0.9", "gpus": 2}
    ssh = fake_ssh(tmp_path, f"""case "$1" in b) echo '{json.dumps(other)}' ;; *) echo '{json.dumps(HERE)}' ;; esac""")
    _, problems = prelaunch.check(["a", "b"], HERE, ssh, sys.executable)
    assert problems == ["b: ddl 0.9, but 1.0 here", "hosts differ in GPU count: a 4, b 2"]


def test_ddl_missing_on_a_host_is_named(tmp_path):
    ssh = fake_ssh(tmp_path, "echo \"ModuleNotFoundError: No module named 'ddl'\" >&2; exit 1")
    _, problems = prelaunch.check(["gpu7"], HERE, ssh, "/opt/py/bin/python")
    assert problems == ["gpu7: ddl is not importable with /opt/py/bin/python: ModuleNotFoundError: No module "
                        "named 'ddl'"]


def test_an_unreachable_host_is_reported_within_the_deadline(tmp_path):
    ssh = fake_ssh(tmp_path, 'case "$1" in dead) exec sleep 60 ;; *) echo \'%s\' ;; esac' % json.dumps(HERE))
    started = time.monotonic()
    _, problems = prelaunch.check(["a", "dead"], HERE, ssh, sys.executable, seconds=2)
    assert time.monotonic() - started < 10
    assert problems == ["dead: no answer within 2 s (unreachable, or ssh waits for a password)"]


def test_the_deadline_per_host_comes_from_ddl_check_seconds():
    assert prelaunch.host_seconds({}) == prelaunch.HOST_SECONDS == 10.0
    assert prelaunch.host_seconds({"DDL_CHECK_SECONDS": "45"}) == 45.0
    for bad in ("0", "-3", "soon"):
        with pytest.raises(ValueError, match=f"DDL_CHECK_SECONDS={bad!r}: the checks' deadline"):
            prelaunch.host_seconds({"DDL_CHECK_SECONDS": bad})


def test_ssh_failure_is_reported_as_unreachable(tmp_path):
    ssh = fake_ssh(tmp_path, 'echo "ssh: connect to host $1 port 22: Connection refused" >&2; exit 255')
    _, problems = prelaunch.check(["n1"], HERE, ssh, sys.executable)
    assert problems == ["n1: unreachable by ssh: ssh: connect to host n1 port 22: Connection refused"]


def test_local_names_are_not_probed_over_ssh(tmp_path):
    ssh = fake_ssh(tmp_path, "exit 255")
    reports, problems = prelaunch.check(["me"], HERE, ssh, sys.executable, local={"me"})
    assert problems == [] and reports[0].facts == HERE
