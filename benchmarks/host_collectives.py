"""Every collective on one host, ddl beside MPI's own, side by side in one run (issue 28's first target).

    python benchmarks/host_collectives.py --ranks 2 4 8 --repeats 10 --out benchmarks/results/host-collectives.md

For each rank count, collective (allreduce, broadcast, allgather, reduce_scatter; float32, sum) and size,
every repeat measures ddl and then MPI (ddl-bench's measure: results checked, nccl-tests' sizes and busbw);
the table gives the median over repeats of ddl's time over MPI's (below 1: ddl is faster), out of place and
in place, and ddl's in-place busbw. ddl writes into preallocated outputs (``out=``), as MPI does.
"""
import argparse
import os
import statistics
import sys

import numpy as np

COLLECTIVES = ("allreduce", "broadcast", "allgather", "reduce_scatter")
SIZES = (8, 1 << 10, 64 << 10, 1 << 20, 16 << 20)


def worker(repeats: int) -> dict:
    import ddl
    from mpi4py import MPI

    from ddl.tools.measure import Runner, bandwidth, measure

    comm = MPI.COMM_WORLD
    ddl.init(comm)
    out = {"host_level": ddl.communicator().host_level}
    for collective in COLLECTIVES:
        runners = {a: Runner(a, comm, collective) for a in ("ddl", "mpi")}
        for nbytes in SIZES:
            samples = {(a, k): [] for a in runners for k in ("out", "in")}
            busbw = []
            iters = max(2, min(2000, (1 << 24) // nbytes))
            for _ in range(repeats):
                for a, runner in runners.items():
                    rec = measure(runner, comm, nbytes // 4, np.dtype(np.float32), "sum", iters, 1, True, 0.02)
                    assert rec["out_wrong"] == 0 and rec["in_wrong"] == 0, f"{a} {collective} {nbytes}: wrong"
                    for k in ("out", "in"):
                        samples[(a, k)].append(rec[f"{k}_us"])
                    if a == "ddl":
                        busbw.append(bandwidth(rec["size"], rec["in_us"], comm.size, collective)[1])
            out[f"{collective} {nbytes}"] = {**{f"{a}_{k}": statistics.median(v) for (a, k), v in samples.items()},
                                             "busbw": statistics.median(busbw)}
    return out


def table(results: dict, n: int) -> str:
    from ddl.units import format_size

    lines = [f"### {n} ranks on one host (host level {'on' if results['host_level'] else 'OFF'})", "",
             "| collective | " + " | ".join(format_size(s) for s in SIZES) + " |",
             "|---|" + "---:|" * len(SIZES)]
    worst = 0.0
    for c in COLLECTIVES:
        cells = []
        for s in SIZES:
            r = results[f"{c} {s}"]
            o, i = r["ddl_out"] / r["mpi_out"], r["ddl_in"] / r["mpi_in"]
            worst = max(worst, o, i)
            cells.append(f"{o:.2f} / {i:.2f}")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines += ["", "ddl's time / MPI's time (out of place / in place; below 1: ddl faster). ddl's absolute times "
              "(us, in place) and busbw (GB/s):", "",
              "| collective | " + " | ".join(format_size(s) for s in SIZES) + " |",
              "|---|" + "---:|" * len(SIZES)]
    for c in COLLECTIVES:
        lines.append(f"| {c} | " + " | ".join(
            f"{results[f'{c} {s}']['ddl_in']:.1f} us, {results[f'{c} {s}']['busbw']:.2f}" for s in SIZES) + " |")
    lines += ["", f"Worst ratio at {n} ranks: {worst:.2f}x MPI's time (target <= 1.0x)."]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", help="also write the tables (markdown) to this file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        from ddl.tools.measure import answer_as_worker

        return answer_as_worker(worker, args.repeats)
    from ddl.runner import mpirun

    parts = []
    for n in args.ranks:
        results = mpirun.worker_json(n, [sys.executable, os.path.abspath(__file__), "--worker",
                                         "--repeats", str(args.repeats)], timeout=3000)
        if results is None:
            return 1
        parts.append(table(results, n))
        print(parts[-1], flush=True)
    command = (f"python benchmarks/{os.path.basename(__file__)} --ranks {' '.join(map(str, args.ranks))} "
               f"--repeats {args.repeats}")
    text = "\n\n".join(parts) + f"\n\nCommand: `{command}`; float32, sum; median of {args.repeats} alternating " \
        f"repeats.\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
