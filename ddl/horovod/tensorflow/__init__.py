"""horovod.tensorflow's names on ddl: only its Keras module, ``ddl.horovod.tensorflow.keras`` (tf.keras is
Keras 3 with TensorFlow ≥ 2.16). TensorFlow's own graph collectives (hvd.allreduce on tf.Tensor inside
tf.function) are not offered: ddl's Keras optimizer averages inside model.fit's compiled step instead."""
