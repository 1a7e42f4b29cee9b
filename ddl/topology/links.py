"""The kinds of link a topology may hold, in one ordered list, with their nominal constants in one table.

Order: innermost and fastest first (GPU fabrics, then the CPU's, then the network), as NCCL orders its path
types. Bandwidth is GB/s per direction for one link (an edge may bundle several: ``links``); latency is
the hardware's one-way latency in microseconds. The figures are nominal (vendor data sheets and NCCL's
``topo.h`` table, see reference/anchors.md), good enough to rank algorithms; a topology file may override
both on any edge with measured values.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinkKind:
    name: str
    bandwidth: float  # GB/s per direction, one link
    latency: float    # microseconds, one way
    meaning: str


LINK_KINDS: tuple[LinkKind, ...] = (
    LinkKind("nvlink1", 20.0, 1.0, "NVLink 1.0 brick (P100)"),
    LinkKind("nvlink2", 25.0, 1.0, "NVLink 2.0 brick (V100; Power9 CPU to GPU on Summit)"),
    LinkKind("nvlink3", 25.0, 1.0, "NVLink 3.0 link (A100)"),
    LinkKind("nvlink4", 25.0, 1.0, "NVLink 4.0 link (H100; 18 per GPU into the NVSwitches)"),
    LinkKind("xbus", 64.0, 0.5, "IBM Power9 X-Bus between the two sockets of a node"),
    LinkKind("upi", 20.8, 0.5, "Intel UPI link between sockets"),
    LinkKind("pcie3", 12.0, 1.5, "PCIe gen3 x16 (NCCL's nominal 12 GB/s)"),
    LinkKind("pcie4", 24.0, 1.5, "PCIe gen4 x16"),
    LinkKind("pcie5", 48.0, 1.5, "PCIe gen5 x16"),
    LinkKind("shm", 4.0, 1.0, "shared memory between processes of one host (measured order, 2-core CI machine)"),
    LinkKind("ib_edr", 12.5, 1.0, "InfiniBand EDR, 100 Gb/s per port"),
    LinkKind("ib_hdr", 25.0, 1.0, "InfiniBand HDR, 200 Gb/s per port"),
    LinkKind("ib_ndr", 50.0, 1.0, "InfiniBand NDR, 400 Gb/s per port (about 48 GB/s measured)"),
    LinkKind("eth_100g", 12.5, 5.0, "100 Gb Ethernet (RoCE or TCP)"),
    LinkKind("eth_25g", 3.125, 10.0, "25 Gb Ethernet"),
    LinkKind("eth_10g", 1.25, 15.0, "10 Gb Ethernet"),
    LinkKind("veth", 0.125, 30.0, "a shaped veth link of the emulated cluster (1 Gb/s unless the file says)"),
)

BY_NAME = {k.name: k for k in LINK_KINDS}
ORDER = {k.name: i for i, k in enumerate(LINK_KINDS)}

# Per message, on top of the wire: posting, matching and completing it in MPI (seconds).
SOFTWARE_OVERHEAD = 2e-6
# Seconds per byte combined by one rank, by the kind of device its data lives on: the CPU kernels on host
# memory (measured order, 2-core CI machine), and a GPU's kernels, bound by HBM (V100 900 GB/s, read two
# write one). Plans for GPU machines assume the GPU path (data reduced on the device).
REDUCE_SECONDS_PER_BYTE = {"cpu": 1 / 4e9, "gpu": 1 / 300e9}


def kind(name: str) -> LinkKind:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown link kind {name!r} (known: {', '.join(BY_NAME)})") from None
