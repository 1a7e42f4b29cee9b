"""ddlrun: launch a ddl program as an MPI job, on this host or on an emulated cluster.

    ddlrun -np 4 python train.py                  # 4 ranks on this host
    ddlrun --emulate T2 python train.py           # on an emulated 2-rack cluster (root), torn down after
    ddlrun --emulate 3,2,1:nic=100mbit --dry-run python train.py

This is the launcher's core: the full IBM/horovodrun flag set (hosts, host files, schedulers, pre-launch
checks) is issue 5's. The command is printed (``+ mpirun ...``) before it runs; no shell ever sees it.
Exit status: the job's; 2 for a usage error or where the emulated cluster cannot be built; 124 on --timeout.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

from . import mpirun
from .errors import DDLError


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="ddlrun", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-np", "--np", type=int, help="ranks (default: the emulated cluster's, else this host's cores)")
    ap.add_argument("--emulate", metavar="SPEC", help="run on an emulated cluster: T1..T4, 2x2x2:nic=1gbit, "
                    "3,2,1, or a topology file (see ddl-cluster --help)")
    ap.add_argument("-m", "--mode", help="IBM DDL mode string, e.g. p or r:2x4 (goes into DDL_OPTIONS)")
    ap.add_argument("--ddloption", default="", help="further DDL_OPTIONS, e.g. '-dbg_level 1'")
    ap.add_argument("--timeout", type=float, default=0, help="stop the job after this many seconds (0: never)")
    ap.add_argument("--dry-run", action="store_true", help="print the command and exit")
    ap.add_argument("program", nargs=argparse.REMAINDER, help="the program and its arguments")
    args = ap.parse_args(argv)
    if not args.program:
        ap.error("no program given")
    return args


def job_environment(args: argparse.Namespace) -> dict[str, str]:
    options = " ".join(x for x in (f"-mode {args.mode}" if args.mode else "", args.ddloption) if x)
    return {"DDL_OPTIONS": options} if options else {}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    env = job_environment(args)
    timeout = args.timeout or None
    try:
        if args.emulate:
            return _emulated(args, env, timeout)
        n = args.np or os.cpu_count() or 1
        cmd, extra = mpirun.command(n, args.program, int(timeout) if timeout else None)
        print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
        if args.dry_run:
            return 0
        try:
            return subprocess.run(cmd, env={**os.environ, **extra, **env}, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            print(f"ddlrun: the job ran past --timeout {args.timeout:g} s and was stopped", file=sys.stderr)
            return 124
    except DDLError as e:
        print(f"ddlrun: {e}", file=sys.stderr)
        return 2


def _emulated(args: argparse.Namespace, env: dict[str, str], timeout: float | None) -> int:
    from . import cluster, emulate

    c = cluster.Cluster(emulate.topology(args.emulate))
    if args.np and args.np != c.nranks:
        raise DDLError(f"--emulate {args.emulate} runs {c.nranks} ranks; -np {args.np} disagrees")
    if args.dry_run:
        cmd, _ = mpirun.cluster_command(mpirun.mpiexec_path(), c.rank_hosts, "<agent>", args.program,
                                        forward=sorted(["DDL_TOPOLOGY", *env]))
        print("+ " + " ".join(cmd), file=sys.stderr)
        return 0
    with c:
        try:
            return c.mpirun(args.program, env=env, timeout=timeout or 7 * 24 * 3600).returncode
        except subprocess.TimeoutExpired:
            print(f"ddlrun: the job ran past --timeout {args.timeout:g} s and was stopped", file=sys.stderr)
            return 124


if __name__ == "__main__":
    sys.exit(main())
