"""The ``"ddl"`` backend of torch.distributed: ``import ddl.torch`` registers it, then

    dist.init_process_group("ddl")          # under ddlrun (or mpirun): RANK, WORLD_SIZE, MASTER_ADDR are set
    model = torch.nn.parallel.DistributedDataParallel(model)

runs DDP's bucket allreduces, broadcasts and the torch.distributed collectives on ddl's planned,
topology-aware collectives, asynchronously: each call is submitted to the communicator's worker thread
(ddl.core.asynchronous) and returns a Work whose future completes when the collective has. Every rank submits
in the same order (DDP's fixed bucket order); a rank that does not gets MismatchError through its Work.

Ranks are MPI's: torch's rank must be the MPI rank (ddlrun sets RANK from it). ``dist.new_group(ranks)`` gets a
communicator of its own over those ranks (MPI_Comm_create_group), planned for its own hosts. Ops sum, avg,
product, min, max; dtypes float16, bfloat16, float32, float64, int32, int64 (broadcast and allgather: any).
CUDA tensors take ddl's GPU path (ddl.gpu: NCCL inside a node, MPI between nodes) on the caller's thread and
current stream, and their Work is complete on return: the GPU path orders itself on the stream, which a worker
thread would not share. Anything else raises an error naming it. Tested with torch 2.13 (CUDA: tests/gpu,
run only where there is a GPU).
"""
from __future__ import annotations


import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

import ddl
from ddl.errors import DDLError

from . import _host_view, allreduce_, broadcast_  # ddl.torch imports this module after defining them

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


class ProcessGroupDDL(dist.ProcessGroup):
    """A torch process group over one ddl Communicator; every collective is asynchronous."""

    def __init__(self, comm, rank: int, size: int):
        super().__init__(rank, size)
        self.comm = comm

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return NAME

    # -- the machinery: run on the worker, complete a future --------------------------------------------------

    def _submit(self, call: str, run, result, tensors=()):
        fut = torch.futures.Future()
        if any(t.is_cuda for t in tensors):  # the GPU path, in the caller's stream order (see the docstring)
            run()
            fut.set_result(result)
            return _create_work_from_future(fut)

        def job():
            try:
                run()
            except BaseException as e:
                fut.set_exception(e)
                raise
            fut.set_result(result)

        self.comm.submit(f"torch.distributed {call}", job)
        return _create_work_from_future(fut)

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
        _check(inputs, "allgather")

        def run():
            for outs, t in zip(output_lists, inputs):
                gathered = _gather(self.comm, t)
                for i, out in enumerate(outs):
                    out.copy_(gathered[i].reshape(out.shape))

        return self._submit("allgather", run, output_lists, inputs)

    def _allgather_base(self, output, input, opts=None):
        _check([input], "all_gather_into_tensor")
        return self._submit("all_gather_into_tensor",
                            lambda: output.copy_(_gather(self.comm, input).reshape(output.shape)), [output], [input])

    all_gather_single = _allgather_base  # the name torch 2.13's all_gather_into_tensor calls

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = _op(opts) if opts is not None else "sum"
        _check(outputs, "reduce_scatter")

        def run():
            for out, parts in zip(outputs, input_lists):
                whole = torch.cat([p.reshape(-1) for p in parts])
                allreduce_(whole, op, self.comm)
                n = out.numel()
                out.copy_(whole[self.rank() * n:(self.rank() + 1) * n].reshape(out.shape))

        return self._submit("reduce_scatter", run, outputs, outputs)

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _op(opts) if opts is not None else "sum"
        _check([input], "reduce_scatter_tensor")

        def run():
            whole = input.detach().reshape(-1).clone()
            allreduce_(whole, op, self.comm)
            n = output.numel()
            output.copy_(whole[self.rank() * n:(self.rank() + 1) * n].reshape(output.shape))

        return self._submit("reduce_scatter_tensor", run, [output], [input])

    reduce_scatter_single = _reduce_scatter_base  # torch 2.13's reduce_scatter_tensor

    def barrier(self, opts=None):
        return self._submit("barrier", self.comm.barrier, [])


def _gather(comm, t: torch.Tensor) -> torch.Tensor:
    """Every rank's ``t`` (same shape everywhere), stacked: (size, *t.shape), on ``t``'s device."""
    if t.is_cuda:
        return comm.allgather(t.detach().contiguous().reshape(1, -1)).reshape(comm.size, *t.shape)
    values = _host_view(t)[0].reshape(1, -1)
    out = torch.from_numpy(comm.allgather(values)).to(t.dtype)
    return out.reshape(comm.size, *t.shape)


def _create(opts, pg_options=None) -> ProcessGroupDDL:
    """torch's creator (extended API): the world group shares ddl's communicator; a new group gets its own."""
    world = ddl.communicator()
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    if world.size == 1 and opts.group_size > 1:
        raise DDLError(f"the ddl backend runs on MPI ranks, but this process is alone in MPI while torch expects "
                       f"{opts.group_size}: launch with ddlrun (or mpirun)")
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
