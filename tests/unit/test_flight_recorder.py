"""The flight recorder's ring and ddl-trace's verdict on hand-written records (closed-form expected lines)."""
import json

import numpy as np
import pytest

import ddl
from ddl import _native
from ddl.core import flight
from ddl.core.communicator import Communicator
from ddl.tools import trace
from test_loopback import spawn_on

NATIVE = ("rank 2: allreduce(shape=(262144,), dtype=float32, op=sum) made no progress for 2 s (DDL_TIMEOUT); "
          "waiting on receive (reduce) from rank 3 (1048576 bytes, round 1, block 0). The peer may have died, or ranks called "
          "different collectives.")


def test_the_failure_detail_names_peer_round_level_and_phase():
    phases = [(0, "reduce-scatter"), (1, "allreduce"), (0, "allgather")]
    got = flight.failure_detail(NATIVE, phases, ["node", "rack"])
    assert got["waiting_on"] == 3 and got["round"] == 1 and got["block"] == 0
    assert got["waiting_for"] == "receive (reduce)" and got["message_bytes"] == 1 << 20
    assert got["step"] == "round 1: level 1 (rack) allreduce" and got["error"] == NATIVE
    assert flight.failure_detail("peer died", phases, []) == {"error": "peer died"}


def test_the_executor_keeps_the_last_runs_in_order(monkeypatch):
    # two loopback ranks, 5 small allreduces (one run each: the agreement round carries them), a ring of 3
    monkeypatch.setenv("DDL_FLIGHT_RECORDER_RUNS", "3")
    hub = _native.LoopbackHub(2)
    comms = [Communicator.loopback(hub, r, ddl.options.parse("")) for r in range(2)]
    results, errors = spawn_on(comms, lambda c: [c.allreduce(np.full(i + 1, 1.0, np.float32))
                                                 for i in range(5)])
    assert errors == [None, None]
    for comm in comms:
        runs = comm._flight.runs()
        assert [r["seq"] for r in runs] == [2, 3, 4] and [r["bytes"] for r in runs] == [12, 16, 20]
        assert all(r["state"] == "done" and r["end_ns"] >= r["start_ns"] > 0 for r in runs)
        assert runs[-1]["label"].startswith("allreduce(shape=(5,), dtype=float32")
        comm.close()


def _dump(rank, size, runs, host="h"):
    return {"format": flight.FORMAT, "rank": rank, "host": f"{host}{rank}", "pid": 1, "reason": "test",
            "clock_ns": 0, "communicators": [{"communicator": 0, "rank": rank, "size": size, "levels": ["node"],
                                              "runs": runs}]}


def _run(seq, state="done", **extra):
    return {"seq": seq, "label": f"allreduce #{seq}", "bytes": 1 << 20, "algorithm": "ring", "start_ns": 1,
            "end_ns": 2, "state": state, **extra}


def test_the_verdict_names_who_never_entered_and_where_the_others_waited():
    waiting = {"error": "x", "waiting_on": 3, "waiting_for": "receive (reduce)", "round": 1, "block": 0,
               "message_bytes": 1024, "step": "round 1: level 0 (node) reduce-scatter"}
    dumps = [_dump(r, 5, [_run(6), _run(7, "failed", **waiting)]) for r in range(3)] + [_dump(3, 5, [_run(6)])]
    assert trace.verdict(dumps) == [
        "communicator 0 (5 ranks): run #7 allreduce #7 (1 MiB, ring) did not finish on every rank",
        "  rank 3 (h3) never entered it: its last run was #6 allreduce #6 (done)",
        "  rank 4: no file (dead before writing, or not signalled: kill -USR1 a live rank to get its record)",
        "  ranks 0-2 waited on rank 3 (receive (reduce), 1 KiB) at round 1: level 0 (node) reduce-scatter",
        "  verdict: ranks 3-4 behind; the others waited on them",
    ]


def test_nothing_stuck_says_so():
    assert trace.verdict([_dump(r, 2, [_run(0), _run(1)]) for r in range(2)]) == [
        "every rank's runs finished: nothing stuck in these files"]


def test_ddl_trace_reads_a_folder_and_refuses_other_files(tmp_path, capsys):
    for r in range(2):
        (tmp_path / f"rank{r}.json").write_text(json.dumps(_dump(r, 2, [_run(0), _run(1, "running")] if r == 0
                                                                  else [_run(0)])))
    assert trace.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "rank 1 (h1) never entered it" in out and "rank 0 still inside it" in out
    (tmp_path / "rank2.json").write_text("{}")
    assert trace.main([str(tmp_path)]) == 2
    assert "not a ddl flight recorder file" in capsys.readouterr().err
    assert trace.main([str(tmp_path / "empty")]) == 2


@pytest.mark.parametrize("folder", ["", None])
def test_no_folder_writes_nothing(folder, monkeypatch):
    if folder is None:
        monkeypatch.delenv("DDL_FLIGHT_RECORDER", raising=False)
    else:
        monkeypatch.setenv("DDL_FLIGHT_RECORDER", folder)
    assert flight.dump("test") is None


def test_the_ring_size_setting_is_checked():
    assert flight.runs_kept({"DDL_FLIGHT_RECORDER_RUNS": "0"}) == 0
    assert flight.runs_kept({}) == 64
    with pytest.raises(ddl.DDLError, match="DDL_FLIGHT_RECORDER_RUNS='many'"):
        flight.runs_kept({"DDL_FLIGHT_RECORDER_RUNS": "many"})
