"""The engine's host side: the communicator and its collectives (communicator), the agreement round that
starts each of them (agreement), the plan cache (plans), dtypes and ops (dtypes), allreduce_n's packing
(packing), fused gradient buffers (fusion), -check and -dump_iter (diagnostics), and the seam to the GPU path
(devices)."""
from .communicator import Communicator

__all__ = ["Communicator"]
