"""ddl-bench's helpers: sizes, exact inputs, the nccl-tests formulas, the side-by-side table and JSON layout."""
import argparse
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from ddl.tools import bench, measure
from ddl.tools.cli import size


def test_size_arguments():
    assert [size(s) for s in ("8", "64K", "64M", "1G")] == [8, 65536, 64 << 20, 1 << 30]
    with pytest.raises(argparse.ArgumentTypeError, match="bad size 'lots'"):
        size("lots")


def test_sizes_sweep_like_nccl_tests():
    assert bench.sizes(8, 64, 2) == [8, 16, 32, 64]
    assert bench.sizes(1 << 20, 4 << 20, None, 1 << 20) == [1 << 20, 2 << 20, 3 << 20, 4 << 20]  # -i


def test_factor_is_the_default_and_stepbytes_makes_a_linear_sweep():
    assert bench.parse_args([]).stepfactor == 2.0
    args = bench.parse_args(["-b", "1K", "-e", "4K", "-i", "1K"])
    assert args.stepfactor is None and bench.sizes(args.minbytes, args.maxbytes, args.stepfactor,
                                                   args.stepbytes) == [1024, 2048, 3072, 4096]


@pytest.mark.parametrize("collective, factor", [("allreduce", 2 * 3 / 4), ("broadcast", 1.0),
                                                ("allgather", 3 / 4)])
def test_busbw_uses_each_collectives_factor(collective, factor):
    algbw, busbw = measure.bandwidth(8_000_000, 1000.0, 4, collective)  # 8 MB in 1 ms
    assert algbw == pytest.approx(8.0)
    assert busbw == pytest.approx(8.0 * factor)


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "avg"])
def test_inputs_reduce_exactly_in_float16(op):
    size, count = 8, 1000
    want = measure.expected(size, count, np.dtype(np.float64), op)
    stack = np.stack([measure.inputs(r, count, np.dtype(np.float16), op).astype(np.float64) for r in range(size)])
    ref = {"sum": stack.sum(0), "prod": stack.prod(0), "min": stack.min(0), "max": stack.max(0),
           "avg": stack.sum(0) / size}[op]
    assert np.array_equal(want, ref)
    assert measure.count_wrong(want.astype(np.float16), ref, op, np.dtype(np.float16)) == 0
    assert measure.count_wrong((want + 1).astype(np.float16), ref, op, np.dtype(np.float16)) == count


def test_allgather_case_expects_every_ranks_share_in_rank_order():
    case = measure.Case("allgather", rank=1, n=3, count=10, dtype=np.dtype(np.float32), op="sum", root=0)
    assert case.count == 9 and case.x.size == 3  # 10 elements do not split in 3: the whole is rounded down
    shares = [measure.inputs(r, 3, np.dtype(np.float64)) for r in range(3)]
    assert np.array_equal(case.reference(), np.concatenate(shares))
    case.reset(inplace=True)
    assert np.array_equal(case.out[3:6], case.x)  # in place: this rank's share sits at its offset
    tiny = measure.Case("reduce_scatter", rank=0, n=8, count=2, dtype=np.dtype(np.float32), op="sum", root=0)
    assert tiny.count == 8  # 2 elements over 8 ranks: one each, not an empty call


def test_broadcast_case_expects_the_roots_data():
    case = measure.Case("broadcast", rank=0, n=4, count=5, dtype=np.dtype(np.int32), op="sum", root=2)
    assert np.array_equal(case.reference(), [-1, 0, 1, 2, 3])  # (i + 2) % 7 - 3
    case.out[...] = case.reference()
    assert case.wrong() == 0
    case.out[0] = 9
    assert case.wrong() == 1


def rec(algo, size, out_us, in_us, busbw=1.0):
    return {"algo": algo, "size": size, "count": size // 4, "type": "float32", "redop": "sum", "root": -1,
            "cycle": 0, "out_us": out_us, "in_us": in_us, "out_algbw": 0.5, "out_busbw": busbw, "in_algbw": 0.5,
            "in_busbw": busbw, "out_wrong": 0, "in_wrong": 0}


def test_main_table_rows_have_nccl_tests_columns_and_no_algo():
    fields = bench.row_text(rec("ddl", 1024, 10.0, 12.0)).split()
    assert len(fields) == 13  # size count type redop root, then time algbw busbw #wrong twice
    assert fields[:5] == ["1024", "256", "float32", "sum", "-1"]
    assert "ddl" not in fields


