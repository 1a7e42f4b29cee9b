"""Gradient averaging for PyTorch optimizers: fused buffers the gradients live in (GradientBuckets) and
DistributedOptimizer, which starts each buffer's allreduce from backward as soon as its gradients are done.

Rules (as DDP): a parameter no rank produced a gradient for keeps ``.grad`` None (weight decay and momentum
leave it alone); one some ranks used is averaged with zeros from the others. Each buffer carries, after the
gradients, one flag per parameter (1 where this rank produced a gradient), reduced with them: no extra
collective says who used what. Sparse gradients (``nn.Embedding(sparse=True)``) are averaged dense in their
buffer and handed back sparse (Horovod's sparse_as_dense). Parameters added (``add_param_group``) or unfrozen
after wrapping join at the next backward: every rank changes its model alike, so the buffers are rebuilt alike.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

import ddl

from ..core import fusion
from .compression import Compression, Compressor, check, wire_array


def _flat_buffer(like: torch.Tensor, count: int) -> torch.Tensor:
    if like.is_cuda:
        return torch.zeros(count, dtype=like.dtype, device=like.device)
    # numpy's allocator: large buffers get transparent huge pages (measured 14 % faster allreduces than
    # torch's allocator on 100 MB, 4 ranks)
    return torch.from_numpy(np.zeros(count, torch.empty(0, dtype=like.dtype).numpy().dtype))


class _Bucket:
    """One fused buffer: the gradients of ``params`` back to back, then one flag per parameter."""

    def __init__(self, params: list[torch.Tensor]):
        self.params = params
        n = sum(p.numel() for p in params)
        self.flat = _flat_buffer(params[0], n + len(params))
        self.views, start = [], 0
        for p in params:
            self.views.append(self.flat[start:start + p.numel()].view(p.shape))
            start += p.numel()
        self.flags = self.flat[n:]
        self.sparse = [False] * len(params)
        self.fired = 0
        self.handle = None
        self.wire = self.flat  # what travels: the buffer, or its compressed copy

    def stage(self, used: set[int]) -> None:
        """Gradients into the buffer (those not already its views), flags from ``used`` (ids of parameters
        whose gradient this rank produced)."""
        with torch.no_grad():
            for i, (p, view) in enumerate(zip(self.params, self.views)):
                g = p.grad
                self.sparse[i] = g is not None and g.is_sparse
                inside = g is not None and not g.is_sparse and g.data_ptr() == view.data_ptr()
                mine = g is not None and (id(p) in used or not inside)  # a new tensor: set since the last step
                if not mine:
                    view.zero_()
                elif not inside:
                    view.copy_(g.to_dense() if g.is_sparse else g)
                self.flags[i] = 1 if mine else 0

    def start(self, op: str, compression: type[Compressor], comm, prescale: float = 1.0) -> None:
        if prescale != 1.0:
            with torch.no_grad():
                self.flat[:len(self.flat) - len(self.params)].mul_(prescale)  # the flags stay 0 or 1
        self.wire, self.ctx = compression.compress(self.flat)
        if self.wire.is_cuda:  # GPU arrays follow their stream with the blocking call
            comm.allreduce(self.wire, op, out=self.wire)
        else:
            values = wire_array(self.wire)
            self.handle = comm.allreduce_async(values, op, out=values)

    def finish(self, compression: type[Compressor], postscale: float = 1.0, dense: bool = False) -> None:
        if self.handle is not None:
            self.handle.wait()
            self.handle = None
        with torch.no_grad():
            if self.wire is not self.flat:
                self.flat.copy_(compression.decompress(self.wire, self.ctx))
                self.wire = self.flat
            if postscale != 1.0:
                self.flat[:len(self.flat) - len(self.params)].mul_(postscale)
            for i, (p, view) in enumerate(zip(self.params, self.views)):
                if float(self.flags[i]) <= 0:  # no rank produced a gradient: it stays None
                    p.grad = None
                else:
                    p.grad = view.to_sparse() if self.sparse[i] and not dense else view
        self.fired = 0


class GradientBuckets:
    """Gradients that live in fused buffers (one per dtype and device and threshold's worth of bytes, in
    reverse parameter order: the order backward produces them). Averaging is one in-place allreduce per
    buffer; ``start``/``finish`` split it so buffers can go while backward still runs."""

    def __init__(self, params: list[torch.Tensor], threshold: int | None = None, op: str = "avg",
                 compression: type[Compressor] = Compression.none, comm=None, predivide: float = 1.0,
                 sparse_as_dense: bool = False):
        self.params, self.op, self.compression = params, op, check(compression)
        self.sparse_as_dense = sparse_as_dense  # sparse gradients are averaged dense; this keeps them so
        self.comm = comm  # None: ddl's world (looked up at each start: elastic jobs replace it)
        # Horovod's gradient_predivide_factor f: an average summed as g / f, then scaled by f / size
        self.prescale = 1.0 / predivide if predivide != 1.0 else 1.0
        order = list(reversed(params))
        sizes = [p.numel() * p.element_size() for p in order]
        keys = [f"{p.dtype}@{p.device}" for p in order]
        self.buckets = [_Bucket([order[i] for i in b])
                        for b in fusion.buckets(sizes, keys, fusion.threshold_bytes(threshold))]
        self.bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self.next = 0  # buckets are started in index order on every rank

    @staticmethod
    def fits(p: torch.Tensor) -> bool:
        if p.dtype in (torch.complex64, torch.complex128):
            return False
        return p.is_cuda or (p.device.type == "cpu" and p.dtype != torch.bfloat16)

    def start_ready(self, used: set[int], passes: int) -> None:
        """Starts, in order, the buckets whose every parameter has fired ``passes`` times."""
        while self.next < len(self.buckets) and self.buckets[self.next].fired >= passes * len(
                self.buckets[self.next].params):
            self._start(self.buckets[self.next], used)

    def _comm(self):
        return self.comm if self.comm is not None else ddl.communicator()

    def _start(self, bucket: _Bucket, used: set[int]) -> None:
        bucket.stage(used)
        op = "sum" if self.prescale != 1.0 and self.op == "avg" else self.op
        bucket.start(op, self.compression, self._comm(), self.prescale)
        self.next += 1

    def finish(self, used: set[int]) -> None:
        for b in self.buckets[self.next:]:
            self._start(b, used)
        post = (1.0 / self.prescale) / self._comm().size if self.prescale != 1.0 and self.op == "avg" else 1.0
        for b in self.buckets:
            b.finish(self.compression, post, self.sparse_as_dense)
        self.next = 0

    def abandon(self) -> None:
        """After a failure (ddl.elastic): forget the collectives in flight, so the next pass starts afresh on
        the new communicator instead of waiting on the old one's handles."""
        for b in self.buckets:
            b.handle, b.fired, b.wire = None, 0, b.flat
        self.next = 0

    def average(self, used: set[int] | None = None) -> None:
        """Everything at once (Keras' torch backend): a parameter with a gradient counts as used."""
        self.finish(used if used is not None else {id(p) for p in self.params if p.grad is not None})


