"""ddlrun end to end on this machine: real mpiexec, real ranks (the installed ddlrun of this environment, with
whichever MPI wheel it has). Failure paths included: a failing rank, --timeout, Ctrl-C, unreachable and bad
hosts. Each run has a deadline; nothing is left running (every rank's pid is checked)."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

DDLRUN = os.path.join(sys.prefix, "bin", "ddlrun")
REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_report.py")


def ddlrun(*args, timeout=120, **kw):
    return subprocess.run([DDLRUN, *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)


def reports(folder) -> dict[int, dict]:
    out = {}
    for path in glob.glob(os.path.join(folder, "rank*.json")):
        with open(path) as f:
            r = json.load(f)
        out[int(r["RANK"])] = r
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids, seconds=10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_four_local_ranks_get_their_variables_and_allreduce(tmp_path):
    done = ddlrun("-np", 4, sys.executable, REPORT, tmp_path, "ok")
    assert done.returncode == 0, done.stderr
    got = reports(tmp_path)
    assert sorted(got) == [0, 1, 2, 3]
    host_list = f"{got[0]['host']}:0,1,2,3"
    for r, info in got.items():
        assert (info["LOCAL_RANK"], info["WORLD_SIZE"], info["LOCAL_WORLD_SIZE"]) == (str(r), "4", "4")
        assert info["DDL_OPTIONS"] == "-mode p:4x1x1x1" and info["DDL_HOST_LIST"] == host_list
        assert (info["ddl_rank"], info["ddl_size"]) == (r, 4)
        assert info["sum"] == [10.0] * 4  # 1 + 2 + 3 + 4
        assert info["host_level"]  # -mode's dims are the one host's ranks: they share memory, not messages
    assert done.stderr.splitlines()[0].startswith("+ ") and "-n 4" in done.stderr  # the command, printed first
    assert sorted(done.stdout.split("\n")) == sorted(["", *(f"hello from rank {r}" for r in range(4))])


def test_output_filename_gives_each_rank_its_files(tmp_path):
    logs = tmp_path / "logs"
    done = ddlrun("--output-filename", logs, "-np", 2, sys.executable, REPORT, tmp_path, "ok")
    assert done.returncode == 0, done.stderr
    for r in range(2):
        assert (logs / f"rank.{r}" / "stdout").read_text() == f"hello from rank {r}\n"
    assert "hello from rank" not in done.stdout


def test_a_failing_rank_stops_the_job_with_its_message(tmp_path):
    started = time.monotonic()
    done = ddlrun("-np", 3, sys.executable, REPORT, tmp_path, "fail", 1, timeout=90)
    took = time.monotonic() - started
    assert done.returncode != 0 and took < 60
    assert "rank 1: something went wrong on purpose" in done.stderr
    assert "ddlrun: rank 1 (" in done.stderr and "exited with status 3" in done.stderr
    assert "ddlrun: rank 0" not in done.stderr  # the ranks the launcher stopped are not reported as failures
    assert wait_gone([r["pid"] for r in reports(tmp_path).values()]) == []


def test_a_killed_rank_ends_the_job_named_with_its_signal(tmp_path):
    # without --elastic one dead process ends the job within seconds, named, with nothing left running
    started = time.monotonic()
    done = ddlrun("-np", 4, sys.executable, REPORT, tmp_path, "kill", 2, timeout=90)
    assert done.returncode != 0 and time.monotonic() - started < 60
    assert "ddlrun: rank 2 (" in done.stderr and "was killed by SIGKILL" in done.stderr, done.stderr[-2000:]
    assert wait_gone([r["pid"] for r in reports(tmp_path).values()]) == []


def test_a_job_past_its_timeout_is_stopped_everywhere(tmp_path):
    started = time.monotonic()
    # (8 s: the ranks must have started and reported first; with three launch tests sharing 2 cores, MPICH's
    # start took longer than 3 s once)
    done = ddlrun("--timeout", 8, "-np", 2, sys.executable, REPORT, tmp_path, "sleep", timeout=90)
    assert done.returncode == 124 and time.monotonic() - started < 35
    assert "ran past --timeout 8 s" in done.stderr
    assert len(reports(tmp_path)) == 2 and wait_gone([r["pid"] for r in reports(tmp_path).values()]) == []


def test_ctrl_c_stops_every_rank(tmp_path):
    proc = subprocess.Popen([DDLRUN, "-np", "3", sys.executable, REPORT, str(tmp_path), "sleep"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(reports(tmp_path)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(reports(tmp_path)) == 3, "the ranks did not start"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "interrupted" in err
    assert wait_gone([r["pid"] for r in reports(tmp_path).values()]) == []


def test_an_unreachable_host_is_reported_quickly_and_nothing_launches(tmp_path):
    # 192.0.2.1 is TEST-NET-1: never routed. A stand-in ssh that never answers covers hosts that drop packets.
    hang = tmp_path / "ssh-that-hangs"
    hang.write_text("#!/bin/sh\nexec sleep 60\n")
    hang.chmod(0o755)
    for env in ({}, {"DDL_SSH": str(hang)}):
        started = time.monotonic()
        done = ddlrun("-H", "192.0.2.1", sys.executable, REPORT, tmp_path, "ok", timeout=60,
                      env={**os.environ, **env})
        assert time.monotonic() - started < 15
        assert done.returncode == 3, done.stderr
        assert "check failed: 192.0.2.1:" in done.stderr and "not launched" in done.stderr
    assert reports(tmp_path) == {}


@pytest.mark.parametrize("hosts", ["a;rm -rf ~", "$(touch /tmp/pwned)", "-oProxyCommand=sh"])
def test_a_bad_host_name_is_refused_before_anything_runs(tmp_path, hosts):
    done = ddlrun("-H", hosts, sys.executable, REPORT, tmp_path, "ok", timeout=30)
    assert done.returncode == 2 and "not a valid host name" in done.stderr and "+ " not in done.stderr


def test_no_program_and_unknown_options_are_usage_errors():
    assert ddlrun().returncode == 2
    done = ddlrun("--bogus", "prog")
    assert done.returncode == 2 and "unknown option '--bogus'" in done.stderr


def test_version():
    import ddl

    assert ddlrun("--version").stdout.strip() == f"ddlrun (ddl) {ddl.__version__}"
