"""Every DDL_* environment variable, declared once with its default and meaning (mpi4py's rc, NCCL_PARAM).

Read at ddl.init(); DDL_OPTIONS entries (see ddl.options) override these.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import DDLError


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    meaning: str

    def get(self, environ=os.environ) -> str:
        return environ.get(self.name, self.default)


SETTINGS = {
    s.name: s
    for s in (
        Setting("DDL_OPTIONS", "", "IBM DDL option string: -mode, -dump_iter, -dbg_level, -check, ... "
                "(docs/reference/options.md)"),
        Setting("DDL_BOOTSTRAP", "auto", "how a job started without an MPI launcher (torchrun, RANK/WORLD_SIZE/"
                "MASTER_ADDR/MASTER_PORT) forms its world: auto (its processes join one MPI communicator through "
                "the store, MPICH 4 only), mpi (never: each process alone unless an MPI launcher started it)"),
        Setting("DDL_TIMEOUT", "300", "seconds a collective may go without any progress before it fails naming the peer"),
        Setting("DDL_ALGO", "auto", "force allreduce algorithms: one for every level or a comma list per level, innermost "
                "first; each auto, ring, rabenseifner, direct, or (top level only) exchange, recursive_doubling "
                "(alone: the latency plan)"),
        Setting("DDL_SEGMENT_BYTES", "auto", "bytes per pipeline block for large messages (auto: chosen by the planner)"),
        Setting("DDL_INFLIGHT", "auto", "pipeline blocks in flight at once (auto: 2 on one level, one per phase "
                "on several)"),
        Setting("DDL_TOPOLOGY", "", "topology file or library machine name to plan over instead of discovery"),
        Setting("DDL_PLAN", "", "plan file (ddl-topo --dump-plan) that forces the tree, algorithms and blocks"),
        Setting("DDL_NODES", "", "nodes per rack, for discovery (set by ddlrun --nodes)"),
        Setting("DDL_RACKS", "", "racks per aisle, for discovery (set by ddlrun --racks)"),
        Setting("DDL_AISLES", "", "aisles, for discovery (set by ddlrun --aisles)"),
        Setting("DDL_NETWORK", "eth_10g", "link kind between discovered nodes (a name from ddl.topology.links)"),
        Setting("DDL_FUSION_BYTES", str(128 << 20), "bytes per fused buffer when optimizers average many gradients "
                "(ddl.core.fusion); 0: one buffer per dtype"),
        Setting("DDL_NCCL_LEVELS", "auto", "GPU arrays: how many innermost levels of the tree run on NCCL (the rest "
                "over MPI, staged through host memory): auto the cost model's choice, all every level whose groups "
                "are of one size, a number that many innermost (0: every level over MPI)"),
        Setting("DDL_NCCL_LIBRARY", "", "path of libnccl.so to use (default: the nvidia-nccl-cu13/-cu12 wheel, "
                "else the system's libnccl.so.2)"),
        Setting("DDL_CUDA_DRIVER", "libcuda.so.1", "the CUDA driver library ddl opens for GPU arrays"),
        Setting("DDL_PROBE", "auto", "measure the network's switch levels between hosts: auto (when a job spans 3 "
                "or more hosts and no plan, hierarchy, topology or tiers were given), 0 (never), 1 (also on 2 "
                "hosts), force (measure again, ignoring the cache), trust (use a cached result without checking it against "
                "the network first; by default a few short rounds verify it and a stale one is measured again)"),
        Setting("DDL_PROBE_CACHE", "", "folder of probe results kept per set of hosts (default "
                "~/.cache/ddl/probe; 'off': no cache)"),
        Setting("DDL_PROBE_BUDGET", "5", "seconds the probe may spend measuring: past it, the groups its finished stages found stand under one "
                "switch (none finished: hosts alone), and the next job measures again"),
        Setting("DDL_PROBE_RECORD", "", "a file the probe's first leader writes every round it measured to (the "
                "flows asked for and their rates), so its grouping can be replayed (tests/unit/data/probe)"),
        Setting("DDL_PROBE_WINDOW", "16", "the probe pairs each host with at most this many neighbours in host "
                "order per stage (all pairs up to this many hosts)"),
        Setting("DDL_SCHEDULER_TOPOLOGY", "auto", "switch levels from Slurm's `scontrol show topology`: auto (inside "
                "a Slurm job with scontrol), off, or a file holding its output"),
        Setting("DDL_TIMELINE", "", "file to write a Chrome trace to at ddl.finalize() (chrome://tracing, Perfetto): "
                "per rank, one event per call and per level, phase and pipeline block"),
        Setting("DDL_FLIGHT_RECORDER", "", "folder where each rank writes its last collectives (rank<R>.json) when "
                "one fails or passes its deadline, or on SIGUSR1; ddl-trace FOLDER says who was behind and where"),
        Setting("DDL_FLIGHT_RECORDER_RUNS", "64", "native runs (two per collective: agreement and data) each "
                "communicator keeps for the flight recorder; 0 keeps none"),
        Setting("DDL_ELASTIC_MIN_NP", "1", "ddl.elastic: the fewest ranks a job may shrink to and go on in place "
                "(ddlrun --min-np sets it)"),
        Setting("DDL_SHM", "auto", "the host memory level: auto (a communicator whose ranks share one host runs its "
                "collectives through a shared-memory segment; large broadcasts and allgathers read peers' buffers directly "
                "where the kernel allows), slots (the segment only) or 0 (MPI messages only)"),
        Setting("DDL_PATH", "", "force one path of every collective's road (tests and benchmarks): device, alone, "
                "host memory, riding or planned; a call that path cannot take follows the usual order "
                "(ddl.explain names the path each call takes)"),
        Setting("DDL_TRANSPORT", "auto", "how ranks on different hosts talk: auto (ddl's own TCP connections where "
                "a communicator spans several hosts, up to 256 ranks, outside elastic jobs; else MPI), mpi, tcp "
                "(ddl's TCP wherever there are several ranks)"),
        Setting("DDL_TCP_IFACE", "", "the network interface ddl's TCP connections between hosts use (default: any "
                "address a peer has that this rank has not)"),
        Setting("DDL_TCP_UNIX", "1", "ddl's TCP transport connects ranks of one host over a Unix socket (0: "
                "loopback TCP)"),
        Setting("DDL_TCP_SHM", "1", "ddl's TCP transport moves the bytes between ranks of one host through shared "
                "memory, the Unix socket only waking a rank that sleeps (0: through the socket)"),
        Setting("DDL_SMALL_BYTES", "65536", "largest payload carried in the agreement round itself (latency path)"),
        Setting("DDL_REST", "100", "microseconds: while an asynchronous collective (DDP's buckets, a submitted "
                "call nobody waits for yet) of at least 4 MiB waits on MPI over a level "
                "of 2.6 Gbit/s or slower links, its thread sleeps between polls (an eighth of the wait so far, at most this long) instead of spinning, "
                "leaving the cores to the training beside it; 0: always spin. Over ddl's TCP (DDL_TRANSPORT) "
                "waits are event-driven: any such collective blocks until bytes move (at most 1 ms, or this long)"),
    )
}


def get(name: str, environ=os.environ) -> str:
    return SETTINGS[name].get(environ)


def get_whole(name: str, environ=os.environ, floor: int = 0, unit: str = "") -> int:
    """A setting that is a whole number, raised to ``floor``; anything else is an error naming the setting."""
    text = get(name, environ)
    try:
        return max(floor, int(text))
    except ValueError:
        raise DDLError(f"{name}={text!r}: expected a whole number{unit}") from None


# Set by the launchers of Open MPI, MPICH/Hydra, PMIx and Slurm's PMI: the process belongs to an MPI job.
_LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS")


def launched_by_mpi(environ=os.environ) -> bool:
    """Whether this process was started by an MPI launcher (mpirun, mpiexec, srun with PMI)."""
    return any(v in environ for v in _LAUNCHER_VARIABLES)


def version() -> str:
    """ddl's installed version ("0+unknown" for a source tree that was never installed)."""
    from importlib.metadata import PackageNotFoundError, version as installed

    try:
        return installed("ddl")
    except PackageNotFoundError:
        return "0+unknown"
