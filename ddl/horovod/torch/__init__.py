"""horovod.torch's API on ddl: ``import ddl.horovod.torch as hvd`` in place of ``import horovod.torch as hvd``.

Every collective runs on ddl's engine (its topology-aware plans; ``process_set=`` picks the communicator of a
set added with ``hvd.add_process_set``). ``*_async`` calls run on the communicator's worker thread in
submission order and return a handle for ``hvd.synchronize`` / ``hvd.poll``; every rank must submit in the
same order (as in Horovod; ddl checks it: a rank that does not gets ddl.MismatchError). ``name=`` is not
needed to match collectives (ddl matches them by order), but Horovod's duplicate-name error holds.

What Horovod's own test suite checks, ddl follows here (its gradients, integer averaging, world ranks as roots
in process sets, a barrier that does not wait for operations in flight, join serving allreduces with zeros).
What differs is said where it applies: Adasum needs a power-of-two number of ranks and gathers the ranks'
tensors rather than halving them (ddl.torch.adasum says what that costs).
"""
from __future__ import annotations

import time
import warnings

import numpy as np
import torch

import ddl
from ... import torch as dt
from ...errors import DDLError
from ...torch.adasum import DistributedAdasumOptimizer, adasum_
from ...torch.compression import Compression
from .. import (Adasum, Average, HorovodInternalError, Max, Min, ProcessSet, Product, Sum,  # noqa: F401
                add_process_set, allgather_object, ccl_built, communicator_of, cross_rank, cross_size,
                ddl_built, global_process_set, gloo_built, gloo_enabled, init, is_homogeneous, is_initialized,
                local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank,
                remove_process_set, rocm_built, rooted, shutdown, size, unsupported)
