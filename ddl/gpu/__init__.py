"""The GPU path: collectives on CUDA arrays, NCCL for the GPUs of one node, MPI (staged through pinned host
memory) above them. Device arrays as ddl sees them (arrays), the libraries opened at run time (libraries),
the pure decisions (groups), one device's machinery (path), and a communicator's device collectives
(collectives), registered with the host path's seam (ddl.core.devices) on import.
"""
from ..core import devices as _devices
from .arrays import CudaArray, DeviceArray, host_dtype, is_device_array, view
from .collectives import DeviceCollectives
from .groups import cross_tree, nccl_groups, shard
from .libraries import load_driver, load_nccl, nccl_candidates
from .path import DevicePath

_devices.register(DeviceCollectives, view)

__all__ = ["CudaArray", "DeviceArray", "DeviceCollectives", "DevicePath", "cross_tree", "host_dtype",
           "is_device_array", "load_driver", "load_nccl", "nccl_candidates", "nccl_groups", "shard", "view"]
