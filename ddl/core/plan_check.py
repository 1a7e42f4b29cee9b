"""A plan checked against what it does: a communicator's first large allreduces are timed, and where they run
far below what the plan predicts the job says so.

A probe that read noise as structure, or a network that changed under a cached result, plans a job that runs at
a fraction of what it could, and nothing else would tell the user. So on every communicator that plans over the
network, every rank times its allreduces of each size from ``MIN_BYTES`` (the whole call: agreement round,
staging, run; the first call of a size left out: connections and first touches), and the slowest rank's mean
of every ``SAMPLES`` of them (what a benchmark reports and a training job pays: a rank that waits less for its
peers, as rank 0 may, sees a faster job than the one that runs, and a median hides the calls that stall: on an
emulated three-rack star, idle jobs whose medians read 93-95 % of the prediction ran at 81-83 % of the lower
bound in the benchmark, whose figure is the mean) is compared with the plan's prediction (its cost model, with the level
figures it planned with): a job may start well and slow down when a neighbour starts. Below ``SLOW`` of the
prediction, or of the lower bound where the plan predicted at least that much (the model is a few per cent
optimistic: a job can miss the bound by more than the prediction), it warns, whatever ``-dbg_level`` (once per
communicator), naming the size, the times, the lower bound and how the level figures were obtained; where those
came from the probe's cache, the cached result is marked doubtful, and the next job over these hosts measures
afresh instead of verifying it. Below ``BOUND_SLOW`` of the lower bound it knows (where the plan predicted at
least that much) it warns too, and keeps the cache: that bound is built from measured figures, and on an
emulated three-rack star jobs at 83-84 % of the links' own bound read 88-89 % of it in their check (figures 1-6 %
below the links, and a benchmark's later calls a few per cent slower than the check's windows), so a job must
pass 90 % of it to be surely past 85 % of the true one; the plan and its figures are not what is wrong there (it
ran near its prediction). With ``-dbg_level 1`` each size's first check is reported.
The ranks combine their means at the end of each window (the same call on every rank: they count the same
calls), so every rank reaches the same verdict and stops timing together; rank 0 alone says it and marks the
cache. A check, not an agreement: nothing any rank computes depends on it.
"""
from __future__ import annotations

import statistics
import sys
import time

from ..units import format_size

MIN_BYTES = 1 << 20
SAMPLES = 5
SLOW = 0.85
BOUND_SLOW = 0.90  # of the lower bound built from the measured level figures (see above)
SIZES = 4  # sizes checked per communicator, at most


class PlanCheck:
    """``explain(nbytes)``: the plan's Explanation for that size; ``doubt(text)``: what to do with a result the
    check does not believe (mark the probe's cache); ``verbose``: report every check (-dbg_level 1);
    ``slowest(seconds)``: the largest of every rank's mean (a collective: every rank calls it at the same
    window; this rank's alone without one); ``speaks``: this rank says what it found and doubts."""

    def __init__(self, explain, doubt, verbose: bool, say=None, enabled: bool = True, slowest=None,
                 speaks: bool = True):
        self.explain, self.doubt, self.verbose, self.enabled = explain, doubt, verbose, enabled
        self.slowest, self.speaks = slowest or (lambda seconds: seconds), speaks
        self.say = say or (lambda text: print(f"ddl: {text}", file=sys.stderr, flush=True))
        self.samples: dict[int, list[float]] = {}  # size -> this window's times (the first call left out)
        self.checked: dict[int, float] = {}  # size -> measured / predicted time, its last window
        self.warned = False

    def timed(self, nbytes: int):
        """A context manager timing one allreduce of ``nbytes`` (a no-op once the job has warned, and for sizes
        past the first ``SIZES``)."""
        if not self.enabled or self.warned or nbytes < MIN_BYTES or (
                nbytes not in self.samples and len(self.samples) >= SIZES):
            return _NOTHING
        return _Timer(self, nbytes)

    def ran(self, nbytes: int, seconds: float) -> None:
        runs = self.samples.get(nbytes)
        if runs is None:  # the first call of a size is not counted
            self.samples[nbytes] = []
            return
        runs.append(seconds)
        if len(runs) < SAMPLES:
            return
        measured = self.slowest(statistics.fmean(runs))
        runs.clear()
        e = self.explain(nbytes)
        first_window = nbytes not in self.checked
        self.checked[nbytes] = measured / e.predicted
        reached = e.predicted / measured
        costs = ", ".join(f"{lv.name} {lv.costs}" for lv in e.plan.levels)
        text = (f"plan check: allreduce of {format_size(nbytes)} took {measured * 1e3:.2f} ms (the slowest rank's "
                f"mean of {SAMPLES}); "
                f"the plan predicted {e.predicted * 1e3:.2f} ms, so it ran at {reached:.0%} of its prediction and "
                f"{e.bound / measured:.0%} of the lower bound (level figures: {costs})")
        # far: below SLOW of the prediction, or of the lower bound where the plan expected to reach it;
        # short: below BOUND_SLOW of the lower bound the plan expected to reach (the figures may be right)
        expected, of_bound = e.bound / e.predicted, e.bound / measured
        far = reached < SLOW or of_bound < SLOW <= expected
        short = far or of_bound < BOUND_SLOW <= expected
        if short and not self.warned:
            self.warned = True  # on every rank: they stop timing together
            if not self.speaks:
                return
            if far:
                below = "the prediction" if reached < SLOW else \
                    f"{SLOW:.0%} of the lower bound, which the plan expected"
                self.say(f"{text}: far below {below}. The levels or their figures may be wrong (a probe misled "
                         f"by noise, a network changed since it was measured) or the hosts are busy; "
                         f"{self.doubt(text)}")
            else:
                self.say(f"{text}: below {BOUND_SLOW:.0%} of the lower bound, which the plan expected (a bound "
                         f"built from measured figures: this job may be below {SLOW:.0%} of what the links "
                         f"allow). The hosts may be busy, or the links slower for a collective than for the "
                         f"probe's flows; the levels ran near their prediction and are kept")
        elif self.verbose and first_window and self.speaks:  # -dbg_level 1: each size's first window
            self.say(text)


class _Timer:
    def __init__(self, check: PlanCheck, nbytes: int):
        self.check, self.nbytes = check, nbytes

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, kind, *_):
        if kind is None:
            self.check.ran(self.nbytes, time.perf_counter() - self.start)
        return False


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *_):
        return False


_NOTHING = _Nothing()
