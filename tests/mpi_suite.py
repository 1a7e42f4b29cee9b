"""Runs tests/mpi under mpiexec at several rank counts (default 1 2 3 4 8: a non-power of two and more ranks
than cores included) and prints one closing line for all of them.

Nothing can hang: pytest-timeout (thread method) ends a stuck test, the exit guard in conftest.py aborts the
job if a peer never arrives, mpiexec's own timeout ends the job, and subprocess's timeout ends mpiexec.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

from ddl.runner import mpirun  # the installed ddl: run this from tests/, so the source tree is not on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))


def run_once(n: int, pytest_args: list[str], timeout: int) -> tuple[bool, dict, str]:
    """One mpiexec job; (ok, counts, output). Each rank leaves its counts in a file (conftest.py)."""
    argv = [sys.executable, "-m", "pytest", "-q", "--color=no", "-p", "no:cacheprovider", "--with-mpi",
            "--timeout=300", "--timeout-method=thread", *pytest_args]
    cmd, env = mpirun.command(n, argv, timeout=timeout)
    print(f"+ {' '.join(cmd)}", flush=True)
    with tempfile.TemporaryDirectory() as results:
        env = {**os.environ, **env, "DDL_TEST_RESULTS_DIR": results}
        try:
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, errors="replace",
                                 timeout=timeout + 60, cwd=HERE)
            text, rc = out.stdout + out.stderr, out.returncode
        except subprocess.TimeoutExpired as e:
            text, rc = f"{e.stdout or ''}{e.stderr or ''}\nmpiexec did not finish in time", 124
        ranks = [json.load(open(f)) for f in glob.glob(os.path.join(results, "rank*.json"))]
    counts = {"passed": max((r["passed"] for r in ranks), default=0),
              "failed": sum(r["failed"] + r["error"] for r in ranks),
              "skipped": max((r["skipped"] for r in ranks), default=0), "ranks": len(ranks), "exit": rc}
    ok = rc == 0 and len(ranks) == n and counts["failed"] == 0 and all(r["exit"] == 0 for r in ranks)
    return ok, counts, text


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3, 4, 8])
    ap.add_argument("--timeout", type=int, default=900, help="seconds for one mpiexec job")
    ap.add_argument("pytest_args", nargs="*", default=["mpi"], help="relative to tests/")
    args = ap.parse_args()
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    status = 0
    for n in args.ranks:
        ok, c, text = run_once(n, args.pytest_args, args.timeout)
        if not ok:
            status = 1
            c["failed"] = max(c["failed"], 1)
            print(text[-20000:])
        print(f"-n {n}: {'ok' if ok else 'FAILED'} ({c['passed']} passed, {c['failed']} failed, "
              f"{c['skipped']} skipped on each of {c['ranks']}/{n} ranks, exit {c['exit']})", flush=True)
        for k in totals:
            totals[k] += c[k]
    print(f"mpi: {totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped")
    return status


if __name__ == "__main__":
    sys.exit(main())
