"""Calls checked on receipt against calls agreed first, side by side in one job per emulated cluster (as root):

    python benchmarks/checked_calls.py --topologies T1,T2 --repeats 5 --out benchmarks/results/checked-calls.md

Over ddl's own TCP connections an allreduce, a reduce-scatter or a broadcast of up to CHECKED_UP_TO
(ddl.core.paths.planned) carries its mismatch check in its own messages instead of running an agreement round
first (a small broadcast otherwise rides in the round). In one job the
two take turns, repeat by repeat (the module's threshold set to the size or to 0 between them), with Open MPI's
own collective beside them: ddl-bench's measure (results checked, out of place, float32 sum, the slowest
rank's mean per call), the median over repeats. Allreduces and reduce-scatters small enough to ride in the
agreement round (the riding path) take it both ways and are left out. Only the ratios in one table compare: this machine's speed moves
by tens of percent between minutes.
"""
import argparse
import statistics
import sys

SIZES = (8, 1 << 10, 8 << 10, 64 << 10, 256 << 10, 1 << 20)
COLLECTIVES = ("allreduce", "reduce_scatter", "broadcast")


def worker(repeats: int) -> None:
    import numpy as np
    from mpi4py import MPI

    import ddl
    import ddl.core.paths.planned as planned
    from ddl.tools.measure import Runner, measure

    comm = MPI.COMM_WORLD
    ddl.init(comm)
    checked_up_to = planned.CHECKED_UP_TO
    rows = []
    for collective in COLLECTIVES:
        runners = {"ddl": Runner("ddl", comm, collective), "mpi": Runner("mpi", comm, collective)}
        for nbytes in SIZES:
            if "checked on receipt" not in ddl.explain(nbytes, collective).path:  # (riding, or too large)
                continue
            times: dict[str, list[float]] = {"checked": [], "agreed": [], "mpi": []}
            iters = max(5, min(500, (1 << 24) // nbytes))
            for _ in range(repeats):
                for mode in times:
                    planned.CHECKED_UP_TO = 0 if mode == "agreed" else checked_up_to
                    rec = measure(runners["mpi" if mode == "mpi" else "ddl"], comm, nbytes // 4,
                                  np.dtype(np.float32), "sum", iters, 2, True, 0.1, places=(False,))
                    assert rec["out_wrong"] == 0, f"{mode} {collective} {nbytes}: wrong elements"
                    times[mode].append(rec["out_us"])
            planned.CHECKED_UP_TO = checked_up_to
            rows.append((collective, nbytes, {m: statistics.median(t) for m, t in times.items()}))
    if comm.rank == 0:
        from ddl.units import format_size

        for collective, nbytes, t in rows:
            print(f"| {collective} | {format_size(nbytes)} | {t['checked']:.0f} | {t['agreed']:.0f} | "
                  f"{t['checked'] / t['agreed']:.2f} | {t['mpi']:.0f} | {t['checked'] / t['mpi']:.2f} | "
                  f"{t['agreed'] / t['mpi']:.2f} |", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topologies", default="T1,T2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="also write the tables (markdown) to this file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.repeats)
        return 0
    from ddl.cluster import Cluster
    from ddl.cluster import spec as emulate

    parts = []
    for name in args.topologies.split(","):
        with Cluster(emulate.topology(name)) as cluster:
            done = cluster.mpirun([sys.executable, __file__, "--worker", "--repeats", str(args.repeats)],
                                  timeout=1800, quiet=True, capture=True)
        if done.returncode:
            print(f"{name}: the job failed ({done.returncode}):\n{done.stderr[-3000:]}", file=sys.stderr)
            return 1
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("|")]
        parts.append(f"### {name}: {emulate.PRESET_TEXT.get(name, name)}\n\n"
                     "| collective | size | checked (us) | agreed (us) | checked / agreed | Open MPI (us) | "
                     "checked / MPI | agreed / MPI |\n|:---|---:|---:|---:|---:|---:|---:|---:|\n" + "\n".join(lines))
        print(parts[-1] + "\n", flush=True)
    text = "\n\n".join(parts) + (f"\n\nCommand: `python benchmarks/checked_calls.py --topologies {args.topologies} "
                                 f"--repeats {args.repeats}`; median of {args.repeats} repeats, taken in turns.\n")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
