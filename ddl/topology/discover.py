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

from .. import config
from . import links
from ..errors import TopologyError
from .graph import Topology


def exchange(comm, by_name: bool = False) -> tuple[list[dict], tuple[int, int, int]]:
    """Every rank's report, gathered on the mpi4py communicator ``comm``, and this rank's (local rank, local
    size, hosts). Each host is named by its processor name, made unique by its first rank when two
    shared-memory groups share a name. ``by_name``: a host is its processor name (ranks that joined through a
    store: MPI places every one of them on one node, each having been alone in its own world)."""
    from mpi4py import MPI

    if by_name:
        names = comm.allgather(MPI.Get_processor_name())
        local = comm.Split(names.index(names[comm.rank]), comm.rank)
    else:
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        first = local.bcast(comm.rank)
        name = local.bcast(MPI.Get_processor_name())
        gpus = local.bcast(nvml_gpus() if local.rank == 0 else None)
        reports = comm.allgather({"host": name, "first": first, "numa": numa_node(), "gpus": gpus})
        names = {(r["host"], r["first"]) for r in reports}
        if len({h for h, _ in names}) != len(names):  # two shared-memory groups under one name
            for r in reports:
                r["host"] = f"{r['host']}#{r['first']}"
        return reports, (local.rank, local.size, len(names))
    finally:
        local.Free()


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


