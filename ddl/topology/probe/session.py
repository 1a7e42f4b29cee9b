"""When the probe runs in a job, and where its result comes from: the cache, a fresh measurement, or neither.

Switch levels above the hosts come from the first source that applies (ddl.planner.sources documents the
whole order): a plan file, a hierarchy, a topology file, tiers (DDL_NODES/RACKS/AISLES, -mode dims) > the
probe's cache or a fresh probe > the scheduler's topology > hosts alone. This module decides the probe's part,
the same way on every rank (all inputs are the same everywhere), and never fails a job: a probe that cannot
finish gives its reason and the job goes on with the next source.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ... import config
from ...errors import DDLError
from . import cache
from .measure import check, natural_key, probe
from .result import ProbeError, ProbeResult, utc_now


@dataclass
class Outcome:
    result: ProbeResult | None
    how: str            # "measured", "cached ...", or why there is no result ("off", "given", a failure)
    seconds: float = 0.0  # measuring, or verifying a cached result
    warning: str | None = None  # what the job must hear whatever its -dbg_level (a stale cache)


def wanted(options, hosts: list[str], hierarchy=None, topology=None, environ=os.environ) -> str | None:
    """Why the probe does not run here (None: it runs)."""
    if options.probe == "0":
        return "off (DDL_PROBE=0)"
    if options.plan or hierarchy is not None or topology is not None or options.topology:
        return "given (a plan, hierarchy or topology decides)"
    tiers = [v for v in ("DDL_NODES", "DDL_RACKS", "DDL_AISLES") if config.get(v, environ)]
    if tiers or (options.mode is not None and len(options.mode.dims) > 2):
        return f"given (tiers: {', '.join(tiers) or '-mode'})"
    hosts_n = len(set(hosts))
    if hosts_n < 2 or (hosts_n < 3 and options.probe == "auto"):
        return f"not needed ({hosts_n} host{'s' if hosts_n != 1 else ''})"
    return None


def survey_hosts(comm, rank_hosts: list[str], options, environ=os.environ) -> Outcome:
    """Every rank of ``comm``: the probe's result for these hosts, from the cache unless ``force``, else
    measured (and cached). Failures come back as an Outcome without a result, with the reason."""
    hosts = sorted(set(rank_hosts), key=natural_key)
    folder = config.get("DDL_PROBE_CACHE", environ) or cache.default_directory()
    note = warning = None
    if folder != "off" and options.probe != "force":
        found, note = cache.load(folder, hosts) if comm.rank == 0 else (None, None)
        found = comm.bcast(found.to_dict() if found is not None else None, root=0)
        doubted = found is not None and found.get("doubtful")
        if doubted:
            warning = (f"the cached result for these hosts (measured {found.get('measured_at') or 'at an unknown time'}) "
                       f"was marked doubtful by a job: {doubted}; measuring again")
        if found is not None and not doubted:
            cached = ProbeResult.from_dict(found)
            if options.probe == "trust":
                return Outcome(cached, "cached (trusted, not verified)")
            start = time.perf_counter()
            verdict = check(comm, rank_hosts, cached, min(options.timeout, 5.0))
            seconds = time.perf_counter() - start
            if verdict.agrees:
                cached.verified_at = utc_now()
                if comm.rank == 0:
                    _save(folder, cached)
                return Outcome(cached, f"cached, verified against the network in {seconds:.2f} s "
                                       f"({verdict.rounds} rounds, {verdict.flows} flows)", seconds)
            warning = (f"the cached result for these hosts (measured {cached.measured_at or 'at an unknown time'}) "
                       f"does not match the network: {verdict.why}; measuring again")
    budget = _seconds(config.get("DDL_PROBE_BUDGET", environ), "DDL_PROBE_BUDGET")
    window = int(_seconds(config.get("DDL_PROBE_WINDOW", environ), "DDL_PROBE_WINDOW"))
    start = time.perf_counter()
    try:
        result = probe(comm, rank_hosts, budget, min(options.timeout, max(2.0, budget)), window)
    except ProbeError as e:
        return Outcome(None, f"failed: {e}" + (f" ({note})" if note else ""), time.perf_counter() - start, warning)
    if note:
        result.notes.append(note)
    if result.doubtful:  # the budget cut the survey short: this job plans with what stands
        cut = result.doubtful.partition(": ")[2].removeprefix("probe: ")  # (said after "probe: ")
        warning = "; ".join(w for w in (warning, f"{cut}; the next job measures again (a longer DDL_PROBE_BUDGET "
                                                  f"would let it finish)") if w)
    if folder != "off" and comm.rank == 0:
        written = _save(folder, result)
        if written:
            result.notes.append(written)
    return Outcome(result, "measured", time.perf_counter() - start, warning)


def doubt_cached(rank_hosts: list[str], why: str, environ=os.environ) -> str:
    """Marks the cached result for these hosts doubtful (the next job measures afresh); says what it did."""
    folder = config.get("DDL_PROBE_CACHE", environ) or cache.default_directory()
    if folder == "off":
        return "the probe's cache is off (DDL_PROBE_CACHE=off)"
    found, _ = cache.load(folder, sorted(set(rank_hosts)))
    if found is None:
        return "the probe's cache holds no result for these hosts"
    found.doubtful = f"{utc_now()}: {why}"
    failed = _save(folder, found)
    return failed or (f"the probe's cached result for these hosts ({cache.path(folder, found.hosts)}) is marked "
                      f"doubtful: the next job over them measures afresh")


def _save(folder: str, result: ProbeResult) -> str | None:
    """Writes the cache; why not, if it could not."""
    try:
        cache.save(folder, result)
    except OSError as e:
        return f"probe cache {folder} not written: {e}"
    return None


def _seconds(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise DDLError(f"{name}={text!r}: expected a number") from None
    if not value > 0:
        raise DDLError(f"{name}={text!r}: must be positive")
    return value
