"""What a probe found: the hosts' switch tree and, per level, the measured bandwidth and latency; as JSON for
the cache, the broadcast to every rank and ``ddl-topo --probe``."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from ...errors import TopologyError

FORMAT = "ddl-probe/1"
LEVEL_NAMES = ("leaf", "spine", "core", "super")


class ProbeError(TopologyError):
    """The probe could not measure (a host that did not answer, the budget spent) or its cache is unusable."""


class BudgetSpent(ProbeError):
    """The probe's time budget ran out (DDL_PROBE_BUDGET): the stages it finished still stand."""


@dataclass(frozen=True)
class Level:
    """One level of the switch tree, innermost first: its children (hosts, then groups) reach each other at
    ``bandwidth`` bytes/s each under load (the child's uplink) and ``latency`` seconds one way. ``how``: "probed"
    (the survey's rounds) or "calibrated" (an allreduce's load, ddl.topology.probe.calibrate)."""
    name: str
    bandwidth: float
    latency: float
    groups: int
    how: str = "probed"

    def to_dict(self) -> dict:
        return {"name": self.name, "bandwidth": self.bandwidth, "latency": self.latency, "groups": self.groups,
                "how": self.how}


@dataclass
class ProbeResult:
    hosts: list[str]                 # sorted host names
    tree: list                       # nested lists of host names, innermost groups deepest
    levels: list[Level]              # innermost first; len(levels) == depth of tree
    seconds: float = 0.0             # how long measuring took
    rounds: int = 0
    flows: int = 0
    notes: list[str] = field(default_factory=list)
    source: str = "probe"            # "probe" (measured) or "scheduler" (nominal costs)
    measured_at: str = ""            # when (UTC, ISO 8601)
    settings: dict = field(default_factory=dict)  # how: window, repeats, budget, flow bytes
    verified_at: str = ""            # when a job last checked it against the network (UTC, ISO 8601)
    doubtful: str = ""               # why a job did not believe it (its plan ran far below its prediction)

    @property
    def depth(self) -> int:
        return len(self.levels)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "hosts": self.hosts, "tree": self.tree,
                "levels": [lv.to_dict() for lv in self.levels], "seconds": self.seconds, "rounds": self.rounds,
                "flows": self.flows, "notes": self.notes, "source": self.source, "measured_at": self.measured_at,
                "settings": self.settings, "verified_at": self.verified_at, "doubtful": self.doubtful}

    @classmethod
    def from_dict(cls, d, where: str = "probe result") -> "ProbeResult":
        """Checks everything a cache file could get wrong; raises ProbeError naming it."""
        def bad(what):
            return ProbeError(f"{where}: {what}")
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise bad(f"not a {FORMAT} result")
        hosts = d.get("hosts")
        if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h for h in hosts):
            raise bad("hosts: must be a non-empty list of names")
        levels = d.get("levels")
        if not isinstance(levels, list) or not levels:
            raise bad("levels: must be a non-empty list")
        out = []
        for i, lv in enumerate(levels):
            if not isinstance(lv, dict):
                raise bad(f"levels[{i}]: must be an object")
            bw, lat, groups = lv.get("bandwidth"), lv.get("latency"), lv.get("groups")
            if not _number(bw) or not 0 < bw < 1e13:
                raise bad(f"levels[{i}].bandwidth: must be > 0 bytes/s")
            if not _number(lat) or not 0 <= lat < 10:
                raise bad(f"levels[{i}].latency: must be between 0 and 10 s")
            if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
                raise bad(f"levels[{i}].groups: must be a positive whole number")
            how = lv.get("how", "probed")
            if how not in ("probed", "calibrated"):
                raise bad(f"levels[{i}].how: must be probed or calibrated")
            out.append(Level(str(lv.get("name", LEVEL_NAMES[min(i, 3)])), float(bw), float(lat), groups, how))
        tree = d.get("tree")
        found = _hosts_of(tree, bad, len(out))
        if sorted(found) != sorted(hosts) or len(set(found)) != len(found):
            raise bad("tree: must hold every host once")
        settings = d.get("settings")
        return cls(list(hosts), tree, out, float(d.get("seconds", 0.0)), int(d.get("rounds", 0)),
                   int(d.get("flows", 0)), [str(n) for n in d.get("notes", [])],
                   "scheduler" if d.get("source") == "scheduler" else "probe", str(d.get("measured_at", "")),
                   dict(settings) if isinstance(settings, dict) else {},
                   str(d.get("verified_at", "")), str(d.get("doubtful", "")))


def utc_now() -> str:
    """A result's timestamps (measured_at, verified_at): UTC, ISO 8601, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x


def _hosts_of(tree, bad, depth: int) -> list[str]:
    """Host names of a tree whose every leaf sits ``depth`` lists deep."""
    if depth == 0 or isinstance(tree, str):
        if not isinstance(tree, str) or depth:
            raise bad("tree: its depth must match levels")
        return [tree]
    if not isinstance(tree, list) or not tree:
        raise bad("tree: every group must be a non-empty list")
    return [h for t in tree for h in _hosts_of(t, bad, depth - 1)]
