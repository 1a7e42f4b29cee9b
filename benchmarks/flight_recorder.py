"""What the flight recorder costs per call: an 8 B allreduce on two communicators of one job, one keeping its
runs (DDL_FLIGHT_RECORDER_RUNS=64, the default) and one keeping none (0), in alternating batches.

    python benchmarks/flight_recorder.py               # 4 ranks on this host, 15 repeats of 2,000 calls each
    python benchmarks/flight_recorder.py --np 2 --repeats 9

Prints the median per-call time of each and their ratio (issue 17: not measurable at 8 B).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np


def job(repeats: int, calls: int) -> None:
    from mpi4py import MPI

    import ddl
    from ddl.core.communicator import Communicator

    comms = {}
    for label, runs in (("off", "0"), ("on", "64")):
        os.environ["DDL_FLIGHT_RECORDER_RUNS"] = runs
        comms[label] = Communicator.from_mpi(MPI.COMM_WORLD, ddl.options.parse(""))
    assert comms["off"]._flight is None and comms["on"]._flight is not None
    x, y = np.ones(2, np.float32), np.empty(2, np.float32)  # 8 B
    seen = {"off": [], "on": []}
    for rep in range(repeats + 2):
        for label in (("off", "on") if rep % 2 else ("on", "off")):
            comm = comms[label]
            comm.barrier()
            t = time.perf_counter()
            for _ in range(calls):
                comm.allreduce(x, out=y)
            took = comm.allreduce(np.array([(time.perf_counter() - t) / calls]), "max")[0]
            if rep >= 2:  # two warm-up rounds
                seen[label].append(took)
    if MPI.COMM_WORLD.rank == 0:
        off, on = statistics.median(seen["off"]), statistics.median(seen["on"])
        print(f"8 B allreduce, {MPI.COMM_WORLD.size} ranks, median of {repeats} x {calls} calls: recorder off "
              f"{off * 1e6:.2f} us, on {on * 1e6:.2f} us, on / off {on / off:.3f}")
    for comm in comms.values():
        comm.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        job(args.repeats, args.calls)
        return 0
    ddlrun = os.path.join(os.path.dirname(sys.executable), "ddlrun")
    return subprocess.run([ddlrun, "-np", str(args.np), sys.executable, __file__, "--job", "--repeats",
                           str(args.repeats), "--calls", str(args.calls)], timeout=1200).returncode


if __name__ == "__main__":
    sys.exit(main())
