"""horovod.keras / horovod.tensorflow.keras's API on Keras 3 (backends torch and tensorflow):
``import ddl.horovod.keras as hvd`` (or ``ddl.horovod.tensorflow.keras``) in place of Horovod's.

The optimizer and the callbacks are ddl.keras' (gradients averaged in fused buffers once per update, inside
model.fit's compiled step on TensorFlow); the collectives on values take numpy arrays or tensors and give
back tensors of the backend. What Keras 3 or ddl.keras does not offer is refused by name with what to use.
"""
from __future__ import annotations

import keras
import numpy as np

import ddl
from ... import keras as dk
from .. import (Adasum, Average, HorovodInternalError, Max, Min, ProcessSet, Product, Sum,  # noqa: F401
                add_process_set, allgather_object, barrier, communicator_of, cross_rank, cross_size,
                global_process_set, init, is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled, rank,
                remove_process_set, rooted, shutdown, size, unsupported)

_global = global_process_set


class Compression:
    """Horovod's names; ddl.keras sends gradients in their own dtype."""
    none = "none"
    fp16 = "fp16"


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0,
                         groups=None, process_set=_global):
    """The optimizer, averaging gradients across ranks before every update (ddl.keras.DistributedOptimizer).
    ``sparse_as_dense``, ``device_*``, ``num_groups`` and ``groups`` are accepted: Keras 3 hands ddl dense
    gradients, and ddl's buffers decide the fusion."""
    if compression != Compression.none:
        unsupported("compression=hvd.Compression.fp16 in ddl.horovod.keras", "Compression.none (ddl.horovod.torch "
                    "compresses, for PyTorch)")
    if op != Average:
        unsupported(f"DistributedOptimizer(op={op!r}) in ddl.horovod.keras", "op=hvd.Average")
    if gradient_predivide_factor != 1.0:
        unsupported("gradient_predivide_factor in ddl.horovod.keras", "1.0 (the average is one scaling after "
                    "the sum, in the gradients' dtype)")
    if backward_passes_per_step != 1:
        unsupported("backward_passes_per_step in ddl.horovod.keras", "the optimizer's own "
                    "gradient_accumulation_steps=N (ddl averages once per update)")
    if process_set is not _global and process_set.ranks is not None:
        unsupported("process_set= in ddl.horovod.keras' DistributedOptimizer", "the global set")
    return dk.DistributedOptimizer(optimizer)


def _array(value) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(value))


def _tensor(array: np.ndarray):
    return keras.ops.convert_to_tensor(array)


def _op(op, average) -> str:
    if op is None:
        return Sum if average is False else Average
    if op == Adasum:
        unsupported("op=hvd.Adasum in ddl.horovod.keras", "ddl.horovod.torch's allreduce(op=hvd.Adasum)")
    return op


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none, process_set=_global):
    a = _array(value)
    if prescale_factor != 1.0:
        a = a * prescale_factor
    out = communicator_of(process_set).allreduce(a, _op(op, average))
    if postscale_factor != 1.0:
        out = out * postscale_factor
    return _tensor(out)


def allgather(value, name=None, process_set=_global):
    return _tensor(communicator_of(process_set).allgather(_array(value)))


def broadcast(value, root_rank, name=None, process_set=_global):
    comm = communicator_of(process_set)
    return _tensor(rooted(process_set, root_rank, lambda root: comm.broadcast(_array(value), root)))


def broadcast_variables(variables, root_rank=0) -> None:
    dk.broadcast_variables(variables, root_rank)


def broadcast_global_variables(root_rank):
    unsupported("hvd.broadcast_global_variables (Keras 3 has no global variables)",
                "hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) in fit, or "
                "hvd.broadcast_variables(model.variables, root_rank)")


def broadcast_object(obj, root_rank=0, name=None, process_set=_global):
    from ...elastic import broadcast_object as world_broadcast

    if process_set is not _global and process_set.ranks is not None:
        unsupported("broadcast_object(process_set=...) in ddl.horovod.keras", "the global set")
    return world_broadcast(obj, root_rank)


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none):
    """keras.models.load_model, its optimizer made distributed."""
    objects = dict(custom_objects or {})
    for opt in custom_optimizers or []:
        objects[opt.__name__] = opt
    model = keras.models.load_model(filepath, custom_objects=objects)
    if model.optimizer is not None:
        DistributedOptimizer(model.optimizer, compression=compression)
    return model


from . import callbacks, elastic  # noqa: E402,F401 (hvd.callbacks, hvd.elastic)
