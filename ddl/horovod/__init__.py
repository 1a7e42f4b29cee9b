"""Horovod's API on ddl: a Horovod script runs on ddl's topology-aware engine with one changed line,

    import ddl.horovod.torch as hvd          # was: import horovod.torch as hvd

This package holds what every framework module shares: initialisation and the rank queries, the reduction ops,
process sets (Horovod's name for teams: independent groups of ranks, each with its own ddl communicator,
planned on its own part of the topology, whose collectives progress at the same time as other sets'), the
error types elastic scripts catch, and the one way an unsupported name fails (``unsupported``: naming it and
what to use instead; nothing is silently ignored).
"""
from __future__ import annotations

import ddl
from ..core.communicator import Communicator
from ..core.join import JOIN_CALL, wait_for_all
from ..errors import DDLError, TransportError

# Horovod's reduction ops, as ddl names them
Average, Sum, Adasum, Min, Max, Product = "avg", "sum", "adasum", "min", "max", "prod"

HorovodInternalError = TransportError  # a collective failed (ddl.RankFailure, a subclass, when a rank died)


class ProcessSet:
    """Ranks of the world that reduce among themselves (``ranks`` None: the world). Made on every rank alike
    (``add_process_set`` or ``init(process_sets=...)``); collectives take it as ``process_set=``."""

    def __init__(self, ranks=None):
        self.ranks = None if ranks is None else sorted(int(r) for r in ranks)
        self.process_set_id: int | None = 0 if ranks is None else None
        self._comm: Communicator | None = None
        self._beside: tuple[Communicator, Communicator] | None = None  # (the set's, its barrier's)

    def included(self) -> bool:
        return self.ranks is None or ddl.rank() in self.ranks

    def size(self) -> int:
        return ddl.size() if self.ranks is None else len(self.ranks)

    def rank(self) -> int:
        """This rank's number in the set (-1 outside it, as Horovod)."""
        if self.ranks is None:
            return ddl.rank()
        return self.ranks.index(ddl.rank()) if ddl.rank() in self.ranks else -1

    def communicator(self) -> Communicator:
        """The ddl communicator of the set; an error on a rank outside it."""
        if self.ranks is None:
            return ddl.communicator()
        if self.process_set_id is None:
            raise DDLError(f"rank {ddl.rank()}: process set {self.ranks} was not added (hvd.add_process_set)")
        if self._comm is None:
            raise DDLError(f"rank {ddl.rank()}: this rank is not in process set {self.process_set_id} "
                           f"(ranks {self.ranks})")
        return self._comm

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet()
_sets: dict[int, ProcessSet] = {0: global_process_set}


def init(comm=None, process_sets=None) -> None:
    """Initialises ddl (``comm``: an mpi4py communicator, or a list of world ranks as Horovod allows), then adds
    ``process_sets`` (a list of ProcessSet or of rank lists) on every rank."""
    if isinstance(comm, (list, tuple)):
        unsupported("hvd.init(comm=[ranks])", "ddl.init(comm=MPI.COMM_WORLD.Create_group(...)) or process sets")
    again = ddl.initialized() and comm is None
    ddl.init(comm)
    if again:
        _meet_again(ddl.communicator())
    for s in process_sets or []:
        add_process_set(s)


_INIT_CALL = "hvd.init()"


def _meet_again(comm) -> None:
    """``hvd.init()`` once initialised (every rank calls it, as a script or Horovod's suite does at each test):
    the ranks meet here before going on. A rank that left a computation early (an error on that rank only)
    then costs the others that computation's calls, which fail on their ranks with MismatchError naming
    ``hvd.init()`` until they reach it, and nothing after: without the meeting, every later call would pair with
    another. A rank in ``join`` is not waited for (it waits for allreduces): the init fails there instead."""
    wait_for_all(comm, _INIT_CALL, lambda calls: bool(calls) and JOIN_CALL not in calls)


def shutdown() -> None:
    for key in [k for k in _sets if k]:
        remove_process_set(_sets[key])
    if global_process_set._beside is not None:
        global_process_set._beside[1].close()
        global_process_set._beside = None
    ddl.finalize()


def is_initialized() -> bool:
    return ddl.initialized()


def rank() -> int:
    return ddl.rank()


def size() -> int:
    return ddl.size()


def local_rank() -> int:
    return ddl.local_rank()


def local_size() -> int:
    return ddl.local_size()


def _hosts() -> list[str]:
    hosts = ddl.communicator().hosts
    return hosts if hosts else ["localhost"] * ddl.size()


