"""Runs tests/mpi under mpiexec at several rank counts (default 1 2 3 4 8: non-powers of two and more ranks
than cores included) and prints one closing line for all of them.

Nothing can hang: pytest-timeout (thread method) ends a stuck test, the exit guard in conftest.py aborts the
job if a peer never arrives, mpiexec's own timeout ends the job, and subprocess's timeout ends mpiexec.
"""
import argparse
import os
import re
import subprocess
import sys

from ddl import mpirun  # the installed ddl: run this from tests/, so the source tree is not on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))

SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3, 4, 8])
    ap.add_argument("--timeout", type=int, default=900, help="seconds for one mpiexec job")
    ap.add_argument("pytest_args", nargs="*", default=["mpi"], help="relative to tests/")
    args = ap.parse_args()
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    status = 0
    for n in args.ranks:
        argv = [sys.executable, "-m", "pytest", "-q", "--color=no", "-p", "no:cacheprovider", "--with-mpi",
                "--timeout=300", "--timeout-method=thread", *args.pytest_args]
        cmd, env = mpirun.command(n, argv, timeout=args.timeout)
        print(f"+ {' '.join(cmd)}", flush=True)
        try:
            out = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, errors="replace",
                                 timeout=args.timeout + 60, cwd=HERE)
            text, rc = out.stdout + out.stderr, out.returncode
        except subprocess.TimeoutExpired as e:
            text, rc = f"{e.stdout or ''}{e.stderr or ''}\nmpiexec did not finish in time", 124
        counts = {"passed": 0, "failed": 0, "skipped": 0}
        summaries = 0
        for line in text.splitlines():
            if " in " in line and ("passed" in line or "failed" in line) and not line.startswith(" "):
                summaries += 1
                found = {k.rstrip("s") if k.startswith("error") else k: int(v) for v, k in SUMMARY.findall(line)}
                counts["passed"] = max(counts["passed"], found.get("passed", 0))
                counts["skipped"] = max(counts["skipped"], found.get("skipped", 0))
                counts["failed"] += found.get("failed", 0) + found.get("error", 0)
        ok = rc == 0 and summaries == n and counts["failed"] == 0
        if not ok:
            status = 1
            counts["failed"] = max(counts["failed"], 1)
            print(text[-20000:])
        print(f"-n {n}: {'ok' if ok else 'FAILED'} ({counts['passed']} passed, {counts['failed']} failed, "
              f"{counts['skipped']} skipped on each of {summaries}/{n} ranks, exit {rc})", flush=True)
        for k in totals:
            totals[k] += counts[k]
    print(f"mpi: {totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped")
    return status


if __name__ == "__main__":
    sys.exit(main())
