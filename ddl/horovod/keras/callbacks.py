"""Horovod's Keras callbacks on ddl.keras."""
from __future__ import annotations

import sys

import keras

import ddl
from ... import keras as dk


class BroadcastGlobalVariablesCallback(dk.DDLGlobalVariablesCallback):
    """When training begins every rank takes ``root_rank``'s weights and optimizer state (and the optimizer
    averages, if the script did not wrap it). Horovod broadcast after the first batch; ddl does before it,
    so no rank ever steps from weights of its own."""

    def __init__(self, root_rank=0, device=""):
        super().__init__(root_rank)


class MetricAverageCallback(keras.callbacks.Callback):
    """At each epoch's end the metrics are replaced by their mean over ranks (put it before the callbacks that
    read them)."""

    def __init__(self, device=""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        dk.average_logs(logs)


def _momentum_note(callback, optimizer) -> None:
    if callback.momentum_correction and float(getattr(optimizer, "momentum", 0) or 0) > 0 and not callback._said:
        callback._said = True
        if ddl.rank() == 0:
            print("ddl.horovod.keras: momentum_correction is not applied (Keras 3 keeps an optimizer's momentum "
                  "fixed in its compiled step); the learning rate follows Horovod's schedule", file=sys.stderr)


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """From ``start_epoch`` to ``end_epoch`` the learning rate is ``initial_lr * multiplier`` (a number, or a
    function of the epoch); with ``staircase`` set at each epoch's start, else at every batch with the
    epoch's fraction (``steps_per_epoch``, else fit's steps)."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        self.initial_lr, self.start_epoch, self.end_epoch = float(initial_lr), start_epoch, end_epoch
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch, m=float(multiplier): m)
        self.staircase, self.momentum_correction, self.steps_per_epoch = staircase, momentum_correction, steps_per_epoch
        self._epoch, self._said = 0, False

    def _active(self, epoch: float) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set(self, epoch: float) -> None:
        if self._active(epoch):
            _momentum_note(self, self.model.optimizer)
            self.model.optimizer.learning_rate = self.initial_lr * self.multiplier(epoch)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        if self.staircase:
            self._set(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if not self.staircase:
            steps = self.steps_per_epoch or self.params.get("steps") or 1
            self._set(self._epoch + batch / steps)


class LearningRateWarmupCallback(dk.LearningRateWarmupCallback):
    """Goyal et al.'s warm-up, Horovod's signature: from ``initial_lr / size`` to ``initial_lr`` over
    ``warmup_epochs``, batch by batch."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__(initial_lr, warmup_epochs, steps_per_epoch, verbose)
        self.momentum_correction, self._said = momentum_correction, False

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        if epoch >= self.warmup_epochs and not getattr(self, "_ended", False):
            self._ended = True  # the warm-up's end: the full rate, unless a schedule after this one says else
            self.model.optimizer.learning_rate = self.initial_lr

    def on_train_batch_begin(self, batch, logs=None):
        """As Horovod's (a schedule whose end is warmup_epochs, excluded), so a schedule starting there wins."""
        epoch = self.epoch_at(batch)
        if epoch < self.warmup_epochs:
            _momentum_note(self, self.model.optimizer)
            self.model.optimizer.learning_rate = self.rate(epoch)
