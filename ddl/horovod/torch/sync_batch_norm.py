"""Horovod's SyncBatchNorm on ddl: batch normalisation whose training statistics are those of the global
batch (every rank's), so that N ranks of B samples normalise as one process of N * B does.

One allreduce per forward (each channel's sum, sum of squares and the count, together); the gradient flows
back through it (the gradient of a sum across ranks is the sum of the gradients: one more allreduce), so
what autograd computes on each rank is its share of the gradient of the sum of the ranks' losses, which
DistributedOptimizer's average turns into the global batch's.
"""
from __future__ import annotations

import torch

from ... import torch as dt
from .. import communicator_of, global_process_set


class _SumAcrossRanks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, process_set):
        ctx.process_set = process_set
        out = tensor.detach().clone()
        dt.allreduce_(out, "sum", communicator_of(process_set))
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.detach().clone().contiguous()
        dt.allreduce_(out, "sum", communicator_of(ctx.process_set))
        return out, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """A drop-in for torch.nn.BatchNorm1d/2d/3d (inputs of shape (N, C, ...)) in training; in evaluation the
    running statistics, as any BatchNorm."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects (N, C, ...) input, got {input.dim()} dimensions")

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training and self.track_running_stats:
            return super().forward(input)
        c = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        count = torch.tensor([input.numel() / c], dtype=input.dtype, device=input.device)
        local = torch.cat([input.sum(dims), (input * input).sum(dims), count])
        total = _SumAcrossRanks.apply(local, self.process_set)
        n = total[2 * c]
        mean = total[:c] / n
        var = total[c:2 * c] / n - mean * mean
        if self.training and self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                self.running_mean.mul_(1 - m).add_(m * mean.detach())
                unbiased = var.detach() * (n.detach() / (n.detach() - 1)) if float(n) > 1 else var.detach()
                self.running_var.mul_(1 - m).add_(m * unbiased)
        shape = [1, c] + [1] * (input.dim() - 2)
        out = (input - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out
