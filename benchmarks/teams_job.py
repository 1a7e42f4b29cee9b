"""Two teams' allreduces alone and together, for benchmarks/teams.py: 4 ranks, team A and team B of two ranks
each (``--layout racks``: A = ranks 0, 1 on rack 0, B = ranks 2, 3 on rack 1, no link shared; ``crossed``: A =
0, 2 and B = 1, 3, both across the racks' uplinks). Each round: A alone, B alone, both at once; the time of a
phase is its slowest rank's. Writes the times (JSON) on rank 0."""
import argparse
import json
import time

import numpy as np
from mpi4py import MPI

import ddl

ap = argparse.ArgumentParser()
ap.add_argument("--layout", choices=("racks", "crossed"), required=True)
ap.add_argument("--mib", type=float, default=4.0)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--out", required=True)
args = ap.parse_args()

ddl.init()
world, mpi = ddl.communicator(), MPI.COMM_WORLD
members = {"A": [0, 1], "B": [2, 3]} if args.layout == "racks" else {"A": [0, 2], "B": [1, 3]}
teams = {name: ddl.new_team(ranks) for name, ranks in members.items()}
mine = next(name for name, t in teams.items() if t is not None)
data = np.ones(int(args.mib * 2**20) // 4, np.float32)
teams[mine].allreduce(data, "sum")  # plans made, connections up
times: dict[str, list[float]] = {"A alone": [], "B alone": [], "together": []}
for _ in range(args.rounds):
    for phase, active in (("A alone", {"A"}), ("B alone", {"B"}), ("together", {"A", "B"})):
        world.barrier()
        start = time.perf_counter()
        if mine in active:
            out = teams[mine].allreduce(data, "sum")
            assert out[0] == len(members[mine])
        took = mpi.allreduce(time.perf_counter() - start if mine in active else 0.0, op=MPI.MAX)
        times[phase].append(took)
if world.rank == 0:
    with open(args.out, "w") as f:
        json.dump({"times": times, "bytes": data.nbytes, "members": members}, f)
