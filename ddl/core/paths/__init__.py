"""The paths a collective can take, one module each, and the order of a communicator's table (ddl.core.road).

    device        GPU arrays (ddl.gpu registers it; ddl.core.devices)
    alone         a job of one rank
    host memory   ranks that share one host: one shared-memory segment
    riding        small calls in the agreement round itself
    planned       ddl's plan per level on the native executor (takes every call: the last resort)

Adding a path is one module here (or in its own room, registered as the device path is) and one entry below.
"""
from __future__ import annotations

from .. import devices
from .alone import Alone
from .host_memory import HostMemory
from .planned import Planned
from .riding import Riding


def table(comm) -> list:
    """The paths of ``comm``, in the order a call tries them."""
    planned = Planned(comm)
    return [devices.path_for(comm), Alone(comm), HostMemory(comm), Riding(comm, planned), planned]


__all__ = ["Alone", "HostMemory", "Planned", "Riding", "table"]