def test_side_by_side_table_is_comments_with_time_ratios():
    rows = [rec("ddl", 1024, 10.0, 20.0), rec("mpi", 1024, 15.0, 10.0)]
    lines = bench.comparison(rows, ["ddl", "mpi"])
    assert all(line.startswith("#") for line in lines)
    assert lines[-1].split()[-3:] == ["1.000", "1.50x", "0.50x"]  # mpi: busbw, 15/10, 10/20
    assert bench.comparison(rows, ["ddl"]) == []


def test_json_has_nccl_tests_layout_with_peers_apart():
    args = bench.parse_args(["--algo", "ddl,mpi", "-b", "1K", "-e", "1K"])
    rows = [rec("ddl", 1024, 10.0, 20.0), rec("mpi", 1024, 15.0, 10.0)]
    doc = bench.as_nccl_tests_json(args, [], rows, 4, 1, "MPI", 0)
    assert [r["size"] for r in doc["results"]] == [1024] and len(doc["peers"]["mpi"]) == 1
    assert set(doc["results"][0]["out_of_place"]) == {"time", "alg_bw", "bus_bw", "nwrong"}
    assert doc["results"][0]["in_place"]["time"] == 20.0
    assert doc["out_of_bounds"] == {"count": 0, "okay": "true"}
    assert doc["config"]["iterations"] == 20 and doc["config"]["run_cycles"] == 1


def test_integer_average_is_skipped_not_failed():
    runner = measure.Runner.__new__(measure.Runner)
    runner.algo = "ddl"
    assert not runner.supports(np.dtype(np.int32), "avg")
    assert runner.supports(np.dtype(np.float16), "avg")


def test_a_round_where_every_library_ran_slow_is_named_and_left_out():
    """make bench's rounds: a round whose every library ran far below its usual speed is a disturbed machine;
    one library slow alone is that library's result, kept."""
    from ddl.tools.measure import disturbed_rounds, spread

    def rnd(ddl, mpi):
        return {"ddl": {1024: ddl, 1 << 20: 10 * ddl}, "mpi": {1024: mpi, 1 << 20: 10 * mpi}}

    usual = [rnd(1.0, 1.2), rnd(1.1, 1.3), rnd(0.9, 1.1)]
    assert disturbed_rounds(usual) == {}
    slow = usual[:1] + [rnd(2.0, 2.6)] + usual[1:]  # round 1: both at about 2x
    found = disturbed_rounds(slow)
    assert list(found) == [1] and found[1] >= 1.9
    alone = usual[:1] + [rnd(1.0, 3.0)] + usual[1:]  # only mpi slow: kept
    assert disturbed_rounds(alone) == {}
    assert disturbed_rounds(slow[:2]) == {}  # two rounds: which one is usual cannot be told
    assert len(disturbed_rounds([rnd(1.0, 1.0), rnd(3.0, 3.0), rnd(3.0, 3.0)])) <= 1  # never the majority
    assert spread([1.0, 1.2, 0.8]) == pytest.approx(0.4)


def test_a_target_most_rounds_contradict_is_undecided_not_met_or_missed():
    """make bench's verdicts: a target keeps the pooled verdict where most kept rounds give it too (how many met
    it said where they differ); one that most rounds contradict is undecided."""
    topologies = _topologies()

    def times(ddl_small, peer_small):  # 1 KiB: ddl's time against one peer's (target: within 1.2x)
        return {"ddl": {1024: ddl_small}, "ompi-tuned": {1024: peer_small}}

    bound = {1024: (1e-6, "")}
    steady = {"times": times(110, 100), "round_times": [times(108, 100), times(112, 100), times(110, 100)]}
    assert [ok for _, ok, _ in topologies.decided("T1", steady, bound)] == [True]
    missed = {"times": times(140, 100), "round_times": [times(135, 100), times(150, 100), times(140, 100)]}
    assert [ok for _, ok, _ in topologies.decided("T1", missed, bound)] == [False]
    outlier = {"times": times(118, 100), "round_times": [times(114, 100), times(125, 100), times(118, 100)]}
    (target, ok, measured), = topologies.decided("T1", outlier, bound)  # one round of three over: still met
    assert ok is True and "met in 2 of 3 rounds" in measured and "1.18x" in measured
    torn = {"times": times(119, 100), "round_times": [times(121, 100), times(125, 100), times(119, 100)]}
    (target, ok, measured), = topologies.decided("T1", torn, bound)  # the pooled median met; two rounds missed
    assert ok is None and "met in 1 of 3 rounds" in measured
    split = {"times": times(119, 100), "round_times": [times(118, 100), times(125, 100)]}
    assert [ok for _, ok, _ in topologies.decided("T1", split, bound)] == [None]  # one of two: no majority
    alone = {"times": times(118, 100)}  # one round: its verdict
    assert [ok for _, ok, _ in topologies.decided("T1", alone, bound)] == [True]