from .. import barrier as _barrier
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
    _name_free(process_set, "allreduce_async", name)
    copy = tensor.detach().clone()
    return _submit(process_set, "allreduce_async", name, allreduce_, copy, average, name, op, prescale_factor,
                   postscale_factor, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=_global):
    _name_free(process_set, "allreduce_async_", name)
    return _submit(process_set, "allreduce_async_", name, allreduce_, tensor, average, name, op, prescale_factor,
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
            flat = torch.cat([t.reshape(-1) for t in members])
            dt.allreduce_(flat, how, comm)
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
    _name_free(process_set, "grouped_allreduce_async", name)
    copies = [t.detach().clone() for t in tensors]
    return _submit(process_set, "grouped_allreduce_async", name, grouped_allreduce_, copies, average, name, op,
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
        # Horovod's gradient: the ranks' output gradients averaged, then this rank's rows of it
        mean = allreduce_(grad.detach().clone(), None, None, Average, 1.0, 1.0, ctx.process_set)
        rows = _gather(torch.tensor([ctx.rows]), ctx.process_set)
        offset = int(rows[:ctx.process_set.rank()].sum())
        return mean.narrow(0, offset, ctx.rows), None


def allgather(tensor, name=None, process_set=_global):
    """Every rank's tensor concatenated along the first dimension (its size may differ by rank)."""
    return _Allgather.apply(tensor, process_set)


def allgather_async(tensor, name=None, process_set=_global):
    _name_free(process_set, "allgather_async", name)
    return _submit(process_set, "allgather_async", name, _gather, tensor.detach().clone(), process_set)


def grouped_allgather(tensors, name=None, process_set=_global):
    return [allgather(t, name, process_set) for t in tensors]


def broadcast_(tensor, root_rank, name=None, process_set=_global):
    """Overwrites ``tensor`` with root's (``root_rank``: a rank of the world in the set, as Horovod's); returns
    it."""
    with torch.no_grad():
        comm = communicator_of(process_set)
        return rooted(process_set, root_rank, lambda root: dt.broadcast_(tensor, root, comm))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, process_set):
        ctx.root, ctx.process_set = root_rank, process_set
        return broadcast_(tensor.detach().clone(), root_rank, None, process_set)

    @staticmethod
    def backward(ctx, grad):
        # Horovod's gradient: the ranks' gradients averaged, on the root only (the others' inputs did not count)
        mean = allreduce_(grad.detach().clone(), None, None, Average, 1.0, 1.0, ctx.process_set)
        return (mean if rank() == ctx.root else torch.zeros_like(mean)), None, None


def broadcast(tensor, root_rank, name=None, process_set=_global):
    return _Broadcast.apply(tensor, root_rank, process_set)


def broadcast_async(tensor, root_rank, name=None, process_set=_global):
    _name_free(process_set, "broadcast_async", name)
    return _submit(process_set, "broadcast_async", name, broadcast_, tensor.detach().clone(), root_rank, name,
                   process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=_global):
    _name_free(process_set, "broadcast_async_", name)
    return _submit(process_set, "broadcast_async_", name, broadcast_, tensor, root_rank, name, process_set)


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
    _name_free(process_set, "reducescatter_async", name)
    return _submit(process_set, "reducescatter_async", name, reducescatter, tensor.detach().clone(), name,
                   Compression.none, op, process_set, prescale_factor, postscale_factor)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average, process_set=_global,
                          prescale_factor=1.0, postscale_factor=1.0):
    """Each tensor's block of its reduction, one reduce-scatter per tensor."""
    return [reducescatter(t, name, compression, op, process_set, prescale_factor, postscale_factor)
            for t in tensors]


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=_global, prescale_factor=1.0,
                                postscale_factor=1.0):
    _name_free(process_set, "grouped_reducescatter_async", name)
    return _submit(process_set, "grouped_reducescatter_async", name, grouped_reducescatter,
                   [t.detach().clone() for t in tensors], name, Compression.none, op, process_set,
                   prescale_factor, postscale_factor)


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=_global):
    """A sparse tensor's allreduce (Average or Sum), as Horovod's: every rank's indices and values gathered
    (two allgathers, submitted now), then put together; returns a function that waits and gives the sparse
    result (duplicate indices left uncoalesced, as torch sums them wherever they are used)."""
    if not tensor.is_sparse:
        raise ddl.ArgumentError(f"rank {ddl.rank()}: sparse_allreduce_async takes a sparse COO tensor "
                                f"(dense tensors: allreduce_async)")
    if op not in (Average, Sum):
        raise ddl.ArgumentError(f"rank {ddl.rank()}: sparse_allreduce_async op {op!r}: hvd.Average or hvd.Sum")
    parts = (None, None) if name is None else (f"{name}.indices", f"{name}.values")
    for part in parts:
        _name_free(process_set, "sparse_allreduce_async", part)
    local = tensor.coalesce() if not tensor.is_coalesced() else tensor
    # one row per stored entry (allgather concatenates along the first dimension)
    rows = local.indices().t().contiguous()
    indices = _submit(process_set, "sparse_allreduce_async", parts[0], _gather, rows, process_set)
    values = _submit(process_set, "sparse_allreduce_async", parts[1], _gather, local.values().contiguous(),
                     process_set)
    size = process_set.size()

    def result():
        everywhere, gathered = synchronize(values), synchronize(indices)
        if op == Average and everywhere.is_floating_point():
            everywhere = everywhere / size
        summed = torch.sparse_coo_tensor(gathered.t(), everywhere, tensor.shape, check_invariants=False)
        if op == Average and not everywhere.is_floating_point():  # integers: the sum, truncated (as dense)
            summed = summed.coalesce()
            summed = torch.sparse_coo_tensor(summed.indices(), torch.div(summed.values(), size,
                                                                          rounding_mode="trunc"), tensor.shape,
                                             check_invariants=False)
        return summed

    return result


# -- handles, barrier, join, objects ------------------------------------------------------------------------

def _name_free(process_set, call: str, name) -> None:
    """Horovod's duplicate-name error: an asynchronous operation named as one still in use on this rank is
    refused here, before anything is copied or submitted (only this rank raises, no rank waits for it). A name
    is in use until its operation finished and, since it was submitted, this rank passed a barrier (or its handle
    was synchronized or polled done). Horovod frees it when the operation ends; the barrier makes the answer
    independent of how fast the other ranks were (two calls in a row always clash)."""
    if name is None:
        return
    comm = communicator_of(process_set)
    earlier = _in_flight.get((id(comm), name))
    if earlier is not None and (earlier[1] == _barriers_passed[0] or not _finishes(earlier[0])):
        raise ddl.ArgumentError(f"rank {comm.rank}: {call}(name={name!r}): an operation of that name is still "
                                f"in use (Horovod's rule: concurrent operations need distinct names; synchronize "
                                f"the earlier one's handle first)")


