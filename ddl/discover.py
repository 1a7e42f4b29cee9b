"""Discovery at ddl.init: what each rank can see of its machine, and the topology all ranks build from it.

Each rank reports its host (MPI's processor name, one per shared-memory group), the NUMA node its CPU
affinity lies in (when it lies in one), and its host's GPUs with their NVLink peers from NVML (nvidia-ml-py;
skipped cleanly without a driver). The reports are exchanged once at init and every rank builds the same
Topology from them. Switch levels above the nodes come from the launcher (ddlrun --nodes/--racks/--aisles,
exported as DDL_NODES, DDL_RACKS, DDL_AISLES): hosts in order of their first rank fill racks, racks fill
aisles. A topology file (DDL_TOPOLOGY) replaces all of this and is checked against the hosts instead.
"""
from __future__ import annotations

import glob
import os
import re

from . import config, links
from .errors import TopologyError
from .topology import Topology


def numa_node() -> int | None:
    """The NUMA node holding every CPU this process may run on, or None (unbound, or no NUMA info)."""
    try:
        mine = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return None
    nodes = sorted(glob.glob("/sys/devices/system/node/node[0-9]*/cpulist"))
    if len(nodes) < 2:
        return None
    for path in nodes:
        try:
            cpus = _cpulist(open(path).read())
        except OSError:
            return None
        if mine <= cpus:
            return int(re.search(r"node(\d+)", path).group(1))
    return None


def _cpulist(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def nvml_gpus() -> list[dict]:
    """[{"bus": PCI bus id, "nvlink": {peer bus id: links}}] for this host's GPUs; [] without NVML."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no device: a CPU machine
        return []
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            bus = _text(pynvml.nvmlDeviceGetPciInfo(h).busId)
            peers: dict[str, int] = {}
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(h, link):
                        remote = _text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
                        peers[remote] = peers.get(remote, 0) + 1
                except Exception:  # link absent or NVLink unsupported
                    break
            gpus.append({"bus": bus, "nvlink": peers})
        return gpus
    except Exception:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _text(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def build(reports: list[dict], environ=os.environ) -> Topology:
    """The topology every rank derives from all ranks' reports (rank order), placement included."""
    hosts: dict[str, list[int]] = {}
    for r, rep in enumerate(reports):
        hosts.setdefault(rep["host"], []).append(r)
    network = config.get("DDL_NETWORK", environ)
    links.kind(network)  # a clear error for an unknown link kind
    t = Topology("discovered")
    parents = _switches(t, list(hosts), network, environ)
    placement: list[str | None] = [None] * len(reports)
    for h, ranks in hosts.items():
        node = t.add(h, "node", parents.get(h), {"kind": network} if parents.get(h) else None, host=h)
        gpus = reports[ranks[0]]["gpus"]
        if gpus and len(ranks) <= len(gpus):
            ids = [t.add(f"{h}/gpu{i}", "gpu", node, {"kind": "pcie3"}) for i in range(len(gpus))]
            bus = {g["bus"]: i for i, g in enumerate(gpus)}
            for i, g in enumerate(gpus):
                for peer, n in g["nvlink"].items():
                    j = bus.get(peer)
                    if j is not None and i < j:
                        t.link(ids[i], ids[j], "nvlink2", n)
            for k, r in enumerate(ranks):
                placement[r] = ids[k]
            continue
        numa = [reports[r]["numa"] for r in ranks]
        if None not in numa and len(set(numa)) > 1:
            sockets = {}
            for n in sorted(set(numa)):
                sockets[n] = t.add(f"{h}/cpu{n}", "cpu", node, {"kind": "shm"}, slots=numa.count(n))
            ids = list(sockets.values())
            for i in range(len(ids)):
                for j in range(i + 1, len(ids)):
                    t.link(ids[i], ids[j], "upi")
            for r, n in zip(ranks, numa):
                placement[r] = sockets[n]
        else:
            t.graph.nodes[node]["slots"] = len(ranks)
            for r in ranks:
                placement[r] = node
    t.placement = placement  # type: ignore[assignment]
    return t.validate()


def _switches(t: Topology, hosts: list[str], network: str, environ) -> dict[str, str]:
    """Switch levels over the hosts: racks of DDL_NODES nodes, aisles of DDL_RACKS racks (DDL_AISLES, when
    given, must match), all joined by one top switch. Uplinks are as wide as the node links under them
    (non-blocking). Returns each host's switch; {} for a single host."""
    if len(hosts) < 2:
        return {}
    nodes, racks, aisles = (_count(environ, v) for v in ("DDL_NODES", "DDL_RACKS", "DDL_AISLES"))
    nracks = -(-len(hosts) // nodes) if nodes and nodes < len(hosts) else 0
    naisles = -(-nracks // racks) if nracks and racks and racks < nracks else 0
    if aisles and aisles != max(naisles, 1):
        raise TopologyError(f"DDL_AISLES={aisles}, but {len(hosts)} hosts in racks of {nodes} nodes and aisles "
                            f"of {racks} racks make {max(naisles, 1)}")
    top = t.add("network", "switch", level="network")
    aisle = [t.add(f"aisle{i}", "switch", top, {"kind": network, "links": nodes * racks}, level="aisle")
             for i in range(naisles)]
    rack = [t.add(f"rack{i}", "switch", aisle[i // racks] if aisle else top, {"kind": network, "links": nodes},
                  level="rack") for i in range(nracks)]
    return {h: rack[i // nodes] if rack else top for i, h in enumerate(hosts)}


def _count(environ, name: str) -> int | None:
    text = config.get(name, environ)
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise TopologyError(f"{name}={text!r}: expected a positive whole number")
    return int(text)