def cross_rank() -> int:
    """This rank's number among the ranks of the same local rank: its host's place in host order."""
    hosts = _hosts()
    return list(dict.fromkeys(hosts)).index(hosts[ddl.rank()])


def cross_size() -> int:
    """How many hosts run a rank of this local rank."""
    hosts, mine = _hosts(), ddl.local_rank()
    counts = {h: hosts.count(h) for h in dict.fromkeys(hosts)}
    return sum(1 for n in counts.values() if n > mine)


def is_homogeneous() -> bool:
    hosts = _hosts()
    return len({hosts.count(h) for h in set(hosts)}) == 1


def add_process_set(process_set) -> ProcessSet:
    """Adds a process set on every rank (collective over the world: every rank calls it with the same ranks;
    ranks that disagree all get ddl.MismatchError naming who passed what). Its members get a ddl communicator
    of their own, planned on the world's topology narrowed to them."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    world = ddl.communicator()
    if ps.ranks is None:
        raise DDLError(f"rank {world.rank}: the global process set exists already")
    if any(s.ranks == ps.ranks for s in _sets.values()):
        world.agree(f"add_process_set(ranks={ps.ranks})", f"a process set of ranks {ps.ranks} exists already")
    ps._comm = ddl.new_team(ps.ranks, call="add_process_set")
    ps.process_set_id = max(_sets) + 1
    _sets[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a set added before (every rank calls it); True if it was there."""
    if process_set.process_set_id in (None, 0) or process_set.process_set_id not in _sets:
        return False
    ddl.communicator().agree(f"remove_process_set(id={process_set.process_set_id})")
    _sets.pop(process_set.process_set_id)
    if process_set._beside is not None:
        process_set._beside[1].close()
        process_set._beside = None
    if process_set._comm is not None:
        process_set._comm.close()
        process_set._comm = None
    process_set.process_set_id = None
    return True


def communicator_of(process_set: ProcessSet | None) -> Communicator:
    return (process_set or global_process_set).communicator()


def rooted(process_set: ProcessSet | None, root_rank: int, collective, *args):
    """``collective(root, *args)`` with Horovod's ``root_rank`` (a rank of the world, also for a process set) as
    the set's own rank. A root outside the set is passed on as one past the set's ranks, so every member fails
    alike in ddl's agreement (none waits), and the error names the root as the caller gave it."""
    ps = process_set or global_process_set
    if ps.ranks is None:
        return collective(root_rank, *args)
    inside = root_rank in ps.ranks
    try:
        return collective(ps.ranks.index(root_rank) if inside else len(ps.ranks), *args)
    except DDLError as e:
        if inside:
            raise
        raise type(e)(f"rank {ddl.rank()}: root_rank {root_rank} is not in process set {ps.process_set_id} "
                      f"(ranks {ps.ranks}; Horovod's root_rank is a rank of the world)") from e


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Returns once every rank of the set has reached it. As Horovod's, it does not wait for the asynchronous
    operations in flight (they are matched among themselves, a barrier with barriers): it runs on a second
    communicator of the set's ranks, made at the set's first barrier."""
    comm = communicator_of(process_set)
    made = process_set._beside
    if made is None or made[0] is not comm:  # first barrier, or the set's communicator was replaced (elastic)
        if made is not None:
            made[1].close()
        made = process_set._beside = (comm, comm.group(list(range(comm.size))))
    made[1].barrier()


def allgather_object(obj, name=None, process_set: ProcessSet = global_process_set) -> list:
    """Every rank's ``obj`` (anything pickle writes), in rank order."""
    import pickle

    return [pickle.loads(b) for b in communicator_of(process_set).allgather_bytes(pickle.dumps(obj))]


def unsupported(name: str, instead: str):
    """Raises the error every unsupported Horovod name gives: what it is and what to use instead."""
    raise DDLError(f"{name} is not supported by ddl's Horovod surface; use {instead}")


# what the build-introspection calls of Horovod report for ddl
def mpi_enabled() -> bool:
    return True


def mpi_built() -> bool:
    return True


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def nccl_built() -> int:
    """As Horovod's: the version code of the NCCL library ddl's GPU path finds here (it loads it to see; e.g.
    22703 for 2.27.3, which is true), or 0 when there is none."""
    from ..gpu import libraries
    from ..errors import DeviceError

    try:
        return int(libraries.load_nccl().version)
    except DeviceError:
        return 0


def ccl_built() -> bool:
    """oneCCL: never (ddl's CPU path is its own, over MPI)."""
    return False


def rocm_built() -> bool:
    return False


def ddl_built() -> bool:
    return True


def mpi_threads_supported() -> bool:
    from mpi4py import MPI

    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE
