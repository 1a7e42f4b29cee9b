"""Where a job's ranks go: host lists from the command line, host files and batch schedulers (pure parsing).

A host list is a list of ``Host(name, slots)`` in order: the order ranks fill them, packed host by host.
Sources, as ddlrun tries them: ``-H a,b:4``; ``--hostfile`` (``host``, ``host:4`` or ``host slots=4`` a line,
``#`` comments); Slurm (``SLURM_JOB_NODELIST`` with bracket ranges, ``SLURM_TASKS_PER_NODE`` such as
``4(x2),2``); LSF (``LSB_MCPU_HOSTS`` "h1 4 h2 4", else ``LSB_DJOB_HOSTFILE``, one line per slot); PBS
(``PBS_NODEFILE``, one line per slot); else this machine alone. Every name is validated: names reach ssh and
MPI's launcher, so a name such as ``a;rm -rf ~`` is refused here, before anything runs.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import DDLError
from ..topology.scheduler import expand_hostlist

# RFC 1123 host names and IPv4 addresses; no leading '-' (it would read as an option to ssh).
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,253}[A-Za-z0-9])?")
LOCAL_NAMES = ("localhost", "127.0.0.1")


class HostError(DDLError):
    """A bad host name, host file or scheduler variable."""


@dataclass(frozen=True)
class Host:
    name: str
    slots: int | None = None  # None: not said; ddlrun fills in one per GPU, else 1


def check_name(name: str, where: str) -> str:
    if not _NAME.fullmatch(name):
        raise HostError(f"{where}: {name!r} is not a valid host name (letters, digits, '.', '-' and '_' only)")
    return name


def _slots(text: str, where: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise HostError(f"{where}: slots must be a positive whole number, got {text!r}")
    return int(text)


def parse_host_list(text: str, where: str = "-H") -> list[Host]:
    """``a,b:4,c`` -> hosts (slots after a colon)."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            raise HostError(f"{where} {text!r}: empty host name")
        name, _, slots = item.partition(":")
        out.append(Host(check_name(name, where), _slots(slots, f"{where} {item!r}") if slots else None))
    return merge(out)


def _lines(text: str, where: str):
    """(where, line) for each line with something on it, ``#`` comments dropped."""
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if line:
            yield f"{where}, line {number}", line


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as e:
        raise HostError(f"{what} {path!r}: {e.strerror}") from None


def parse_hostfile(text: str, where: str = "hostfile") -> list[Host]:
    """One host a line: ``host``, ``host:4``, ``host slots=4`` (Open MPI's form; ``max_slots`` ignored)."""
    out = []
    for at, line in _lines(text, where):
        words = line.split()
        name, _, slots = words[0].partition(":")
        count = _slots(slots, at) if slots else None
        for w in words[1:]:
            key, _, value = w.partition("=")
            if key == "slots":
                count = _slots(value, at)
            elif key != "max_slots":
                raise HostError(f"{at}: unknown field {w!r} (expected 'host', 'host:N' or 'host slots=N')")
        out.append(Host(check_name(name, at), count))
    if not out:
        raise HostError(f"{where}: no hosts in it")
    return merge(out)


def read_hostfile(path: str) -> list[Host]:
    return parse_hostfile(_read(path, "hostfile"), f"hostfile {path!r}")


def parse_rankfile(text: str, where: str = "rankfile") -> list[str]:
    """Open MPI's rankfile (``rank N=host slot=...`` a line) -> the host of every rank. ddl leaves ranks
    unbound, so the slot part is read but not used."""
    placed: dict[int, str] = {}
    for at, line in _lines(text, where):
        m = re.fullmatch(r"rank\s+(\d+)\s*=\s*(\S+?)(?:\s+slot=\S+)?", line)
        if not m:
            raise HostError(f"{at}: expected 'rank N=host slot=...', got {line!r}")
        rank, host = int(m.group(1)), check_name(m.group(2), at)
        if rank in placed:
            raise HostError(f"{at}: rank {rank} is placed twice")
        placed[rank] = host
    if sorted(placed) != list(range(len(placed))) or not placed:
        missing = sorted(set(range(max(placed, default=-1) + 1)) - set(placed))
        raise HostError(f"{where}: ranks must be 0..N-1 each once (missing {missing[:5] or 'all'})")
    return [placed[r] for r in range(len(placed))]


