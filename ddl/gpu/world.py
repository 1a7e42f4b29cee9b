"""A world for GPU jobs started without an MPI launcher on an MPI whose separate processes cannot join one
communicator (Open MPI; ddl.core.bootstrap): torchrun, or RANK/WORLD_SIZE/MASTER_ADDR set by hand, with
``dist.init_process_group("ddl")``. Collectives on GPU arrays run ddl's per-level plan with NCCL at every level
(its groups made from ids handed round through torch's store), and each call's agreement round goes through the
store too (every rank's call hash, problem and payload: a mismatched or invalid call raises on every rank,
none waits past the deadline). Nothing here needs MPI. Host arrays need a world of MPI ranks: they are refused
on every rank, in one line naming the fix.

The tree comes from the hosts the ranks report: a node level of the GPUs of each host and one level across
hosts when every host holds as many ranks, else one flat group (NCCL alone). Levels are priced from the nominal
link table (no probe runs without MPI); DDL_NCCL_LEVELS does not apply (there is no MPI to stage over).
"""
from __future__ import annotations

import os
import socket
import threading

import numpy as np

from .. import options as ddl_options
from ..core.agreement import hash64
from ..core.bootstrap import refusal
from ..core.calls import Calls
from ..errors import DDLError, MismatchError
from ..topology.costs import default_level
from .exchange import StoreExchange

NODE_LINK, NETWORK_LINK = "pcie4", "eth_100g"  # nominal: no probe runs without MPI


def host_refusal(rank: int, library: str) -> str:
    return refusal(rank, "collectives on host (CPU) arrays", "only GPU arrays run here: move the tensors to the "
                   "GPU, or launch with ddlrun (or mpirun) instead", library)


def hosts_tree(hosts: list[str]):
    """The ranks grouped by host (in order of each host's first rank) when every host holds as many, else one
    flat group."""
    by_host: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        by_host.setdefault(h, []).append(r)
    groups = list(by_host.values())
    if len(groups) == 1 or len({len(g) for g in groups}) != 1:
        return list(range(len(hosts)))
    return groups


class DeviceWorld:
    """A communicator of GPU ranks over torch's store and NCCL, without MPI (see the module's docstring). It has
    what ddl.gpu's device collectives use of a communicator (rank, size, tree, levels, options, lock, agree)
    and the collectives ddl.torch's process group calls."""

    mpi_comm = None

    def __init__(self, store, rank: int, size: int, options=None, library: str = "this MPI"):
        from .collectives import DeviceCollectives

        self.rank, self.size = rank, size
        self.options = options or ddl_options.parse()
        self.lock = threading.RLock()
        # (torchrun's restarts reuse its store: each attempt keeps its own keys)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.exchange = StoreExchange(store, rank, size, self.options.timeout, f"ddl/device/{attempt}/")
        self.hosts = self.exchange.allgather(socket.gethostname())
        self.tree = hosts_tree(self.hosts)
        nested = isinstance(self.tree[0], list)
        self.levels = [default_level("node", NODE_LINK)] + ([default_level("hosts", NETWORK_LINK)] if nested else [])
        self._library = library
        self._calls = Calls(rank, size, self, self.options.timeout, False, False)
        self._device = DeviceCollectives(self, levels="all")

    # -- what the device path and the calls use ---------------------------------------------------------------

    @staticmethod
    def hash(text: str) -> int:
        return hash64(text)

    def agree(self, call: str, problem: str | None = None, work: np.ndarray | None = None, dtype=None,
              op=None) -> None:
        """Every rank's (hash, problem, payload) through the store: a problem anywhere raises everywhere, naming
        the rank; calls that differ raise MismatchError naming each rank's; ``work`` becomes the sum of every
        rank's (the one reduction the device path's rounds use)."""
        entries = self.exchange.allgather((hash64(call), call, problem, None if work is None else work.copy()))
        if problem:
            raise DDLError(problem if problem.startswith(f"rank {self.rank}") else f"rank {self.rank}: {problem}")
        bad = [(r, p) for r, (_, _, p, _) in enumerate(entries) if p]
        if bad:
            r, p = bad[0]
            raise DDLError(f"rank {self.rank}: {call}: rank {r} could not take part: {p}")
        calls = [text for _, text, _, _ in entries]
        if len({h for h, _, _, _ in entries}) != 1:
            detail = "; ".join(f"rank {r}: {text}" for r, text in enumerate(calls))
            raise MismatchError(f"rank {self.rank}: ranks called ddl differently: {detail}", calls)
        if work is not None:
            work[...] = np.sum([payload for *_, payload in entries], axis=0)

    # -- the collectives --------------------------------------------------------------------------------------

    def _run(self, call):
        if not call.device:  # every rank learns of it in the round, whatever it called
            self.agree(call.text, host_refusal(self.rank, self._library))
        return self._device.run(call)

    def allreduce(self, array, op: str = "sum", out=None):
        return self._run(self._calls.allreduce(array, op, out))

    def broadcast(self, array, root: int = 0, out=None):
        return self._run(self._calls.broadcast(array, root, out))

    def allgather(self, array, out=None):
        return self._run(self._calls.allgather(array, out))

    def reduce_scatter(self, array, op: str = "sum", out=None, counts=None):
        return self._run(self._calls.reduce_scatter(array, op, out, counts))

    def allreduce_n(self, arrays, op: str = "sum", average=None):
        return self._device.allreduce_n(arrays, "avg" if average else op)

    def barrier(self) -> None:
        with self.lock:
            self.agree("barrier()")

    def broadcast_bytes(self, data: bytes | None, root: int = 0) -> bytes:
        return self.exchange.allgather(data if self.rank == root else None)[root]

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        return self.exchange.allgather(bytes(data))

    def alltoall(self, array, send_rows=None, recv_rows=None):
        self.agree("alltoall()", host_refusal(self.rank, self._library))

    def submit(self, what: str, job) -> None:
        """(ddl.torch's process group hands host-tensor work here: it runs at once, and is refused inside)"""
        job()

    def close(self) -> None:
        self._device.close()

    def __repr__(self) -> str:
        return f"DeviceWorld(rank {self.rank} of {self.size}, tree {self.tree}, over torch's store and NCCL)"

