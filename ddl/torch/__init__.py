"""PyTorch on ddl: collectives on tensors, broadcasting a model and its optimizer, and averaging gradients.

    import ddl.torch as dt
    dt.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * ddl.size()))
    dt.broadcast_optimizer_state(optimizer, root_rank=0)
    ... loss.backward(); optimizer.step()          # gradients averaged over ranks, in fused buffers

CPU tensors that are contiguous are reduced in their own memory (through numpy, no copy); CUDA tensors stay
on their device (ddl's GPU path: NCCL inside a node, MPI between nodes; see ddl.gpu); others are copied to
the host and back. Importing this module imports torch (``import ddl`` never does) and registers the
``"ddl"`` backend of torch.distributed (ddl.torch.backend: DistributedDataParallel on ddl).
"""
from __future__ import annotations

import io

import numpy as np
import torch

import ddl

from ..core import fusion
from ..core.parts import split_rows
from ..errors import ArgumentError, DDLError

# The oldest torch with what ddl.torch calls: post-accumulate-grad hooks (DistributedOptimizer's overlap) and
# register_backend(devices=...) (the "ddl" backend). Tested: TESTED_TORCH (tests/train, CI).
OLDEST_TORCH, TESTED_TORCH = (2, 1), "2.13"


def check_torch_version(version: str) -> None:
    """Refuses a torch older than OLDEST_TORCH, naming it (newer ones are let through: the process-group API
    they call is what DDP itself calls)."""
    numbers = tuple(int(x) for x in version.split("+")[0].split(".")[:2] if x.isdigit())
    if numbers < OLDEST_TORCH:
        raise DDLError(f"ddl.torch needs torch {OLDEST_TORCH[0]}.{OLDEST_TORCH[1]} or newer (tested with "
                       f"{TESTED_TORCH}); this is torch {version}")


check_torch_version(torch.__version__)

__all__ = ["allreduce", "allreduce_", "broadcast", "broadcast_", "allgather", "allgather_into", "reduce_scatter",
           "reduce_scatter_into", "alltoall", "broadcast_parameters",
           "broadcast_object", "broadcast_optimizer_state", "DistributedOptimizer", "average_gradients",
           "init_process_group", "GradientBuckets", "Compression", "device_mesh"]


def _host_view(tensor: torch.Tensor) -> tuple[np.ndarray, bool]:
    """(numpy array with the tensor's values, whether it shares the tensor's memory)."""
    t = tensor.detach()
    if t.device.type == "cpu" and t.is_contiguous() and t.dtype != torch.bfloat16:
        return t.numpy(), True
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: reduce in float32, round back on the way in
        return t.to(torch.float32).cpu().contiguous().numpy(), False
    return t.cpu().contiguous().numpy(), False


def _write_back(tensor: torch.Tensor, values: np.ndarray, shared: bool) -> torch.Tensor:
    if not shared:
        with torch.no_grad():
            tensor.copy_(torch.from_numpy(np.ascontiguousarray(values)).reshape(tensor.shape))
    return tensor


def allreduce(tensor: torch.Tensor, op: str = "avg") -> torch.Tensor:
    """A new tensor: the reduction of every rank's ``tensor`` (same device and dtype as the input)."""
    return allreduce_(tensor.detach().clone(), op)


def allreduce_(tensor: torch.Tensor, op: str = "avg", comm=None) -> torch.Tensor:
    """Reduces ``tensor`` in place across ranks (of ``comm``, default ddl's); returns it."""
    comm = comm or ddl.communicator()
    if tensor.is_cuda:
        work = tensor.detach() if tensor.is_contiguous() else tensor.detach().contiguous()
        comm.allreduce(work, op, out=work)
        return tensor if work.data_ptr() == tensor.data_ptr() else _copy_into(tensor, work)
    values, shared = _host_view(tensor)
    comm.allreduce(values, op, out=values)
    return _write_back(tensor, values, shared)


