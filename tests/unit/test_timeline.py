"""Per-level timing: the round labels of a plan, the executor's round spans, -dump_iter's per-level lines and
the Chrome trace of DDL_TIMELINE (ddl.core.timeline). End to end over the loopback transport (ranks are
threads); tests/mpi/test_timeline.py does the same with MPI ranks."""
import json
from dataclasses import replace

import numpy as np
import pytest

from ddl import _native, planner
from ddl.core.communicator import Communicator
from ddl.core.diagnostics import CallTimer
from ddl.core.timeline import Call, Event, chrome_trace, events
from ddl.options import parse
from ddl.planner.programs import round_phases
from ddl.schedule import Op
from ddl.topology.tree import leaves, normalize
from test_loopback import spawn_on

BASE = replace(parse("", environ={}), timeout=20.0)


def lowest_common_level(tree, a: int, b: int) -> int:
    """The innermost level whose group holds both ranks (0: the innermost groups), walking the nested lists."""
    def path(t, r):  # groups from the root down to r's innermost group
        if isinstance(t[0], int):
            return [t] if r in t else None
        for child in t:
            p = path(child, r)
            if p is not None:
                return [t] + p
        return None

    pa, pb = path(tree, a), path(tree, b)
    shared = sum(1 for x, y in zip(pa, pb) if x is y)
    return len(pa) - shared


TREES = [
    [[0, 1], [2, 3]],
    [[0, 1, 2], [3, 4], [5]],
    [[[0, 1], [2, 3]], [[4, 5], [6, 7]]],
    [[[0, 1, 2], [3]], [[4, 5]]],
]


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("nbytes", [1 << 10, 1 << 22])
def test_round_labels_match_the_levels_the_steps_cross(tree, nbytes):
    tree = normalize(tree)
    levels = planner.default_levels(tree)
    plan = planner.choose(tree, levels, nbytes)
    labels = round_phases(plan)
    for rank in leaves(tree):
        prog = planner.program(rank, plan, 1000)
        assert len(labels) >= prog.rounds
        for s in prog.steps:
            level, phase = labels[s.round]
            if plan.shape == "latency":
                if tree == normalize(TREES[2]):  # uniform: every round crosses exactly the level it names
                    assert lowest_common_level(tree, rank, s.peer) == level
                continue
            assert lowest_common_level(tree, rank, s.peer) == level, (rank, s)
            if phase == "reduce-scatter":
                assert s.op is not Op.RECV_COPY
            if phase == "allgather":
                assert s.op is not Op.RECV_REDUCE


def test_latency_plan_labels_one_phase_per_round():
    tree = normalize(TREES[2])
    plan = planner.choose(tree, planner.default_levels(tree), 8, ("recursive_doubling",))
    assert plan.shape == "latency"
    assert round_phases(plan) == [(0, "recursive doubling"), (1, "recursive doubling"), (2, "recursive doubling")]


def test_events_merge_a_blocks_rounds_per_phase():
    spans = np.array([[0, 0, 10, 20], [0, 1, 20, 35], [1, 0, 15, 40], [0, 2, 35, 50], [1, 1, 40, 41]], np.int64)
    labels = [(0, "reduce-scatter"), (0, "reduce-scatter"), (1, "allreduce")]
    got = {(e.block, e.level, e.phase): (e.start, e.end) for e in events(spans, labels, "x")}
    assert got == {(0, 0, "reduce-scatter"): (10, 35), (0, 1, "allreduce"): (35, 50),
                   (1, 0, "reduce-scatter"): (15, 41)}
    assert {e.phase for e in events(spans, (), "ring")} == {"ring"}


def test_call_timer_prints_the_mean_per_level_and_phase(capsys):
    timer = CallTimer(2, 0, ["node", "rack"])
    call = Call("allreduce", 64, 0, 100, [Event(0, "reduce-scatter", 0, 0, 30_000), Event(0, "reduce-scatter", 1, 10_000, 50_000),
                                        Event(1, "allreduce", 0, 30_000, 70_000)])
    assert timer.add(1e-4, 64, call) == []
    lines = timer.add(3e-4, 64, call)
    assert lines[0].startswith("[ddl] iter 2: allreduce 200.0 us per call")
    assert "level 0 (node)" in lines[1] and "reduce-scatter" in lines[1] and lines[1].endswith("50.0 us per call")
    assert "level 1 (rack)" in lines[2] and lines[2].endswith("40.0 us per call")
    assert capsys.readouterr().err.splitlines() == lines


