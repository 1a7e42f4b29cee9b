"""Small collectives across emulated hosts (run by test_emulated): each known call twice (the second takes its
short path), checked against numpy, then one rank calls differently. Writes this rank's findings as JSON.

    small_calls_job.py REPORT_PREFIX
"""
import json
import sys

import numpy as np


def main() -> int:
    import ddl
    from mpi4py import MPI

    ddl.init()
    c = ddl.communicator()
    rank, p = c.rank, c.size
    wrong = []
    for _ in range(2):
        b = np.arange(5, dtype=np.float64) * (rank + 1)
        c.broadcast(b, p - 1, out=b)
        if not np.array_equal(b, np.arange(5) * p):
            wrong.append("broadcast")
        got = c.allgather(np.full((2, 3), rank, np.int32))
        if not np.array_equal(got, np.repeat(np.arange(p, dtype=np.int32), 2)[:, None] * np.ones(3, np.int32)):
            wrong.append("allgather")
        part = c.reduce_scatter(np.arange(4 * p, dtype=np.float32) + rank, "sum")
        whole = p * np.arange(4 * p, dtype=np.float64) + p * (p - 1) / 2
        if not np.array_equal(part, whole[4 * rank:4 * rank + 4]):
            wrong.append("reduce_scatter")
        counts = [1 + r % 3 for r in range(p)]  # parts of uneven rows, in the round's layout of hosts
        rows = np.arange(sum(counts) * 2, dtype=np.int64).reshape(-1, 2) * (rank + 1)
        mine = c.reduce_scatter(rows, "sum", counts=counts)
        start = sum(counts[:rank])
        if not np.array_equal(mine, (p * (p + 1) // 2) * np.arange(sum(counts) * 2).reshape(-1, 2)[
                start:start + counts[rank]]):
            wrong.append("uneven reduce_scatter")
        y = c.allreduce(np.full(3, rank + 1, np.int64))
        if not np.array_equal(y, np.full(3, p * (p + 1) // 2)):
            wrong.append("allreduce")
        c.barrier()
        # uneven rows: the ride's round hashes each rank's count, so the ranks find out together and gather them
        uneven = c.allgather(np.full((1 + rank % 2, 2), rank, np.int16))
        if not np.array_equal(uneven, np.concatenate([np.full((1 + r % 2, 2), r, np.int16) for r in range(p)])):
            wrong.append("uneven allgather")
    raised = None
    try:  # rank 1 calls a broadcast where the others call the known allgather
        if rank == 1:
            c.broadcast(np.ones(3), 0)
        else:
            c.allgather(np.full((2, 3), rank, np.int32))
    except ddl.MismatchError as e:
        raised = str(e)
    c.barrier()  # the communicator still works afterwards
    with open(f"{sys.argv[1]}.{rank}", "w") as f:
        json.dump({"host": MPI.Get_processor_name(), "agreement": c.agreement.plan(0).algorithm,
                   "gathered": c.agreement.gather_plan(24).algorithm,
                   "scattered": c.agreement.scatter_plan(tuple([4] * p))[0].algorithm,
                   "wrong": wrong, "raised": raised}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
