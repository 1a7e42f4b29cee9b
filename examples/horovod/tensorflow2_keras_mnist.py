"""Horovod's tf.keras MNIST example, written as Horovod's tensorflow2_keras_mnist.py is (generated 8x8 digits
in place of the download): only the import line differs (``import ddl.horovod.tensorflow.keras as hvd``).
tf.keras is Keras 3 on TensorFlow here; Keras 3 takes no ``experimental_run_tf_function``. Rank 0 prints the
final loss and accuracy (averaged over ranks by MetricAverageCallback) and whether every rank holds the same
weights.

    ddlrun -np 2 python examples/horovod/tensorflow2_keras_mnist.py
"""
import argparse

import numpy as np
import tensorflow as tf

import ddl.horovod.tensorflow.keras as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.002)
args = parser.parse_args()

hvd.init()
tf.keras.utils.set_random_seed(42)

# generated digits: the label is which half of the image is brighter
rng = np.random.default_rng(hvd.rank())
images = rng.random((1024, 8, 8, 1)).astype(np.float32)
images[:512, :4] += 0.5
labels = np.repeat([0, 1], 512).astype(np.int64)
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().shuffle(1024, seed=hvd.rank())
dataset = dataset.batch(args.batch_size)

model = tf.keras.Sequential([
    tf.keras.Input((8, 8, 1)),
    tf.keras.layers.Conv2D(8, 3, activation="relu"),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(16, activation="relu"),
    tf.keras.layers.Dense(2, activation="softmax"),
])

# the learning rate grows with the ranks; the warm-up starts it from the single-rank value
scaled_lr = args.lr * hvd.size()
opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(scaled_lr), backward_passes_per_step=1,
                               average_aggregated_gradients=True)
model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"])

callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=0),
]
history = model.fit(dataset, steps_per_epoch=64 // hvd.size(), callbacks=callbacks, epochs=args.epochs,
                    verbose=1 if hvd.rank() == 0 else 0)

weights = float(sum(np.sum(w, dtype=np.float64) for w in model.get_weights()))
every = hvd.allgather(tf.constant([weights], dtype=tf.float64)).numpy().tolist()  # Horovod's keras has no allgather_object
if hvd.rank() == 0:
    print(f"final loss {history.history['loss'][-1]:.4f} accuracy {history.history['accuracy'][-1]:.4f} "
          f"ranks {hvd.size()} same weights on every rank {all(w == weights for w in every)}")
