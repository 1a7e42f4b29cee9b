"""ddl: topology-aware allreduce for data-parallel training, after IBM's Distributed Deep Learning library.

    import ddl
    grads = ddl.allreduce(grads, op="avg")

The first call initialises ddl on MPI's world communicator when the process was started by mpiexec/mpirun
(or on ``ddl.init(comm=...)``'s communicator); started plainly, ddl runs alone with size 1 and MPI is never
initialised. Collectives must be called in the same order on every rank, as in MPI; ranks whose arguments
differ all raise MismatchError. Importing ddl never imports TensorFlow, Keras or PyTorch.
"""
from __future__ import annotations

from numbers import Integral

try:
    from . import _native  # noqa: F401 (the compiled executor; every part of ddl needs it)
except ImportError as _missing:
    from ._source_tree import unbuilt_message

    raise ImportError(unbuilt_message(__path__[0], _missing)) from None
from . import _moved
from . import gpu as _gpu  # noqa: F401 (registers the device collectives with ddl.core.devices)
from . import options as _options
from . import config as _config
from .config import launched_by_mpi as _launched_by_mpi
from .core import bootstrap as _bootstrap
from .core.asynchronous import Handle
from .core.communicator import Communicator
from .errors import ArgumentError, DDLError, DeviceError, MismatchError, RankFailure, TopologyError, TransportError

_moved.install()

__all__ = [
    "init", "finalize", "initialized", "communicator", "new_team", "rank", "size", "local_rank", "local_size",
    "num_hosts",
    "allreduce", "allreduce_n", "grads_reduce", "broadcast", "bcast", "allgather", "reduce_scatter", "alltoall",
    "barrier", "join",
    "explain",
    "allreduce_async", "broadcast_async", "allgather_async", "synchronize", "poll", "Handle",
    "ArgumentError", "DDLError", "DeviceError", "MismatchError", "RankFailure", "TopologyError", "TransportError", "Communicator",
    "__version__",
    "DDLCallback", "DDLGlobalVariablesCallback",
]

__version__ = _config.version()

_world: Communicator | None = None

def init(comm=None, options: str | None = None, hierarchy=None, topology=None) -> Communicator:
    """Initialises ddl (idempotent). ``comm``: an mpi4py communicator (default: MPI.COMM_WORLD when launched
    by MPI). ``options``: IBM DDL's option string (default: $DDL_OPTIONS), e.g. ``"-mode r -check 1e-5"``.
    ``topology``: a topology file, library machine name, dict or ddl.topology.Topology to plan over
    (default: $DDL_TOPOLOGY, else discovery: hosts from MPI, NUMA, GPUs from NVML, racks from ddlrun).
    ``hierarchy``: the tree directly, as nested lists of ranks innermost group deepest (ddl.topology.tree).
    Calling it again with other arguments after ddl is initialised is an error: finalize() first."""
    global _world
    if isinstance(comm, str):  # IBM's ddl.init(options)
        comm, options = None, comm if options is None else options
    if _world is not None:
        if comm is None and options is None and hierarchy is None and topology is None:
            return _world
        raise DDLError("ddl is already initialised (perhaps implicitly by an earlier call); call "
                       "ddl.finalize() before ddl.init() with other arguments")
    opts = _options.parse(options)
    if comm is None and _launched_by_mpi():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    elif comm is None and _bootstrap.environment() is not None:  # torchrun, an operator, or variables by hand
        comm = _bootstrap.world(opts.timeout)
    _world = (Communicator.from_mpi(comm, opts, hierarchy, topology) if comm is not None
              else Communicator(None, 0, 1, opts, hierarchy=hierarchy, topology=topology))
    if opts.timeline:  # the trace is written at finalize(); a script that never calls it still gets one
        import atexit

        atexit.register(finalize)
    return _world


def initialized() -> bool:
    return _world is not None


def finalize() -> None:
    """Releases ddl's communicator (MPI itself is finalised by mpi4py at exit). ddl.init() may follow."""
    global _world
    if _world is not None:
        _world.close()
        _world = None


def _replace_world(comm: Communicator) -> None:
    """ddl.elastic's recovery: the survivors' communicator becomes the world (the old one is closed)."""
    global _world
    _world = comm


def communicator() -> Communicator:
    """The communicator behind the module-level functions (initialising ddl if needed)."""
    return _world if _world is not None else init()


def new_team(ranks, *, call: str = "new_team") -> Communicator | None:
    """A team: its own communicator for ``ranks`` (ranks of the world), planned on the world's topology narrowed
    to them, whose collectives run beside other teams' (each team its own worker thread and transport), as the
    Cray PE ML plugin's teams and Horovod's process sets. Collective over the world: every rank calls it with
    the same ranks (ranks that disagree all get MismatchError, naming who passed what); members get the
    team's communicator, the others None. ``call``: what errors name (ddl.horovod's add_process_set)."""
    world = communicator()
    ranks = [int(r) if isinstance(r, Integral) else r for r in ranks]  # numpy's integers too
    problem = None
    if not all(isinstance(r, int) for r in ranks):  # said in the agreement round: no rank is left waiting
        problem = f"{call}: ranks {ranks}: whole numbers expected"
    elif not ranks or len(set(ranks)) != len(ranks) or not all(0 <= r < world.size for r in ranks):
        problem = f"{call}: ranks {ranks}: distinct ranks of 0..{world.size - 1} expected"
    world.agree(f"{call}(ranks={ranks})", problem)
    return world.group(ranks) if world.rank in ranks else None


