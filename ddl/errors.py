"""ddl's two kinds of failure (after gloo): usage errors and transport errors."""


class DDLError(RuntimeError):
    """Something was wrong with a call: bad input, arguments that differ across ranks, a bad option or plan.
    A RuntimeError, as torch.distributed's and Horovod's collective errors are (code written for them catches
    these)."""


class MismatchError(DDLError):
    """Ranks called the same collective with different shapes, dtypes, ops or roots (raised on every rank; after a
    small broadcast that ran ahead on one host, by the others at their next collective that waits for every rank;
    after a broadcast checked on receipt across hosts, by a rank that had finished it in the call it is in by then
    or at its next).
    ``calls``: what each rank called, in rank order (the same list on every rank), when the ranks exchanged it."""

    def __init__(self, message: str, calls=None):
        super().__init__(message)
        self.calls = list(calls) if calls is not None else None


class TransportError(DDLError):
    """A peer died or a deadline passed. The communicator is unusable: ddl.finalize() and ddl.init() again."""


class RankFailure(TransportError):
    """Ranks died (a crash, a kill, a lost host), seen through MPI's fault tolerance (ULFM: Open MPI launched
    with ``--with-ft ulfm``, which ``ddlrun --elastic`` does). ``ranks``: the failed ranks of the communicator,
    as far as this rank knows them. The communicator is unusable; ddl.elastic recovers on the survivors."""

    def __init__(self, message: str, ranks=()):
        super().__init__(message)
        self.ranks = sorted(set(int(r) for r in ranks))


class ArgumentError(DDLError, ValueError):
    """A call's own arguments cannot work (sizes or splits that do not add up), seen on every rank."""


class TopologyError(DDLError, ValueError):
    """A topology file, graph or placement that is malformed or contradicts what MPI sees."""


class DeviceError(DDLError):
    """The GPU path cannot run here: no CUDA driver or NCCL library, or a CUDA or NCCL call failed (the
    message names the library or call). After a failed NCCL call the group is aborted: ddl.finalize()."""
