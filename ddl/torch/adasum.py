"""Adasum (Maleki et al., "Scaling Distributed Training with Adaptive Summation", MLSys 2021): instead of
averaging, pairs of ranks combine their vectors a and b as

    (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b

(the sum where a and b are orthogonal, their average where they are equal), then pairs of pairs, as the
paper's recursive doubling does: ranks (0, 1), (2, 3), ... first, then (01, 23), and so on; hence a
power-of-two number of ranks. Dot products are taken per tensor, also when several tensors travel fused (as
Horovod does: per layer).

Here every rank gathers the vectors with ddl's allgather and combines the tree itself, in float64: the same
result as the paper's vector-halving schedule, with (n - 1) times a vector's bytes received per rank where
that schedule receives about 2 (n - 1) / n times; fine for the few ranks Adasum is used with, not optimal.

``DistributedAdasumOptimizer`` applies it where Horovod does: to each rank's parameter *change* (its own
optimizer's step on its own gradients; optimizer state stays per rank), not to the gradients."""
from __future__ import annotations

import contextlib

import numpy as np
import torch

import ddl

from ..errors import DDLError
from .compression import Compression, Compressor, check


def combine(rows: np.ndarray, bounds: list[tuple[int, int]]) -> np.ndarray:
    """Adasum of ``rows`` (one float64 row per rank, a power-of-two count), dot products taken over each
    ``(start, end)`` slice of ``bounds`` separately."""
    level = rows
    while level.shape[0] > 1:
        a, b = level[0::2], level[1::2]
        out = np.empty_like(a)
        for start, end in bounds:
            sa, sb = a[:, start:end], b[:, start:end]
            dot = np.einsum("ij,ij->i", sa, sb)
            aa, bb = np.einsum("ij,ij->i", sa, sa), np.einsum("ij,ij->i", sb, sb)
            # a zero vector adds nothing and takes nothing away: its partner passes through unchanged
            ca = 1.0 - np.divide(dot, 2 * aa, out=np.zeros_like(dot), where=aa > 0)
            cb = 1.0 - np.divide(dot, 2 * bb, out=np.zeros_like(dot), where=bb > 0)
            out[:, start:end] = ca[:, None] * sa + cb[:, None] * sb
        level = out
    return level[0]


def _power_of_two(comm):
    comm = comm or ddl.communicator()
    if comm.size & (comm.size - 1):
        raise DDLError(f"rank {comm.rank}: Adasum needs a power-of-two number of ranks, not {comm.size}")
    return comm


def adasum_(tensors: list[torch.Tensor], comm=None) -> list[torch.Tensor]:
    """Replaces every tensor by the Adasum of its values on the ranks of ``comm`` (default ddl's world);
    tensors of one dtype and device travel in one allgather, each keeping its own dot products."""
    comm = _power_of_two(comm)
    groups: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        if not t.is_floating_point():
            raise DDLError(f"rank {comm.rank}: Adasum of a {t.dtype} tensor: floating-point tensors only")
        groups.setdefault((t.dtype, str(t.device)), []).append(t)
    with torch.no_grad():
        for key in sorted(groups, key=str):  # the same order on every rank
            members = groups[key]
            flat = torch.cat([t.detach().reshape(-1) for t in members]).cpu()  # combined on the host anyway
            rows = ddl.torch.allgather(flat.reshape(1, -1), comm).double().numpy()
            ends = np.cumsum([t.numel() for t in members])
            bounds = [(int(e - t.numel()), int(e)) for t, e in zip(members, ends)]
            result = torch.from_numpy(combine(rows, bounds))
            for t, (start, end) in zip(members, bounds):
                t.copy_(result[start:end].view(t.shape))
    return tensors


def DistributedAdasumOptimizer(optimizer: torch.optim.Optimizer, compression: type[Compressor] = Compression.none,
                               comm=None) -> torch.optim.Optimizer:
    """Makes ``step()`` run ``optimizer``'s own step on this rank's gradients, then replace every trainable
    parameter's change by the Adasum of the ranks' changes (sent through ``compression``); returns the
    optimizer, still an instance of its own class. Gradients accumulate until ``step()`` as in plain torch
    (so ``backward_passes_per_step`` needs nothing). ``synchronize()`` and ``skip_synchronize()`` exist
    for scripts that call them and do nothing: there is nothing to reduce before the step."""
    if getattr(optimizer, "_ddl_distributed", False):
        return optimizer
    compression = check(compression)
    base = type(optimizer)

    def trainable(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"] if p.requires_grad]

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        _power_of_two(comm)  # before the local step, which the error would otherwise leave half done
        params = trainable(self)
        starts = [p.detach().clone() for p in params]
        out = base.step(self)
        with torch.no_grad():
            deltas = [p.detach() - s for p, s in zip(params, starts)]  # zeros where a parameter had no gradient
            wire = [compression.compress(d) for d in deltas]
            adasum_([w for w, _ in wire], comm)
            for p, s, (w, ctx) in zip(params, starts, wire):
                p.copy_(s + compression.decompress(w, ctx))
        return loss if closure is not None else out

    def synchronize(self) -> None:
        pass

    @contextlib.contextmanager
    def skip_synchronize(self):
        yield

    optimizer.__class__ = type(base.__name__, (base,), {
        "step": step, "synchronize": synchronize, "skip_synchronize": skip_synchronize,
        "_ddl_distributed": True, "__module__": base.__module__})
    return optimizer
