"""ddlrun launches an elastic job again (--max-restarts, --host-discovery-script), on Open MPI and on MPICH
(which has no ULFM: restarts are its only elastic mode). The job is tests/launch/elastic_job.py: weights with a
closed-form value after any schedule of ranks; failures happen in its first launch only. Every launch after
the first must start from the commit rank 0 wrote to disk, which the results show (the step train started at)."""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ddl.runner import mpirun

DDLRUN = os.path.join(sys.prefix, "bin", "ddlrun")
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_job.py")
STEPS, EVERY = 20, 5
OPEN_MPI = mpirun.flavor(mpirun.mpiexec_path()) == "openmpi"


def closed_form(sizes: list[int]) -> float:
    """w after step s on sizes[s] ranks: each step subtracts 0.001 * (n + 1) / 2 * (s + 1)."""
    w = np.float32(0)
    for s, n in enumerate(sizes):
        w = np.float32(w - np.float32(0.001) * np.float32((n + 1) / 2 * (s + 1)))
    return float(w)


def run_job(tmp_path, spec: str, *flags):
    done = subprocess.run([DDLRUN, *flags, sys.executable, JOB, str(STEPS), str(EVERY), spec, str(tmp_path)],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)
    results = {}
    for path in glob.glob(str(tmp_path / "result.*.json")):
        results[int(path.rsplit(".", 2)[1])] = json.loads(open(path).read())
    return done, results


def test_a_killed_rank_ends_the_launch_and_the_job_restarts_from_the_last_commit(tmp_path):
    done, results = run_job(tmp_path, "3@12", "--max-restarts", "1", "-np", "4")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "restart 1 of 1: the job failed with status" in done.stderr
    assert sorted(results) == [0, 1, 2, 3]
    for got in results.values():
        assert got["starts"] == [10] and got["restarts"] == 1 and got["size"] == 4  # from the commit at step 10
        np.testing.assert_allclose(got["w0"], closed_form([4] * STEPS), rtol=1e-5)
    assert not glob.glob(str(tmp_path / ".ddl-elastic-*")), "the state folder ddlrun made outlived success"


def test_new_hosts_from_the_discovery_script_grow_the_job_up_to_max_np(tmp_path):
    (tmp_path / "hosts").write_text("localhost:2\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {tmp_path / 'hosts'}\n")
    script.chmod(0o755)
    # rank 0 doubles the slots at step 5; the job sees it at its commit at step 10 and is launched on 4
    done, results = run_job(tmp_path, "grow@5", "--min-np", "2", "--max-np", "4", "--discovery-interval", "0.2",
                            "--host-discovery-script", str(script))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "launching again on the more hosts" in done.stderr
    assert sorted(results) == [0, 1, 2, 3]
    for got in results.values():
        assert got["starts"] == [10] and got["size"] == 4
        np.testing.assert_allclose(got["w0"], closed_form([2] * 10 + [4] * 10), rtol=1e-5)


@pytest.mark.skipif(not OPEN_MPI, reason="in-place recovery needs Open MPI's ULFM")
def test_fewer_than_min_np_left_in_place_restarts_the_job_at_full_size(tmp_path):
    # 3 goes at step 12: in place, 3 ranks from the commit at 10; 2 goes at 14: below --min-np 3, every survivor
    # ends with 75, and the job is launched again on 4 ranks from the last commit on disk (step 10)
    done, results = run_job(tmp_path, "3@12,2@14", "--min-np", "3", "--max-restarts", "1", "-np", "4")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fewer than the minimum of 3" in done.stderr
    assert "restart 1 of 1: fewer ranks than --min-np were left to go on in place" in done.stderr
    assert sorted(results) == [0, 1, 2, 3]
    for got in results.values():
        assert got["starts"] == [10] and got["size"] == 4
        np.testing.assert_allclose(got["w0"], closed_form([4] * STEPS), rtol=1e-5)
