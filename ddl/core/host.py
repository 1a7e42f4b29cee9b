"""The host memory level: the ranks of one host run their collectives through one shared-memory segment.

Each communicator whose ranks all share a host gets its own segment (POSIX shared memory, so teams and the
communicators of an elastic shrink each have theirs). Rank 0 creates it; once every rank has mapped it, rank 0
unlinks its name, so nothing is left in /dev/shm whatever way the job ends afterwards (a killed rank's mapping
goes with its process). The collectives themselves are native (ddl._native.HostMemory): each step checks
every rank's call hash in the segment, so mismatched calls raise on every rank at no extra round. A small
broadcast that every rank has made before runs ahead (its root does not wait; receivers check the root's hash on
receipt, and a mismatch reaches the other ranks at their next full step: see host_memory.hpp).

Where the kernel lets ranks read each other's memory (process_vm_readv, checked once per segment by every rank),
broadcasts and allgathers from SINGLE_COPY_BYTES copy straight from the writer's buffer: one copy, not two
(DDL_SHM=slots keeps them in the segment's slots).

Python decides what the native level runs: the slot size, single copy and, per call, whether an allreduce reduces in one
phase (every rank reads every rank's data: one wait) or two (each rank reduces a slice, then all copy the
slices: a second wait, a ``size``-th of the reading).
"""
from __future__ import annotations

import os
import socket

from .. import _native

SLOT_BYTES = 1 << 20  # per rank and parity: large calls move in steps of this many bytes per rank
# An allreduce up to this many bytes per rank reduces in one phase: below it the second wait costs more than
# reading every rank's data (measured on 2 to 8 ranks, benchmarks/results/host-memory.md).
ONE_PHASE_BYTES = 16 << 10
# Broadcasts and allgathers of at least this many bytes per rank read the writer's buffer directly, where they
# can: below it one system call per peer costs more than the second copy through a slot.
SINGLE_COPY_BYTES = 32 << 10
_made = 0  # segments this process has asked for: part of the next one's name


def eligible(size: int, hosts: list[str] | None, options) -> bool:
    """Whether a communicator of ``size`` ranks on ``hosts`` (each rank's) gets the host level. Not where a
    flight recorder folder is set: the recorder keeps the executor's runs, and the host level's calls are not
    among them yet (such a job runs over MPI messages, as before)."""
    from ..planner.sources import dims_follow_hosts
    from . import flight

    # ddlrun passes -mode with dims that group the ranks by host (one host: all of them in one group); such
    # dims say what the host level already knows. Dims that group them otherwise are a hierarchy asked for.
    mode = options.mode
    return (size > 1 and options.shm != "0" and hosts is not None and len(set(hosts)) == 1
            and options.algo == "auto" and options.plan is None and not flight.folder()
            and (mode is None or not mode.dims or dims_follow_hosts(mode.dims, hosts)))


class HostLevel:
    """One communicator's segment and the native collectives on it."""

    def __init__(self, native, name: str):
        self.native, self.name = native, name

    @classmethod
    def create(cls, mpi_comm, wanted: bool, slot_bytes: int = SLOT_BYTES,
               single_copy: bool = True) -> "HostLevel | None":
        """Collective over ``mpi_comm``. None on every rank unless every rank ``wanted`` it and mapped the
        segment (the communicator then runs over MPI messages alone); the reason is kept in ``last_refusal``.
        With ``single_copy`` (alike on every rank), large broadcasts and allgathers read peers' buffers directly
        if every rank can."""
        global _made, last_refusal
        from mpi4py import MPI

        if not mpi_comm.allreduce(int(wanted), op=MPI.MIN):
            return None
        rank, size = mpi_comm.rank, mpi_comm.size
        name = None
        if rank == 0:
            _made += 1
            name = f"/ddl-{socket.gethostname()[:40]}-{os.getpid()}-{_made}"
        name = mpi_comm.bcast(name, root=0)
        pids = mpi_comm.allgather(os.getpid())
        native, why = None, ""
        if rank == 0:
            native, why = _open(name, True, rank, size, slot_bytes, pids)
        made = mpi_comm.bcast(native is not None, root=0)
        if made and rank != 0:
            native, why = _open(name, False, rank, size, slot_bytes, pids)
        everyone = mpi_comm.allreduce(int(native is not None)) == size
        if rank == 0 and made:
            _native.HostMemory.unlink(name)  # every rank has it mapped (or gave up): the name goes now
        if not everyone:
            last_refusal = why or "another rank could not map the host memory segment"
            return None
        _single_copy_if_possible(mpi_comm, native, single_copy)
        return cls(native, name)

    def close(self) -> None:
        self.native = None  # unmaps


last_refusal = ""


def _single_copy_if_possible(mpi_comm, native, wanted: bool) -> None:
    """Collective: every rank reads its successor's probe word; single copy goes on only where every rank wanted
    it and could (a container's seccomp profile or Yama's ptrace scope may forbid it)."""
    from mpi4py import MPI

    addresses = mpi_comm.allgather(native.probe_address)
    peer = (mpi_comm.rank + 1) % mpi_comm.size
    able = wanted and native.can_read(peer, addresses[peer])
    if mpi_comm.allreduce(int(able), op=MPI.MIN):
        native.single_copy_bytes = SINGLE_COPY_BYTES


def _open(name, create, rank, size, slot_bytes, pids):
    try:
        return _native.HostMemory(name, create, rank, size, slot_bytes, pids, list(range(size))), ""
    except (RuntimeError, ValueError) as e:
        return None, f"rank {rank}: {e}"
