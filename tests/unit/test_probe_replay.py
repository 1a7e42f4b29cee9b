"""The probe's grouping replayed on rounds measured on the emulated cluster: every round of whole probe jobs
(benchmarks/probe_trees.py --record: T2, a three-rack star with ranks round-robin, racks interleaved by name; on an
idle machine and beside a busy process), each flow's rate as the receiver saw it. Fed the same flows, the survey
and the calibration must find the cluster's true tree, which the recorder wrote from the cluster's description
(never from the probe). A change to the grouping that asks for other flows than the recorded job did is named."""
import glob
import json
import os

import pytest

from ddl.topology.probe.calibrate import calibrate
from ddl.topology.probe.grouping import Flow
from ddl.topology.probe.survey import survey

FIXTURES = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "probe", "*.json")))


def replay(rounds: list[dict], phase: str):
    """A measure that answers each round with the flows recorded for it, checking it is asked the same."""
    queue = iter(rounds)

    def measure(pairs, index):
        recorded = next(queue, None)
        assert recorded is not None, f"{phase}: more rounds asked for than the job measured"
        assert [list(p) for p in pairs] == recorded["pairs"], \
            f"{phase} round {recorded['index']}: asked for {pairs}, the job measured {recorded['pairs']}"
        return [Flow(**f) for f in recorded["flows"]]
    return measure


def order_free(tree):
    """A tree of host names as nested frozensets, groups of one dropped (as the recorder wrote the truth)."""
    if isinstance(tree, str):
        return tree
    kids = {order_free(k) for k in tree}
    return next(iter(kids)) if len(kids) == 1 else frozenset(kids)


def plain(tree):
    return tree if isinstance(tree, str) else sorted((plain(k) for k in tree), key=json.dumps)


@pytest.mark.skipif(not FIXTURES, reason="no recorded probe rounds")
@pytest.mark.parametrize("path", FIXTURES, ids=os.path.basename)
def test_recorded_rounds_give_the_true_tree(path):
    with open(path) as f:
        rec = json.load(f)
    hosts = rec["hosts"]
    result = survey(hosts, replay(rec["rounds"]["survey"], "survey"), rec["window"], rec["repeats"])
    result = calibrate(result, hosts, replay(rec["rounds"]["calibration"], "calibration"), lambda nbytes: int(nbytes),
                       first_round=result.rounds)
    assert plain(order_free(result.tree)) == rec["truth"], f"{rec['shape']} ({rec['load']}): {result.notes}"
    assert len(result.levels) == depth(rec["truth"])


def depth(tree) -> int:
    return 0 if isinstance(tree, str) else 1 + max(depth(k) for k in tree)
