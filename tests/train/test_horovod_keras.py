"""ddl.horovod.keras under MPI (make train runs it at 2 ranks, on the torch backend and on tensorflow): a script
written the Horovod way (its optimizer wrapped, its callbacks) trains the weights one process gets on the
global batch; the learning-rate callbacks follow Horovod's formulas; the value collectives and the elastic
callbacks. Expected values come from Keras run on one process and from closed forms, never from ddl."""
import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")
MPI = pytest.importorskip("mpi4py.MPI")

import ddl  # noqa: E402
import ddl.horovod.keras as hvd  # noqa: E402
from test_keras import Record, data, flat, make_model as keras_model  # noqa: E402  (the same model, data, log)

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
BATCH, STEPS = 8, 4


def make_model(seed: int, distributed: bool):
    return keras_model(seed, hvd.DistributedOptimizer if distributed else (lambda optimizer: optimizer))


class Rates(keras.callbacks.Callback):
    """The learning rate at every batch (placed after the callbacks that set it)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_begin(self, batch, logs=None):
        self.seen.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


def test_a_horovod_keras_script_trains_as_one_process_on_the_global_batch():
    hvd.init()
    p, r = hvd.size(), hvd.rank()
    x, y = data(p)
    reference = make_model(seed=5, distributed=False)
    reference.fit(x, y, batch_size=BATCH * p, epochs=3, shuffle=False, verbose=0)
    model = make_model(seed=5 if r == 0 else 50 + r, distributed=True)  # the broadcast aligns the starts
    before, after = Record(), Record()
    model.fit(x[r::p], y[r::p], batch_size=BATCH, epochs=3, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), before,
                         hvd.callbacks.MetricAverageCallback(), after])
    np.testing.assert_allclose(flat(model.get_weights()), flat(reference.get_weights()), rtol=1e-4, atol=1e-5)
    local = [[e[k] for k in sorted(e)] for e in before.epochs]
    np.testing.assert_allclose([[e[k] for k in sorted(e)] for e in after.epochs],
                               np.mean(COMM.allgather(np.array(local)), axis=0), rtol=1e-12)


def test_warmup_then_schedule_follow_horovods_formulas():
    p = hvd.size()
    x, y = data(p)
    model = make_model(seed=1, distributed=True)
    rates = Rates()
    lr = 0.1 * p
    model.fit(x[:BATCH * STEPS], y[:BATCH * STEPS], batch_size=BATCH, epochs=4, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=2, momentum_correction=False),
                         hvd.callbacks.LearningRateScheduleCallback(lr, 0.5, start_epoch=2, end_epoch=3),
                         hvd.callbacks.LearningRateScheduleCallback(lr, lambda e: 0.1, start_epoch=3),
                         rates])
    want = []
    for epoch in range(4):
        for b in range(STEPS):
            e = epoch + b / STEPS
            if e < 2:  # Goyal et al.: lr / p rising linearly to lr over the first two epochs
                want.append(lr * ((1 - e / 2) / p + e / 2))
            else:
                want.append(lr * (0.5 if epoch == 2 else 0.1))
    np.testing.assert_allclose(rates.seen, want, rtol=1e-6)


def test_value_collectives_and_objects():
    p, r = hvd.size(), hvd.rank()
    value = np.full(3, float(r + 1))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(hvd.allreduce(value)), np.full(3, (p + 1) / 2))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(hvd.allreduce(value, op=hvd.Sum, postscale_factor=2)),
                               np.full(3, p * (p + 1)))
    gathered = keras.ops.convert_to_numpy(hvd.allgather(np.full((r + 1, 2), r)))
    np.testing.assert_array_equal(gathered, np.concatenate([np.full((i + 1, 2), i) for i in range(p)]))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(hvd.broadcast(np.array([r, r]), p - 1)), [p - 1] * 2)
    assert hvd.broadcast_object({"r": r}, root_rank=p - 1) == {"r": p - 1}
    assert hvd.allgather_object(r) == list(range(p))
    with pytest.raises(ddl.DDLError, match="broadcast_global_variables.*BroadcastGlobalVariablesCallback"):
        hvd.broadcast_global_variables(0)
    with pytest.raises(ddl.DDLError, match="op=hvd.Average"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Sum)


def test_elastic_keras_state_and_its_callbacks():
    p, r = hvd.size(), hvd.rank()
    x, y = data(p)
    model = make_model(seed=3, distributed=True)
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    model.fit(x[r::p], y[r::p], batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.elastic.UpdateBatchStateCallback(state),
                         hvd.elastic.UpdateEpochStateCallback(state),
                         hvd.elastic.CommitStateCallback(state, batches_per_commit=2)])
    assert (state.epoch, state.batch) == (2, 0) and state.commits == 2 * (STEPS // 2 + 1)
    weights = flat(model.get_weights())
    model.set_weights([w + 1 for w in model.get_weights()])
    state.restore()
    np.testing.assert_array_equal(flat(model.get_weights()), weights)
