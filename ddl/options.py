"""IBM DDL's option string (DDL_OPTIONS, ``ddl.init(options=...)``) plus ddl's own options.

IBM's grammar (``-mode``, ``-dump_iter``, ``-dev_sync``, ``-rebind_iter``, ``-dbg_level``, ``-check``) and ddl's
own options, each of which overrides one DDL_* setting of ddl.config; every one is declared in ``OPTIONS`` below,
from which docs/reference/options.md is generated. Options not given fall back to the DDL_* settings.
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Callable

from . import config
from .errors import DDLError

MODE_LETTERS = {
    "r": "ring only",
    "n": "NCCL where possible, else ring",
    "b": "enhanced NCCL where possible, else ring",
    "c": "RCS only",
    "m": "MPI reduce_scatter + allgatherv",
    "p": "explore: measure and pick the best per dimension",
}
ALGORITHMS = ("auto", "ring", "rabenseifner", "recursive_doubling", "direct", "exchange")
# What each -mode letter makes of every level on the CPU path (NCCL arrives with the GPU path). IBM never
# documented "RCS"; we read it as recursive halving/doubling. "m" (MPI reduce_scatter + allgatherv) becomes
# its point-to-point equivalent, direct exchange: ddl never calls MPI's collectives.
MODE_ALGORITHMS = {"r": "ring", "n": "ring", "b": "ring", "c": "rabenseifner", "m": "direct", "p": "auto"}


@dataclass(frozen=True)
class Mode:
    letter: str
    dims: tuple[int, ...] = ()

    def check_size(self, size: int) -> None:
        """IBM DDL's error when the tiers do not multiply to the number of ranks."""
        product = 1
        for d in self.dims:
            product *= d
        if self.dims and product != size:
            dims = " ".join(f"dim[{i}]={d}" for i, d in enumerate(self.dims))
            raise DDLError(f"invalid dim size={product} usr_size={size} {dims}")


@dataclass(frozen=True)
class Options:
    mode: Mode | None = None
    dump_iter: int = 0
    dev_sync: int = 0
    rebind_iter: int = 0
    dbg_level: int = 0
    check: float | None = None
    timeout: float = 300.0
    algo: str = "auto"              # one name, or a comma list per level innermost first
    segment: int | None = None      # bytes per pipeline block; None: the planner decides
    inflight: int | None = None     # None: the planner decides
    topology: str | None = None     # file or machine name; None: discovery
    plan: str | None = None         # plan file forcing the plan
    small_bytes: int = 65536
    rest: float = 100.0              # microseconds: the longest sleep between polls of a large run (0: spin)
    probe: str = "auto"             # auto, 0, 1, force (ddl.topology.probe)
    timeline: str | None = None     # Chrome-trace file written at ddl.finalize() (ddl.core.timeline)
    shm: str = "auto"               # the host memory level: auto, slots or 0 (ddl.core.host)
    path: str | None = None         # the path forced on every collective's road (ddl.core.road), None: none
    extra: dict = field(default_factory=dict)


def parse_mode(text: str) -> Mode:
    m = re.fullmatch(r"([a-z])(?::(\d+(?:x\d+)*))?", text)
    if not m or m.group(1) not in MODE_LETTERS:
        raise DDLError(f"bad -mode {text!r}: expected <letter>[:AxBx...] with letter one of "
                       f"{', '.join(MODE_LETTERS)}")
    dims = tuple(int(d) for d in m.group(2).split("x")) if m.group(2) else ()
    if any(d < 1 for d in dims):
        raise DDLError(f"bad -mode {text!r}: every dimension must be at least 1")
    return Mode(m.group(1), dims)


def _number(name: str, value: str, kind=int, low=0):
    try:
        v = kind(value)
    except ValueError:
        raise DDLError(f"option -{name} expects a number, got {value!r}") from None
    if v < low:
        raise DDLError(f"option -{name} must be at least {low}, got {value!r}")
    return v


