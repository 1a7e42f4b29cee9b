"""Keras 3 on ddl: IBM's four changes to a training script, for today's Keras.

    import ddl                                                    # 1. import ddl
    x, y = x[ddl.rank()::ddl.size()], y[ddl.rank()::ddl.size()]   # 2. each rank its shard of the data
    opt = keras.optimizers.SGD(0.01 * ddl.size())                 # 3. learning rate scaled by the ranks
    model.fit(x, y, callbacks=[ddl.DDLCallback(), ...,            # 4. two callbacks: DDLCallback first,
                               ddl.DDLGlobalVariablesCallback()]) #    DDLGlobalVariablesCallback last

When training begins, the callbacks make the model's optimizer average the gradients across ranks before
every update (in fused buffers, ddl.core.fusion), and rank 0's weights and optimizer state go to every rank; at
each epoch's end DDLCallback replaces the metrics with their mean over ranks, so every rank (and History,
and the progress bar, which come after it) sees global numbers.

Backends: torch (tested). tensorflow: the averaging runs eagerly only (``model.compile(run_eagerly=True)``);
untested. jax: not supported, its compiled train step never returns to Python between the gradients and the
update; DistributedOptimizer says so.
"""
from __future__ import annotations

import keras
import numpy as np

import ddl

from ..core import fusion
from ..errors import DDLError

__all__ = ["DDLCallback", "DDLGlobalVariablesCallback", "DistributedOptimizer", "LearningRateWarmupCallback",
           "broadcast_variables", "average_gradients", "keep_gradient_buffers"]


def _to_numpy(x) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(x))


def average_gradients(grads, variables, threshold: int | None = None) -> list:
    """The gradients averaged across ranks (a missing gradient counts as zeros, so every rank forms the same
    buffers). On the torch backend, CPU gradients are averaged in their own memory."""
    arrays = [np.zeros(v.shape, keras.backend.standardize_dtype(v.dtype)) if g is None else _to_numpy(g)
              for g, v in zip(grads, variables)]
    averaged = fusion.allreduce_arrays(arrays, "avg", threshold)
    out = []
    for g, a in zip(grads, averaged):
        if g is not None and keras.backend.backend() == "torch" and g.device.type == "cpu" and g.is_contiguous():
            np.copyto(g.detach().numpy(), a)  # same memory: no new tensor
            out.append(g)
        else:
            out.append(keras.ops.convert_to_tensor(a, dtype=None if g is None else g.dtype))
    return out


def _buffered_average(buffers: dict, variables, grads, threshold) -> list | None:
    """Torch backend: gradients live in fused buffers as the parameters' .grad (ddl.torch.GradientBuckets),
    so the average is one in-place allreduce per buffer; with DDLCallback's zero_grad, which zeroes in place,
    backward writes straight into the buffers and nothing is copied. None where the variables cannot live
    there (GPU or bfloat16 tensors): the caller averages by copy."""
    from ..torch import GradientBuckets

    params = [v.value for v in variables]
    key = tuple(id(p) for p in params)
    if key not in buffers:  # decided once per list of variables, not at every step
        buffers[key] = GradientBuckets(params, threshold) if all(map(GradientBuckets.fits, params)) else None
    if buffers[key] is None:
        return None
    for p, g in zip(params, grads):
        if g is not None and g is not p.grad:  # gradients computed elsewhere (a custom train step)
            p.grad = g
    buffers[key].average()
    return [p.grad for p in params]


def keep_gradient_buffers(model) -> None:
    """Torch backend: the model's zero_grad (called by Keras before each step) zeroes gradients in place
    instead of dropping them, so they stay in ddl's fused buffers."""
    if keras.backend.backend() != "torch" or getattr(model, "_ddl_zero_grad", False):
        return
    import torch

    model.zero_grad = lambda set_to_none=True: torch.nn.Module.zero_grad(model, set_to_none=False)
    model._ddl_zero_grad = True


