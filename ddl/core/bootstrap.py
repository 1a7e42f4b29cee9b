"""The world without an MPI launcher: processes started alone (by torchrun, a Kubernetes operator, or by hand
with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT) join one MPI communicator through a key-value store.

MPICH 4 singletons can connect to each other through a port (MPI_Open_port, MPI_Comm_accept/_connect): rank 0
opens one and publishes its name in the store; the others join one at a time in rank order (each accept is
collective over those already joined, each merge appends the newcomer last), so the merged communicator's
ranks are the launcher's. From there ddl is the same as under mpirun: MPI messages, the host memory level, the
probe, plans and deadlines. Open MPI 5 singletons cannot connect (no runtime joins them), nor can MPICH
5.0.0-5.0.2's (every singleton is named alike, pmodels/mpich#7805): both are refused with one line.

The store is the one torch hands the backend (dist.init_process_group), torchrun's agent store (workers
connect to it as clients), or, with the variables set by hand, a torch TCPStore that rank 0 hosts at
MASTER_ADDR:MASTER_PORT (torch's own init_process_group then connects to it).
"""
from __future__ import annotations

import os
import sys
import threading
from datetime import timedelta

from ..config import SETTINGS, launched_by_mpi
from ..errors import DDLError

VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_hosted = None  # the store rank 0 hosts when nobody else does: kept open for the job's life
joined_through = None  # "store" once this process's world was formed here (ddl.explain says so)


def environment(environ=os.environ) -> tuple[int, int] | None:
    """(rank, size) when the environment says this process is one of several started without an MPI launcher;
    None when an MPI launcher started it, a variable is missing, or the job has one process."""
    if launched_by_mpi(environ) or SETTINGS["DDL_BOOTSTRAP"].get(environ) == "mpi":
        return None
    if not all(environ.get(v) for v in VARIABLES):
        return None
    try:
        rank, size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
    except ValueError:
        raise DDLError(f"RANK={environ['RANK']!r} and WORLD_SIZE={environ['WORLD_SIZE']!r} must be integers") from None
    if not 0 <= rank < size:
        raise DDLError(f"RANK={rank} is outside 0..WORLD_SIZE-1 ({size})")
    return (rank, size) if size > 1 else None


def mpi_library() -> str:
    """This MPI in a few words: "MPICH 4.3.2", "Open MPI v5.0.11"."""
    from mpi4py import MPI

    first = (MPI.Get_library_version().splitlines() or ["unknown MPI"])[0].split(",")[0]
    return " ".join(first.replace("Version:", "").split())


def can_join() -> bool:
    """Whether this MPI's separately started processes can connect (MPICH 4; not Open MPI, not MPICH 5.0.0-5.0.2)."""
    return mpi_library().startswith("MPICH 4.")


def refusal(rank: int, what: str = "ddl", instead: str = "launch with ddlrun (or mpirun) instead",
            library: str | None = None) -> str:
    """The one line that refuses ``what`` without an MPI launcher on an MPI that cannot join its processes."""
    return (f"rank {rank}: {what} without an MPI launcher (torchrun, RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) "
            f"needs MPICH 4 (make MPI=mpich setup, or pip install 'mpich<5' before mpi4py and ddl); this ddl runs "
            f"on {library or mpi_library()}, whose separately started processes cannot connect: {instead}")


def check_mpi(rank: int) -> None:
    """Refuses, in one line, an MPI whose singletons cannot connect to each other."""
    if not can_join():
        raise DDLError(refusal(rank))