def read_rankfile(path: str) -> list[str]:
    return parse_rankfile(_read(path, "rankfile"), f"rankfile {path!r}")


def merge(hosts: list[Host]) -> list[Host]:
    """A host named again adds its slots to its first entry (order of first appearance kept)."""
    order: dict[str, Host] = {}
    for h in hosts:
        if h.name in order:
            old = order[h.name]
            order[h.name] = Host(h.name, (old.slots or 1) + (h.slots or 1))
        else:
            order[h.name] = h
    return list(order.values())


# -- schedulers ----------------------------------------------------------------------------------------------

def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed node list: ``gpu[01-03,07],login1,r[1-2]n[1-2]`` -> every name, in order."""
    try:
        if not text:
            raise ValueError("empty entry")
        names = expand_hostlist(text)
    except ValueError as e:
        raise HostError(f"SLURM_JOB_NODELIST {text!r}: {e}") from None
    return [check_name(n, "SLURM_JOB_NODELIST") for n in names]


def slurm_tasks_per_node(text: str, nodes: int) -> list[int]:
    """``4(x2),2`` -> [4, 4, 2]."""
    counts: list[int] = []
    for item in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not m or int(m.group(1)) < 1:
            raise HostError(f"SLURM_TASKS_PER_NODE {text!r}: bad entry {item!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if len(counts) != nodes:
        raise HostError(f"SLURM_TASKS_PER_NODE {text!r} gives {len(counts)} nodes, SLURM_JOB_NODELIST {nodes}")
    return counts


def from_slurm(env) -> list[Host]:
    names = expand_nodelist(env.get("SLURM_JOB_NODELIST") or env["SLURM_NODELIST"])
    tasks = env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_STEP_TASKS_PER_NODE")
    counts = slurm_tasks_per_node(tasks, len(names)) if tasks else [None] * len(names)
    return merge([Host(n, c) for n, c in zip(names, counts)])


def from_lsf(env) -> list[Host]:
    """LSB_MCPU_HOSTS ("h1 4 h2 4"), else LSB_DJOB_HOSTFILE (one line per slot). The launch host of an LSF
    job on Summit-like machines ("batch" nodes with no GPUs) is listed first and dropped when it holds one
    slot while others hold more, as IBM's ddlrun and horovodrun did."""
    if env.get("LSB_MCPU_HOSTS"):
        words = env["LSB_MCPU_HOSTS"].split()
        if len(words) % 2:
            raise HostError(f"LSB_MCPU_HOSTS {env['LSB_MCPU_HOSTS']!r}: expected pairs 'host slots'")
        hosts = [Host(check_name(words[i], "LSB_MCPU_HOSTS"), _slots(words[i + 1], "LSB_MCPU_HOSTS"))
                 for i in range(0, len(words), 2)]
    else:
        hosts = _one_line_per_slot(env["LSB_DJOB_HOSTFILE"], "LSB_DJOB_HOSTFILE")
    hosts = merge(hosts)
    if len(hosts) > 1 and hosts[0].slots == 1 and all((h.slots or 1) > 1 for h in hosts[1:]):
        hosts = hosts[1:]
    return hosts


def from_pbs(env) -> list[Host]:
    return _one_line_per_slot(env["PBS_NODEFILE"], "PBS_NODEFILE")


def _one_line_per_slot(path: str, variable: str) -> list[Host]:
    lines = [ln.strip() for ln in _read(path, variable).splitlines() if ln.strip()]
    if not lines:
        raise HostError(f"{variable} {path!r}: no hosts in it")
    return merge([Host(check_name(n, variable), 1) for n in lines])


SCHEDULERS = (  # (name, the variable that says we are inside its job, reader)
    ("slurm", "SLURM_JOB_NODELIST", from_slurm),
    ("lsf", "LSB_MCPU_HOSTS", from_lsf),
    ("lsf", "LSB_DJOB_HOSTFILE", from_lsf),
    ("pbs", "PBS_NODEFILE", from_pbs),
)


def from_scheduler(env=os.environ) -> tuple[str, list[Host]] | None:
    """(scheduler, hosts) of the batch job this runs in, or None outside one."""
    for name, variable, reader in SCHEDULERS:
        if env.get(variable):
            return name, reader(env)
    return None