def DistributedOptimizer(optimizer, threshold: int | None = None):
    """Makes ``optimizer`` (a keras.optimizers.Optimizer) average gradients across ranks before every update,
    in fused buffers of at most ``threshold`` bytes (default DDL_FUSION_BYTES); returns it. With
    ``gradient_accumulation_steps`` it averages once per update, not at every micro-step."""
    if keras.backend.backend() == "jax":
        raise DDLError(f"rank {ddl.rank()}: ddl.keras cannot average gradients on the jax backend (its train "
                       "step is compiled end to end); use KERAS_BACKEND=torch")
    if getattr(optimizer, "_ddl_distributed", False):
        return optimizer
    original = optimizer.apply
    buffers = {}  # torch backend: the GradientBuckets of each list of variables seen

    def apply(grads, trainable_variables=None):
        variables = list(trainable_variables if trainable_variables is not None else optimizer._trainable_variables)
        grads = list(grads)
        steps = getattr(optimizer, "gradient_accumulation_steps", None)
        if steps:
            # Keras adds each micro-step's gradients to local accumulators and updates every `steps` calls with
            # (gradients + accumulators) / steps: averaging is linear, so averaging both on the update step
            # alone (one fused allreduce) gives the same update as averaging every micro-step.
            if (int(optimizer._iterations) + 1) % steps:
                return original(grads, trainable_variables)
            accumulators = [optimizer._accumulated_gradients[optimizer._get_variable_index(v)] for v in variables]
            both = average_gradients(grads + [a.value for a in accumulators], variables + accumulators, threshold)
            for a, value in zip(accumulators, both[len(grads):]):
                a.assign(value)
            return original(both[:len(grads)], trainable_variables)
        averaged = _buffered_average(buffers, variables, grads, threshold) \
            if keras.backend.backend() == "torch" else None
        if averaged is None:
            averaged = average_gradients(grads, variables, threshold)
        return original(averaged, trainable_variables)

    optimizer.apply = apply
    optimizer._ddl_distributed = True
    return optimizer


def broadcast_variables(variables, root: int = 0) -> None:
    """Assigns root's values to every variable (one broadcast per dtype)."""
    variables = list(variables)
    values = fusion.broadcast_arrays([_to_numpy(v.value) for v in variables], root)
    for v, a in zip(variables, values):
        v.assign(a)


class DDLCallback(keras.callbacks.Callback):
    """First in the callback list: gradients averaged at every step (the optimizer is wrapped when training
    begins), and the epoch's metrics replaced by their mean over ranks."""

    def __init__(self, threshold: int | None = None):
        super().__init__()
        self.threshold = threshold

    def on_train_begin(self, logs=None):
        DistributedOptimizer(self.model.optimizer, self.threshold)
        keep_gradient_buffers(self.model)

    def on_epoch_end(self, epoch, logs=None):
        if not logs or ddl.size() == 1:
            return
        names = sorted(logs)
        values = np.array([float(logs[k]) for k in names], np.float64)
        averaged = ddl.communicator().allreduce(values, "avg")
        for k, v in zip(names, averaged):
            logs[k] = float(v)


class DDLGlobalVariablesCallback(keras.callbacks.Callback):
    """Last in the callback list: when training begins, every rank gets rank 0's weights and optimizer state
    (and the optimizer averages gradients, as with DDLCallback)."""

    def __init__(self, root: int = 0, threshold: int | None = None):
        super().__init__()
        self.root, self.threshold = root, threshold

    def on_train_begin(self, logs=None):
        DistributedOptimizer(self.model.optimizer, self.threshold)
        keep_gradient_buffers(self.model)
        broadcast_variables(list(self.model.variables) + list(self.model.optimizer.variables), self.root)


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Goyal et al.'s gradual warm-up: over the first ``warmup_epochs`` the learning rate rises linearly, step
    by step, from ``initial_lr / ddl.size()`` to ``initial_lr`` (the rate already scaled by the ranks)."""

    def __init__(self, initial_lr: float, warmup_epochs: float = 5, steps_per_epoch: int | None = None,
                 verbose: int = 0):
        super().__init__()
        self.initial_lr, self.warmup_epochs = float(initial_lr), float(warmup_epochs)
        self.steps_per_epoch, self.verbose = steps_per_epoch, verbose
        self._epoch = 0

    def rate(self, epoch: float) -> float:
        done = min(1.0, epoch / self.warmup_epochs) if self.warmup_epochs > 0 else 1.0
        return self.initial_lr * ((1.0 - done) / ddl.size() + done)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        steps = self.steps_per_epoch or self.params.get("steps") or 1
        epoch = self._epoch + batch / steps
        if epoch <= self.warmup_epochs:
            self.model.optimizer.learning_rate = self.rate(epoch)

    def on_epoch_end(self, epoch, logs=None):
        if self.verbose and ddl.rank() == 0 and epoch < self.warmup_epochs + 1:
            print(f"\nEpoch {epoch + 1}: learning rate {float(_to_numpy(self.model.optimizer.learning_rate)):.6g}")
