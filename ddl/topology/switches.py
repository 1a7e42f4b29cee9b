"""Switch levels above the hosts at ddl.init when nobody gave them: the probe (cached or measured), else the
scheduler's topology, else none (hosts under one switch). Runs on every rank of the job's communicator; the
same inputs everywhere give the same answer everywhere. What was used, and how long it took, is reported with
``-dbg_level 1``; a probe or scheduler listing that cannot be used is reported always, with the fallback."""
from __future__ import annotations

import os
import sys

from .. import config
from . import links
from .probe import session
from .probe.result import ProbeResult
from .scheduler import SchedulerError, read


def switch_levels(comm, reports: list[dict], options, hierarchy=None, topology=None,
                  environ=os.environ) -> ProbeResult | None:
    rank_hosts = [r["host"] for r in reports]
    why_not = session.wanted(options, rank_hosts, hierarchy, topology, environ)
    say = _reporter(comm.rank, options.dbg_level)
    if why_not is None:
        outcome = session.survey_hosts(comm, rank_hosts, options, environ)
        if outcome.warning:
            say(f"probe: {outcome.warning}", always=True)
        if outcome.result is not None:
            r = outcome.result
            say(f"probe {outcome.how}: {len(r.hosts)} hosts in {len(r.levels)} level(s) "
                f"({', '.join(f'{lv.name} {lv.bandwidth * 8 / 1e6:.0f} Mbit/s' for lv in r.levels)}); "
                + (f"{outcome.seconds:.2f} s, {r.rounds} rounds, {r.flows} flows" if outcome.how == "measured"
                   else "no survey"))
            for note in r.notes:
                say(f"probe: {note}")
            return r
        say(f"probe {outcome.how}; falling back to the scheduler's topology or hosts alone", always=True)
    elif options.dbg_level >= 1 and len(set(rank_hosts)) > 1:
        say(f"probe {why_not}")
    if why_not is not None and why_not.startswith("given"):
        return None
    network = links.kind(config.get("DDL_NETWORK", environ))
    try:
        found = read(sorted(set(rank_hosts)), config.get("DDL_SCHEDULER_TOPOLOGY", environ),
                     network.bandwidth * 1e9, network.latency * 1e-6, environ)
    except SchedulerError as e:
        say(f"{e}; using the hosts alone", always=True)
        return None
    if found is not None:
        say(f"switch levels from the scheduler: {len(found.levels)} level(s)")
    return found


def _reporter(rank: int, level: int):
    def say(text: str, always: bool = False) -> None:
        if rank == 0 and (always or level >= 1):
            print(f"ddl: {text}", file=sys.stderr, flush=True)
    return say
