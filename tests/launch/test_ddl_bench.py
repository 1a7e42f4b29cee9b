"""ddl-bench end to end under mpiexec: each collective's main table parses positionally as nccl-tests' does
(13 fields, no algorithm column), every result is checked, the JSON keeps nccl-tests' layout."""
import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(sys.prefix, "bin", "ddl-bench")


@pytest.mark.parametrize("collective", ["allreduce", "broadcast", "allgather"])
def test_each_collective_checks_out_and_parses_like_nccl_tests(collective, tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run([BENCH, "--np", "3", "--collective", collective, "-b", "8", "-e", "96K", "-f", "32",
                           "-n", "2", "-w", "1", "--min-seconds", "0", "-N", "2", "-r", "2", "-J", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.strip() and not line.startswith(("#", "+"))]
    assert len(rows) == 2 * 3 and all(len(r) == 13 for r in rows)  # two cycles of 8 B, 256 B, 8 KiB
    assert all(r[8] == "0" and r[12] == "0" for r in rows)  # #wrong, out of place and in place
    assert "# Side by side" in done.stdout and "# Out of bounds values : 0 OK" in done.stdout
    doc = json.loads(out.read_text())
    assert doc["collective"] == collective and len(doc["results"]) == 6 and len(doc["peers"]["mpi"]) == 6
    assert {r["root"] for r in doc["results"]} == ({2} if collective == "broadcast" else {-1})