MAX_SEGMENT = 1 << 30  # a block is sent whole by some algorithms; MPI counts stop at 2 GiB


def _segment(v: int) -> int:
    if v > MAX_SEGMENT:
        raise DDLError(f"segment of {v} bytes is above the limit of {MAX_SEGMENT} (1 GiB)")
    return v


def algorithms(text: str, where: str = "-algo") -> str:
    """Checks an algorithm list: one name, or names per level separated by commas."""
    names = [a.strip() for a in text.split(",")]
    bad = [a for a in names if a not in ALGORITHMS]
    if bad or not names:
        raise DDLError(f"{where} {text!r}: {', '.join(map(repr, bad)) or 'empty'} is not an algorithm; expected "
                       f"one of {', '.join(ALGORITHMS)}, or one per level separated by commas")
    return ",".join(names)


PROBE_VALUES = ("auto", "0", "1", "force", "trust")


def probe_mode(text: str, where: str = "-probe") -> str:
    value = text.strip().lower()
    if value not in PROBE_VALUES:
        raise DDLError(f"{where} {text!r}: expected one of {', '.join(PROBE_VALUES)}")
    return value


SHM_VALUES = ("auto", "0", "1", "slots")


def shm_mode(text: str, where: str = "-shm") -> str:
    value = text.strip().lower()
    if value not in SHM_VALUES:
        raise DDLError(f"{where} {text!r}: expected auto (or 1: the host memory level where ranks share a host), "
                       f"slots (that level without reading peers' buffers directly) or 0 (MPI messages only)")
    return "auto" if value == "1" else value


PATHS = ("device", "alone", "host memory", "riding", "planned")  # ddl.core.paths, in their table's order


def path_name(text: str, where: str = "-path") -> str | None:
    value = " ".join(text.strip().lower().replace("_", " ").split())
    if not value:
        return None
    if value not in PATHS:
        raise DDLError(f"{where} {text!r}: expected one of {', '.join(PATHS)}")
    return value


def _from_environment(environ) -> Options:
    seg = config.get("DDL_SEGMENT_BYTES", environ)
    inflight = config.get("DDL_INFLIGHT", environ)
    return Options(
        timeout=_number("timeout (DDL_TIMEOUT)", config.get("DDL_TIMEOUT", environ), float, 0.001),
        algo=algorithms(config.get("DDL_ALGO", environ), "DDL_ALGO="),
        segment=None if seg == "auto" else _segment(_number("segment (DDL_SEGMENT_BYTES)", seg, int, 1)),
        inflight=None if inflight == "auto" else _number("inflight (DDL_INFLIGHT)", inflight, int, 1),
        small_bytes=_number("small (DDL_SMALL_BYTES)", config.get("DDL_SMALL_BYTES", environ), int, 0),
        rest=_number("rest (DDL_REST)", config.get("DDL_REST", environ), float, 0),
        topology=config.get("DDL_TOPOLOGY", environ) or None,
        plan=config.get("DDL_PLAN", environ) or None,
        probe=probe_mode(config.get("DDL_PROBE", environ), "DDL_PROBE="),
        timeline=config.get("DDL_TIMELINE", environ) or None,
        shm=shm_mode(config.get("DDL_SHM", environ), "DDL_SHM="),
        path=path_name(config.get("DDL_PATH", environ), "DDL_PATH="),
    )


@dataclass(frozen=True)
class Option:
    """One entry of the option string: the Options attribute it sets, how its value is read, what it means (the
    options reference is generated from this table), and the DDL_* setting it overrides, if any."""
    attribute: str
    convert: Callable[[str], object]
    meaning: str
    setting: str | None = None
    value: str = "N"  # the value's placeholder in the reference


