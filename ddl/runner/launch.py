"""What ddlrun launches, decided without running anything: the placement of ranks on hosts, the settings every
rank gets, and the MPI job (ddl.runner.mpirun builds its command line). Pure: every fact about the machine comes in.

Ranks are packed host by host in the order the hosts were given (the topology order: a scheduler lists the
nodes of a rack together), or placed as a rankfile says. Every rank gets:
- ``DDL_OPTIONS``: ``-mode <letter>:<dims>`` (IBM's four tiers: ranks per node x nodes per rack x racks per
  aisle x aisles, where the placement has such a shape) and the user's ``--ddloption`` text;
- ``DDL_HOST_LIST``: ``host:0,1;host2:2,3`` (each host's ranks, as IBM's ddlrun published it);
- through ddl.runner.rankenv, which starts the program: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, one GPU per
  rank by local rank (CUDA_VISIBLE_DEVICES) where there are GPUs, and its own log files with --output-filename;
- the user's exportable variables (``exportable``), and MASTER_PORT free on rank 0's host where that is here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import mpirun
from .. import options
from ..errors import DDLError
from .hosts import LOCAL_NAMES, Host

# Every exportable variable of the user travels to the ranks (as horovodrun does), but not the launcher's own
# (MPI's, the shell's, this session's): those describe this process, not the job.
NOT_FORWARDED = {"HOSTNAME", "HOST", "PWD", "OLDPWD", "SHLVL", "_", "TERM", "DISPLAY", "SHELL", "PS1", "TMUX",
                 "HOME", "USER", "LOGNAME", "MAIL"}  # the remote login sets these itself
NOT_FORWARDED_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "PMI_", "HYDRA_", "BASH_FUNC_", "SSH_", "SLURM_", "LSB_",
                          "PBS_", "XDG_")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TIERS = ("ranks per node", "nodes per rack", "racks per aisle", "aisles")


class LaunchError(DDLError):
    """The request cannot be placed (too many ranks for the slots, tiers that do not fit...)."""


@dataclass(frozen=True)
class Machine:
    """Facts about the machine ddlrun runs on."""
    hostname: str
    cores: int
    gpus: int
    root: bool
    python: str
    environ: dict = field(default_factory=dict)
    free_port: int = 0                      # a TCP port free on this machine (0: none looked for)


@dataclass(frozen=True)
class Request:
    """What the user asked for (ddlrun's options, parsed)."""
    program: list[str]
    np: int | None = None
    hosts: list[Host] | None = None         # None: this machine alone
    rank_hosts: list[str] | None = None     # a rankfile's placement (rank r on rank_hosts[r])
    mode: str = "p"
    ddloption: str = ""
    no_ddloptions: bool = False
    accelerators: int | None = None         # ranks (GPUs) per host where the host list does not say
    nodes: int | None = None                # IBM's tiers; default: every node in one rack, one aisle
    racks: int | None = None
    aisles: int | None = None
    mpiargs: tuple = ()
    tcp: bool = False
    output_dir: str | None = None
    agent: str | None = None                # the emulated cluster's way in (ssh's place)
    iface: str | None = None
    elastic: bool = False                   # survive lost ranks in place (ULFM), down to min_np
    min_np: int | None = None
    max_np: int | None = None
    job_env: dict = field(default_factory=dict)  # settings ddlrun made: restarts' state folder, horovodrun's flags
    ssh_port: int | None = None


@dataclass(frozen=True)
class Launch:
    """What ddlrun will start: the mpiexec job, each rank's host and IBM's tiers where they fit."""
    job: mpirun.Job
    rank_hosts: list[str]                   # where each rank runs
    dims: tuple[int, ...] | None            # IBM's tiers, where the placement has that shape
    remote: bool                            # some host is not this machine


def placement(req: Request, here: Machine) -> list[str]:
    """The host of every rank."""
    if req.rank_hosts is not None:
        if req.np is not None and req.np != len(req.rank_hosts):
            raise LaunchError(f"the rankfile places {len(req.rank_hosts)} ranks; -np {req.np} disagrees")
        return list(req.rank_hosts)
    if req.hosts is None:
        n = req.np or req.accelerators or here.gpus or here.cores
        return [here.hostname] * n
    default = req.accelerators or here.gpus or 1
    slots = [(h.name, h.slots or default) for h in req.hosts]
    total = sum(k for _, k in slots)
    n = req.np or total
    if n > total:
        listed = ", ".join(f"{h}:{k}" for h, k in slots)
        raise LaunchError(f"-np {n} is more than the {total} slots of the hosts ({listed}); give more hosts or "
                          f"slots (-H host:N, 'host slots=N' in a hostfile)")
    out: list[str] = []
    for name, k in slots:
        out += [name] * min(k, n - len(out))
    return out


def tiers(rank_hosts: list[str], req: Request) -> tuple[int, ...] | None:
    """IBM's four dims for this placement, or None where it has no such shape (uneven or interleaved hosts)
    and the user asked for none. Tiers the user gave that do not fit are an error."""
    runs = mpirun._runs(rank_hosts)
    asked = any(v is not None for v in (req.nodes, req.racks, req.aisles))
    shaped = len({h for h, _ in runs}) == len(runs) and len({k for _, k in runs}) == 1
    if not shaped:
        if asked:
            raise LaunchError("--nodes/--racks/--aisles need the same number of ranks on every host, packed host "
                              f"by host; this placement has {', '.join(f'{h}:{k}' for h, k in runs)}")
        return None
    per_node, nodes = runs[0][1], len(runs)
    aisles, racks = req.aisles or 1, req.racks or 1
    per_rack = req.nodes or nodes // (racks * aisles) or 1
    dims = (per_node, per_rack, racks, aisles)
    if per_node * per_rack * racks * aisles != len(rank_hosts):
        shown = " x ".join(f"{d} {t}" for d, t in zip(dims, TIERS))
        raise LaunchError(f"{shown} = {per_node * per_rack * racks * aisles} ranks, but the job has "
                          f"{len(rank_hosts)} ({nodes} hosts of {per_node})")
    return dims


def ddl_options(req: Request, dims: tuple[int, ...] | None) -> str:
    mode = req.mode
    if dims and ":" not in mode:  # a mode with its own dims is the user's to keep
        mode += ":" + "x".join(map(str, dims))
    return " ".join(x for x in (f"-mode {mode}", req.ddloption.strip()) if x)


def host_list(rank_hosts: list[str]) -> str:
    """IBM's DDL_HOST_LIST: ``host:0,2;host2:1,3`` (hosts in order of their first rank)."""
    ranks: dict[str, list[int]] = {}
    for r, h in enumerate(rank_hosts):
        ranks.setdefault(h, []).append(r)
    return ";".join(f"{h}:{','.join(map(str, rs))}" for h, rs in ranks.items())


def exportable(environ: dict, ours: set = frozenset()) -> list[str]:
    """The user's variables every rank gets, sorted: all that can be exported but the launcher's own."""
    return sorted(n for n in environ if _NAME.fullmatch(n) and n not in ours and n not in NOT_FORWARDED
                  and not n.startswith(NOT_FORWARDED_PREFIXES))


def plan(req: Request, here: Machine) -> Launch:
    if not req.program:
        raise LaunchError("no program given")
    rank_hosts = placement(req, here)
    if not rank_hosts:
        raise LaunchError("-np must be at least 1")
    dims = tiers(rank_hosts, req)
    local = req.hosts is None and req.rank_hosts is None
    settings: dict[str, str] = {}
    if not req.no_ddloptions:
        settings["DDL_OPTIONS"] = ddl_options(req, dims)
        options.parse(settings["DDL_OPTIONS"], environ={})  # a bad mode or option fails here, not on every rank
    settings["DDL_HOST_LIST"] = host_list(rank_hosts)
    if dims and any(v is not None for v in (req.nodes, req.racks, req.aisles)):
        # the same tiers for ddl's discovery, which keeps what it sees inside each node (sockets, GPUs)
        settings.update(DDL_NODES=str(dims[1]), DDL_RACKS=str(dims[2]), DDL_AISLES=str(dims[3]))
    if here.gpus or req.accelerators:
        settings["DDL_BIND_GPU"] = "1"
    if req.output_dir:
        settings["DDL_OUTPUT_DIR"] = req.output_dir
    if req.elastic:
        low = req.min_np or 1
        if low > len(rank_hosts):
            raise LaunchError(f"--min-np {low} is more than the {len(rank_hosts)} ranks launched (-np)")
        if req.max_np is not None and req.max_np < len(rank_hosts):
            raise LaunchError(f"--max-np {req.max_np} is less than the {len(rank_hosts)} ranks launched (-np)")
        settings.update(DDL_ELASTIC="1", DDL_ELASTIC_MIN_NP=str(low))
    settings.update(req.job_env)
    if "MASTER_PORT" not in here.environ and here.free_port and rank_hosts[0] in (here.hostname, *LOCAL_NAMES):
        # torch's TCP store listens on rank 0's host: a port found free there, not a fixed 29500 two jobs share
        settings["MASTER_PORT"] = str(here.free_port)
    ours = set(settings)
    forward = exportable(here.environ, ours)
    job = mpirun.Job([here.python, "-m", "ddl.runner.rankenv", *req.program], len(rank_hosts),
                     None if local else rank_hosts, set_env=settings, forward=tuple(forward), agent=req.agent,
                     iface=req.iface, tcp=req.tcp or req.agent is not None, mpiargs=tuple(req.mpiargs),
                     fault_tolerant=req.elastic, ssh_port=req.ssh_port)
    remote = not local and any(h != here.hostname and h not in LOCAL_NAMES for h in rank_hosts)
    return Launch(job, rank_hosts, dims, remote)