def broadcast(tensor: torch.Tensor, root: int = 0) -> torch.Tensor:
    """A new tensor holding root's values."""
    return broadcast_(tensor.detach().clone(), root)


def broadcast_(tensor: torch.Tensor, root: int = 0, comm=None) -> torch.Tensor:
    """Overwrites ``tensor`` with root's values (of ``comm``, default ddl's); returns it."""
    comm = comm or ddl.communicator()
    if tensor.is_cuda:  # in place where the tensor is contiguous (the device path writes out directly)
        work = tensor.detach() if tensor.is_contiguous() else tensor.detach().contiguous()
        comm.broadcast(work, root, out=work)
        return tensor if work.data_ptr() == tensor.data_ptr() else _copy_into(tensor, work)
    values, _ = _host_view(tensor)
    return _write_back(tensor, comm.broadcast(values, root), False)


def allgather(tensor: torch.Tensor, comm=None) -> torch.Tensor:
    """Every rank's tensor (of ``comm``, default ddl's) concatenated along the first dimension, in rank order
    (first dimensions may differ)."""
    comm = comm or ddl.communicator()
    if tensor.is_cuda:
        return comm.allgather(tensor.detach().contiguous())
    values, _ = _host_view(tensor.detach().contiguous())
    return torch.from_numpy(comm.allgather(values)).to(tensor.device, tensor.dtype)