def test_trace_puts_overlapping_blocks_of_a_phase_in_lanes():
    calls = [Call("allreduce", 8, 1000, 9000, [Event(0, "reduce-scatter", 0, 1000, 4000),
                                               Event(0, "reduce-scatter", 1, 2000, 5000),
                                               Event(0, "reduce-scatter", 2, 4000, 6000)]).to_list()]
    trace = json.loads(json.dumps(chrome_trace([{"rank": 3, "host": "n0", "origin": 1000, "levels": ["node"],
                                                  "calls": calls}])))
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "call"]
    lane = {e["args"]["block"]: e["tid"] for e in xs}
    assert lane[0] != lane[1] and lane[2] == lane[0]
    assert {e["pid"] for e in trace["traceEvents"]} == {3}
    call = next(e for e in trace["traceEvents"] if e.get("cat") == "call")
    assert (call["ts"], call["dur"]) == (0.0, 8.0)


def _traced_run(tmp_path, p, tree, sizes):
    path = tmp_path / "trace.json"
    opts = replace(BASE, segment=16 << 10, small_bytes=0, timeline=str(path))
    hub = _native.LoopbackHub(p)
    comms = [Communicator.loopback(hub, r, opts, hierarchy=tree) for r in range(p)]

    def work(comm):
        got = [comm.allreduce(np.full(n, comm.rank + 1.0, np.float32)) for n in sizes]
        comm.close()
        return got

    results, errors = spawn_on(comms, work)
    assert errors == [None] * p
    want = p * (p + 1) / 2
    for got in results:
        assert all(np.all(g == want) for g in got)
    return json.loads(path.read_text())


def test_loopback_trace_has_every_rank_and_level_and_fits_in_its_calls(tmp_path):
    trace = _traced_run(tmp_path, 4, [[0, 1], [2, 3]], [100, 40_000, 250_000])
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for pid in range(4):
        calls = [e for e in xs if e["pid"] == pid and e["cat"] == "call"]
        assert len(calls) == 3
        phases = [e for e in xs if e["pid"] == pid and e["cat"] != "call"]
        assert {e["args"]["level"] for e in phases if e["name"] != "agreement"} == {0, 1}
        assert {e["name"] for e in phases} == {"agreement", "recursive doubling", "reduce-scatter", "allreduce",
                                               "allgather"}  # 100 elements: the latency plan
        eps = 1e-3  # microseconds: the JSON's rounding
        for call in calls:
            inside = [e for e in phases if call["ts"] - eps <= e["ts"] and e["ts"] + e["dur"] <= call["ts"] + call["dur"] + eps]
            per_block: dict = {}
            for e in inside:
                if e["name"] != "agreement":
                    per_block[e["args"]["block"]] = per_block.get(e["args"]["block"], 0.0) + e["dur"]
            assert per_block and max(per_block.values()) <= call["dur"] + eps
        # every phase event belongs to exactly one call
        for e in phases:
            owners = [c for c in calls if c["ts"] - eps <= e["ts"] and e["ts"] + e["dur"] <= c["ts"] + c["dur"] + eps]
            assert len(owners) == 1, e
    big = [e for e in xs if e["pid"] == 0 and e["cat"] != "call" and e["name"] == "reduce-scatter"]
    assert len({e["args"]["block"] for e in big}) > 1  # pipelined: one event per block


def test_recording_is_off_unless_asked():
    hub = _native.LoopbackHub(2)
    comms = [Communicator.loopback(hub, r, BASE) for r in range(2)]
    results, errors = spawn_on(comms, lambda c: c.allreduce(np.ones(50_000, np.float32)))
    assert errors == [None, None]
    for c in comms:
        assert not c._executor.recording
        spans, dropped = c._executor.take_spans()
        assert spans.shape == (0, 4) and dropped == 0