def nvml_gpus(nvml=None) -> list[dict]:
    """This host's GPUs as NVML reports them, [] without NVML (nvidia-ml-py) or a driver. Per GPU: "bus" (PCI
    bus id), "numa" (NUMA node, None if unknown), "pcie" (link generation), "nvlink" ({peer GPU bus id: links}),
    "nvlink_version", "switch_links" (links into NVSwitches), "cpu_links" (NVLink to the CPU, as on Power9)."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return []
    try:
        nvml.nvmlInit()
    except Exception:  # no driver, no device: a CPU machine
        return []
    try:
        return [_nvml_gpu(nvml, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    except Exception:
        return []
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _nvml_gpu(nvml, h) -> dict:
    bus = _bus(nvml.nvmlDeviceGetPciInfo(h).busId)
    gpu = {"bus": bus, "numa": _gpu_numa(nvml, h, bus), "pcie": _optional(nvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
           "nvlink": {}, "nvlink_version": None, "switch_links": 0, "cpu_links": 0}
    kinds = {getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2): "switch_links",
             getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_IBMNPU", 1): "cpu_links"}
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if not nvml.nvmlDeviceGetNvLinkState(h, link):
                continue
        except Exception:  # past this GPU's last link, or no NVLink at all
            break
        gpu["nvlink_version"] = gpu["nvlink_version"] or _optional(nvml.nvmlDeviceGetNvLinkVersion, h, link)
        remote = _optional(nvml.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
        if remote in kinds:
            gpu[kinds[remote]] += 1
        else:
            peer = _bus(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
            gpu["nvlink"][peer] = gpu["nvlink"].get(peer, 0) + 1
    return gpu


def _optional(fn, *args):
    try:
        return fn(*args)
    except Exception:  # not supported by this GPU or NVML version
        return None


def _bus(x) -> str:
    """NVML's bus ids are 8-digit domains ("00000000:07:00.0"); sysfs uses 4 ("0000:07:00.0"). Keep sysfs's."""
    text = _text(x).lower()
    domain, _, rest = text.partition(":")
    return f"{domain[-4:]}:{rest}" if rest else text


def _gpu_numa(nvml, h, bus: str) -> int | None:
    node = _optional(getattr(nvml, "nvmlDeviceGetNumaNodeId", lambda h: None), h)
    if node is None or node < 0:
        try:
            node = int(open(f"/sys/bus/pci/devices/{bus}/numa_node").read())
        except (OSError, ValueError):
            return None
    return node if node >= 0 else None


def _text(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def build(reports: list[dict], environ=os.environ, probed=None) -> Topology:
    """The topology every rank derives from all ranks' reports (rank order), placement included. Switch levels:
    the launcher's tiers where given, else ``probed`` (a ddl.topology.probe ProbeResult, measured links), else
    one switch over all hosts."""
    hosts: dict[str, list[int]] = {}
    for r, rep in enumerate(reports):
        hosts.setdefault(rep["host"], []).append(r)
    network = config.get("DDL_NETWORK", environ)
    links.kind(network)  # a clear error for an unknown link kind
    t = Topology("discovered")
    tiers = [_count(environ, v) for v in ("DDL_NODES", "DDL_RACKS", "DDL_AISLES")]
    if probed is not None and not any(tiers) and len(hosts) > 1:
        t.name = "probed"
        uplinks = _probed_switches(t, probed, network)
    else:
        uplinks = {h: (p, {"kind": network}) for h, p in _switches(t, list(hosts), network, environ).items()}
    placement: list[str | None] = [None] * len(reports)
    for h, ranks in hosts.items():
        parent, up = uplinks.get(h, (None, None))
        node = t.add(h, "node", parent, up, host=h)
        gpus = reports[ranks[0]]["gpus"]
        if gpus and len(ranks) <= len(gpus):
            ids = _gpu_node(t, h, node, gpus)
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


def _gpu_node(t: Topology, h: str, node: str, gpus: list[dict]) -> list[str]:
    """A host's GPUs under their sockets (the NUMA nodes NVML gives) or an NVSwitch, named as the machine
    files name them ({host}/cpu{n}, {host}/nvswitch, {host}/gpu{i}), with NVLink of the version NVML reports."""
    numa = sorted({g.get("numa") for g in gpus} - {None})
    sockets = ({n: t.add(f"{h}/cpu{k}", "cpu", node, {"kind": "shm"}) for k, n in enumerate(numa)}
               if len(numa) > 1 else {})  # named in order: Power9's NUMA nodes are 0 and 8
    cpus = list(sockets.values())
    for i in range(len(cpus)):
        for j in range(i + 1, len(cpus)):
            t.link(cpus[i], cpus[j], "upi")
    version = next((g["nvlink_version"] for g in gpus if g.get("nvlink_version")), 2)
    nvlink = f"nvlink{min(max(int(version), 1), 4)}"
    switch = (t.add(f"{h}/nvswitch", "switch", node, {"kind": _pcie(gpus[0])}, level="nvswitch")
              if any(g.get("switch_links") for g in gpus) else None)
    ids = []
    for i, g in enumerate(gpus):
        if switch is not None:
            parent, up = switch, {"kind": nvlink, "links": g["switch_links"]}
        else:
            parent = sockets.get(g.get("numa"), node)
            up = {"kind": nvlink, "links": g["cpu_links"]} if g.get("cpu_links") else {"kind": _pcie(g)}
        ids.append(t.add(f"{h}/gpu{i}", "gpu", parent, up))
    bus = {g["bus"]: i for i, g in enumerate(gpus)}
    for i, g in enumerate(gpus):
        for peer, n in g["nvlink"].items():
            j = bus.get(peer)
            if j is not None and i < j:
                t.link(ids[i], ids[j], nvlink, n)
    return ids


def _pcie(gpu: dict) -> str:
    gen = gpu.get("pcie")
    return f"pcie{gen}" if gen in (3, 4, 5) else "pcie3"


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


def _probed_switches(t: Topology, probed, network: str) -> dict[str, tuple[str, dict]]:
    """The probe's switch tree, its links priced as measured: a child's uplink carries the bandwidth its level
    measured, and half the one-way time measured between siblings of that level (up and down again), less the
    per-message software cost the planner adds itself. The planner prices a level by its own links: what lies
    below was paid at lower levels."""
    levels = probed.levels
    hop = [max(0.0, lv.latency - links.SOFTWARE_OVERHEAD) / 2 for lv in levels]
    measured = [probed.source == "probe" and ("calibrated" if lv.how == "calibrated" else True) for lv in levels]
    link = lambda k: {"kind": network, "bandwidth": levels[k].bandwidth / 1e9, "latency": hop[k] * 1e6,
                      "measured": measured[k]}
    out: dict[str, tuple[str, dict]] = {}
    counter = [0] * len(levels)

    def add(tree, depth: int, parent: str | None) -> None:  # depth: levels below this group
        k = depth - 1
        name = f"{levels[k].name}{counter[k]}"
        counter[k] += 1
        t.add(name, "switch", parent, link(depth) if parent is not None else None, level=levels[k].name)
        for child in tree:
            if isinstance(child, str):
                out[child] = (name, link(0))
            else:
                add(child, depth - 1, name)
    add(probed.tree, len(levels), None)
    return out


def _count(environ, name: str) -> int | None:
    text = config.get(name, environ)
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise TopologyError(f"{name}={text!r}: expected a positive whole number")
    return int(text)
