"""Switch levels from the scheduler: Slurm's ``scontrol show topology``.

With the tree plugin, each line names a switch, its level, and its nodes (leaf switches) or child switches:

    SwitchName=s0 Level=0 LinkSpeed=1 Nodes=tux[0-3]
    SwitchName=s2 Level=1 LinkSpeed=1 Nodes=tux[0-7] Switches=s[0-1]

The listing covers the whole cluster; the job's hosts are kept, switches without any are dropped, and a switch
with one child adds no level. The block plugin's lines (``BlockName=b0 ... Nodes=tux[0-3]``) are read as one
level of blocks. Slurm gives no bandwidths (``LinkSpeed`` is relative), so the levels are priced from the nominal
link table (DDL_NETWORK). Malformed output is refused naming its line.
"""
from __future__ import annotations

import re
import shutil
import subprocess

from ..errors import TopologyError
from .probe.result import Level, ProbeResult

_FIELD = re.compile(r"(\w+)=(\S*)")


class SchedulerError(TopologyError):
    """The scheduler's topology cannot be read or does not cover the job's hosts."""


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host lists: ``gpu[01-03,07],login1,r[1-2]n[1-2]`` -> every name, in order (zero
    padding kept: ``[08-10]`` -> 08, 09, 10; an empty text names no host). Raises ValueError saying what is
    wrong; ddl.runner.hosts reads SLURM_JOB_NODELIST with it too."""
    if not text:
        return []
    items, depth, current = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced ']'")
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    if depth:
        raise ValueError("unbalanced '['")
    items.append(current)
    if any(not i for i in items):
        raise ValueError("empty entry")
    return [name for item in items for name in _expand_one(item)]


def _expand_one(item: str) -> list[str]:
    m = re.match(r"([^\[]*)\[([^\]]*)\](.*)", item)
    if not m:
        return [item]
    prefix, ranges, rest = m.groups()
    out = []
    for r in ranges.split(","):
        lo, _, hi = r.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise ValueError(f"bad range {r!r}")
        width = len(lo)
        for i in range(int(lo), int(hi or lo) + 1):
            out.extend(prefix + str(i).zfill(width) + tail for tail in _expand_one(rest))
    return out


def parse(text: str, hosts: list[str], bandwidth: float, latency: float) -> ProbeResult:
    """The job's switch tree from ``scontrol show topology`` output, levels priced at ``bandwidth`` bytes/s and
    ``latency`` s one way (nominal). Raises SchedulerError naming the line or the host that is missing."""
    switches: dict[str, dict] = {}
    blocks: list[list[str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = dict(_FIELD.findall(line))
        try:
            if "SwitchName" in fields:
                level = fields.get("Level", "0")
                if not level.isdigit():
                    raise ValueError(f"Level={level!r} is not a number")
                switches[fields["SwitchName"]] = {
                    "level": int(level), "nodes": expand_hostlist(fields.get("Nodes", "")),
                    "switches": expand_hostlist(fields.get("Switches", "")), "line": number}
            elif "BlockName" in fields:
                blocks.append(expand_hostlist(fields.get("Nodes", "")))
            else:
                raise ValueError("expected SwitchName=... or BlockName=...")
        except ValueError as e:
            raise SchedulerError(f"scontrol show topology, line {number}: {e}: {line.strip()[:120]!r}") from None
    if blocks and switches:
        raise SchedulerError("scontrol show topology mixes switches (tree plugin) and blocks (block plugin)")
    if not switches and not blocks:
        raise SchedulerError("scontrol show topology lists no switches or blocks")
    job = set(hosts)
    tree = _block_tree(blocks, job) if blocks else _switch_tree(switches, job)
    found = _leaves(tree)
    missing = sorted(job - set(found))
    if missing:
        raise SchedulerError(f"scontrol show topology does not place host {missing[0]}"
                             f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}")
    depth = _depth(tree)
    tree = _pad(tree, depth)
    names = ("leaf", "spine", "core", "super")
    levels = [Level(names[min(k, 3)], bandwidth, latency * (k + 1), 1) for k in range(depth)]
    return ProbeResult(sorted(job), tree, levels, notes=["from scontrol show topology (nominal link costs)"],
                       source="scheduler")


def _block_tree(blocks: list[list[str]], job: set) -> list:
    groups = [[h for h in b if h in job] for b in blocks]
    return [g for g in groups if g] or []


def _switch_tree(switches: dict, job: set) -> list:
    children = {c for s in switches.values() for c in s["switches"]}
    for name, s in switches.items():
        for c in s["switches"]:
            if c not in switches:
                raise SchedulerError(f"scontrol show topology, line {s['line']}: switch {name} names child "
                                     f"switch {c}, which is not listed")
    roots = [n for n in switches if n not in children]
    seen: set = set()

    def build(name):
        if name in seen:
            raise SchedulerError(f"scontrol show topology: switch {name} is reached twice (a loop?)")
        seen.add(name)
        s = switches[name]
        kids = [build(c) for c in s["switches"]] if s["switches"] else [h for h in s["nodes"] if h in job]
        kids = [k for k in kids if k]
        return kids[0] if len(kids) == 1 and isinstance(kids[0], list) else kids
    tops = [t for t in (build(r) for r in roots) if t]
    return tops[0] if len(tops) == 1 else tops


def _leaves(tree) -> list[str]:
    return [tree] if isinstance(tree, str) else [h for t in tree for h in _leaves(t)]


def _depth(tree) -> int:
    return 0 if isinstance(tree, str) else 1 + max(_depth(t) for t in tree)


def _pad(tree, depth: int):
    """Every host at the same depth: a shallow branch gets groups of one below it."""
    if isinstance(tree, str):
        return tree if depth == 0 else _pad([tree], depth)
    return [_pad(t, depth - 1) for t in tree]


def read(hosts: list[str], setting: str, bandwidth: float, latency: float, environ) -> ProbeResult | None:
    """The scheduler's tree for ``hosts``: from the file ``setting`` names, or (``auto``) from scontrol inside
    a Slurm job; None where there is none to read."""
    if setting == "off":
        return None
    if setting == "auto":
        if not environ.get("SLURM_JOB_ID") or shutil.which("scontrol") is None:
            return None
        try:
            done = subprocess.run(["scontrol", "show", "topology"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SchedulerError(f"scontrol show topology: {e}") from None
        if done.returncode:
            raise SchedulerError(f"scontrol show topology: {done.stderr.strip() or 'failed'}")
        text = done.stdout
    else:
        try:
            with open(setting) as f:
                text = f.read()
        except OSError as e:
            raise SchedulerError(f"DDL_SCHEDULER_TOPOLOGY={setting!r}: {e}") from None
    return parse(text, hosts, bandwidth, latency)
