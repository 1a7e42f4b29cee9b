"""horovod.torch's API on ddl: ``import ddl.horovod.torch as hvd`` in place of ``import horovod.torch as hvd``.

Every collective runs on ddl's engine (its topology-aware plans; ``process_set=`` picks the communicator of a
set added with ``hvd.add_process_set``). ``*_async`` calls run on the communicator's worker thread in
submission order and return a handle for ``hvd.synchronize`` / ``hvd.poll``; every rank must submit in the
same order (as in Horovod; ddl checks it: a rank that does not gets ddl.MismatchError). ``name=`` is accepted
and not needed: ddl matches collectives by their order, not their names.

What differs from Horovod is said where it applies: ``join`` needs every rank to reach it (a rank still
reducing meanwhile gets MismatchError naming both calls, not a hang); Adasum needs a power-of-two number of ranks and gathers the
ranks' tensors rather than halving them (ddl.torch.adasum says what that costs).
"""
from __future__ import annotations

import time

import numpy as np
import torch

import ddl
from ... import torch as dt
from ...errors import DDLError
from ...torch.adasum import DistributedAdasumOptimizer, adasum_
from ...torch.compression import Compression
from .. import (Adasum, Average, HorovodInternalError, Max, Min, ProcessSet, Product, Sum,  # noqa: F401
                add_process_set, allgather_object, barrier, ccl_built, communicator_of, cross_rank, cross_size,
                ddl_built, global_process_set, gloo_built, gloo_enabled, init, is_homogeneous, is_initialized,
                local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank,
                remove_process_set, rocm_built, shutdown, size, unsupported)
from .sync_batch_norm import SyncBatchNorm  # noqa: F401

_global = global_process_set


def _op(op, average) -> str:
    """Horovod's op and its deprecated ``average`` flag, as ddl's op name."""
    if op is not None and average is not None:
        raise DDLError("give op= or the deprecated average=, not both")
    if op is None:
        return Sum if average is False else Average
    if op not in (Average, Sum, Adasum, Min, Max, Product):
        raise DDLError(f"unknown op {op!r}: hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max or hvd.Product")
    return op


# -- allreduce ------------------------------------------------------------------------------------------------

def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=_global):
    """Reduces ``tensor`` in place across the set's ranks; returns it."""
    return grouped_allreduce_([tensor], average, name, op, prescale_factor, postscale_factor, process_set)[0]


class _Allreduce(torch.autograd.Function):
    """allreduce with a gradient: the gradient of a sum (or average) is the same reduction of the gradients."""

    @staticmethod
    def forward(ctx, tensor, op, pre, post, process_set):
        ctx.args = (op, pre, post, process_set)
        return allreduce_(tensor.detach().clone(), None, None, op, pre, post, process_set)

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, process_set = ctx.args
        if op not in (Average, Sum):
            raise DDLError(f"no gradient through an allreduce with op {op!r} (only Average and Sum)")
        return allreduce_(grad.detach().clone(), None, None, op, pre, post, process_set), None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=_global):
    """A new tensor: ``tensor`` reduced across the set's ranks (Average by default); differentiable."""
    wire, ctx = compression.compress(tensor)
    out = _Allreduce.apply(wire, _op(op, average), prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=_global):
    copy = tensor.detach().clone()
    return _submit(process_set, "allreduce_async", allreduce_, copy, average, name, op, prescale_factor,
                   postscale_factor, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=_global):
    return _submit(process_set, "allreduce_async_", allreduce_, tensor, average, name, op, prescale_factor,
                   postscale_factor, process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=_global):
    """Reduces every tensor in place, fused: one allreduce per dtype and device (Adasum: one gather, each
    tensor keeping its own dot products, as Horovod's per-layer Adasum)."""
    op, tensors, comm = _op(op, average), list(tensors), communicator_of(process_set)
    with torch.no_grad():
        if prescale_factor != 1.0:
            for t in tensors:
                t.copy_(_scaled(t, prescale_factor))
        if op == Adasum:
            adasum_(tensors, comm)
        else:
            _fused_allreduce_(tensors, op, comm)
        if postscale_factor != 1.0:
            for t in tensors:
                t.copy_(_scaled(t, postscale_factor))
    return tensors


def _fused_allreduce_(tensors, op: str, comm) -> None:
    groups: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, str(t.device)), []).append(t)
    for key in sorted(groups, key=str):  # the same order on every rank
        members = groups[key]
        # Horovod averages integers too (the sum, divided and truncated toward zero as its C++ casts do);
        # ddl's own allreduce refuses "avg" for them
        integer_average = op == Average and not (key[0].is_floating_point or key[0].is_complex)
        how = Sum if integer_average else op
        if len(members) == 1 and members[0].is_contiguous():
            dt.allreduce_(members[0], how, comm)  # in place, no copy
            flat = members[0]
        else:
            flat = dt.allreduce_(torch.cat([t.reshape(-1) for t in members]), how, comm)
        if integer_average:
            flat.copy_(torch.div(flat, comm.size, rounding_mode="trunc"))
        if flat is members[0]:
            continue
        start = 0
        for t in members:
            t.copy_(flat[start:start + t.numel()].view(t.shape))
            start += t.numel()


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=_global):
    if compression is not Compression.none or any(t.requires_grad for t in tensors):  # (each differentiable)
        return [allreduce(t, average, name, compression, op, prescale_factor, postscale_factor, process_set)
                for t in tensors]
    return grouped_allreduce_([t.detach().clone() for t in tensors], average, name, op, prescale_factor,
                              postscale_factor, process_set)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=_global):
    copies = [t.detach().clone() for t in tensors]
    return _submit(process_set, "grouped_allreduce_async", grouped_allreduce_, copies, average, name, op,
                   prescale_factor, postscale_factor, process_set)


