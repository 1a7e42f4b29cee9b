"""ddl.elastic for Keras: a state holding a model (its weights and its optimizer's variables) and a callback
that commits it as training goes.

    state = ddl.keras.elastic.KerasState(model, epoch=0, batch=0)

    @ddl.elastic.run
    def train(state):
        model.fit(x, y, initial_epoch=state.epoch, epochs=epochs,
                  callbacks=[ddl.DDLCallback(), ddl.keras.elastic.CommitStateCallback(state, batches_per_commit=50)])

After a failure the survivors roll back to the last commit (the epoch and batch it was taken at included) and
fit again from that epoch; batches of a partly done epoch run again (Keras starts epochs from their first
batch), so commit at epoch ends at least.
"""
from __future__ import annotations

import keras
import numpy as np

from ..elastic import State
from . import broadcast_variables


def _optimizer_variables(model) -> list:
    optimizer = getattr(model, "optimizer", None)
    return list(optimizer.variables) if optimizer is not None else []


def _build_optimizer(model) -> None:
    """Builds the model's optimizer (its moments) now, as fit would, so that every rank holds the same
    variables: rank 0 may have built it to take a commit from disk, the others not yet."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)


def _values(variables) -> list[np.ndarray]:
    return [np.array(keras.ops.convert_to_numpy(v.value)) for v in variables]


class KerasState(State):
    def __init__(self, model, **values):
        super().__init__(**values)
        object.__setattr__(self, "model", model)

    def save(self):
        return {"values": super().save(), "model": _values(self.model.variables),
                "optimizer": _values(_optimizer_variables(self.model))}

    def load(self, saved) -> None:
        super().load(saved["values"])
        _build_optimizer(self.model)  # a restarted job loads a commit before fit has built it
        for v, value in zip(self.model.variables, saved["model"]):
            v.assign(value)
        variables = _optimizer_variables(self.model)
        if len(variables) == len(saved["optimizer"]):  # else it was built after the commit: left as it is
            for v, value in zip(variables, saved["optimizer"]):
                v.assign(value)
        optimizer = getattr(self.model, "optimizer", None)
        for buckets in getattr(optimizer, "_ddl_buffers", {}).values():
            if buckets is not None:
                buckets.abandon()

    def sync(self, root: int = 0) -> None:
        super().sync(root)
        _build_optimizer(self.model)  # on every rank alike: rank 0 may have built it to load a commit
        broadcast_variables(list(self.model.variables) + _optimizer_variables(self.model), root)


class CommitStateCallback(keras.callbacks.Callback):
    """Commits ``state`` every ``batches_per_commit`` batches and at every epoch's end, keeping
    ``state.epoch`` and ``state.batch`` (where they exist) current."""

    def __init__(self, state: State, batches_per_commit: int = 1):
        super().__init__()
        self.state, self.every = state, max(1, int(batches_per_commit))

    def _set(self, name: str, value: int) -> None:
        if name in self.state._values:
            setattr(self.state, name, value)

    def on_train_batch_end(self, batch, logs=None):
        self._set("batch", batch + 1)
        if (batch + 1) % self.every == 0:
            self.state.commit()

    def on_epoch_end(self, epoch, logs=None):
        self._set("epoch", epoch + 1)
        self._set("batch", 0)
        self.state.commit()