def test_a_peer_is_compared_with_the_ddl_measured_in_its_own_job():
    """make bench runs ddl in every job beside that job's peer: ddl's time over ompi-tuned's is the tuned job's
    ddl over it, so a machine slower during one job than another does not move the verdict."""
    topologies = _topologies()
    # each round: the main job (ddl, ompi-han) ran 1.5x slow; the tuned job (its ddl, ompi-tuned) did not
    one = {"ddl": {1024: [150.0]}, "ompi-han": {1024: [300.0]}, "ddl@ompi-tuned": {1024: [110.0]},
           "ompi-tuned": {1024: [100.0]}}
    result = topologies.pooled([one, one, one])
    assert result["ratios"]["ompi-tuned"][1024] == pytest.approx(1.1)   # 110 / 100, not 150 / 100
    assert result["ratios"]["ompi-han"][1024] == pytest.approx(0.5)
    assert result["times"]["ddl"][1024] == pytest.approx(130.0)          # ddl's samples of both jobs: (110+150)/2
    (target, ok, measured), = topologies.decided("T1", result, {1024: (1e-6, "")})
    assert ok is True and "1.10x vs ompi-tuned" in measured


def test_a_rounds_ddl_time_and_the_prediction_pool_every_job_ddl_ran_in():
    """make bench: ddl's time in a round is the median of its samples from every job of that round (its own and
    beside each peer), as the pooled time is; one slow call of the main job no longer decides a round."""
    topologies = _topologies()
    big = 16 << 20

    def rnd(main, beside):  # microseconds: ddl in the main job and beside ompi-tuned, two measurements each
        return {"ddl": {big: main}, "ompi-han": {big: [800e3, 800e3]}, "ddl@ompi-tuned": {big: beside},
                "ompi-tuned": {big: [700e3, 700e3]}}
    result = topologies.pooled([rnd([370e3, 280e3], [277e3, 276e3]), rnd([277e3, 279e3], [276e3, 278e3]),
                                rnd([383e3, 281e3], [275e3, 277e3])])
    assert [m["ddl"][big] for m in result["round_times"]] == [278.5e3, 277.5e3, 279e3]
    assert result["ratios"]["ompi-han"][big] == pytest.approx(325e3 / 800e3)  # (paired within the main job)
    verdicts = {t: (ok, m) for t, ok, m in topologies.decided("T2", result, {big: (0.268, "")})}
    ok, measured = verdicts[">= 85% of the lower bound, >= 16 MiB"]
    assert ok is True and "rounds" not in measured  # every round met it (with the main job's alone: 1 of 3)
    result["model"] = {"predicted": {str(big): 270e3}, "levels": [], "tree_source": "topology"}
    _, error = topologies.prediction(result)
    assert error == pytest.approx(abs(270e3 - 277.5e3) / 277.5e3)  # the median of all 12 samples


def _topologies():
    return _benchmark("topologies")


def _benchmark(name: str):
    """benchmarks/NAME.py, loaded as a module (benchmarks/ is not a package)."""
    where = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, where)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("how, expected_ms", [("bound", None), ("measured", 0.0), ("750", 750.0)])
def test_the_training_jobs_compute_is_the_allreduces_lower_bound_unless_asked(monkeypatch, how, expected_ms):
    training = _benchmark("training")
    nbytes = training.gradient_bytes()
    assert 100e6 < nbytes < 105e6  # ResNet-50's ~25.6 M float32 gradients
    # T1: 4 nodes on one switch, 1 Gbit/s NICs; an allreduce's busiest NIC carries 2 (4-1)/4 of the bytes
    bound_s = 2 * 3 / 4 * nbytes * 8 / 1e9
    asked = []
    monkeypatch.setattr(training, "run_job", lambda name, job, args: asked.append(args) or {"steps": {}})
    result = training.run("T1", 3, how)
    compute_ms = float(asked[0][asked[0].index("--compute-ms") + 1])
    assert compute_ms == pytest.approx(bound_s * 1e3 if expected_ms is None else expected_ms, rel=0.01)
    assert result["bound"] == pytest.approx(bound_s, rel=0.01) and result["compute_from"] == how