# -- allgather, broadcast, alltoall, reducescatter --------------------------------------------------------

def _gather(tensor, process_set) -> torch.Tensor:
    return dt.allgather(tensor, communicator_of(process_set))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, process_set):
        ctx.rows, ctx.process_set = tensor.shape[0], process_set
        return _gather(tensor, process_set)

    @staticmethod
    def backward(ctx, grad):
        summed = allreduce_(grad.detach().clone(), None, None, Sum, 1.0, 1.0, ctx.process_set)
        rows = _gather(torch.tensor([ctx.rows]), ctx.process_set)
        offset = int(rows[:ctx.process_set.rank()].sum())
        return summed.narrow(0, offset, ctx.rows), None


def allgather(tensor, name=None, process_set=_global):
    """Every rank's tensor concatenated along the first dimension (its size may differ by rank)."""
    return _Allgather.apply(tensor, process_set)


def allgather_async(tensor, name=None, process_set=_global):
    return _submit(process_set, "allgather_async", _gather, tensor.detach().clone(), process_set)


def grouped_allgather(tensors, name=None, process_set=_global):
    return [allgather(t, name, process_set) for t in tensors]


def broadcast_(tensor, root_rank, name=None, process_set=_global):
    """Overwrites ``tensor`` with root's (``root_rank``: a rank of the set); returns it."""
    with torch.no_grad():
        return dt.broadcast_(tensor, root_rank, communicator_of(process_set))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, process_set):
        ctx.root, ctx.process_set = root_rank, process_set
        return broadcast_(tensor.detach().clone(), root_rank, None, process_set)

    @staticmethod
    def backward(ctx, grad):
        summed = allreduce_(grad.detach().clone(), None, None, Sum, 1.0, 1.0, ctx.process_set)
        return (summed if ctx.process_set.rank() == ctx.root else torch.zeros_like(summed)), None, None


def broadcast(tensor, root_rank, name=None, process_set=_global):
    return _Broadcast.apply(tensor, root_rank, process_set)


def broadcast_async(tensor, root_rank, name=None, process_set=_global):
    return _submit(process_set, "broadcast_async", broadcast_, tensor.detach().clone(), root_rank, name,
                   process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=_global):
    return _submit(process_set, "broadcast_async_", broadcast_, tensor, root_rank, name, process_set)


class _Alltoall(torch.autograd.Function):
    """alltoall with a gradient: the rows' gradients go back where the rows came from (an alltoall with the
    received splits)."""

    @staticmethod
    def forward(ctx, tensor, splits, process_set):
        ctx.process_set = process_set
        out, received = dt.alltoall(tensor.detach(), splits, communicator_of(process_set))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _):
        back, _ = dt.alltoall(grad.detach().contiguous(), ctx.received, communicator_of(ctx.process_set))
        return back, None, None


def alltoall(tensor, splits=None, name=None, process_set=_global):
    """Rows ``splits[j]`` of ``tensor`` (in order) go to rank j; returns what every rank sent here, in rank
    order, and (when ``splits`` is given) how many rows came from each (ddl.torch.alltoall: the splits in one
    small allgather, then ddl's pairwise exchange); differentiable."""
    out, received = _Alltoall.apply(tensor, splits, process_set)
    return out if splits is None else (out, received)


class _Reducescatter(torch.autograd.Function):
    """reducescatter with Horovod's gradient: the blocks' gradients gathered back (allgather), times the ranks
    for Sum and as they are for Average, scaled as the forward was (what Horovod's own tests require)."""

    @staticmethod
    def forward(ctx, tensor, op, pre, post, process_set):
        comm = communicator_of(process_set)
        ctx.args = (pre * post * (comm.size if op == Sum else 1), process_set)
        work = _scaled(tensor.detach(), pre)
        if op == Average and not work.dtype.is_floating_point:  # as allreduce: Horovod truncates integers
            out = torch.div(dt.reduce_scatter(work, Sum, comm), comm.size, rounding_mode="trunc")
        else:
            out = dt.reduce_scatter(work, op, comm)
        return _scaled(out, post)

    @staticmethod
    def backward(ctx, grad):
        scale, process_set = ctx.args
        return _scaled(_gather(grad.detach().contiguous(), process_set), scale), None, None, None, None


