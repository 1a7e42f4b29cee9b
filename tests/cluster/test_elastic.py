"""Elastic jobs across an emulated cluster (root and network namespaces; skipped otherwise): 4 hosts in 2
racks, one rank each, over TCP. A lost process: the survivors on the other hosts shrink, re-plan and finish
with the closed form. A lost host (its MPI daemon dies with the rank): Open MPI's runtime ends the job (ddlrun
says so, where the runtime returns 0), and ddlrun launches it again on the hosts its discovery script lists."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ddl import cluster
from ddl.runner import mpirun

WHY = cluster.available()
pytestmark = [pytest.mark.skipif(WHY is not None, reason=str(WHY)), pytest.mark.timeout(300),
              pytest.mark.skipif(mpirun.flavor(mpirun.mpiexec_path()) != "openmpi",
                                 reason="in-place recovery needs Open MPI's ULFM (MPICH refuses --elastic)")]
JOB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "launch", "elastic_job.py")


def run(tmp_path, spec: str, *flags) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddl.tools.ddlrun", "--emulate", "2x2x1", "--elastic", *flags,
                           sys.executable, JOB, "20", "5", spec, str(tmp_path)], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)


def test_a_lost_process_across_hosts_is_survived(tmp_path):
    done = run(tmp_path, "3@12")
    assert done.returncode == 0, done.stderr[-3000:]
    # steps 0-9 on 4 ranks (mean gradient 2.5 (s + 1)), the kill at 12 rolls back to the commit at 10, steps
    # 10-19 on 3 ranks (2 (s + 1)): w = -0.001 (2.5 * 55 + 2 * 155)
    for r in range(3):
        got = json.loads((tmp_path / f"result.{r}.json").read_text())
        assert got["size"] == 3 and got["recoveries"] == [[3]] and got["seen"][0]["ranks"] == [3]
        assert "rank 3 (node3) failed" in got["seen"][0]["message"]
        np.testing.assert_allclose(got["w0"], -0.001 * (2.5 * 55 + 2 * 155), rtol=1e-5)


@pytest.mark.full  # CI runs test_a_lost_process_across_hosts_is_survived
def test_a_lost_host_ends_the_launch_and_the_job_goes_on_on_the_hosts_left(tmp_path):
    # the hosts a discovery script lists; the rank that takes node3 down with it strikes node3 off
    (tmp_path / "hosts").write_text("".join(f"node{i}:1\n" for i in range(4)))
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {tmp_path / 'hosts'}\n")
    script.chmod(0o755)
    done = run(tmp_path, "3@12:host", "--max-restarts", "1", "--host-discovery-script", str(script))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "a host was lost and Open MPI's runtime ended the job" in done.stderr
    assert "restart 1 of 1: a host was lost" in done.stderr
    # launched again on node0-2 from the commit at step 10 (on disk): the same closed form as in place
    for r in range(3):
        got = json.loads((tmp_path / f"result.{r}.json").read_text())
        assert got["size"] == 3 and got["starts"] == [10] and got["restarts"] == 1
        np.testing.assert_allclose(got["w0"], -0.001 * (2.5 * 55 + 2 * 155), rtol=1e-5)
