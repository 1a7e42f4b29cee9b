"""What one small allreduce costs per call, for every call form, side by side with MPI_Allreduce in one run.

    python benchmarks/per_call.py                 # launches 4 ranks itself, then one rank alone
    python benchmarks/per_call.py --np 4 --repeats 15

Forms: ``ddl.allreduce(x)`` (a new result), ``ddl.allreduce(x, out=y)`` (preallocated, what training loops
use), ``ddl.allreduce(y, out=y)`` (in place); MPI: mpi4py's ``Allreduce`` on preallocated numpy buffers (the
same work, with mpi4py's own per-call Python cost). Each repeat times a batch of ddl calls, then a batch of MPI
calls of the same form, after a barrier; the verdict takes the median over repeats. Targets (issue 14): at 4
ranks on one host ddl <= 1.2 x MPI_Allreduce for every form; one rank <= 2 us per call.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

FORMS = ("new", "out=", "in place")


def _calls(form: str, x, y):
    import ddl

    if form == "new":
        return lambda: ddl.allreduce(x)
    if form == "out=":
        return lambda: ddl.allreduce(x, out=y)
    return lambda: ddl.allreduce(y, out=y)


def _batch(fn, calls: int, comm=None) -> float:
    if comm is not None:
        comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    seconds = time.perf_counter() - start
    if comm is not None:  # the slowest rank's time is the collective's
        from mpi4py import MPI

        seconds = comm.allreduce(seconds, op=MPI.MAX)
    return seconds / calls * 1e6


def side_by_side(repeats: int, calls: int) -> dict:
    import ddl
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    ddl.init(comm)
    x = np.full(2, comm.rank + 1, np.float32)
    y, ref = np.empty_like(x), np.empty_like(x)
    result = {}
    for form in FORMS:
        ddl_call = _calls(form, x, y)
        mpi_call = (lambda: comm.Allreduce(x, ref, op=MPI.SUM)) if form != "in place" else \
            (lambda: comm.Allreduce(MPI.IN_PLACE, ref, op=MPI.SUM))
        for fn in (ddl_call, mpi_call):
            _batch(fn, calls // 4, comm)  # warm-up
        d, m = [], []
        for _ in range(repeats):
            d.append(_batch(ddl_call, calls, comm))
            m.append(_batch(mpi_call, calls, comm))
        expected = comm.size * (comm.size + 1) / 2
        got = ddl.allreduce(x)
        assert np.all(got == expected), f"wrong result {got} != {expected}"
        result[form] = {"ddl_us": statistics.median(d), "mpi_us": statistics.median(m),
                        "ddl_all": d, "mpi_all": m}
    return result


def alone(repeats: int, calls: int) -> dict:
    x = np.ones(2, np.float32)
    y = np.empty_like(x)
    out = {}
    for form in FORMS:
        fn = _calls(form, x, y)
        _batch(fn, calls // 4)
        out[form] = statistics.median(_batch(fn, calls) for _ in range(repeats))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--role", choices=["ranks", "alone"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "ranks":
        r = side_by_side(args.repeats, args.calls)
        from mpi4py import MPI

        if MPI.COMM_WORLD.rank == 0:
            print("RESULT " + json.dumps(r), flush=True)
        return 0
    if args.role == "alone":
        print("RESULT " + json.dumps(alone(args.repeats, args.calls * 10)), flush=True)
        return 0

    from ddl.runner.mpirun import command

    me = [sys.executable, os.path.abspath(__file__), "--repeats", str(args.repeats), "--calls", str(args.calls)]
    cmd, env = command(args.np, me + ["--role", "ranks"], timeout=900)
    ranks = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=960)
    lone = subprocess.run(me + ["--role", "alone"], capture_output=True, text=True, timeout=600)
    try:
        many = json.loads(next(l for l in ranks.stdout.splitlines() if l.startswith("RESULT "))[7:])
        one = json.loads(next(l for l in lone.stdout.splitlines() if l.startswith("RESULT "))[7:])
    except StopIteration:
        print(ranks.stdout[-3000:], ranks.stderr[-3000:], lone.stderr[-3000:], file=sys.stderr)
        return 1
    missed = 0
    print(f"8 B float32 sum, median of {args.repeats} alternating repeats of {args.calls} calls")
    print(f"{'form':<10} {args.np} ranks: {'ddl us':>8} {'MPI us':>8} {'ratio':>6} (target <= 1.2)   "
          f"1 rank: {'ddl us':>7} (target <= 2)")
    for form in FORMS:
        d, m = many[form]["ddl_us"], many[form]["mpi_us"]
        ok = d / m <= 1.2 and one[form] <= 2.0
        missed += not ok
        print(f"{form:<10} {'':9}{d:>8.2f} {m:>8.2f} {d / m:>6.2f} {'':19}{'':8}{one[form]:>7.2f}   "
              f"{'PASS' if ok else 'MISS'}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
