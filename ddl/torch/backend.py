"""The ``"ddl"`` backend of torch.distributed: ``import ddl.torch`` registers it, then

    dist.init_process_group("ddl")          # under ddlrun (or mpirun): RANK, WORLD_SIZE, MASTER_ADDR are set
    model = torch.nn.parallel.DistributedDataParallel(model)
    # or sharded: fully_shard(layer, mesh=ddl.torch.device_mesh())  (FSDP2; HSDP from the topology)

runs DDP's bucket allreduces, FSDP2's allgathers and reduce-scatters, DTensor's redistributions,
torch.distributed.checkpoint's object collectives and the other torch.distributed collectives on ddl's planned,
topology-aware collectives, asynchronously: each call is submitted to the communicator's worker thread
(ddl.core.asynchronous) and returns a Work whose future completes when the collective has (and whose wait()
raises the collective's error). Every rank submits in the same order (DDP's fixed bucket order, FSDP's layer
order); a rank that does not gets MismatchError through its Work.

Ranks are MPI's: torch's rank must be the MPI rank (ddlrun sets RANK from it). Started without an MPI launcher
(torchrun) the processes join one MPI communicator through torch's store on MPICH 4; on an MPI that cannot join
them (Open MPI) the group is a world of GPU ranks over the store alone (ddl.gpu.world: CUDA tensors on NCCL at
every level, host tensors refused in one line). ``dist.new_group(ranks)`` (and
every group of a DeviceMesh) gets a communicator of its own over those ranks (MPI_Comm_create_group), planned
for its own hosts. The group keeps the name torch gives it (DeviceMesh and FSDP2 find groups by name).
reduce_scatter_tensor and all_gather_into_tensor (and their coalesced and list forms, uneven sizes included)
run ddl's reduce-scatter and allgather, planned per level; all_to_all_single is ddl's pairwise exchange;
gather and scatter ride on allgather and broadcast (more traffic than a direct exchange: they serve
checkpoints, not every step); reduce is an allreduce. Ops sum, avg, product, min, max; dtypes float16,
bfloat16, float32, float64, int32, int64 (broadcast and allgather: any). CUDA tensors take ddl's GPU path
(ddl.gpu: every collective per level, NCCL at the levels its cost model picks, MPI staged above) on the
caller's thread, queued after the caller's current stream (which waits for it): with every level on NCCL the
call returns once NCCL's kernels are queued. Their Work's wait() makes the current stream wait for the collective's event, as NCCL's does. Not
provided: send/recv (pipeline parallelism) and PREMUL_SUM (FSDP's set_gradient_divide_factor); they raise an
error naming them. Tested with torch 2.13 (CUDA:
tests/gpu, run only where there is a GPU).
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

import ddl
from ddl import options as ddl_options
from ddl.config import launched_by_mpi
from ddl.core import bootstrap
from ddl.errors import DDLError

from . import (_copy_into, _host_view, allgather, allgather_into, allreduce_, broadcast_,  # ddl.torch imports
               reduce_scatter_into)  # this module after defining them

NAME = "ddl"
_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.PRODUCT: "prod",
        dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max"}


def _op(opts) -> str:
    op = opts.reduceOp
    for known, name in _OPS.items():
        if op == known:
            return name
    raise DDLError(f"the ddl backend does not support reduce op {op} (supported: sum, avg, product, min, max)")


def _check(tensors, call: str) -> None:
    for t in tensors:
        if t.is_sparse or t.layout != torch.strided:
            raise DDLError(f"the ddl backend's {call} takes dense tensors, not {t.layout} (densify it, or "
                           f"reduce its indices and values separately)")
        if t.device.type not in ("cpu", "cuda"):
            raise DDLError(f"the ddl backend's {call} takes CPU or CUDA tensors; got one on {t.device}")


class _Work(dist.Work):
    """A collective's Work over a future: ``wait`` raises the collective's error (torch's future-wrapping Work
    returns True even when the future failed, so a synchronous call would return as if it had worked). A CUDA
    collective's Work holds an event recorded after ddl's work on the caller's stream: ``wait`` makes the
    current stream wait for it, as NCCL's Work does, whichever stream waits."""

    def __init__(self, future: torch.futures.Future, event=None, handle=None):
        super().__init__()
        self._future, self._event, self._handle = future, event, handle

    def wait(self, timeout=None) -> bool:  # (the collective has its own deadline: ddl's timeout)
        with self._handle.waiting() if self._handle is not None else contextlib.nullcontext():
            self._future.wait()
        if self._event is not None:
            torch.cuda.current_stream().wait_event(self._event)
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()