def alltoall(tensor: torch.Tensor, splits=None, comm=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``splits[j]`` of ``tensor`` (in order) go to rank j (of ``comm``, default ddl's; without
    ``splits``, equal parts); returns what every rank sent here, in rank order, and how many rows came from
    each. One small allgather of the splits, then ddl's pairwise exchange (only the destination's rows travel);
    bad splits anywhere are refused on every rank, naming the rank."""
    comm = comm or ddl.communicator()
    if tensor.dim() == 0:
        raise DDLError(f"rank {comm.rank}: alltoall needs a tensor with a first dimension to split")
    n, rows = comm.size, tensor.shape[0]
    if splits is None:
        mine = torch.full((n,), rows // n if rows % n == 0 else -1, dtype=torch.int64)
    else:
        integral = not (torch.is_tensor(splits) and (splits.is_floating_point() or splits.is_complex()))
        mine = torch.as_tensor(splits, dtype=torch.int64).reshape(-1)
        if not integral or mine.numel() != n or int(mine.sum()) != rows or bool((mine < 0).any()):
            mine = torch.full((n,), -1, dtype=torch.int64)
    table = allgather(mine.reshape(1, n), comm)  # table[i][j]: rows rank i sends to rank j; -1: a bad call
    bad = [i for i in range(n) if bool((table[i] < 0).any())]
    if bad:
        raise ArgumentError(f"rank {comm.rank}: alltoall refused: rank(s) {bad} gave splits that are not {n} "
                            f"integer row counts adding up to their first dimension (or, without splits, a first "
                            f"dimension not divisible by {n})")
    values, _ = _host_view(tensor.detach().contiguous())
    got = comm.alltoall(values, table[comm.rank].tolist(), table[:, comm.rank].tolist())
    return torch.from_numpy(got).to(tensor.device, tensor.dtype), table[:, comm.rank].clone()


def reduce_scatter(tensor: torch.Tensor, op: str = "avg", comm=None, counts=None) -> torch.Tensor:
    """This rank's part, along the first dimension, of the reduction of every rank's ``tensor`` (the same
    shape on every rank, of ``comm``, default ddl's): ``counts[r]`` rows for rank r (the same list on every
    rank), or parts as ddl.core.parts.split_rows makes them. Half the traffic of an allreduce."""
    comm = comm or ddl.communicator()
    rows = split_rows(tensor.shape[0] if tensor.dim() else 0, comm.size, counts)
    out = torch.empty((rows[comm.rank],) + tuple(tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    return reduce_scatter_into(out, tensor, op, comm, counts)


def reduce_scatter_into(out: torch.Tensor, tensor: torch.Tensor, op: str = "avg", comm=None,
                        counts=None) -> torch.Tensor:
    """``reduce_scatter`` written into ``out`` (this rank's part's number of elements); returns ``out``."""
    comm = comm or ddl.communicator()
    if tensor.dim() == 0:
        raise DDLError(f"rank {comm.rank}: reduce_scatter needs a tensor with a first dimension to split")
    rows = split_rows(tensor.shape[0], comm.size, counts)
    shape = (rows[comm.rank],) + tuple(tensor.shape[1:])
    _same_dtype(out, tensor, "reduce_scatter", comm)
    if tensor.is_cuda:  # the device path's reduce-scatter, per level, into out's own memory where it can
        landing = _device_landing(out, shape, tensor.device, comm, "reduce_scatter")
        comm.reduce_scatter(tensor.detach().contiguous(), op, out=landing, counts=counts)
        return out if landing.data_ptr() == out.data_ptr() else _copy_into(out, landing)
    values, _ = _host_view(tensor)
    landing, finish = _landing(out, shape, comm, "reduce_scatter")
    comm.reduce_scatter(values, op, out=landing, counts=counts)
    finish()
    return out


def allgather_into(out: torch.Tensor, tensor: torch.Tensor, comm=None) -> torch.Tensor:
    """Every rank's ``tensor`` (the same shape everywhere) in rank order, written into ``out`` (``size`` times
    its elements): torch's all_gather_into_tensor on ddl's allgather, planned per level."""
    comm = comm or ddl.communicator()
    _same_dtype(out, tensor, "allgather", comm)
    if tensor.is_cuda:  # the device path's allgather, per level, into out's own memory where it can
        landing = _device_landing(out, (comm.size, tensor.numel()), tensor.device, comm, "allgather")
        comm.allgather(tensor.detach().contiguous().reshape(1, -1), out=landing)
        return out if landing.data_ptr() == out.data_ptr() else _copy_into(out, landing)
    values, _ = _host_view(tensor.detach().contiguous())
    landing, finish = _landing(out, (comm.size, values.size), comm, "allgather")
    comm.allgather(values.reshape(1, -1), out=landing)
    finish()
    return out


def _same_dtype(out: torch.Tensor, tensor: torch.Tensor, call: str, comm) -> None:
    if out.dtype != tensor.dtype:
        raise DDLError(f"rank {comm.rank}: {call}'s output is {out.dtype} but its input {tensor.dtype}: they must "
                       f"be of one dtype")


def _landing(out: torch.Tensor, shape: tuple, comm, call: str):
    """(a numpy array of ``shape`` for a collective to write ``out``'s new values into, what finishes the
    write): ``out``'s own memory where numpy can hold it, else a buffer copied into ``out`` afterwards."""
    n = int(np.prod(shape, dtype=np.int64))
    if out.numel() != n:
        raise DDLError(f"rank {comm.rank}: {call}'s output has {out.numel()} elements; it needs {n} "
                       f"(shape {tuple(shape)})")
    if out.device.type == "cpu" and out.is_contiguous() and out.dtype != torch.bfloat16:
        return out.detach().numpy().reshape(shape), lambda: None
    dtype = np.float32 if out.dtype == torch.bfloat16 else torch.empty(0, dtype=out.dtype).numpy().dtype
    values = np.empty(shape, dtype)
    return values, lambda: _copy_into(out, torch.from_numpy(values))


def _device_landing(out: torch.Tensor, shape: tuple, device, comm, call: str) -> torch.Tensor:
    """A tensor of ``shape`` on ``device`` (the input's GPU) for the device path to write ``out``'s new values
    into: a view of ``out`` where it is contiguous there (no copy), else a new one, copied into ``out`` after."""
    n = int(np.prod(shape, dtype=np.int64))
    if out.numel() != n:
        raise DDLError(f"rank {comm.rank}: {call}'s output has {out.numel()} elements; it needs {n} "
                       f"(shape {tuple(shape)})")
    if out.device == device and out.is_contiguous():
        return out.detach().view(shape)
    return torch.empty(shape, dtype=out.dtype, device=device)


