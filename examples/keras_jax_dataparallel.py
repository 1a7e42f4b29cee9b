"""Keras' own data parallelism on JAX, launched by ddlrun: the digits of keras_digits.py, no ddl in the script.

    ddlrun -np 2 python examples/keras_jax_dataparallel.py

ddlrun exports what keras.distribution.initialize() reads (KERAS_DISTRIBUTION_PROCESS_ID, _NUM_PROCESSES and
_JOB_ADDRESSES: JAX's coordinator on rank 0's host). The gradients are averaged by JAX's own collectives
inside the compiled step (gloo on CPUs, NCCL on GPUs), not by ddl: ddl cannot reach into JAX's compiled step.
Use it when the model is JAX-first; use ddl.keras on torch or tensorflow for ddl's topology-aware allreduce.
"""
import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import keras  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=32, help="per process")
    ap.add_argument("--lr", type=float, default=0.01, help="for one process; scaled by the processes")
    args = ap.parse_args()
    keras.distribution.initialize()  # from ddlrun's variables
    rank, size = jax.process_index(), jax.process_count()
    # each process feeds its own shard: the global batch is every process's batch together
    data_parallel = keras.distribution.DataParallel(devices=jax.devices())
    data_parallel.auto_shard_dataset = False
    keras.distribution.set_distribution(data_parallel)
    keras.utils.set_random_seed(1234)  # the same initial weights in every process (Keras replicates them)

    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int64")
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    steps = len(x_train) // (args.batch_size * size)  # whole global batches only: every process steps alike
    x_train, y_train = (a[rank::size][:steps * args.batch_size] for a in (x_train, y_train))

    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, activation="relu", padding="same"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=args.lr * size, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, shuffle=False,
              verbose=2 if rank == 0 else 0)
    test = len(x_test) // size * size  # evaluation too is data-parallel: equal shards
    loss, accuracy = model.evaluate(x_test[:test][rank::size], y_test[:test][rank::size],
                                    batch_size=args.batch_size, verbose=0)
    if rank == 0:
        print(f"processes {size}: test accuracy {accuracy:.4f}, loss {loss:.4f} on {test} held-out digits")


if __name__ == "__main__":
    main()
