"""Every collective on one host, ddl beside MPI's own, side by side in one run (issue 28's first target); and
on the emulated clusters (as root), where the collectives follow their plans per level.

    python benchmarks/host_collectives.py --ranks 2 4 8 --repeats 10 --out benchmarks/results/host-collectives.md
    python benchmarks/host_collectives.py --topologies T1,T2 --repeats 5 --out benchmarks/results/cluster-collectives.md

For each rank count, collective (allreduce, broadcast, allgather, reduce_scatter; float32, sum) and size (8 B to
64 MiB on one host, to 16 MiB on the clusters),
every repeat measures ddl and then MPI (ddl-bench's measure: results checked, nccl-tests' sizes and busbw);
on the clusters PyTorch's gloo too (issue 48's target is the faster of the two; ``--peers``), in a job of its
own; the table gives the median over repeats of ddl's time over the faster peer's (below 1: ddl is faster), out of
place and in place, and ddl's in-place busbw. ddl writes into preallocated outputs (``out=``), as MPI does.
"""
import argparse
import os
import statistics
import sys

import numpy as np

COLLECTIVES = ("allreduce", "broadcast", "allgather", "reduce_scatter")
SIZES = (8, 1 << 10, 8 << 10, 64 << 10, 1 << 20, 16 << 20)  # on the emulated clusters (64 MiB there: seconds per call)
ONE_HOST_SIZES = SIZES + (64 << 20,)
# below 1 MiB a measurement takes a few hundred milliseconds, and a median of a few such moved by 20-30 % from run
# to run on this 2-core machine (MPI's 8 B broadcast on T2: 35-103 us in one job): three times the repeats there
SMALL_BELOW, SMALL_REPEATS = 1 << 20, 3
# gloo's call costs 2-100 ms where MPI's costs 40-2700 us (below 1 MiB on T1 and T2): a measurement of it runs calls for
# about this long, and its median is of --repeats alone, so that its column does not triple the sweep's time
GLOO_SECONDS = 0.3