def rank() -> int:
    return communicator().rank


def size() -> int:
    return communicator().size


def local_rank() -> int:
    """Rank among the processes of this host (shared-memory domain)."""
    return communicator().local_rank


def local_size() -> int:
    return communicator().local_size


def num_hosts() -> int:
    return communicator().num_hosts


def allreduce(array, op: str = "sum", out=None):
    """Reduces ``array`` across ranks with op 'sum', 'avg', 'prod', 'min' or 'max'. Returns a new array of
    the same shape and dtype, or writes ``out`` (which may be ``array`` itself, for in place). Non-contiguous
    input is copied first. dtypes: float16, bfloat16 (ml_dtypes), float32, float64, int32, int64; 'avg' is
    for floating types only. GPU arrays (cupy, torch CUDA tensors, __cuda_array_interface__) stay on their
    device, ordered after the caller's current stream (see ddl.gpu)."""
    return communicator().allreduce(array, op, out)


def allreduce_n(arrays, op: str = "sum", average: bool | None = None):
    """Reduces many arrays in one fused allreduce per dtype; returns the reduced arrays in order. IBM's
    ``allreduce_n(grads, average=True)`` is ``op="avg"``."""
    return communicator().allreduce_n(arrays, op, average)


def grads_reduce(grads_and_vars, average: bool = True):
    """IBM's ``grads_reduce``: the gradients of (gradient, variable) pairs averaged (or summed) in one fused
    allreduce per dtype; returns the pairs with the reduced gradients (None gradients pass through)."""
    pairs = list(grads_and_vars)
    present = [i for i, (g, _) in enumerate(pairs) if g is not None]
    reduced = allreduce_n([pairs[i][0] for i in present], "avg" if average else "sum")
    out = list(pairs)
    for i, g in zip(present, reduced):
        out[i] = (g, pairs[i][1])
    return out


def allreduce_async(array, op: str = "sum", out=None) -> Handle:
    """allreduce without blocking: returns a Handle (``wait()``, ``done()``, ``result``) at once; the
    collective runs on ddl's worker thread, after those submitted before (every rank must submit in the same
    order; a rank that differs gets MismatchError, no hang). Leave ``array`` and ``out`` alone until done.
    Host arrays only."""
    return communicator().allreduce_async(array, op, out)


def broadcast_async(array, root: int = 0) -> Handle:
    return communicator().broadcast_async(array, root)


def allgather_async(array) -> Handle:
    return communicator().allgather_async(array)


def synchronize(handle: Handle, timeout: float | None = None):
    """Waits for a submitted collective and returns its result (Horovod's name); raises its error."""
    return handle.wait(timeout)


def poll(handle: Handle) -> bool:
    """Whether a submitted collective has finished (never blocks)."""
    return handle.done()


def broadcast(array, root: int = 0, out=None):
    """Returns root's ``array`` on every rank (or writes it to ``out``, which may be ``array`` itself)."""
    return communicator().broadcast(array, root, out)


bcast = broadcast


def allgather(array, out=None):
    """Concatenates every rank's ``array`` along the first axis, in rank order (first dims may differ); into
    ``out`` when given (in place when this rank's rows of ``out`` are ``array``)."""
    return communicator().allgather(array, out)


def reduce_scatter(array, op: str = "sum", out=None, counts=None):
    """Reduces ``array`` (the same shape on every rank) with ``op`` as allreduce does and returns this rank's
    part of the result along the first axis (``counts[r]`` rows for rank r, or parts as numpy.array_split
    makes them), or writes it to ``out``."""
    return communicator().reduce_scatter(array, op, out, counts)


def alltoall(array, send_rows=None, recv_rows=None):
    """Rows ``send_rows[j]`` of ``array`` (in order; default equal parts) go to rank j; returns what every rank
    sent here, concatenated in rank order (a pairwise exchange: only the destination's rows travel)."""
    return communicator().alltoall(array, send_rows, recv_rows)


def join() -> None:
    """This rank has no more data (uneven inputs): until every rank has called join, it takes part in the
    others' allreduces with zeros (an 'avg' still divides by every rank); any other collective of theirs
    meanwhile fails on their ranks with MismatchError naming join. Returns once all ranks have joined."""
    communicator().join()


def barrier() -> None:
    communicator().barrier()


def explain(nbytes: int, collective: str = "allreduce"):
    """What an allreduce of ``nbytes`` bytes would do: levels, groups, algorithms, bytes per link, predicted
    time against the topology's lower bound, and the path a call of ``collective`` moving that many bytes takes
    and why (``.path``). ``print(ddl.explain(64 << 20))``; ``.to_dict()`` for JSON."""
    return communicator().explain(nbytes, collective)


def __getattr__(name: str):
    """IBM's Keras callbacks as ``ddl.DDLCallback``: ddl.keras (and keras) is imported only when one is used."""
    if name in ("DDLCallback", "DDLGlobalVariablesCallback"):
        from . import keras as _keras

        return getattr(_keras, name)
    moved = _moved.attribute(name)
    if moved is not None:
        return moved
    raise AttributeError(f"module 'ddl' has no attribute {name!r}")
