"""DDL_TIMELINE and -dump_iter with MPI ranks: a pretend cluster (test_topology) gives several levels; the trace
rank 0 writes at close must be valid JSON with a track per rank, events for every level, and per call and
pipeline block phase durations that fit inside the call."""
import json
import os
import tempfile
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

from ddl.core.communicator import Communicator
from ddl.planner import Shape
from test_collectives import assert_reduced, contribution
from test_topology import options, pretend

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size
SIZES = (7, 10007, 300_001)


@pytest.mark.mpi(min_size=2)
def test_trace_file_has_every_rank_level_and_block_within_its_call():
    topo, tree = pretend(SIZE)
    where = COMM.bcast(tempfile.mkdtemp(prefix="ddl-timeline-") if RANK == 0 else None)
    path = os.path.join(where, "trace.json")
    comm = Communicator.from_mpi(COMM, replace(options(), timeline=path), topology=topo)
    try:
        for n in SIZES:
            assert_reduced(comm.allreduce(contribution(RANK, n, np.float32, "sum")), n, np.float32, "sum")
    finally:
        comm.close()
    COMM.Barrier()
    if RANK == 0:
        trace = json.load(open(path))
        xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        assert {e["pid"] for e in xs} == set(range(SIZE))
        names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
        assert names[0].startswith("rank 0 (")
        depth = Shape.of(tree).depth
        eps = 1e-3
        for pid in range(SIZE):
            calls = [e for e in xs if e["pid"] == pid and e["cat"] == "call"]
            assert [c["args"]["bytes"] for c in calls] == [4 * n for n in SIZES]
            phases = [e for e in xs if e["pid"] == pid and e["cat"] != "call"]
            assert all(e["dur"] >= 0 for e in phases)
            levels = {e["args"]["level"] for e in phases if e["args"]["level"] >= 0}
            assert levels == set(range(depth)), (pid, levels)
            for call in calls:
                inside = [e for e in phases if call["ts"] - eps <= e["ts"]
                          and e["ts"] + e["dur"] <= call["ts"] + call["dur"] + eps]
                per_block: dict = {}
                for e in inside:
                    per_block[e["args"]["block"]] = per_block.get(e["args"]["block"], 0.0) + e["dur"]
                assert per_block and max(per_block.values()) <= call["dur"] + eps
            assert sum(1 for c in calls for e in phases if c["ts"] - eps <= e["ts"]
                       and e["ts"] + e["dur"] <= c["ts"] + c["dur"] + eps) == len(phases)
        os.remove(path)
        os.rmdir(where)


@pytest.mark.mpi(min_size=2)
def test_dump_iter_prints_per_level_times_on_rank_0(capfd):
    topo, tree = pretend(SIZE)
    comm = Communicator.from_mpi(COMM, replace(options(), dump_iter=2), topology=topo)
    try:
        for _ in range(2):
            comm.allreduce(contribution(RANK, 300_001, np.float32, "sum"))
    finally:
        comm.close()
    err = capfd.readouterr().err
    if RANK == 0:
        assert "[ddl] iter 2: allreduce" in err
        for level in range(Shape.of(tree).depth):
            assert f"level {level} (" in err
        assert "reduce-scatter" in err or Shape.of(tree).depth == 1
    else:
        assert "[ddl] iter" not in err