def test_the_cluster_sweep_compares_ddl_with_the_faster_of_mpi_and_gloo_in_each_cell():
    sweep = _benchmark("host_collectives")
    sizes = [8, 1024]
    results = {"sizes": sizes, "host_level": True}
    for c in sweep.COLLECTIVES:
        for s in sizes:  # ddl 10 us; MPI 20 us, gloo 40 us, but at 8 B allgather in place gloo 5 us
            gloo_in = 5.0 if (c, s) == ("allgather", 8) else 40.0
            results[f"{c} {s}"] = {"ddl_out": 10.0, "ddl_in": 10.0, "mpi_out": 20.0, "mpi_in": 20.0,
                                   "gloo_out": 40.0, "gloo_in": gloo_in, "busbw": 1.0}
    text = sweep.table(results, 8, "T1")
    allgather = next(line for line in text.splitlines() if line.startswith("| allgather | 0"))
    assert allgather.startswith("| allgather | 0.50 / 2.00 g | 0.50 / 0.50 |")  # 10 / 20 out; 10 / 5 in, gloo's
    assert "Worst ratio at 8 ranks: 2.00x the faster peer's time" in text
    assert "| allgather | 20 / 5 | 20 / 40 |" in text  # the peers' own times beside
    mpi_only = {k: ({f: x for f, x in v.items() if not f.startswith("gloo")} if isinstance(v, dict) else v)
                for k, v in results.items()}
    text = sweep.table(mpi_only, 8, "T1")  # one host compares MPI alone: as before
    assert "Worst ratio at 8 ranks: 0.50x MPI's time" in text and " g" not in text
    # gloo runs in a job of its own (its threads slowed ddl's broadcast beside it), merged cell by cell
    assert sweep.jobs(("mpi", "gloo")) == [("ddl", "mpi"), ("gloo",)] and sweep.jobs(("mpi",)) == [("ddl", "mpi")]
    merged = {"sizes": sizes, "allreduce 8": {"ddl_in": 1.0, "mpi_in": 2.0}}
    sweep.merge(merged, {"sizes": sizes, "allreduce 8": {"gloo_in": 3.0}})
    assert merged["allreduce 8"] == {"ddl_in": 1.0, "mpi_in": 2.0, "gloo_in": 3.0}


def test_a_buckets_own_allreduce_starts_when_it_is_ready_or_when_the_one_before_finishes():
    training = _benchmark("training")
    # two steps of three buckets (index, bytes, ready s, done s): bucket 1 is queued behind bucket 0 in the first
    # step (ready 0.30, bucket 0 done 0.40) and waits for backward in the second (ready 0.50, bucket 0 done 0.45)
    steps = [[(0, 100, 0.10, 0.40), (1, 200, 0.30, 0.70), (2, 300, 0.90, 1.00)],
             [(0, 100, 0.12, 0.45), (1, 200, 0.50, 0.75), (2, 300, 0.80, 1.10)]]
    b = training.bucket_times(steps)
    assert [x["bytes"] for x in b] == [100, 200, 300]
    assert b[0]["own"] == pytest.approx((0.30 + 0.33) / 2) and b[0]["idle"] == 0.0
    assert b[1]["own"] == pytest.approx((0.30 + 0.25) / 2)  # 0.70 - 0.40, 0.75 - 0.50
    assert b[1]["idle"] == pytest.approx((0.0 + 0.05) / 2)
    assert b[2]["own"] == pytest.approx((0.10 + 0.30) / 2)  # 1.00 - 0.90, 1.10 - 0.80
    assert b[2]["idle"] == pytest.approx((0.20 + 0.05) / 2)
    assert b[1]["ready"] == pytest.approx(0.40) and b[2]["done"] == pytest.approx(1.05)


def test_the_cluster_sweep_shows_ddls_own_times_out_of_place_and_in_place():
    sweep = _benchmark("host_collectives")
    sizes = [8]
    results = {"sizes": sizes, "host_level": True}
    for c in sweep.COLLECTIVES:
        results[f"{c} 8"] = {"ddl_out": 12.5, "ddl_in": 10.0, "mpi_out": 20.0, "mpi_in": 20.0, "busbw": 0.5}
    line = next(x for x in sweep.table(results, 8, "T1").splitlines() if x.startswith("| broadcast | 12.5"))
    assert line == "| broadcast | 12.5 / 10.0 us, 0.50 |"


def test_a_buckets_share_of_its_bound_is_the_topologys_bound_over_its_time():
    training = _benchmark("training")
    nbytes = 25_000_000
    bound_s = 2 * 3 / 4 * nbytes * 8 / 1e9  # T1: the busiest 1 Gbit/s NIC carries 2 (4-1)/4 of the bytes
    assert training._of_bound({"topology": "T1"}, [{"bytes": nbytes, "own": 2 * bound_s}]) == "50%"
    assert training._of_bound({"topology": "T1"}, [{"bytes": nbytes, "own": 0.0}]) == "-"  # finished with the one before
