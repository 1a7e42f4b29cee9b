"""The probe over MPI: one leader per host runs the rounds, every wait under a deadline, the whole under a time
budget; the result (or why there is none) reaches every rank.

A round: the leaders meet (a barrier), each pings the host it sends to (three round trips, the shortest kept:
the latency), meet again, then every flow of the round moves ``nbytes`` at once; each receiver times its
flow from the second meeting. The leaders then share what they saw (an allgather), so every leader groups the
same numbers and reaches the same tree.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import asdict

import numpy as np

from ... import config
from .calibrate import REPEATS as CALIBRATION_REPEATS, SECONDS as CALIBRATION_SECONDS, calibrate
from .grouping import Flow
from .result import BudgetSpent, ProbeError, ProbeResult, utc_now
from .schedule import DEFAULT_WINDOW, patterns
from .survey import survey
from .verify import Verdict, verify

MIN_BYTES, MAX_BYTES, CALIBRATION_BYTES = 64 << 10, 16 << 20, 1 << 20
# A verifying round is short: flows of 160 KB read up to 2x a shaped 50 Mbit/s uplink on the emulator (clocks start
# after the first bytes left), 320 KB up to 1.6x
VERIFY_MIN_BYTES = 512 << 10
PINGS = 3
_TAG = 7700


def natural_key(host: str):
    """node2 before node10: hosts sort as clusters number them."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", host)]


def _wait(requests, deadline: float, what) -> None:
    from mpi4py import MPI

    pause = 1e-5
    while not MPI.Request.Testall(requests):
        if time.monotonic() > deadline:
            raise ProbeError(what() if callable(what) else what)
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)