def _finishes(handle, within: float = 1.0) -> bool:
    """Whether ``handle`` is done or gets done within ``within`` seconds: an operation the other ranks joined
    before a barrier may still be waiting for this rank's worker thread to take its turn."""
    try:
        handle.wait(within)
    except Exception:  # noqa: BLE001 (not done in time, or failed: either way the answer is in the handle)
        pass
    return handle.done()


def _submit(process_set, call: str, name, fn, *args):
    """``fn(*args)`` on the set's worker thread (``name``: the caller's, checked by _name_free before)."""
    comm = communicator_of(process_set)
    handle = comm.submit(call, fn, *args)
    if name is not None:
        _in_flight[(id(comm), name)] = (handle, _barriers_passed[0])
    return handle


_in_flight: dict = {}  # (communicator id, name) -> (the Handle of the last operation of that name, barriers then)
_barriers_passed = [0]


def _release(handle) -> None:
    """Frees ``handle``'s name, and forgets the names _name_free would pass anyway (finished, a barrier since)."""
    for key in [k for k, (h, at) in _in_flight.items()
                if h is handle or (h.done() and at != _barriers_passed[0])]:
        del _in_flight[key]


def synchronize(handle):
    """The result of an ``*_async`` call (the output tensor), once it is done; its error if it failed."""
    try:
        return handle.wait()
    finally:
        _release(handle)


def barrier(process_set=_global) -> None:
    """Horovod's barrier: every rank of the set reached it (it does not wait for the operations in flight)."""
    _barrier(process_set)
    _barriers_passed[0] += 1


def poll(handle) -> bool:
    if handle.done():
        _release(handle)
        return True
    return False


def join(device=-1) -> int:
    """This rank has no more data (Horovod's join): until every rank has joined, it takes part in the others'
    allreduces with zeros (an Average still divides by every rank); their allgathers, broadcasts and other
    collectives fail on their ranks with ddl.MismatchError naming join, as Horovod's do. Returns the rank that
    joined last (by the hosts' clocks), the same on every rank."""
    comm = ddl.communicator()
    comm.drain()
    arrived = time.time()
    comm.join()
    return int(np.argmax(comm.allgather(np.array([arrived]))))


def broadcast_object(obj, root_rank=0, name=None, process_set=_global):
    """Root's ``obj`` (anything torch.save writes) on every rank of the set."""
    comm = communicator_of(process_set)
    return rooted(process_set, root_rank, lambda root: dt.broadcast_object(obj, root, comm))


# -- training ------------------------------------------------------------------------------------------------

def broadcast_parameters(params, root_rank=0) -> None:
    dt.broadcast_parameters(params, root_rank)


