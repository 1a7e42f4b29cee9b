"""horovod.torch.elastic on ddl.elastic: ``@hvd.elastic.run``, ``hvd.elastic.TorchState(model, optimizer,
**values)``, ``hvd.elastic.ObjectState(**values)``; states have ``commit()``, ``restore()``, ``sync()``,
``check_host_updates()`` and ``register_reset_callbacks()``. Launch with ``ddlrun --min-np K`` (in place,
Open MPI's ULFM) and ``--host-discovery-script``/``--reset-limit`` (launched again, growing to --max-np).
"""
from __future__ import annotations

from ...elastic import HostsUpdated, State, run  # noqa: F401 (Horovod's names)
from ...torch.elastic import TorchState as _TorchState
from .. import unsupported

HostsUpdatedInterrupt = HostsUpdated


class TorchState(_TorchState):
    def __init__(self, model=None, optimizer=None, **values):
        super().__init__(model, optimizer, **values)


class ObjectState(State):
    """Values (picklable) kept across failures; Horovod's ``bcast_object``/``get_rank`` are not needed."""

    def __init__(self, bcast_object=None, get_rank=None, **values):
        super().__init__(**values)


def __getattr__(name: str):
    if name == "ElasticSampler":
        unsupported("hvd.elastic.ElasticSampler", "a torch DistributedSampler(num_replicas=hvd.size(), "
                    "rank=hvd.rank()) made again in a reset callback, skipping the samples state.batch says")
    raise AttributeError(f"module 'ddl.horovod.torch.elastic' has no attribute {name!r}")