def open_store(rank: int, size: int, timeout: float, environ=os.environ):
    """The job's store from the environment: torchrun's agent store as a client, else one rank 0 hosts."""
    global _hosted
    try:
        import torch.distributed as dist
    except ImportError:
        raise DDLError(f"rank {rank}: without an MPI launcher ddl meets its peers through torch's TCPStore at "
                       f"MASTER_ADDR:MASTER_PORT; install torch, or launch with ddlrun (or mpirun)") from None
    host, port = environ["MASTER_ADDR"], int(environ["MASTER_PORT"])
    agent = environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    try:
        store = dist.TCPStore(host, port, size, is_master=rank == 0 and not agent,
                              timeout=timedelta(seconds=timeout), wait_for_workers=False)
    except Exception as e:  # torch raises RuntimeError or DistStoreError naming the address
        raise DDLError(f"rank {rank}: cannot reach the store at {host}:{port} within {timeout:g} s ({e})") from None
    if rank == 0 and not agent:
        _hosted = store
        # torch's own init_process_group (env://) would try to host a second store on the same port: it
        # connects to this one instead, as torchrun's workers do to the agent's.
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    return store


def join(store, rank: int, size: int, timeout: float, prefix: str | None = None):
    """Every process of the job calls this: an MPI intracommunicator of ``size`` ranks, this one ``rank``.
    Each wait has ``timeout`` seconds: a process that never comes is named, and this one exits (an MPI accept
    cannot be interrupted, so the deadline ends the process rather than leave it waiting forever)."""
    global joined_through
    check_mpi(rank)
    from mpi4py import MPI

    if prefix is None:  # torchrun's restarts reuse its store: each attempt keeps its own keys
        prefix = f"ddl/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    store.set_timeout(timedelta(seconds=timeout))
    watchdog = _Watchdog(rank, size, timeout)
    try:
        if rank == 0:
            port = MPI.Open_port()
            store.set(prefix + "port", port)
            comm = MPI.COMM_SELF
        else:
            watchdog.waiting_for(f"its turn to join (ranks 0..{rank - 1} joined before it)")
            _wait(store, prefix + f"turn/{rank}", rank, timeout)
            port = store.get(prefix + "port").decode()
            inter = MPI.COMM_SELF.Connect(port, root=0)
            comm = _merge(inter, high=True)
        for newcomer in range(rank + 1, size):
            watchdog.waiting_for(f"rank {newcomer} to join")
            if comm.rank == 0:
                store.set(prefix + f"turn/{newcomer}", "1")
            inter = comm.Accept(port, root=0)
            previous, comm = comm, _merge(inter, high=False)
            if previous != MPI.COMM_SELF:
                previous.Free()
        if rank == 0:
            MPI.Close_port(port)
    finally:
        watchdog.cancel()
    if comm.size != size or comm.rank != rank:
        raise DDLError(f"rank {rank}: joining through the store gave rank {comm.rank} of {comm.size}, expected "
                       f"{rank} of {size} (was the store shared with another job?)")
    joined_through = "store"
    return comm


def world(timeout: float):
    """The world communicator for a process the environment says is one of several (``environment()``)."""
    rank, size = environment()
    return join(open_store(rank, size, timeout), rank, size, timeout)


def _merge(inter, high: bool):
    merged = inter.Merge(high=high)
    inter.Free()
    return merged


def _wait(store, key: str, rank: int, timeout: float) -> None:
    try:
        store.wait([key])
    except Exception:  # torch's DistStoreError on a timeout, RuntimeError on a lost store
        raise DDLError(f"rank {rank}: waited {timeout:g} s in the store for {key!r}: the ranks before it did not "
                       f"all arrive (a process that did not start or died)") from None


class _Watchdog:
    """Ends this process, naming what it waited for, when the join takes longer than the deadline."""

    def __init__(self, rank: int, size: int, timeout: float):
        self.rank, self.size, self.what = rank, size, "the join"
        self.timer = threading.Timer(timeout, self._expire, args=(timeout,))
        self.timer.daemon = True
        self.timer.start()

    def waiting_for(self, what: str) -> None:
        self.what = what

    def _expire(self, timeout: float) -> None:
        sys.stderr.write(f"ddl: rank {self.rank}: forming the world of {self.size} without an MPI launcher took "
                         f"over {timeout:g} s, waiting for {self.what}; exiting\n")
        sys.stderr.flush()
        os._exit(1)

    def cancel(self) -> None:
        self.timer.cancel()