class _Averaging:
    """What DistributedOptimizer adds to one optimizer."""

    def __init__(self, optimizer, op: str, threshold: int | None, passes: int, overlap: bool,
                 compression: type[Compressor], comm=None, predivide: float = 1.0, sparse_as_dense: bool = False):
        self.optimizer, self.op, self.threshold, self.passes, self.overlap = optimizer, op, threshold, passes, overlap
        self.compression, self.comm, self.predivide, self.dense = compression, comm, predivide, sparse_as_dense
        self.params: list[torch.Tensor] = []
        self.ids: set[int] = set()
        self.buckets: GradientBuckets | None = None
        self.others: list[torch.Tensor] = []
        self.hooks: list = []
        self.used: set[int] = set()
        self.synchronized = False
        self.skip = False
        self.refresh()

    def current(self) -> list[torch.Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]

    def refresh(self) -> None:
        """(Re)builds the buffers when the optimizer's trainable parameters changed."""
        now = self.current()
        if len(now) == len(self.params) and all(a is b for a, b in zip(now, self.params)):
            return
        for h in self.hooks:
            h.remove()
        self.params, self.ids = now, {id(p) for p in now}
        self.buckets = GradientBuckets([p for p in now if GradientBuckets.fits(p)], self.threshold, self.op,
                                       self.compression, self.comm, self.predivide, self.dense)
        self.others = [p for p in now if not GradientBuckets.fits(p)]
        self.hooks = [p.register_post_accumulate_grad_hook(self.on_gradient) for p in now]

    def on_gradient(self, p: torch.Tensor) -> None:
        if id(p) not in self.ids:
            return
        if not self.used:
            self.refresh()  # the pass's first gradient: parameters may have changed since the last step
        self.used.add(id(p))
        bucket = self.buckets.bucket_of.get(id(p))
        if bucket is not None:
            bucket.fired += 1
            if self.overlap:
                self.buckets.start_ready(self.used, self.passes)

    def synchronize(self) -> None:
        if self.synchronized:
            return
        if not self.used:
            self.refresh()
        self.buckets.finish(self.used)
        if self.others:
            from . import average_gradients

            if self.comm is not None and self.comm is not ddl.communicator():
                raise ddl.DDLError(f"rank {ddl.rank()}: parameters of dtype {self.others[0].dtype} on "
                                   f"{self.others[0].device} are averaged over the world only, not a process set")

            average_gradients(self.others, self.threshold)
        self.synchronized = True

    def reset(self) -> None:
        self.used, self.synchronized = set(), False

    def abandon(self) -> None:
        self.buckets.abandon()
        self.reset()


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None, op: str = "avg",
                         backward_passes_per_step: int = 1, threshold: int | None = None, overlap: bool = True,
                         compression: type[Compressor] = Compression.none, gradient_predivide_factor: float = 1.0,
                         sparse_as_dense: bool = False, comm=None):
    """Makes ``optimizer`` average (``op="avg"``; or ``"sum"``) the gradients across ranks, and returns it.
    Gradients live in fused buffers; with ``overlap`` each buffer's allreduce starts from backward as soon as
    its gradients are complete (in the order backward produces them), so ``step()`` mostly waits for the last.
    ``compression``: ``Compression.fp16`` or ``.bf16`` sends floating-point gradients in that dtype (half the
    bytes of float32; see ddl.torch.compression for the precision given up). ``backward_passes_per_step``:
    gradients accumulate over that many backward passes before the average.
    ``synchronize()`` averages now (for clipping); a ``step()`` right after does not average again, nor does
    one inside ``skip_synchronize()``. It stays an instance of its own class (schedulers, state_dict and
    checkpoints work as before); ``zero_grad`` zeroes the buffers in place. ``named_parameters`` is accepted
    for Horovod scripts (the optimizer's own parameters are what is averaged). ``gradient_predivide_factor``
    f (Horovod's; with ``op="avg"``): gradients are summed as g / f and the sum scaled by f / size, which
    keeps a float16 sum in range. Sparse gradients are averaged dense and made sparse again, or left dense
    with ``sparse_as_dense`` (Horovod's flag). ``comm``: the communicator to average over (default ddl's world; a
    process set's for ddl.horovod)."""
    if getattr(optimizer, "_ddl_distributed", False):
        return optimizer
    if op not in ("avg", "sum"):
        raise ddl.DDLError(f"DistributedOptimizer op {op!r}: expected 'avg' or 'sum'")
    if backward_passes_per_step < 1:
        raise ddl.DDLError(f"backward_passes_per_step must be at least 1, got {backward_passes_per_step}")
    base = type(optimizer)
    if gradient_predivide_factor <= 0 or (gradient_predivide_factor != 1.0 and op != "avg"):
        raise ddl.DDLError(f"gradient_predivide_factor {gradient_predivide_factor}: a positive factor, with "
                           f"op 'avg' only")
    averaging = _Averaging(optimizer, op, threshold, backward_passes_per_step, overlap, check(compression),
                           comm, gradient_predivide_factor, sparse_as_dense)

    def synchronize(self) -> None:
        averaging.synchronize()

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not averaging.skip:
            averaging.synchronize()
        out = base.step(self)
        averaging.reset()
        return loss if closure is not None else out

    def zero_grad(self, set_to_none: bool = True) -> None:
        base.zero_grad(self, set_to_none=False)  # keep the buffers' views: zero them in place
        averaging.reset()

    @contextlib.contextmanager
    def skip_synchronize(self):
        averaging.skip = True
        try:
            yield
        finally:
            averaging.skip = False

    optimizer.__class__ = type(base.__name__, (base,), {
        "step": step, "synchronize": synchronize, "zero_grad": zero_grad, "skip_synchronize": skip_synchronize,
        "_ddl_distributed": True, "_ddl_averaging": averaging, "__module__": base.__module__})
    return optimizer
