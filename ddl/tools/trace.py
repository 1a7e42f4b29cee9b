"""ddl-trace: reads the flight recorder's files (DDL_FLIGHT_RECORDER=DIR: one rank<R>.json per rank, written
on a failure, a deadline or SIGUSR1) and says who was behind and where.

    ddl-trace DIR            the verdict: the first run that did not finish everywhere, who never entered it,
                             and where each of the others waited (peer, round, level and phase)
    ddl-trace DIR --runs 5   also each rank's last 5 runs
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..core.agreement import ranges
from ..core.flight import FORMAT
from ..errors import DDLError
from ..units import format_size
from .cli import Parser, one_line_errors


def load(folder: str) -> list[dict]:
    files = sorted(Path(folder).glob("rank*.json"))
    if not files:
        raise DDLError(f"no flight recorder files (rank<R>.json) in {folder}")
    out = []
    for f in files:
        data = json.loads(f.read_text())
        if not isinstance(data, dict) or data.get("format") != FORMAT or "communicators" not in data:
            raise DDLError(f"{f}: not a ddl flight recorder file (format {FORMAT})")
        out.append(data)
    return out


def _describe(run: dict) -> str:
    how = f", {run['algorithm']}" if run.get("algorithm") else ""  # known for failed runs
    return f"#{run['seq']} {run['label']} ({format_size(run['bytes'])}{how})"


def _where_waiting(run: dict) -> str:
    if run["state"] == "running":
        return "still inside it when the file was written"
    if "waiting_on" not in run:
        return f"failed: {run.get('error', '?')}"
    return (f"waited on rank {run['waiting_on']} ({run['waiting_for']}, {format_size(run['message_bytes'])}) at "
            f"{run.get('step', 'round ' + str(run['round']))}")


def verdict(dumps: list[dict], communicator: str | None = None) -> list[str]:
    """Lines that say, for each communicator with a run that did not finish on every rank (or the one asked
    for), which run that was, which ranks never entered it and where the others waited."""
    by_comm: dict[str, dict[int, dict]] = {}
    hosts = {d["rank"]: d["host"] for d in dumps}
    for d in dumps:
        for c in d["communicators"]:
            by_comm.setdefault(c["communicator"], {})[c["rank"]] = c
    lines: list[str] = []
    for index in sorted(by_comm):
        if communicator is not None and index != communicator:
            continue
        lines += _one_communicator(index, by_comm[index], hosts)
    return lines or ["every rank's runs finished: nothing stuck in these files"]


def _one_communicator(name: str, ranks: dict[int, dict], hosts: dict[int, str]) -> list[str]:
    size = next(iter(ranks.values()))["size"]
    members = next(iter(ranks.values())).get("members") or list(range(size))
    hosts = {r: hosts.get(members[r], "?") for r in range(size)}  # by this communicator's ranks
    unfinished = [min((r["seq"] for r in c["runs"] if r["state"] != "done"), default=None) for c in ranks.values()]
    stuck = min((s for s in unfinished if s is not None), default=None)
    last = {r: max((run["seq"] for run in c["runs"]), default=-1) for r, c in ranks.items()}
    if stuck is None:
        if len(set(last.values())) <= 1:
            return []
        stuck = max(last.values())  # nothing failed, but some ranks got further: the others are behind
    runs_at = {r: next((run for run in c["runs"] if run["seq"] == stuck), None) for r, c in ranks.items()}
    entered = [run for run in runs_at.values() if run is not None]
    example = next((run for run in entered if run.get("algorithm")), entered[0])
    lines = [f"communicator {name} ({size} ranks): run {_describe(example)} did not finish on every rank"]
    never = sorted(r for r, run in runs_at.items() if run is None and last[r] < stuck)
    for r in never:
        previous = max((run for run in ranks[r]["runs"]), key=lambda run: run["seq"], default=None)
        before = f"its last run was #{previous['seq']} {previous['label']} ({previous['state']})" if previous \
            else "it ran nothing"
        lines.append(f"  rank {r} ({hosts.get(r, '?')}) never entered it: {before}")
    missing = sorted(set(range(size)) - set(ranks))
    if missing:
        who = "rank" if len(missing) == 1 else "ranks"
        lines.append(f"  {who} {ranges(missing)}: no file (dead before writing, or not signalled: kill -USR1 a live "
                     f"rank to get its record)")
    groups: dict[str, list[int]] = {}
    for r, run in sorted(runs_at.items()):
        if run is not None:
            groups.setdefault(_where_waiting(run), []).append(r)
    for what, members in groups.items():
        lines.append(f"  {'rank' if len(members) == 1 else 'ranks'} {ranges(members)} {what}")
    behind = never + missing
    lines.append(f"  verdict: {'rank' if len(behind) == 1 else 'ranks'} {ranges(behind)} behind; the others "
                 f"waited on {'it' if len(behind) == 1 else 'them'}" if behind else
                 "  verdict: every rank entered it; see where each waited (a dead peer, or ranks that called "
                 "different collectives)")
    return lines


def _recent(dumps: list[dict], count: int) -> list[str]:
    lines = []
    for d in sorted(dumps, key=lambda d: d["rank"]):
        lines.append(f"rank {d['rank']} ({d['host']}, written on {d['reason']}):")
        for c in d["communicators"]:
            for run in c["runs"][-count:]:
                took = (run["end_ns"] - run["start_ns"]) / 1e6 if run["end_ns"] else float("nan")
                lines.append(f"  comm {c['communicator']} {_describe(run)} {run['state']} {took:.3f} ms")
    return lines


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="ddl-trace", description=__doc__.split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", help="the DDL_FLIGHT_RECORDER folder")
    p.add_argument("--communicator", help="only this communicator, named as the verdict names it "
                   "('ranks 0-7 #0': the first one over world ranks 0-7)")
    p.add_argument("--runs", type=int, default=0, help="also print each rank's last RUNS runs")
    return p


@one_line_errors("ddl-trace")
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    dumps = load(args.folder)
    for line in verdict(dumps, args.communicator) + (_recent(dumps, args.runs) if args.runs else []):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
