"""How the members of a device path hand each other NCCL's unique ids: over the communicator's MPI (a broadcast
from rank 0, an allgather), or, for jobs torchrun started without MPI, through torch's store."""
from __future__ import annotations


class MpiExchange:
    def __init__(self, mpi_comm):
        self.mpi = mpi_comm

    def broadcast(self, value):
        """Rank 0's value on every rank."""
        return value if self.mpi is None else self.mpi.bcast(value, root=0)

    def allgather(self, value) -> list:
        """Every rank's value, in rank order."""
        return [value] if self.mpi is None else self.mpi.allgather(value)