def _copy_into(tensor: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        tensor.copy_(values.reshape(tensor.shape))
    return tensor


def _tensors(params) -> list[torch.Tensor]:
    """Tensors from a state_dict, named_parameters(), parameters() or a list, in a stable order."""
    if isinstance(params, dict):
        return [params[k] for k in params]
    items = list(params)
    return [p[1] if isinstance(p, tuple) else p for p in items]


def broadcast_parameters(params, root_rank: int = 0) -> None:
    """Overwrites every tensor of ``params`` (a state_dict, named_parameters() or parameters()) with root's
    values, one broadcast per dtype."""
    tensors = [t for t in _tensors(params) if isinstance(t, torch.Tensor)]
    views = [_host_view(t)[0] for t in tensors]
    for t, values in zip(tensors, fusion.broadcast_arrays(views, root_rank)):
        _write_back(t, values, False)


def broadcast_object(obj, root: int = 0, comm=None):
    """Root's ``obj`` (anything torch.save can write) on every rank (of ``comm``, default ddl's)."""
    comm = comm or ddl.communicator()
    buffer = io.BytesIO()
    if comm.rank == root:
        torch.save(obj, buffer)
    return torch.load(io.BytesIO(comm.broadcast_bytes(buffer.getvalue(), root)), weights_only=False)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Gives every rank root's optimizer state (moments, step counts, hyper-parameters). Ranks whose state is
    still empty take root's as it is, so this may run before or after the first step."""
    state = broadcast_object(optimizer.state_dict(), root_rank)
    optimizer.load_state_dict(state)


def average_gradients(parameters, threshold: int | None = None) -> None:
    """Averages the gradients of ``parameters`` across ranks in place, in fused buffers of at most
    ``threshold`` bytes (default DDL_FUSION_BYTES). A parameter that needs a gradient but has none on this
    rank counts as zeros, so ranks whose graphs differ still agree on the buffers."""
    params = [p for p in parameters if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    on_gpu = [p for p in params if p.grad.is_cuda]
    if on_gpu:
        _average_on_device([p.grad for p in on_gpu], threshold)
        params = [p for p in params if not p.grad.is_cuda]
    views = [_host_view(p.grad) for p in params]
    reduced = fusion.allreduce_arrays([v for v, _ in views], "avg", threshold)
    for p, (view, shared), values in zip(params, views, reduced):
        if shared:
            np.copyto(view, values)
        else:
            _write_back(p.grad, values, False)


def _average_on_device(grads: list[torch.Tensor], threshold: int | None) -> None:
    """GPU gradients averaged in place, fused per device and dtype into buffers of at most ``threshold``."""
    keys = [f"{g.dtype}@{g.device}" for g in grads]
    sizes = [g.numel() * g.element_size() for g in grads]
    for bucket in fusion.buckets(sizes, keys, fusion.threshold_bytes(threshold)):
        reduced = ddl.communicator().allreduce_n([grads[i].detach() for i in bucket], "avg")
        for i, values in zip(bucket, reduced):
            _copy_into(grads[i], values)


from .compression import Compression  # noqa: E402
from .optimizer import DistributedOptimizer, GradientBuckets  # noqa: E402 (they use the helpers above)
from .adasum import DistributedAdasumOptimizer, adasum_  # noqa: E402,F401 (Adasum in place of averaging)


from . import backend as _backend  # noqa: E402 (it uses the helpers above)

_backend.register()  # torch.distributed.init_process_group("ddl")
init_process_group = _backend.init_process_group

from . import elastic  # noqa: E402,F401 (ddl.torch.elastic.TorchState)
from .mesh import device_mesh  # noqa: E402 (FSDP2 / HSDP meshes from the topology)
