"""The engine's host side: the communicator, a small face (communicator), over the road every collective takes
(road: a call described once by calls, then the first path of its table, paths/), what it plans (planning),
failures said for people (failures), the agreement round that starts each collective (agreement), the plan cache (plans), dtypes and ops (dtypes), allreduce_n's packing
(packing), fused gradient buffers (fusion), -check and -dump_iter (diagnostics), and the seam to the GPU path
(devices)."""
from .communicator import Communicator

__all__ = ["Communicator"]
