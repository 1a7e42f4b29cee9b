"""The engine core's performance targets, measured side by side in one run on this host.

    python benchmarks/engine_targets.py            # launches 4 ranks itself (and a 1-rank run)

Targets (float32, 4 ranks on one node): 64 MiB allreduce within 1.10 x MPI_Allreduce's time; 8 bytes within
1.5 x MPI_Allreduce's latency + 10 us; and one rank alone, 8 bytes, at most 10 us per ddl.allreduce call.
ddl and MPI alternate within each repeat; the median over repeats is reported, out-of-place and in-place.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import timeit

import numpy as np

def alone_us_per_call(calls: int = 200_000) -> float:
    import ddl

    x = np.ones(2, np.float32)
    ddl.allreduce(x)
    return min(timeit.repeat(lambda: ddl.allreduce(x), number=calls, repeat=3)) / calls * 1e6


def side_by_side(repeats: int) -> dict:
    import ddl
    from mpi4py import MPI

    from ddl.tools.measure import Runner, measure

    comm = MPI.COMM_WORLD
    ddl.init(comm)
    runners = {a: Runner(a, comm) for a in ("ddl", "mpi")}
    cases = {"8 B": (2, 3000, 300), "64 MiB": (16 << 20, 5, 2)}
    out = {}
    for case, (count, iters, warmup) in cases.items():
        samples = {(a, k): [] for a in runners for k in ("out", "in")}
        for _ in range(repeats):
            for a, runner in runners.items():
                rec = measure(runner, comm, count, np.dtype(np.float32), "sum", iters, warmup, check=True)
                assert rec["out_wrong"] == 0 and rec["in_wrong"] == 0, f"{a} {case}: wrong results"
                for k in ("out", "in"):
                    samples[(a, k)].append(rec[f"{k}_us"])
        out[case] = {f"{a}_{k}": statistics.median(v) for (a, k), v in samples.items()}
    return out


def report(results: dict, alone: float, nranks: int) -> int:
    """Prints one line per target; returns how many were missed."""
    lines = []
    big, small = results["64 MiB"], results["8 B"]
    for k in ("out", "in"):
        d, m = big["ddl_" + k], big["mpi_" + k]
        lines.append((f"64 MiB, {nranks} ranks ({k}): ddl <= 1.10 x MPI",
                      f"{d / m:.2f} x (ddl {d / 1e3:.1f} ms, MPI {m / 1e3:.1f} ms)", d / m <= 1.10))
    for k in ("out", "in"):
        d, m = small["ddl_" + k], small["mpi_" + k]
        bound = 1.5 * m + 10
        lines.append((f"8 B, {nranks} ranks ({k}): ddl <= 1.5 x MPI + 10 us",
                      f"ddl {d:.1f} us, MPI {m:.1f} us, bound {bound:.1f} us", d <= bound))
    lines.append(("1 rank, 8 B: <= 10 us per call", f"{alone:.2f} us", alone <= 10))
    print(f"{'target':<46} {'measured (median over repeats)':<50} verdict")
    for target, measured, ok in lines:
        print(f"{target:<46} {measured:<50} {'PASS' if ok else 'FAIL'}")
    return sum(not ok for _, _, ok in lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--alone", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.alone:
        print(alone_us_per_call())
        return 0
    if args.worker:
        results = side_by_side(args.repeats)
        from mpi4py import MPI

        if MPI.COMM_WORLD.rank == 0:
            print(json.dumps(results), flush=True)
        return 0
    from ddl.runner import mpirun

    results = mpirun.worker_json(args.np, [sys.executable, os.path.abspath(__file__), "--worker",
                                           "--repeats", str(args.repeats)])
    if results is None:
        return 1
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "PRTE_"))}  # no MPI job
    alone = float(subprocess.run([sys.executable, os.path.abspath(__file__), "--alone"], env=clean,
                                 capture_output=True, text=True, timeout=300).stdout)
    return 1 if report(results, alone, args.np) else 0


if __name__ == "__main__":
    sys.exit(main())