def _scaled(t: torch.Tensor, factor: float) -> torch.Tensor:
    """``t`` times ``factor`` in its own dtype (integers truncated toward zero, as Horovod's C++ casts)."""
    return t if factor == 1.0 else (t * factor).to(t.dtype)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=_global,
                  prescale_factor=1.0, postscale_factor=1.0):
    """This rank's block of the first dimension of the reduction (blocks as even as can be, the first ranks
    one row more), on ddl's reduce-scatter planned per level (half an allreduce's traffic); differentiable."""
    if op not in (Average, Sum):
        raise DDLError(f"reducescatter op {op!r}: hvd.Average or hvd.Sum (as Horovod's)")
    comm = communicator_of(process_set)
    if tensor.dim() == 0:
        raise DDLError(f"rank {comm.rank}: reducescatter needs a tensor with a first dimension to split")
    wire, ctx = compression.compress(tensor)
    out = _Reducescatter.apply(wire, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


def reducescatter_async(tensor, name=None, op=Average, process_set=_global, prescale_factor=1.0,
                        postscale_factor=1.0):
    return _submit(process_set, "reducescatter_async", reducescatter, tensor.detach().clone(), name,
                   Compression.none, op, process_set, prescale_factor, postscale_factor)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average, process_set=_global,
                          prescale_factor=1.0, postscale_factor=1.0):
    """Each tensor's block of its reduction, one reduce-scatter per tensor."""
    return [reducescatter(t, name, compression, op, process_set, prescale_factor, postscale_factor)
            for t in tensors]


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=_global, prescale_factor=1.0,
                                postscale_factor=1.0):
    return _submit(process_set, "grouped_reducescatter_async", grouped_reducescatter,
                   [t.detach().clone() for t in tensors], name, Compression.none, op, process_set,
                   prescale_factor, postscale_factor)


# -- handles, barrier, join, objects ------------------------------------------------------------------------

def _submit(process_set, name: str, fn, *args):
    return communicator_of(process_set).submit(name, fn, *args)


def synchronize(handle):
    """The result of an ``*_async`` call (the output tensor), once it is done; its error if it failed."""
    return handle.wait()


def poll(handle) -> bool:
    return handle.done()


def join(device=-1) -> int:
    """Every rank says it has no more data; returns the rank that got here last (by the hosts' clocks). Unlike
    Horovod, ranks that joined do not serve the others' allreduces with zeros: every rank must reach join,
    and a rank still reducing meanwhile gets ddl.MismatchError naming both calls."""
    comm = ddl.communicator()
    arrived = comm.allgather(np.array([time.time()]))
    return int(np.argmax(arrived))


def broadcast_object(obj, root_rank=0, name=None, process_set=_global):
    """Root's ``obj`` (anything torch.save writes) on every rank of the set."""
    return dt.broadcast_object(obj, root_rank, communicator_of(process_set))


# -- training ------------------------------------------------------------------------------------------------

def broadcast_parameters(params, root_rank=0) -> None:
    dt.broadcast_parameters(params, root_rank)


def broadcast_optimizer_state(optimizer, root_rank=0, model=None) -> None:
    dt.broadcast_optimizer_state(optimizer, root_rank)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=_global):
    """Horovod's DistributedOptimizer on ddl's (gradients in fused buffers whose allreduces start from
    backward as each fills). ``num_groups``/``groups`` are accepted: ddl's buffers (DDL_FUSION_BYTES) decide
    how gradients are fused. ``sparse_as_dense``: sparse gradients are averaged dense either way; with it
    they stay dense afterwards. ``op=hvd.Adasum``: as Horovod's, each rank steps its own optimizer on its own
    gradients and the parameters' changes are combined by Adasum (ddl.torch.adasum)."""
    comm = None if process_set is _global or process_set.ranks is None else communicator_of(process_set)
    if op == Adasum:
        if gradient_predivide_factor != 1.0:
            raise DDLError("gradient_predivide_factor is not supported with op=hvd.Adasum (as in Horovod): "
                           "Adasum combines parameter changes, it does not average gradients")
        return DistributedAdasumOptimizer(optimizer, compression, comm)
    if op not in (Average, Sum):
        raise DDLError(f"DistributedOptimizer op {op!r}: hvd.Average, hvd.Sum or hvd.Adasum")
    return dt.DistributedOptimizer(optimizer, named_parameters, op, backward_passes_per_step,
                                   compression=compression, gradient_predivide_factor=gradient_predivide_factor,
                                   sparse_as_dense=sparse_as_dense, comm=comm)


from . import elastic  # noqa: E402 (hvd.elastic, on the names above)

_NOT_HERE = {
    "start_timeline": "ddlrun --timeline-filename FILE (or DDL_TIMELINE=FILE) for ddl's Chrome trace",
    "stop_timeline": "ddlrun --timeline-filename FILE (the trace covers the whole run)",
    "sparse_allreduce_async": "a dense allreduce (DistributedOptimizer averages sparse gradients dense)",
    "allgather_object_async": "allgather_object",
}


def __getattr__(name: str):
    if name in _NOT_HERE:
        unsupported(f"hvd.{name}", _NOT_HERE[name])
    raise AttributeError(f"module 'ddl.horovod.torch' has no attribute {name!r}")