OPTIONS = {
    "mode": Option("mode", parse_mode, value="<l>[:AxBx…]", meaning=(
        "IBM's mode. Dims: one per tier, innermost first, over consecutive ranks (`r:4x2`: ranks 0–3 and 4–7 are "
        "the groups); they must multiply to the rank count, else IBM's error `invalid dim size=A usr_size=B "
        "dim[0]=…`, and become the tree large allreduces follow. Letter: the algorithm of every level: `r` ring; "
        "`c` (\"RCS\", never documented by IBM; read as recursive halving/doubling) rabenseifner; `m` (MPI "
        "reduce_scatter + allgatherv) its point-to-point twin, direct exchange; `n`/`b` (NCCL where possible, else "
        "ring) ring on host arrays; `p` (explore) the cost model per level. `-algo`/`DDL_ALGO` override the "
        "letter.")),
    "dump_iter": Option("dump_iter", lambda v: _number("dump_iter", v), meaning=(
        "every N allreduce calls, rank 0 prints the mean time per call and per level and phase (see "
        "[Per-level timing](../guides/timeline.md))")),
    "dev_sync": Option("dev_sync", lambda v: _number("dev_sync", v), meaning=(
        "IBM's device synchronisation; accepted for compatibility, no effect")),
    "rebind_iter": Option("rebind_iter", lambda v: _number("rebind_iter", v), meaning=(
        "IBM's periodic rebinding; accepted for compatibility, no effect")),
    "dbg_level": Option("dbg_level", lambda v: _number("dbg_level", v), value="0|1|2", meaning=(
        "≥ 1: rank 0 prints each new plan (algorithm, blocks, blocks in flight) and where the switch levels came "
        "from (the probe measured, or a cached result verified, with the seconds it took)")),
    "check": Option("check", lambda v: _number("check", v, float), value="TOL", meaning=(
        "also run `MPI_Allreduce` on a copy of the input and raise on every rank if any element differs by more "
        "than TOL (relative)")),
    "timeout": Option("timeout", lambda v: _number("timeout", v, float, 0.001), "", "DDL_TIMEOUT", "S"),
    "algo": Option("algo", algorithms, "", "DDL_ALGO", "NAME[,NAME…]"),
    "segment": Option("segment", lambda v: _segment(_number("segment", v, int, 1)), "", "DDL_SEGMENT_BYTES",
                      "BYTES"),
    "inflight": Option("inflight", lambda v: _number("inflight", v, int, 1), "", "DDL_INFLIGHT"),
    "topology": Option("topology", str, "", "DDL_TOPOLOGY", "FILE"),
    "plan": Option("plan", str, "", "DDL_PLAN", "FILE"),
    "probe": Option("probe", probe_mode, "", "DDL_PROBE", "|".join(PROBE_VALUES)),
    "timeline": Option("timeline", str, "", "DDL_TIMELINE", "FILE"),
    "shm": Option("shm", shm_mode, "", "DDL_SHM", "|".join(SHM_VALUES)),
    "path": Option("path", path_name, "", "DDL_PATH", "|".join(p.replace(" ", "_") for p in PATHS)),
    "rest": Option("rest", lambda v: _number("rest", v, float, 0), "", "DDL_REST", "US"),
}


def parse(text: str | None = None, environ=os.environ) -> Options:
    """Options from ``text`` (default: $DDL_OPTIONS) over the DDL_* defaults. Unknown options are an error."""
    if text is None:
        text = config.get("DDL_OPTIONS", environ)
    opts = _from_environment(environ)
    tokens = shlex.split(text or "")
    i = 0
    while i < len(tokens):
        name = tokens[i].lstrip("-")
        if not tokens[i].startswith("-") or name not in OPTIONS:
            raise DDLError(f"unknown DDL option {tokens[i]!r} in {text!r} (known: "
                           f"{', '.join('-' + k for k in OPTIONS)})")
        if i + 1 >= len(tokens):
            raise DDLError(f"DDL option {tokens[i]} needs a value")
        option = OPTIONS[name]
        opts = replace(opts, **{option.attribute: option.convert(tokens[i + 1])})
        i += 2
    if opts.mode is not None and opts.algo == "auto":
        opts = replace(opts, algo=MODE_ALGORITHMS[opts.mode.letter])
    return opts
