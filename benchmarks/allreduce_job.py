"""One MPI job of the topology suite: every size, each algorithm in turn (interleaved), results checked.

    python benchmarks/allreduce_job.py --algos ddl,ddl-ring,mpi --sizes 1K,64M --out results.json

Launched by benchmarks/topologies.py inside the emulated cluster, once per round and per MPI setting (Open MPI
with coll/han, Open MPI with coll/tuned, MPICH); rank 0 writes {algorithm: {size: microseconds}} as JSON, the
time of a size being the max over ranks of the mean per call (out of place, float32, sum). A wrong element in
any algorithm's result makes the job exit non-zero.
"""
import argparse
import json
import sys

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algos", required=True)
    ap.add_argument("--sizes", required=True, help="comma list of byte counts (64K, 16M, ...)")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=0.3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import ddl
    from mpi4py import MPI

    from ddl.tools.measure import Runner, measure
    from ddl.units import parse_size

    comm = MPI.COMM_WORLD
    ddl.init(comm)
    runners = [Runner(a, comm) for a in args.algos.split(",")]
    f32 = np.dtype(np.float32)
    times: dict = {r.algo: {} for r in runners}
    wrong = 0
    for nbytes in [parse_size(s) for s in args.sizes.split(",")]:
        for runner in runners:
            # Small sizes: the first calls after another algorithm ran are slow (caches, TCP windows, the
            # scheduler), so warm up well and time many calls; large ones: the checked call is warm-up enough.
            small = nbytes < 1 << 20
            rec = measure(runner, comm, nbytes // 4, f32, "sum", max(args.iters, 50 if small else 0),
                          10 if small else 0, True, args.min_seconds,
                          places=(False,))
            times[runner.algo][nbytes] = rec["out_us"]
            if rec["out_wrong"]:
                wrong += rec["out_wrong"]
                if comm.rank == 0:
                    print(f"{runner.algo} at {nbytes} B: {rec['out_wrong']} wrong elements", file=sys.stderr)
    if comm.rank == 0:
        with open(args.out, "w") as f:
            json.dump({"mpi": MPI.Get_library_version().splitlines()[0], "wrong": wrong, "times": times}, f)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
