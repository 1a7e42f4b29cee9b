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

Backends: torch, and tensorflow (eager, or model.fit's compiled step, where the average is one py-function
node; not under XLA, which DDLCallback turns off). jax: ddl cannot average its gradients, its compiled train
step never returns to Python between the gradients and the update (DistributedOptimizer says so); Keras' own
``keras.distribution.DataParallel`` runs under ddlrun instead, on JAX's collectives (README).
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


def _in_graph() -> bool:
    """Whether Keras is tracing a TensorFlow graph (model.fit's compiled train step) rather than running."""
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return not tf.executing_eagerly()


def _average_in_graph(grads, variables, threshold: int | None) -> list:
    """The TensorFlow graph's form of average_gradients: one stateful py-function node (so it runs every step,
    in the graph's order, and is never pruned) that averages all the gradients in fused buffers. Sparse
    gradients (IndexedSlices) travel dense. XLA cannot compile it: DDLCallback turns jit_compile off."""
    import tensorflow as tf

    dense = [tf.zeros(v.shape, v.dtype) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]

    def allreduce(*arrays):
        return fusion.allreduce_arrays(list(arrays), "avg", threshold)

    out = tf.numpy_function(allreduce, dense, [t.dtype for t in dense], stateful=True, name="ddl_allreduce")
    for o, t in zip(out, dense):
        o.set_shape(t.shape)
    return list(out)


def _average(grads, variables, threshold: int | None, buffers: dict | None = None) -> list:
    if _in_graph():
        return _average_in_graph(grads, variables, threshold)
    averaged = _buffered_average(buffers, variables, grads, threshold) \
        if buffers is not None and keras.backend.backend() == "torch" else None
    return averaged if averaged is not None else average_gradients(grads, variables, threshold)


def _average_on_update_step(optimizer, grads, variables, threshold: int | None) -> list:
    """Under ``gradient_accumulation_steps`` Keras adds each micro-step's gradients to local accumulators and
    updates every ``steps`` calls with (gradients + accumulators) / steps: averaging is linear, so averaging
    both on the update step alone (one fused allreduce) gives the update that averaging every micro-step
    would. Returns the gradients to apply; the accumulators are replaced by their averages."""
    steps = optimizer.gradient_accumulation_steps
    if not optimizer.built:  # the accumulators are made by build (Keras' apply builds on first use)
        with keras.name_scope(optimizer.name, caller=optimizer):
            optimizer.build(variables)
    accumulators = [optimizer._accumulated_gradients[optimizer._get_variable_index(v)] for v in variables]
    both = list(grads) + [a.value for a in accumulators]
    if _in_graph():
        import tensorflow as tf

        update = tf.equal((optimizer._iterations + 1) % steps, 0)
        dense = [tf.convert_to_tensor(g) for g in both]
        both = tf.cond(update, lambda: _average_in_graph(dense, variables + accumulators, threshold),
                       lambda: dense)
    elif (int(optimizer._iterations) + 1) % steps:
        return grads
    else:
        both = average_gradients(both, variables + accumulators, threshold)
    for a, value in zip(accumulators, both[len(grads):]):
        a.assign(value)
    return both[:len(grads)]


def DistributedOptimizer(optimizer, threshold: int | None = None):
    """Makes ``optimizer`` (a keras.optimizers.Optimizer) average gradients across ranks before every update,
    in fused buffers of at most ``threshold`` bytes (default DDL_FUSION_BYTES); returns it. With
    ``gradient_accumulation_steps`` it averages once per update, not at every micro-step. On TensorFlow it
    works eagerly and inside model.fit's compiled step (not under XLA: compile with ``jit_compile=False``,
    which DDLCallback does for you)."""
    if keras.backend.backend() == "jax":
        raise DDLError(f"rank {ddl.rank()}: ddl.keras cannot average gradients on the jax backend (its train "
                       "step is compiled end to end, with no way back to ddl in between); use KERAS_BACKEND=torch "
                       "or tensorflow, or Keras' own keras.distribution.DataParallel under ddlrun (README)")
    if getattr(optimizer, "_ddl_distributed", False):
        return optimizer
    original = optimizer.apply
    buffers = {}  # torch backend: the GradientBuckets of each list of variables seen

    def apply(grads, trainable_variables=None):
        variables = list(trainable_variables if trainable_variables is not None else optimizer._trainable_variables)
        grads = list(grads)
        if getattr(optimizer, "gradient_accumulation_steps", None):
            averaged = _average_on_update_step(optimizer, grads, variables, threshold)
        else:
            averaged = _average(grads, variables, threshold, buffers)
        return original(averaged, trainable_variables)

    optimizer.apply = apply
    optimizer._ddl_distributed = True
    # ddl.keras.elastic forgets their collectives after a failure. Set past Keras' attribute tracking, which
    # would keep a copy of the dict (empty) instead of the dict itself.
    object.__setattr__(optimizer, "_ddl_buffers", buffers)
    return optimizer


def _prepare(model, threshold: int | None) -> None:
    """What either callback does when training begins: the optimizer averages, the buffers stay, no XLA."""
    DistributedOptimizer(model.optimizer, threshold)
    keep_gradient_buffers(model)
    _no_xla(model)


def _no_xla(model) -> None:
    """TensorFlow: ddl's allreduce is a py-function node, which XLA cannot compile; a model compiled with
    jit_compile=True (Keras' default where there is a GPU) has its train step rebuilt without it."""
    if keras.backend.backend() != "tensorflow" or not getattr(model, "jit_compile", False):
        return
    model.jit_compile = False
    model.make_train_function(force=True)
    if ddl.rank() == 0:
        print("ddl: jit_compile turned off for training: XLA cannot compile ddl's allreduce (a py-function)")


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
        _prepare(self.model, self.threshold)

    def on_epoch_end(self, epoch, logs=None):
        average_logs(logs)


def average_logs(logs) -> None:
    """Replaces every value of Keras' ``logs`` by its mean over ranks (one allreduce)."""
    if not logs or ddl.size() == 1:
        return
    names = sorted(logs)
    averaged = ddl.communicator().allreduce(np.array([float(logs[k]) for k in names], np.float64), "avg")
    for k, v in zip(names, averaged):
        logs[k] = float(v)


class DDLGlobalVariablesCallback(keras.callbacks.Callback):
    """Last in the callback list: when training begins, every rank gets rank 0's weights and optimizer state
    (and the optimizer averages gradients, as with DDLCallback)."""

    def __init__(self, root: int = 0, threshold: int | None = None):
        super().__init__()
        self.root, self.threshold = root, threshold

    def on_train_begin(self, logs=None):
        _prepare(self.model, self.threshold)
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

    def epoch_at(self, batch: int) -> float:
        """The epoch, with its fraction done, at ``batch`` (steps_per_epoch, else fit's steps)."""
        return self._epoch + batch / (self.steps_per_epoch or self.params.get("steps") or 1)

    def on_train_batch_begin(self, batch, logs=None):
        epoch = self.epoch_at(batch)
        if epoch <= self.warmup_epochs:
            self.model.optimizer.learning_rate = self.rate(epoch)

    def on_epoch_end(self, epoch, logs=None):
        if self.verbose and ddl.rank() == 0 and epoch < self.warmup_epochs + 1:
            print(f"\nEpoch {epoch + 1}: learning rate {float(_to_numpy(self.model.optimizer.learning_rate)):.6g}")


from . import elastic  # noqa: E402,F401 (ddl.keras.elastic: KerasState, CommitStateCallback)
