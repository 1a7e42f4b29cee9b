"""What a small broadcast costs a receiving rank's CPU when its message already waits for it (the root ran
ahead), over ddl's own TCP transport (ranks of this host through its shared pipes) beside MPI's own, alternating
in one job:

    python benchmarks/queued_receive.py --np 2 --repeats 3

A loop of small calls across hosts costs what every rank's CPU costs where ranks share cores (the emulated T1:
8 ranks on 2 cores, a call's time about the CPU of all ranks over 2), and most ranks of a loop of broadcasts are
receivers. Per repeat, for ddl (DDL_TRANSPORT=tcp, DDL_SHM=0) and then MPI: ROUNDS rounds in which the root
broadcasts CALLS 8-byte arrays while the others sleep 4 ms, then each of them makes its CALLS calls, timing its
own CPU (thread time). Medians over rounds, then over repeats, in microseconds of CPU per call.
"""
import os
import statistics
import sys
import time

import numpy as np

ROUNDS, CALLS = 200, 100


def receiving(comm, call) -> float:
    """The median over rounds of this rank's CPU per call (root: 0)."""
    for _ in range(300):
        call()
    comm.Barrier()
    per_call = []
    for _ in range(ROUNDS):
        if comm.rank == 0:
            for _ in range(CALLS):
                call()
            continue
        time.sleep(0.004)  # (the root's calls queue up meanwhile)
        started = time.thread_time()
        for _ in range(CALLS):
            call()
        per_call.append((time.thread_time() - started) / CALLS * 1e6)
    comm.Barrier()
    return statistics.median(per_call) if per_call else 0.0


def worker(repeats: int) -> dict:
    os.environ.update(DDL_TRANSPORT="tcp", DDL_SHM="0")  # ddl's TCP on this host: the path between hosts
    import ddl
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    x = np.ones(2, np.float32)
    got = {"ddl": [], "mpi": []}
    for _ in range(repeats):
        ddl.init(comm)
        assert ddl.communicator()._executor.transport == "tcp", "ddl did not run over its TCP transport"
        got["ddl"].append(receiving(comm, lambda: ddl.broadcast(x, 0, out=x)))
        ddl.finalize()
        got["mpi"].append(receiving(comm, lambda: comm.Bcast(x, 0)))
    everyone = comm.gather(got)
    if comm.rank:
        return {}
    return {lib: [statistics.median(r[lib]) for r in everyone[1:]] for lib in got}  # (per receiver)


def report(results: dict, n: int) -> str:
    ddl_us, mpi_us = statistics.median(results["ddl"]), statistics.median(results["mpi"])
    return (f"### A receiver's CPU per 8 B broadcast, its message queued ({n} ranks on one host)\n\n"
            "| ddl over its TCP (us) | MPI (us) | ddl / MPI |\n|---:|---:|---:|\n"
            f"| {ddl_us:.2f} | {mpi_us:.2f} | {ddl_us / mpi_us:.2f} |\n\n"
            f"Per receiver (ddl / MPI): " + ", ".join(f"{d:.2f} / {m:.2f}" for d, m in zip(results["ddl"],
                                                                                            results["mpi"])))


if __name__ == "__main__":
    from ddl.tools.measure import self_launched

    sys.exit(self_launched(__file__, __doc__, worker, report, repeats=3))