class Leaders:
    """The rounds as the leader of host ``hosts[comm.rank]`` runs them (``comm``: the leaders, in host order)."""

    def __init__(self, comm, hosts: list[str], budget: float, timeout: float):
        self.comm, self.hosts, self.me = comm, hosts, comm.rank
        self.start = time.monotonic()
        self.budget, self.timeout = budget, timeout
        self.nbytes = MIN_BYTES
        self.data = np.zeros(MAX_BYTES, np.uint8)
        self.inbox = np.empty(MAX_BYTES, np.uint8)

    def _deadline(self) -> float:
        return time.monotonic() + self.timeout

    def _meet(self, what: str) -> None:
        _wait([self.comm.Ibarrier()], self._deadline(),
              f"probe: a host did not reach {what} within {self.timeout:g} s (this is host {self.hosts[self.me]})")

    def _latency(self, src: int | None, dst: int | None, tag: int) -> float:
        """Shortest round trip / 2 to ``dst`` while answering the pings of ``src``."""
        best = 0.0
        one, echo, ping = np.zeros(1, np.uint8), np.zeros(1, np.uint8), np.zeros(1, np.uint8)
        for _ in range(PINGS):
            reqs = []
            got_ping = self.comm.Irecv(ping, source=src, tag=tag) if src is not None else None
            got_echo = self.comm.Irecv(echo, source=dst, tag=tag + 1) if dst is not None else None
            t0 = time.perf_counter()
            if dst is not None:
                reqs.append(self.comm.Isend(one, dest=dst, tag=tag))
            deadline = self._deadline()
            answered = got_ping is None
            rtt = None
            while not answered or (got_echo is not None and rtt is None):
                if not answered and got_ping.Test():
                    reqs.append(self.comm.Isend(one, dest=src, tag=tag + 1))
                    answered = True
                if got_echo is not None and rtt is None and got_echo.Test():
                    rtt = time.perf_counter() - t0
                if time.monotonic() > deadline:
                    who = dst if rtt is None and dst is not None else src
                    raise ProbeError(f"probe: host {self.hosts[who]} did not answer within {self.timeout:g} s")
            _wait(reqs, self._deadline(), "probe: a latency ping was never delivered")
            if rtt is not None:
                best = rtt / 2 if best == 0 else min(best, rtt / 2)
        return best

    def round(self, pattern: list[tuple[int, int]], index: int) -> list[Flow]:
        """Runs one round; raises ProbeError (the same on every leader) when the budget is spent."""
        dst = next((d for s, d in pattern if s == self.me), None)
        src = next((s for s, d in pattern if d == self.me), None)
        tag = _TAG + 4 * (index % 1000)
        self._meet(f"round {index}")
        latency = self._latency(src, dst, tag)
        self._meet(f"round {index}'s transfer")
        t0 = time.perf_counter()
        recv = self.comm.Irecv(self.inbox[:self.nbytes], source=src, tag=tag + 2) if src is not None else None
        send = self.comm.Isend(self.data[:self.nbytes], dest=dst, tag=tag + 2) if dst is not None else None
        rate = 0.0
        if recv is not None:
            _wait([recv], self._deadline(), lambda: f"probe: host {self.hosts[src]} sent nothing within "
                                                    f"{self.timeout:g} s (round {index})")
            rate = self.nbytes / max(time.perf_counter() - t0, 1e-9)
        if send is not None:
            _wait([send], self._deadline(), lambda: f"probe: host {self.hosts[dst]} received nothing within "
                                                    f"{self.timeout:g} s (round {index})")
        mine = np.array([rate, latency, time.monotonic() - self.start], np.float64)
        seen = np.zeros((self.comm.size, 3), np.float64)
        _wait([self.comm.Iallgather(mine, seen)], self._deadline(),
              f"probe: a host did not report round {index} within {self.timeout:g} s")
        if seen[0, 2] > self.budget:  # leader 0's clock decides, so every leader stops at the same round
            raise BudgetSpent(f"probe: past its budget of {self.budget:g} s after {index + 1} rounds "
                              f"(DDL_PROBE_BUDGET)")
        return [Flow(index, s, d, float(seen[d, 0]), float(seen[s, 1])) for s, d in pattern]

    def calibrate(self, rounds_expected: int) -> None:
        """Picks the flow size: each round about budget / (3 x rounds expected), at most 0.1 s, at the slowest
        rate a 1 MiB round saw; between 64 KiB and 16 MiB (a round must last long enough that latency and
        the leaders' skew at its start are a small part of it)."""
        self.nbytes = CALIBRATION_BYTES
        flows = self.round([(i, (i + 1) % self.comm.size) for i in range(self.comm.size)], 999)
        slowest = min(f.rate for f in flows) or 1e6
        # One size for every round: flows shrunk after a slow round made the fast rounds that followed too
        # short to tell a 2:1 uplink from noise (seen on the emulated three-tier cluster).
        seconds = min(0.1, self.budget / (3 * max(rounds_expected, 1)))
        self.nbytes = int(min(MAX_BYTES, max(MIN_BYTES, slowest * seconds)))


class Recorder:
    """Every round a leader measured, kept when ``path`` is set (DDL_PROBE_RECORD) and written there at the end:
    the flows asked for and those measured, in order, per phase, so tests can replay the grouping on them."""

    def __init__(self, path: str):
        self.path, self.rounds = path, {"survey": [], "calibration": []}

    def __call__(self, phase: str, measure):
        if not self.path:
            return measure

        def recorded(pairs, index):
            flows = measure(pairs, index)
            self.rounds[phase].append({"pairs": [list(p) for p in pairs], "index": index,
                                       "flows": [asdict(f) for f in flows]})
            return flows
        return recorded

    def write(self, hosts: list[str], window: int, repeats: int, result: ProbeResult) -> None:
        if self.path:
            with open(self.path, "w") as f:
                json.dump({"hosts": hosts, "window": window, "repeats": repeats, "rounds": self.rounds,
                           "found": result.tree}, f)


