"""horovod.keras.elastic on ddl.elastic: ``@hvd.elastic.run``, ``hvd.elastic.KerasState(model, **values)``
and the callbacks that keep it current (commit every N batches; the batch and epoch counters)."""
from __future__ import annotations

import keras

from ...elastic import HostsUpdated, State, run  # noqa: F401 (Horovod's names)
from ...keras.elastic import CommitStateCallback, KerasState as _KerasState  # noqa: F401

HostsUpdatedInterrupt = HostsUpdated


class KerasState(_KerasState):
    def __init__(self, model, optimizer=None, backend=None, **values):
        super().__init__(model, **values)


class _KeepsState(keras.callbacks.Callback):
    def __init__(self, state):
        super().__init__()
        self.state = state


class UpdateBatchStateCallback(_KeepsState):
    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(_KeepsState):
    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = epoch + 1
