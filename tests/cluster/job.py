"""The MPI side of the cluster tests: reports what ddl sees, then allreduces and checks the result.

    job.py REPORT_FILE [SIZE_BYTES [auto|flat-ring [TIMES]]]

Runs under mpirun or torchrun. Rank 0 writes {"hosts": ..., "tree": ..., "levels": ...} to REPORT_FILE; with SIZE_BYTES every rank allreduces
float32 values rank+1 (TIMES times, once unless given) and exits 1 if an element differs from the closed form p(p+1)/2.
"""
import json
import sys

import numpy as np


def main() -> int:
    import ddl
    from mpi4py import MPI

    from ddl.options import parse

    ddl.init()  # MPI's world under mpirun; under torchrun, the world joined through its store
    comm = ddl.communicator().mpi_comm
    flat_ring = len(sys.argv) > 3 and sys.argv[3] == "flat-ring"
    c = ddl.Communicator.from_mpi(comm, options=parse("-algo ring"), hierarchy=list(range(comm.size))) \
        if flat_ring else ddl.communicator()
    hosts = comm.gather(MPI.Get_processor_name())
    if comm.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump({"hosts": hosts, "tree": c.tree, "levels": [lv.name for lv in c.levels],
                       "num_hosts": ddl.num_hosts()}, f)
    if len(sys.argv) > 2:
        x = np.full(int(sys.argv[2]) // 4, comm.rank + 1, np.float32)
        p = comm.size
        for _ in range(int(sys.argv[4]) if len(sys.argv) > 4 else 1):
            y = c.allreduce(x)
            if not np.array_equal(y, np.full_like(x, p * (p + 1) / 2)):
                print(f"rank {comm.rank}: wrong allreduce result", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
