"""Elastic training with ddl.torch or ddl.keras, for tests/launch/test_elastic.py (under ddlrun --elastic).

    elastic_frameworks_job.py torch|keras KILL_RANK KILL_AT OUT_DIR

Global batches of 12 rows (every size the job shrinks to divides 12), each rank its rows r::size: the averaged
gradient is the global batch's whatever the size, so the weights must equal one process training on the
global batches, failure or not (SGD with momentum: the optimizer's state must come back too). torch: 8 steps,
commit every 3, rank KILL_RANK (at launch) dies at step KILL_AT. keras: 4 epochs of 2 batches, committed
by CommitStateCallback at epoch ends, the rank dies when epoch KILL_AT begins. Writes OUT_DIR/weights.<rank>.npy.
"""
import os
import signal
import sys

import numpy as np

framework, kill_rank, kill_at, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.environ.setdefault("KERAS_BACKEND", "torch")

import ddl  # noqa: E402
import ddl.elastic  # noqa: E402

launch_rank = ddl.rank()


def data(rows: int, seed: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, 6)).astype(np.float32), rng.standard_normal((rows, 2)).astype(np.float32)


def die_if(now: int) -> None:
    if launch_rank == kill_rank and now == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


if framework == "torch":
    import torch

    import ddl.torch as dt

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), threshold=64)
    state = dt.elastic.TorchState(model, opt, step=0)

    @ddl.elastic.run
    def train(state):
        while state.step < 8:
            die_if(state.step)
            x, y = (torch.from_numpy(a) for a in data(12, state.step))
            mine = slice(ddl.rank(), None, ddl.size())
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
            opt.step()
            state.step += 1
            if state.step % 3 == 0:
                state.commit()

    train(state)
    weights = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
else:
    import keras

    import ddl.keras as dk

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    state = dk.elastic.KerasState(model, epoch=0)
    x, y = data(24, 5)

    class Die(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            die_if(epoch)

    @ddl.elastic.run
    def train(state):
        p, r = ddl.size(), ddl.rank()
        model.fit(x[r::p], y[r::p], batch_size=12 // p, epochs=4, initial_epoch=state.epoch, shuffle=False,
                  verbose=0, callbacks=[ddl.DDLCallback(), Die(), dk.elastic.CommitStateCallback(state)])

    train(state)
    weights = np.concatenate([np.asarray(keras.ops.convert_to_numpy(w)).ravel() for w in model.weights])
np.save(os.path.join(out, f"weights.{launch_rank}.npy"), weights)
