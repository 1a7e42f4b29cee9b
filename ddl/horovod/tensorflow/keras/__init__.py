"""``import ddl.horovod.tensorflow.keras as hvd``: the same as ddl.horovod.keras (tf.keras is Keras 3)."""
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # a tf.keras script means TensorFlow, if nothing said

from ...keras import *  # noqa: E402,F401,F403
from ...keras import (DistributedOptimizer, allgather_object, broadcast_object, callbacks, elastic,  # noqa: E402,F401
                      load_model)
