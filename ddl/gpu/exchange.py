"""How the members of a device path hand each other NCCL's unique ids: over the communicator's MPI (a broadcast
from rank 0, an allgather), or, for jobs torchrun started without MPI, through torch's store."""
from __future__ import annotations

import pickle
from datetime import timedelta

from ..errors import DDLError


class MpiExchange:
    def __init__(self, mpi_comm):
        self.mpi = mpi_comm

    def broadcast(self, value):
        """Rank 0's value on every rank."""
        return value if self.mpi is None else self.mpi.bcast(value, root=0)

    def allgather(self, value) -> list:
        """Every rank's value, in rank order."""
        return [value] if self.mpi is None else self.mpi.allgather(value)


class StoreExchange:
    """The same through a torch store (torchrun's, or the one torch.distributed hands a process group): every
    round writes one key per rank under its own number, waits for every rank's with the deadline, and removes
    this rank's key of two rounds before (every rank has read it: each has finished the round after it)."""

    def __init__(self, store, rank: int, size: int, timeout: float, prefix: str = "ddl/device/"):
        self.store, self.rank, self.size, self.timeout, self.prefix = store, rank, size, timeout, prefix
        self.round = 0

    def _key(self, n: int, rank: int) -> str:
        return f"{self.prefix}{n}/{rank}"

    def allgather(self, value) -> list:
        n, self.round = self.round, self.round + 1
        self.store.set(self._key(n, self.rank), pickle.dumps(value))
        readers = list(range(self.size))
        keys = [self._key(n, r) for r in readers]
        try:
            self.store.wait(keys, timedelta(seconds=self.timeout))
        except Exception:  # torch's DistStoreError on a timeout, RuntimeError on a lost store
            missing = [r for r, k in zip(readers, keys) if not self._has(k)]
            raise DDLError(f"rank {self.rank}: waited {self.timeout:g} s in the store for rank(s) {missing} "
                           f"(DDL_TIMEOUT): they did not reach the same call (a process that died, or that "
                           f"called something else)") from None
        got = [pickle.loads(self.store.get(k)) for k in keys]
        if n >= 2:
            self._drop(self._key(n - 2, self.rank))
        return got

    def _has(self, key: str) -> bool:
        try:
            return bool(self.store.check([key]))
        except Exception:
            return False

    def _drop(self, key: str) -> None:
        try:
            self.store.delete_key(key)
        except Exception:  # (a store without deletion keeps it: a few bytes a call)
            pass

    def broadcast(self, value):
        """(an allgather: every round waits for every rank, which is what makes removing old keys safe)"""
        return self.allgather(value)[0]
