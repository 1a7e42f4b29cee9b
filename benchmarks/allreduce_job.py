"""One MPI job of the topology suite: every size, each algorithm in turn (interleaved), results checked.

    python benchmarks/allreduce_job.py --algos ddl,ddl-ring,mpi --sizes 1K,64M --out results.json

Launched by benchmarks/topologies.py (and benchmarks/torchrun.py, which also starts it with torchrun) inside the emulated cluster, once per round and per MPI setting (Open MPI
with coll/han, Open MPI with coll/tuned, MPICH); rank 0 writes JSON: ``runs`` {algorithm: {size: [microseconds,
one per repeat]}}, a measurement being the max over ranks of the mean per call (out of place, float32, sum);
``times`` the median of each; for ddl also the time its cost model predicts per size (``predicted``), where its
tree came from and the level costs it planned with. A wrong element in any algorithm's result makes the job
exit non-zero.
"""
import argparse
import json
import statistics
import sys

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algos", required=True)
    ap.add_argument("--sizes", required=True, help="comma list of byte counts (64K, 16M, ...)")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=0.3)
    ap.add_argument("--repeats", type=int, default=1, help="measurements per size and algorithm (interleaved)")
    ap.add_argument("--big-repeats", type=int, help="the same from 1 MiB (default: --repeats): a few calls make "
                    "one measurement there, where one slow call moves it")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import ddl
    from mpi4py import MPI

    from ddl.tools.measure import Runner, measure
    from ddl.units import parse_size

    ddl.init()  # MPI's world under an MPI launcher; under torchrun, the world joined through its store
    comm = ddl.communicator().mpi_comm
    runners = [Runner(a, comm) for a in args.algos.split(",")]
    f32 = np.dtype(np.float32)
    runs: dict = {r.algo: {} for r in runners}
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    wrong = 0
    for nbytes in sizes:
        for _ in range(args.repeats if nbytes < 1 << 20 or args.big_repeats is None else args.big_repeats):
            for runner in runners:
                # The first calls after another algorithm ran are slow (caches, the scheduler, and TCP windows:
                # a connection idle longer than its retransmission timeout starts slow again, Linux's
                # tcp_slow_start_after_idle), so small sizes warm up well and time many calls; large ones take one
                # call right before the timed ones (the checked call's numpy check can leave that gap: a T2
                # 16 MiB allreduce read 290 ms warm and up to 345 ms a second after idle, for every library alike).
                small = nbytes < 1 << 20
                rec = measure(runner, comm, nbytes // 4, f32, "sum", max(args.iters, 50 if small else 0),
                              10 if small else 1, True, args.min_seconds,
                              places=(False,))
                runs[runner.algo].setdefault(nbytes, []).append(rec["out_us"])
                if rec["out_wrong"]:
                    wrong += rec["out_wrong"]
                    if comm.rank == 0:
                        print(f"{runner.algo} at {nbytes} B: {rec['out_wrong']} wrong elements", file=sys.stderr)
    if comm.rank == 0:
        world = ddl.communicator()
        model = {"predicted": {n: world.explain(n).predicted * 1e6 for n in sizes},
                 "tree_source": world.tree_source, "levels": [lv.to_dict() for lv in world.levels],
                 "tree": world.tree, "hosts": world.hosts}
        times = {a: {n: statistics.median(v) for n, v in by.items()} for a, by in runs.items()}
        with open(args.out, "w") as f:
            json.dump({"mpi": MPI.Get_library_version().splitlines()[0], "wrong": wrong, "times": times,
                       "runs": runs, "model": model}, f)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
