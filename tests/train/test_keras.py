"""ddl.keras under MPI (make train runs it at 2 ranks on the torch backend and on tensorflow): the two
callbacks alone make every rank's weights identical and equal to one process training on the concatenated
global batch; DDLCallback logs the mean over ranks; broadcast makes weights and optimizer state identical.
Expected values come from Keras run locally on each rank and from numpy, never from ddl."""
import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")
MPI = pytest.importorskip("mpi4py.MPI")

import ddl  # noqa: E402
import ddl.keras as dk  # noqa: E402

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
BATCH, STEPS, EPOCHS = 8, 4, 3


def make_model(seed: int, wrap=lambda optimizer: optimizer):
    """The tests' small classifier; ``wrap`` makes its optimizer distributed (test_horovod_keras uses it too)."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=wrap(keras.optimizers.SGD(0.1, momentum=0.9)), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def data(p: int):
    rng = np.random.default_rng(11)
    n = p * BATCH * STEPS
    return rng.standard_normal((n, 10)).astype(np.float32), rng.integers(0, 3, n)


def flat(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a, np.float64).reshape(-1) for a in arrays])


class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs))


def test_two_callbacks_give_identical_weights_equal_to_one_process_on_the_global_batch():
    p, r = ddl.size(), ddl.rank()
    x, y = data(p)
    reference = make_model(seed=5)  # rank 0's initial weights (seed 5 below), one process, batches of 8p rows
    reference.fit(x, y, batch_size=BATCH * p, epochs=EPOCHS, shuffle=False, verbose=0)

    model = make_model(seed=5 if r == 0 else 50 + r)  # different start: DDLGlobalVariablesCallback aligns them
    # rank r's shard x[r::p]: its i-th batch of 8 rows is exactly its share of the i-th global batch
    model.fit(x[r::p], y[r::p], batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[ddl.DDLCallback(), ddl.DDLGlobalVariablesCallback()])
    mine = flat(model.get_weights())
    np.testing.assert_allclose(mine, flat(reference.get_weights()), rtol=1e-4, atol=1e-5)  # float32 sums
    # on torch, every gradient lives in one fused buffer (the model is far below the 64 MiB threshold)
    if keras.backend.backend() == "torch":
        assert len({v.value.grad.untyped_storage().data_ptr() for v in model.trainable_variables}) == 1
    every = COMM.allgather(mine)
    for other in every[1:]:
        np.testing.assert_array_equal(other, every[0])


def test_ddl_callback_logs_the_mean_over_ranks():
    p, r = ddl.size(), ddl.rank()
    x, y = data(p)
    before, after = Record(), Record()
    model = make_model(seed=9)
    model.fit(x[r::p], y[r::p], batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
              validation_data=(x[:16], y[:16]), callbacks=[before, ddl.DDLCallback(), after])
    local = [[e[k] for k in sorted(e)] for e in before.epochs]
    expected = np.mean(COMM.allgather(np.array(local)), axis=0)
    assert sorted(after.epochs[0]) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    np.testing.assert_allclose([[e[k] for k in sorted(e)] for e in after.epochs], expected, rtol=1e-12)
    assert model.history.history["loss"] == pytest.approx([e["loss"] for e in after.epochs])


def test_broadcast_makes_weights_and_optimizer_state_identical():
    model = make_model(seed=20 + ddl.rank())
    x, y = data(1)
    model.fit(x, y * 0 + ddl.rank() % 3, batch_size=8, epochs=1, verbose=0)  # rank-local: momenta differ
    variables = list(model.variables) + list(model.optimizer.variables)
    assert len(model.optimizer.variables) > 2  # momentum slots are there to be broadcast
    dk.broadcast_variables(variables, root=0)
    every = COMM.allgather(flat(keras.ops.convert_to_numpy(v.value) for v in variables))
    for other in every[1:]:
        np.testing.assert_array_equal(other, every[0])


def test_explicit_distributed_optimizer_averages_gradients():
    p, r = ddl.size(), ddl.rank()
    model = make_model(seed=1)
    opt = dk.DistributedOptimizer(model.optimizer, threshold=256)
    assert dk.DistributedOptimizer(opt) is opt  # wrapping twice changes nothing
    grads = [keras.ops.full(v.shape, float(r + 1)) for v in model.trainable_variables]
    averaged = dk.average_gradients(grads, model.trainable_variables, threshold=256)
    for g in averaged:
        np.testing.assert_allclose(keras.ops.convert_to_numpy(g), (p + 1) / 2)


def test_warmup_ramps_from_a_share_to_the_full_rate():
    w = dk.LearningRateWarmupCallback(0.8, warmup_epochs=4)
    p = ddl.size()
    assert w.rate(0) == pytest.approx(0.8 / p) and w.rate(4) == pytest.approx(0.8)
    assert w.rate(2) == pytest.approx(0.8 * (0.5 / p + 0.5)) and w.rate(9) == pytest.approx(0.8)


def test_warmup_sets_the_rate_at_every_step_of_training():
    p, r = ddl.size(), ddl.rank()
    x, y = data(p)
    seen = []

    class Rates(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))

    model = make_model(seed=2)
    model.fit(x[r::p], y[r::p], batch_size=BATCH, epochs=3, shuffle=False, verbose=0,
              callbacks=[ddl.DDLCallback(), dk.LearningRateWarmupCallback(0.4, warmup_epochs=2), Rates()])
    epochs = [e + i / STEPS for e in range(3) for i in range(STEPS)]  # where each step starts
    expected = [0.4 * ((1 - min(1.0, e / 2)) / p + min(1.0, e / 2)) for e in epochs]
    np.testing.assert_allclose(seen, expected, rtol=1e-6)


def test_gradient_accumulation_averages_once_per_update(monkeypatch):
    p, r = ddl.size(), ddl.rank()
    keras.utils.set_random_seed(2)
    v = keras.Variable(np.zeros(5, np.float32))
    opt = dk.DistributedOptimizer(keras.optimizers.SGD(1.0, gradient_accumulation_steps=2))
    comm, calls = ddl.communicator(), []
    original = comm.allreduce
    monkeypatch.setattr(comm, "allreduce", lambda *a, **k: (calls.append(1), original(*a, **k))[1])
    opt.apply([keras.ops.full((5,), float(r + 1))], [v])          # a micro-step: accumulated locally
    assert calls == [] and np.all(keras.ops.convert_to_numpy(v) == 0)
    opt.apply([keras.ops.full((5,), 2.0 * (r + 1))], [v])         # the update: one allreduce
    assert len(calls) == 1
    # the update of one process on the global batch: the mean over ranks of (g1 + g2) / 2
    np.testing.assert_allclose(keras.ops.convert_to_numpy(v), -1.5 * (p + 1) / 2, rtol=1e-6)


def test_gradient_accumulation_in_fit_equals_one_process_accumulating_the_global_batch():
    # on tensorflow the average is inside the compiled step (a conditional node); on torch it runs eagerly
    p, r = ddl.size(), ddl.rank()
    x, y = data(p)

    def accumulating(seed):
        model = make_model(seed)
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9, gradient_accumulation_steps=2),
                      loss="sparse_categorical_crossentropy")
        return model

    reference = accumulating(seed=6)
    reference.fit(x, y, batch_size=BATCH * p, epochs=2, shuffle=False, verbose=0)
    model = accumulating(seed=6)
    model.fit(x[r::p], y[r::p], batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[ddl.DDLCallback(), ddl.DDLGlobalVariablesCallback()])
    mine = flat(model.get_weights())
    np.testing.assert_allclose(mine, flat(reference.get_weights()), rtol=1e-5, atol=1e-6)
    assert not np.allclose(mine, flat(make_model(seed=6).get_weights()))  # it did train
    for other in COMM.allgather(mine)[1:]:
        np.testing.assert_array_equal(other, mine)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="XLA: the tensorflow backend's jit_compile")
def test_tensorflow_averages_inside_the_compiled_step_with_jit_compile_turned_off(monkeypatch):
    import ddl.keras

    traced = []
    graph_average = ddl.keras._average_in_graph
    monkeypatch.setattr(ddl.keras, "_average_in_graph", lambda *a: (traced.append(1), graph_average(*a))[1])
    p, r = ddl.size(), ddl.rank()
    x, y = data(p)
    reference = make_model(seed=5)
    reference.fit(x, y, batch_size=BATCH * p, epochs=1, shuffle=False, verbose=0)
    model = make_model(seed=5)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="sparse_categorical_crossentropy",
                  jit_compile=True)
    model.fit(x[r::p], y[r::p], batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[ddl.DDLCallback(), ddl.DDLGlobalVariablesCallback()])
    assert model.jit_compile is False
    assert traced  # the average was traced into the graph: fit did not run eagerly
    np.testing.assert_allclose(flat(model.get_weights()), flat(reference.get_weights()), rtol=1e-5, atol=1e-6)