def probe(comm, rank_hosts: list[str], budget: float, timeout: float, window: int = DEFAULT_WINDOW,
          repeats: int = 2) -> ProbeResult:
    """Runs the probe on every rank of ``comm`` (mpi4py); ``rank_hosts``: each rank's host. Raises ProbeError
    on every rank, with the same reason, where there is no result."""
    def survey_as_leader(sub, hosts: list[str]) -> dict:
        run = Leaders(sub, hosts, budget, timeout)
        record = Recorder(config.get("DDL_PROBE_RECORD") if sub.rank == 0 else "")
        started = time.perf_counter()
        run.calibrate(4 * repeats * len(patterns(len(hosts), window)))
        result = survey(hosts, record("survey", run.round), window, repeats)
        flow_bytes = run.nbytes
        # The levels' figures under an allreduce's load, on a budget of their own (a few short rounds per level)
        loaded = Leaders(sub, hosts, 2.0 + 1.5 * len(result.levels), timeout)

        def size_flows(nbytes: float) -> int:  # (the same on every leader: it follows from the survey)
            loaded.nbytes = int(min(MAX_BYTES, max(MIN_BYTES, nbytes)))
            return loaded.nbytes
        try:
            result = calibrate(result, hosts, record("calibration", loaded.round), size_flows,
                               first_round=result.rounds)
        except BudgetSpent as e:  # the same round on every leader: the survey's figures stand
            result.notes.append(f"{e} while calibrating: the survey's figures stand")
        record.write(hosts, window, repeats, result)
        result.seconds = time.perf_counter() - started
        result.measured_at = utc_now()
        result.settings = {"window": window, "repeats": repeats, "budget": budget, "flow_bytes": flow_bytes,
                           "calibration": {"seconds": CALIBRATION_SECONDS, "repeats": CALIBRATION_REPEATS}}
        return result.to_dict()

    outcome = _on_leaders(comm, rank_hosts, survey_as_leader, budget + 4 * timeout)
    if "error" in outcome:
        raise ProbeError(outcome["error"])
    return ProbeResult.from_dict(outcome)


def check(comm, rank_hosts: list[str], cached: ProbeResult, timeout: float,
          seconds_per_round: float = 0.1) -> Verdict:
    """Verifies ``cached`` against the network on every rank of ``comm`` (ddl.topology.probe.verify), with flows
    sized to last ``seconds_per_round`` at the rate the cached tree predicts for them. The same Verdict on every
    rank; one that could not measure disagrees, naming why."""
    def verify_as_leader(sub, hosts: list[str]) -> dict:
        run = Leaders(sub, hosts, float("inf"), timeout)

        def size_flows(rate: float) -> None:  # (the same on every leader: it follows from the cached tree)
            run.nbytes = int(min(MAX_BYTES, max(VERIFY_MIN_BYTES, rate * seconds_per_round)))
        return asdict(verify(cached, hosts, run.round, expect=size_flows))

    rounds = 4 * cached.depth
    outcome = _on_leaders(comm, rank_hosts, verify_as_leader, rounds * (seconds_per_round * 20 + 4 * timeout))
    if "error" in outcome:
        return Verdict(False, outcome["error"], 0, 0)
    return Verdict(**outcome)


def _on_leaders(comm, rank_hosts: list[str], work, seconds: float) -> dict:
    """``work(leaders, hosts)`` on one leader per host (``leaders``: their communicator, in ``hosts``' order);
    the first host's leader's dict (or ``{"error": why}`` from a ProbeError) reaches every rank of ``comm``
    within ``seconds``."""
    from mpi4py import MPI

    hosts = sorted(set(rank_hosts), key=natural_key)
    first = {h: rank_hosts.index(h) for h in hosts}
    leader = first[rank_hosts[comm.rank]] == comm.rank
    root = first[hosts[0]]
    sub = comm.Split(0 if leader else MPI.UNDEFINED, hosts.index(rank_hosts[comm.rank]) if leader else 0)
    outcome: dict = {}
    if leader:
        try:
            outcome = work(sub, hosts)
        except ProbeError as e:
            outcome = {"error": str(e)}
    text = json.dumps(outcome).encode() if comm.rank == root else b""
    size = np.array([len(text)], np.int64)
    deadline = time.monotonic() + seconds
    _wait([comm.Ibcast(size, root=root)], deadline, "probe: no result from the first host's leader")
    buf = np.frombuffer(text, np.uint8).copy() if comm.rank == root else np.empty(int(size[0]), np.uint8)
    _wait([comm.Ibcast(buf, root=root)], deadline, "probe: no result from the first host's leader")
    outcome = json.loads(buf.tobytes())
    if leader and "error" not in outcome:
        sub.Free()  # after a failure messages may still be in flight on it: it is kept, never reused
    return outcome