class ProcessGroupDDL(dist.ProcessGroup):
    """A torch process group over one ddl Communicator; every collective is asynchronous."""

    def __init__(self, comm, rank: int, size: int):
        super().__init__(rank, size)
        self.comm = comm
        self._name = self._desc = ""

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return NAME

    # torch keeps a group's name in its C++ backends, which a Python group has none of; DeviceMesh, DTensor
    # and FSDP2 look groups up by name, so the group keeps its own (torch sets it right after creating it).
    def getGroupName(self) -> str:  # noqa: N802
        return self._name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._desc = desc

    @property
    def _device_types(self) -> list:
        """The devices this group serves (torch reads it, e.g. checkpoint's async save needs cpu among them)."""
        return [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])

    # -- the machinery: run on the worker, complete a future --------------------------------------------------

    def _submit(self, call: str, run, result, tensors=()):
        fut = torch.futures.Future()
        cuda = next((t for t in tensors if t.is_cuda), None)
        if cuda is not None:  # the GPU path, in the caller's stream order (see the docstring)
            run()
            fut.set_result(result)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(cuda.device))
            return _Work(fut, event)

        def job():
            try:
                run()
            except BaseException as e:
                fut.set_exception(e)
                raise
            fut.set_result(result)

        return _Work(fut, handle=self.comm.submit(f"torch.distributed {call}", job))

    # -- collectives ---------------------------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        op = _op(opts) if opts is not None else "sum"
        _check(tensors, "allreduce")
        return self._submit("allreduce", lambda: [allreduce_(t, op, self.comm) for t in tensors], tensors,
                            tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts):
        _check(tensors, "broadcast")
        root = opts.rootRank
        return self._submit("broadcast", lambda: [broadcast_(t, root, self.comm) for t in tensors],
                            tensors, tensors)

    def allgather(self, output_lists, inputs, opts=None):
        """Rows may differ by rank (each rank's outputs say every rank's size)."""
        _check(inputs, "allgather")
        for outs in output_lists:
            _check_count(outs, self.size(), "allgather", self.rank())

        def run():
            for outs, t in zip(output_lists, inputs):
                _split_into(outs, allgather(t.reshape(-1), self.comm), "allgather", self.rank())

        return self._submit("allgather", run, output_lists, inputs)

    def _allgather_base(self, output, input, opts=None):
        return self.all_gather_single_coalesced([output], [input], opts)

    all_gather_single = _allgather_base  # the name torch 2.13's all_gather_into_tensor calls

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        """all_gather_into_tensor of several tensors in one Work (DTensor's full_tensor calls this)."""
        _check(inputs, "all_gather_into_tensor")
        return self._submit("all_gather_into_tensor",
                            lambda: [allgather_into(o, i, self.comm) for o, i in zip(outputs, inputs)],
                            outputs, inputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # its name before torch 2.13

    def reduce_scatter(self, outputs, input_lists, opts=None):
        """Parts may differ in size (the same sizes on every rank): rank r gets the reduction of parts r."""
        op = _op(opts) if opts is not None else "sum"
        _check(outputs, "reduce_scatter")
        for parts in input_lists:
            _check_count(parts, self.size(), "reduce_scatter", self.rank())

        def run():
            for out, parts in zip(outputs, input_lists):
                whole = torch.cat([p.reshape(-1) for p in parts])
                reduce_scatter_into(out, whole, op, self.comm, [p.numel() for p in parts])

        return self._submit("reduce_scatter", run, outputs, outputs)

    def _reduce_scatter_base(self, output, input, opts=None):
        return self.reduce_scatter_single_coalesced([output], [input], opts)

    reduce_scatter_single = _reduce_scatter_base  # torch 2.13's reduce_scatter_tensor

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        """reduce_scatter_tensor of several tensors in one Work: each input is ``size`` equal parts, rank r's
        output the reduction of parts r (FSDP2 reduces its gradients this way, DTensor's Partial to Shard)."""
        op = _op(opts) if opts is not None else "sum"
        _check(inputs, "reduce_scatter_tensor")
        p = self.size()

        def run():
            for out, t in zip(outputs, inputs):
                if t.numel() != p * out.numel():
                    raise DDLError(f"rank {self.rank()}: reduce_scatter_tensor's input has {t.numel()} elements, "
                                   f"not {p} times its output's {out.numel()}")
                reduce_scatter_into(out, t.reshape(p, -1), op, self.comm)

        return self._submit("reduce_scatter_tensor", run, outputs, inputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # its name before torch 2.13

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """Rows ``input_split_sizes[j]`` of ``input`` go to rank j, ``output_split_sizes[i]`` rows of ``output``
        come from rank i (equal parts where empty): ddl's pairwise exchange."""
        _check([input], "all_to_all_single")
        p = self.size()
        send = list(input_split_sizes) or None
        recv = list(output_split_sizes) or [output.shape[0] // p if output.dim() else 0] * p

        def run():
            got = self.comm.alltoall(_host_view(input.detach().contiguous())[0], send, recv)
            if got.size != output.numel():
                raise DDLError(f"rank {self.rank()}: all_to_all_single received {got.size} elements, but its "
                               f"output holds {output.numel()}")
            _copy_into(output, torch.from_numpy(got))

        return self._submit("all_to_all_single", run, [output], [input])

    alltoall_base = all_to_all_single  # its name before torch 2.13

    def gather(self, output_lists, inputs, opts):
        """Root's outputs get every rank's input (an allgather: every rank receives, root keeps them;
        torch.distributed.checkpoint gathers small metadata this way)."""
        _check(inputs, "gather")
        root, me = opts.rootRank, self.rank()
        if me == root:
            for outs in output_lists:
                _check_count(outs, self.size(), "gather", me)

        def run():
            for k, t in enumerate(inputs):
                gathered = allgather(t.reshape(-1), self.comm)
                if me == root:
                    _split_into(output_lists[k], gathered, "gather", me)

        return self._submit("gather", run, output_lists, inputs)

    def scatter(self, outputs, input_lists, opts):
        """Rank r's output gets root's ``input_lists[0][r]`` (all parts of one size): root's parts are
        broadcast and each rank keeps its own."""
        _check(outputs, "scatter")
        root, me, p = opts.rootRank, self.rank(), self.size()
        if me == root:
            for parts in input_lists:
                _check_count(parts, p, "scatter", me)

        def run():
            for k, out in enumerate(outputs):
                if me == root:
                    whole = torch.cat([t.reshape(-1) for t in input_lists[k]])
                else:
                    whole = torch.empty(p * out.numel(), dtype=out.dtype)
                broadcast_(whole, root, self.comm)
                _copy_into(out, whole[me * out.numel():(me + 1) * out.numel()])

        return self._submit("scatter", run, outputs, outputs)

    def reduce(self, tensors, opts):
        """Root's tensors get the reduction (an allreduce; the other ranks' tensors are left as they were)."""
        op = _op(opts)
        _check(tensors, "reduce")
        root = opts.rootRank

        def run():
            for t in tensors:
                if self.rank() == root:
                    allreduce_(t, op, self.comm)
                else:
                    allreduce_(t.detach().clone(), op, self.comm)

        return self._submit("reduce", run, tensors, tensors)

    def barrier(self, opts=None):
        return self._submit("barrier", self.comm.barrier, [])

    def send(self, tensors, dst, tag=0):
        raise DDLError(_POINT_TO_POINT)

    def recv(self, tensors, src, tag=0):
        raise DDLError(_POINT_TO_POINT)

    def recv_anysource(self, tensors, tag=0):
        raise DDLError(_POINT_TO_POINT)


_POINT_TO_POINT = ("the ddl backend runs collectives only: no send/recv (pipeline parallelism); use a gloo group "
                   "for them (dist.new_group(backend='gloo'))")


def _check_count(tensors, size: int, call: str, rank: int) -> None:
    if len(tensors) != size:
        raise DDLError(f"rank {rank}: {call} takes one tensor per rank ({size}), got {len(tensors)}")


def _split_into(outs, flat: torch.Tensor, call: str, rank: int) -> None:
    """Copies consecutive runs of ``flat`` into ``outs`` (each its own number of elements)."""
    if sum(o.numel() for o in outs) != flat.numel():
        raise DDLError(f"rank {rank}: {call}'s outputs hold {sum(o.numel() for o in outs)} elements in all, but "
                       f"the ranks sent {flat.numel()}")
    at = 0
    for o in outs:
        _copy_into(o, flat[at:at + o.numel()])
        at += o.numel()


_device_world = None  # the world of a job started alone on an MPI whose processes cannot connect (GPU only)


def _create(opts, pg_options=None) -> ProcessGroupDDL:
    """torch's creator (extended API): the world group shares ddl's communicator; a new group gets its own."""
    global _device_world
    alone = not ddl.initialized() and not launched_by_mpi() and opts.group_size > 1
    if _device_world is not None or (alone and not bootstrap.can_join()):  # (a group of one too, in such a job)
        # started alone (torchrun, an operator) where MPI cannot join the processes: GPU tensors run over NCCL at
        # every level, bootstrapped through torch's store (ddl.gpu.world); host tensors are refused in one line
        from ddl.gpu.world import DeviceWorld

        world = DeviceWorld(opts.store, opts.group_rank, opts.group_size, ddl_options.parse(), bootstrap.mpi_library())
        if not opts.global_ranks_in_group:
            _device_world = world
        return ProcessGroupDDL(world, opts.group_rank, opts.group_size)
    if alone and not opts.global_ranks_in_group:
        # started alone (torchrun, an operator): the ranks join one MPI communicator through torch's store
        timeout = ddl_options.parse().timeout
        ddl.init(comm=bootstrap.join(opts.store, opts.group_rank, opts.group_size, timeout))
    world = ddl.communicator()
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    if world.size == 1 and opts.group_size > 1:
        raise DDLError(f"the ddl backend runs on MPI ranks, but this process is alone in MPI while torch expects "
                       f"{opts.group_size}: launch with ddlrun (or mpirun), or torchrun")
    me = ranks[opts.group_rank] if opts.group_rank < len(ranks) else -1
    if me != world.rank:
        raise DDLError(f"torch.distributed rank {me} is MPI rank {world.rank}: the ddl backend needs them equal "
                       f"(ddlrun sets RANK from MPI; leave RANK unset or set it to the MPI rank)")
    if ranks == list(range(world.size)):
        return ProcessGroupDDL(world, opts.group_rank, opts.group_size)
    comm = world.group(ranks)  # collective over the group's members only, as torch calls the creator
    return ProcessGroupDDL(comm, opts.group_rank, opts.group_size)


def init_process_group(**kwargs) -> None:
    """``dist.init_process_group("ddl")`` bootstrapped over MPI: rank and world size from MPI, an in-process
    store (the ddl backend never uses one), so no MASTER_ADDR or MASTER_PORT is needed and two jobs on a host
    cannot collide on a port. Other keyword arguments go to torch."""
    world = ddl.communicator()
    dist.init_process_group(NAME, store=dist.HashStore(), rank=world.rank, world_size=world.size, **kwargs)


def register() -> None:
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])
