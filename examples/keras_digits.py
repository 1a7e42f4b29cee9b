"""IBM DDL's Keras walk-through for Keras 3: handwritten digits (scikit-learn's copy, shipped inside the
package: nothing is downloaded), a small convolutional network, data-parallel over ddl.

    KERAS_BACKEND=torch ddlrun -np 2 python examples/keras_digits.py
    KERAS_BACKEND=torch ddlrun -np 4 python examples/keras_digits.py --epochs 20
    KERAS_BACKEND=tensorflow ddlrun -np 2 python examples/keras_digits.py

The four changes that distribute a Keras script are marked "DDL change".
"""
import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import ddl  # noqa: E402  DDL change 1: import ddl


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.01, help="for one rank; scaled by the ranks")
    args = ap.parse_args()
    keras.utils.set_random_seed(1234 + ddl.rank())  # different initial weights: the broadcast makes them agree

    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]  # 8x8 grey images, 0..1
    y = digits.target.astype("int64")
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)

    # DDL change 2: each rank trains on its own shard of the data
    x_train, y_train = x_train[ddl.rank()::ddl.size()], y_train[ddl.rank()::ddl.size()]

    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, activation="relu", padding="same"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    # DDL change 3: the learning rate grows with the number of ranks (the global batch does)
    optimizer = keras.optimizers.SGD(learning_rate=args.lr * ddl.size(), momentum=0.9)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    # DDL change 4: DDLCallback first (gradients and metrics averaged over ranks), DDLGlobalVariablesCallback
    # last (rank 0's weights and optimizer state to every rank when training begins)
    callbacks = [ddl.DDLCallback(),
                 ddl.keras.LearningRateWarmupCallback(args.lr * ddl.size(), warmup_epochs=3),
                 ddl.DDLGlobalVariablesCallback()]
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks,
              verbose=2 if ddl.rank() == 0 else 0)

    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if ddl.rank() == 0:
        print(f"ranks {ddl.size()}: test accuracy {accuracy:.4f}, loss {loss:.4f} on {len(y_test)} held-out digits "
              f"(Keras on {keras.backend.backend()})")


if __name__ == "__main__":
    main()