def broadcast_optimizer_state(optimizer, root_rank=0, model=None) -> None:
    """Root's optimizer state on every rank. As Horovod's, an optimizer with no state yet gives each trainable
    parameter without a gradient a zero one first (Horovod makes them for the step that creates its state;
    ddl takes root's state as it is and leaves the parameters alone)."""
    if not optimizer.state_dict()["state"]:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
    dt.broadcast_optimizer_state(optimizer, root_rank)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=_global):
    """Horovod's DistributedOptimizer on ddl's (gradients in fused buffers whose allreduces start from
    backward as each fills). ``num_groups``/``groups`` are accepted: ddl's buffers (DDL_FUSION_BYTES) decide
    how gradients are fused. ``sparse_as_dense``: accepted; sparse gradients are averaged dense either way
    and handed back sparse (as Horovod's). A rank outside ``process_set`` steps on its own gradients (as
    Horovod's). ``named_parameters`` is checked as Horovod checks it. ``op=hvd.Adasum``: as Horovod's, each
    rank steps its own optimizer on its own gradients and the parameters' changes are combined by Adasum
    (ddl.torch.adasum)."""
    names = _parameter_names(optimizer, named_parameters)
    if process_set.included():
        comm = None if process_set is _global or process_set.ranks is None else communicator_of(process_set)
    else:  # as Horovod's: a rank outside the set steps on its own gradients
        comm = _on_my_own()
    if op == Adasum:
        if gradient_predivide_factor != 1.0:
            raise DDLError("gradient_predivide_factor is not supported with op=hvd.Adasum (as in Horovod): "
                           "Adasum combines parameter changes, it does not average gradients")
        wrapped = DistributedAdasumOptimizer(optimizer, compression, comm)
        wrapped._parameter_names = names
        return wrapped
    if op not in (Average, Sum):
        raise DDLError(f"DistributedOptimizer op {op!r}: hvd.Average, hvd.Sum or hvd.Adasum")
    # sparse gradients are averaged dense either way (in the fused buffers) and handed back sparse, as Horovod
    # hands them back with or without sparse_as_dense (SparseAdam takes nothing else)
    wrapped = dt.DistributedOptimizer(optimizer, named_parameters, op, backward_passes_per_step,
                                      compression=compression, gradient_predivide_factor=gradient_predivide_factor,
                                      sparse_as_dense=False, comm=comm)
    wrapped._parameter_names = names
    _warn_step_after_synchronize(wrapped)
    return wrapped


def _warn_step_after_synchronize(optimizer) -> None:
    """Horovod warns when step() follows synchronize() outside skip_synchronize() (it would average again).
    ddl's step does not average twice, but a script that must also run on Horovod wants to hear it."""
    base = type(optimizer)

    def step(self, closure=None):
        averaging = self._ddl_averaging
        if averaging.synchronized and not averaging.skip:
            warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                          "optimizer.synchronize(): ddl does not average the gradients again, Horovod does (use "
                          "skip_synchronize() where the script must also run on Horovod)")
        return base.step(self, closure)

    optimizer.__class__ = type(base.__name__, (base,), {"step": step, "__module__": base.__module__})


def _on_my_own():
    """A communicator of this rank alone (its averages are its own gradients), one per world communicator."""
    world = ddl.communicator()
    if _alone.get("world") is not world:
        _alone.update(world=world, comm=world.group([world.rank]))
    return _alone["comm"]


_alone: dict = {}


def _parameter_names(optimizer, named_parameters) -> dict:
    """Horovod's checks of ``named_parameters`` (a ValueError on this rank, before any collective: the same
    model gives every rank the same answer) and its ``_parameter_names``: parameter -> name, ``allreduce.noname.i``
    in the optimizer's order when none are given."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}" for i, p in enumerate(params)}
    named = list(named_parameters)
    if any(not isinstance(pair, tuple) or len(pair) != 2 for pair in named):
        raise ddl.ArgumentError(f"rank {ddl.rank()}: named_parameters must be (name, parameter) pairs, as "
                                f"model.named_parameters() gives")
    seen: dict[str, int] = {}
    for n, _ in named:
        seen[n] = seen.get(n, 0) + 1
    twice = sorted(n for n, k in seen.items() if k > 1)
    if twice:
        raise ddl.ArgumentError(f"rank {ddl.rank()}: named_parameters has names used more than once: {twice}")
    given = {id(p) for _, p in named}
    unnamed = [i for i, p in enumerate(params) if id(p) not in given]
    if unnamed:
        raise ddl.ArgumentError(f"rank {ddl.rank()}: named_parameters leaves {len(unnamed)} of the optimizer's "
                                f"{len(params)} parameters unnamed (positions {unnamed[:8]}): name all or none")
    return {p: n for n, p in named}


from . import elastic  # noqa: E402 (hvd.elastic, on the names above)

_NOT_HERE = {
    "start_timeline": "ddlrun --timeline-filename FILE (or DDL_TIMELINE=FILE) for ddl's Chrome trace",
    "stop_timeline": "ddlrun --timeline-filename FILE (the trace covers the whole run)",
    "allgather_object_async": "allgather_object",
}


def __getattr__(name: str):
    if name in _NOT_HERE:
        unsupported(f"hvd.{name}", _NOT_HERE[name])
    raise AttributeError(f"module 'ddl.horovod.torch' has no attribute {name!r}")
