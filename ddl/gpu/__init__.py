"""The GPU path: collectives on CUDA arrays per level of ddl's tree, NCCL for the innermost levels (chosen by a
cost model), MPI staged through pinned host memory above them. Device arrays as ddl sees them (arrays), the
libraries opened at run time (libraries), the pure decisions (groups: every level's groups and the data's
layout; levels: which run on NCCL), how members hand each other NCCL's ids (exchange), one device's machinery
(path), and a communicator's device collectives (collectives), registered with the host path's seam
(ddl.core.devices) on import.
"""
from ..core import devices as _devices
from .arrays import CudaArray, DeviceArray, host_dtype, is_device_array, view
from .collectives import DeviceCollectives
from .groups import Layout, level_groups, nccl_levels, shard
from .levels import DeviceLevels, choose_levels
from .libraries import load_driver, load_nccl, nccl_candidates
from .path import DevicePath

_devices.register(DeviceCollectives, view)

__all__ = ["CudaArray", "DeviceArray", "DeviceCollectives", "DeviceLevels", "DevicePath", "Layout", "choose_levels",
           "host_dtype", "is_device_array", "level_groups", "load_driver", "load_nccl", "nccl_candidates",
           "nccl_levels", "shard", "view"]