def worker(repeats: int, sizes: tuple[int, ...] = SIZES, libraries: tuple[str, ...] = ("ddl", "mpi")) -> dict:
    """Every collective and size, each of ``libraries`` in turn per repeat. gloo comes in a job of its own: its
    process group's threads (a loop per rank waking ~95 times a second) took CPU turns from ddl's broadcast root
    in the same processes, 53 -> 188 us at 8 B on T1, while MPI's did not move."""
    import ddl
    from mpi4py import MPI

    from ddl.tools.measure import Runner, bandwidth, measure

    comm = MPI.COMM_WORLD
    out = {"sizes": list(sizes)}
    if "ddl" in libraries:
        ddl.init(comm)
        out.update(host_level=ddl.communicator().host_level, ddl=os.path.dirname(ddl.__file__))  # (which build)
    gloo_alone = libraries == ("gloo",)  # (its own job: fewer calls, no extra repeats below 1 MiB)
    for collective in COLLECTIVES:
        runners = {a: Runner(a, comm, collective) for a in libraries}
        for nbytes in sizes:
            samples = {(a, k): [] for a in runners for k in ("out", "in")}
            busbw = []
            iters = max(2, min(2000, (1 << 24) // nbytes))
            if gloo_alone:  # as many calls as fill GLOO_SECONDS, after one to time
                once = measure(runners["gloo"], comm, nbytes // 4, np.dtype(np.float32), "sum", 1, 1, False)
                iters = max(2, min(iters, int(GLOO_SECONDS / (once["out_us"] * 1e-6))))
            small = nbytes < SMALL_BELOW and not gloo_alone
            for _ in range(repeats * (SMALL_REPEATS if small else 1)):
                for a, runner in runners.items():
                    rec = measure(runner, comm, nbytes // 4, np.dtype(np.float32), "sum", iters, 1, True, 0.02)
                    assert rec["out_wrong"] == 0 and rec["in_wrong"] == 0, f"{a} {collective} {nbytes}: wrong"
                    for k in ("out", "in"):
                        samples[(a, k)].append(rec[f"{k}_us"])
                    if a == "ddl":
                        busbw.append(bandwidth(rec["size"], rec["in_us"], comm.size, collective)[1])
            out[f"{collective} {nbytes}"] = {f"{a}_{k}": statistics.median(v) for (a, k), v in samples.items()}
            if busbw:
                out[f"{collective} {nbytes}"]["busbw"] = statistics.median(busbw)
    return out


def table(results: dict, n: int, where: str | None = None) -> str:
    from ddl.units import format_size

    sizes = results.get("sizes", SIZES)
    peers = [p for p in ("mpi", "gloo") if f"{p}_in" in results[f"{COLLECTIVES[0]} {sizes[0]}"]]
    names = [p if p == "gloo" else "MPI" for p in peers]
    title = where or f"{n} ranks on one host (host level {'on' if results['host_level'] else 'OFF'})"
    lines = [f"### {title}", "",
             "| collective | " + " | ".join(format_size(s) for s in sizes) + " |",
             "|---|" + "---:|" * len(sizes)]
    worst = 0.0
    for c in COLLECTIVES:
        cells = []
        for s in sizes:
            r = results[f"{c} {s}"]
            best = {k: min(peers, key=lambda p: r[f"{p}_{k}"]) for k in ("out", "in")}
            o, i = (r[f"ddl_{k}"] / r[f"{best[k]}_{k}"] for k in ("out", "in"))
            worst = max(worst, o, i)
            cells.append(f"{o:.2f} / {i:.2f}" + (" g" if "gloo" in best.values() else ""))
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    against = "MPI's time" if peers == ["mpi"] else \
        "the faster peer's time (of " + " and ".join(names) + \
        "; g: gloo was the faster in that cell)"
    lines += ["", f"ddl's time / {against} (out of place / in place; below 1: ddl faster). ddl's absolute times "
              "(us, out of place / in place) and in-place busbw (GB/s):", "",
              "| collective | " + " | ".join(format_size(s) for s in sizes) + " |",
              "|---|" + "---:|" * len(sizes)]
    for c in COLLECTIVES:
        lines.append(f"| {c} | " + " | ".join(
            f"{results[f'{c} {s}']['ddl_out']:.1f} / {results[f'{c} {s}']['ddl_in']:.1f} us, "
            f"{results[f'{c} {s}']['busbw']:.2f}" for s in sizes) + " |")
    if len(peers) > 1:
        lines += ["", "The peers' in-place times (us), " + " / ".join(names) + ":",
                  "", "| collective | " + " | ".join(format_size(s) for s in sizes) + " |",
                  "|---|" + "---:|" * len(sizes)]
        for c in COLLECTIVES:
            lines.append(f"| {c} | " + " | ".join(
                " / ".join(f"{results[f'{c} {s}'][f'{p}_in']:.0f}" for p in peers) for s in sizes) + " |")
    lines += ["", f"Worst ratio at {n} ranks: {worst:.2f}x {'MPI' if peers == ['mpi'] else 'the faster peer'}'s time "
              "(target <= 1.0x)."]
    if "bound" in results:
        broadcast = results["broadcast_bound"] / (results[f"broadcast {SIZES[-1]}"]["ddl_in"] * 1e-6)
        lines += ["", "Lower bound of a reduce-scatter or allgather (half the allreduce's: per level (E-1)/E x n / "
                  "B_out) against ddl's in-place time at " + format_size(SIZES[-1]) + ": " + ", ".join(
                      f"{c} {results['bound'] / (results[f'{c} {SIZES[-1]}']['ddl_in'] * 1e-6):.0%}"
                      for c in ("reduce_scatter", "allgather")) + " of the bound; broadcast (n / B_out of the "
                  f"slowest level's links) {broadcast:.0%} of its bound."]
    return "\n".join(lines)


def jobs(peers: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The jobs a sweep runs: ddl beside MPI (where MPI is a peer), gloo in one of its own (see worker)."""
    return [("ddl",) + tuple(p for p in peers if p != "gloo")] + ([("gloo",)] if "gloo" in peers else [])


def merge(results: dict, job: dict) -> None:
    """A job's cells into the sweep's (each cell's times side by side)."""
    for key, value in job.items():
        if isinstance(value, dict) and isinstance(results.get(key), dict):
            results[key].update(value)
        else:
            results.setdefault(key, value)


def on_cluster(name: str, repeats: int, peers: tuple[str, ...]) -> tuple[dict, int, str]:
    """The worker as an MPI job on the emulated cluster ``name`` (ddl told its topology)."""
    import json

    from ddl import planner
    from ddl.cluster import Cluster, spec as emulate

    t = emulate.topology(name)
    with Cluster(t) as cluster:
        # (a PYTHONPATH of the caller's reaches the ranks: benchmarks/before_after.sh runs an earlier build so)
        forward = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else None
        results = {}
        for libraries in jobs(peers):
            done = cluster.mpirun([sys.executable, os.path.abspath(__file__), "--worker", "--repeats", str(repeats),
                                   "--libraries", ",".join(libraries)],
                                  env=forward, timeout=3000, quiet=True, capture=True)
            if done.returncode:
                raise RuntimeError(f"{name}: the job of {', '.join(libraries)} failed ({done.returncode}):\n"
                                   f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
            merge(results, json.loads(done.stdout.strip().splitlines()[-1]))
    tree, levels = t.hierarchy(t.place(None, t.capacity()))
    results["bound"] = planner.lower_bound(planner.Shape.of(tree), levels, SIZES[-1])[0] / 2
    results["broadcast_bound"] = planner.broadcast_lower_bound(planner.Shape.of(tree), levels, SIZES[-1])
    return results, t.capacity(), f"{name}: {emulate.PRESET_TEXT.get(name, name)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--topologies", help="emulated clusters instead of one host (T1,T2; needs root)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", help="also write the tables (markdown) to this file")
    ap.add_argument("--peers", help="compared with: mpi, gloo (default: both on the clusters, mpi on one host)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help=argparse.SUPPRESS)  # the worker's
    ap.add_argument("--libraries", default="ddl,mpi", help=argparse.SUPPRESS)  # the worker's
    args = ap.parse_args()
    peers = tuple(args.peers.split(",")) if args.peers else ("mpi", "gloo") if args.topologies else ("mpi",)
    if set(peers) - {"mpi", "gloo"} or not peers:
        ap.error(f"--peers {args.peers}: mpi, gloo or both")
    if args.worker:
        from ddl.tools.measure import answer_as_worker

        return answer_as_worker(lambda repeats: worker(repeats, tuple(args.sizes), tuple(args.libraries.split(","))),
                                args.repeats)
    from ddl.runner import mpirun

    parts = []
    for name in args.topologies.split(",") if args.topologies else ():
        results, n, where = on_cluster(name, args.repeats, peers)
        print(f"{name}: the ranks ran ddl from {results.get('ddl')}", file=sys.stderr)
        parts.append(table(results, n, where))
        print(parts[-1], flush=True)
    for n in args.ranks if not args.topologies else ():
        results = {}
        for libraries in jobs(peers):
            job = mpirun.worker_json(n, [sys.executable, os.path.abspath(__file__), "--worker",
                                         "--repeats", str(args.repeats), "--libraries", ",".join(libraries),
                                         "--sizes", *map(str, ONE_HOST_SIZES)], timeout=3000)
            if job is None:
                return 1
            merge(results, job)
        parts.append(table(results, n))
        print(parts[-1], flush=True)
    what = f"--topologies {args.topologies}" if args.topologies else f"--ranks {' '.join(map(str, args.ranks))}"
    command = f"python benchmarks/{os.path.basename(__file__)} {what} --repeats {args.repeats}" + \
        (f" --peers {args.peers}" if args.peers else "")
    text = "\n\n".join(parts) + f"\n\nCommand: `{command}`; float32, sum; median of {args.repeats} alternating " \
        f"repeats ({args.repeats * SMALL_REPEATS} below {SMALL_BELOW >> 20} MiB)" + \
        (f"; gloo in a job of its own, median of {args.repeats}, calls filling ~{GLOO_SECONDS} s a measurement"
         if "gloo" in peers else "") + ".\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
