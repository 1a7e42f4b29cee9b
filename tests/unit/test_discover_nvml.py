"""NVML discovery against the machine library: a stand-in NVML answers as NVML does on a DGX-1, a DGX H100 and a
Summit node (per-link remote PCI ids and device types, NUMA nodes, NVLink and PCIe generations — the published
topologies written out link by link here), and the GPUs, their parents, uplinks and NVLinks that discovery
builds must be those of topology/dgx1.json, dgx-h100.json and summit-node.json."""
import pytest

from ddl import topology

from ddl.topology import discover


class FakeNvml:
    NVML_NVLINK_MAX_LINKS = 18
    NVML_NVLINK_DEVICE_TYPE_GPU, NVML_NVLINK_DEVICE_TYPE_IBMNPU, NVML_NVLINK_DEVICE_TYPE_SWITCH = 0, 1, 2

    def __init__(self, buses, numa, links, version, pcie=None):
        """links[i]: per NVLink of GPU i, the peer GPU index, or "switch" / "cpu"."""
        self.buses, self.numa, self.links, self.version, self.pcie = buses, numa, links, version, pcie

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.buses)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetPciInfo(self, h):
        return type("Pci", (), {"busId": f"0000{self.buses[h]}".encode()})

    def nvmlDeviceGetNumaNodeId(self, h):
        return self.numa[h]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        if self.pcie is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return self.pcie

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link >= len(self.links[h]):
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return 1

    def nvmlDeviceGetNvLinkVersion(self, h, link):
        return self.version

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        peer = self.links[h][link]
        return {"switch": 2, "cpu": 1}.get(peer, 0)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return self.nvmlDeviceGetPciInfo(self.links[h][link])


def links_from_pairs(n, pairs):
    links = [[] for _ in range(n)]
    for a, b, count in pairs:
        links[a] += [b] * count
        links[b] += [a] * count
    return links


DGX1 = FakeNvml(
    [f":{b}:00.0" for b in ("06", "07", "0a", "0b", "85", "86", "89", "8a")], [0] * 4 + [1] * 4,
    links_from_pairs(8, [(0, 1, 1), (0, 2, 1), (0, 3, 2), (1, 2, 2), (1, 3, 1), (2, 3, 1), (4, 5, 1), (4, 6, 1),
                         (4, 7, 2), (5, 6, 2), (5, 7, 1), (6, 7, 1), (0, 4, 2), (1, 5, 2), (2, 6, 2), (3, 7, 2)]),
    version=2, pcie=3)
DGX_H100 = FakeNvml([f":{b}:00.0" for b in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")], [0] * 4 + [1] * 4,
                    [["switch"] * 18 for _ in range(8)], version=4, pcie=5)
SUMMIT = FakeNvml([f":{b}:00.0" for b in ("04", "05", "06", "35", "36", "37")], [0] * 3 + [8] * 3,
                  [links[:] + ["cpu", "cpu"] for links in links_from_pairs(
                      6, [(0, 1, 2), (0, 2, 2), (1, 2, 2), (3, 4, 2), (3, 5, 2), (4, 5, 2)])], version=2)


def gpu_shape(t: topology.Topology, host: str) -> dict:
    """What NVML can know of a node: each GPU's parent and uplink, the GPU-GPU links, the NVSwitch's uplink."""
    g = t.graph
    short = lambda v: v[len(host) + 1:] if v.startswith(host + "/") else ("node" if v == host else v)  # noqa: E731
    shape = {}
    for v in sorted(t.devices(host)):
        p = t.parent(v)
        up = g.edges[v, p]
        shape[short(v)] = (short(p), t.kind(p), up["kind"], up["links"])
        for w in g.neighbors(v):
            e = g.edges[v, w]
            if t.kind(w) == "gpu" and not e["uplink"]:
                shape[f"{short(min(v, w))}-{short(max(v, w))}"] = (e["kind"], e["links"])
    switch = f"{host}/nvswitch"
    if switch in g:
        shape["nvswitch"] = g.edges[switch, host]["kind"]
    return shape


@pytest.mark.parametrize("machine,nvml", [("dgx1", DGX1), ("dgx-h100", DGX_H100), ("summit-node", SUMMIT)])
def test_nvml_discovery_matches_the_machine_file(machine, nvml):
    model = topology.load(machine)
    host = model.nodes()[0]
    gpus = discover.nvml_gpus(nvml)
    assert len(gpus) == len(model.devices(host))
    found = discover.build([{"host": host, "numa": None, "gpus": gpus}] * len(gpus))
    assert gpu_shape(found, host) == gpu_shape(model, host)


def test_nvml_reports_are_read_link_by_link():
    gpus = discover.nvml_gpus(SUMMIT)
    assert gpus[0] == {"bus": "0000:04:00.0", "numa": 0, "pcie": None, "nvlink": {"0000:05:00.0": 2,
                       "0000:06:00.0": 2}, "nvlink_version": 2, "switch_links": 0, "cpu_links": 2}
    h100 = discover.nvml_gpus(DGX_H100)[5]
    assert (h100["switch_links"], h100["nvlink"], h100["numa"], h100["pcie"]) == (18, {}, 1, 5)


def test_nvml_that_fails_to_start_means_no_gpus():
    class Broken(FakeNvml):
        def nvmlInit(self):
            raise RuntimeError("NVML_ERROR_DRIVER_NOT_LOADED")

    assert discover.nvml_gpus(Broken([], [], [], 2)) == []


def test_two_discovered_dgx_h100_nodes_give_nccl_one_group_per_node():
    """Discovery -> tree -> the GPU path's levels: NCCL inside each node (NVLink-priced level), GPU k of each node
    a group of the level between them."""
    from ddl import gpu

    gpus = discover.nvml_gpus(DGX_H100)
    reports = [{"host": h, "numa": None, "gpus": gpus} for h in ("dgx-a", "dgx-b") for _ in range(8)]
    found = discover.build(reports)
    tree, levels = found.hierarchy(found.place([r["host"] for r in reports], 16))
    assert tree == [list(range(8)), list(range(8, 16))]
    assert levels[0].link.startswith("nvlink4") and levels[0].bandwidth > 10 * levels[1].bandwidth
    assert gpu.level_groups(tree)[0] == [list(range(8)), list(range(8, 16))]
    assert gpu.Layout(tree, 1, 3).across[3] == [3, 11]  # GPU 3 of each node: one MPI pair
    assert gpu.Layout(tree, 2, 3).mine == [list(range(8)), [3, 11]]  # or NCCL between them too


def test_ddl_topo_without_a_source_plans_one_rank_per_gpu(monkeypatch, capsys):
    """On a GPU host (a DGX H100's NVML here) ddl-topo shows one rank per GPU, not one per core; --ranks still
    chooses otherwise."""
    import socket

    from ddl.tools import topo as topo_cli

    gpus = discover.nvml_gpus(DGX_H100)
    t = topo_cli.load(None, gpus=gpus)
    assert t.capacity() == 8 and len(t.devices(socket.gethostname())) == 8
    assert topo_cli.load(None, ranks=20, gpus=gpus).capacity() == 20  # more ranks than GPUs: slots again
    assert topo_cli.load(None, gpus=[]).capacity() >= 1  # no GPU: one rank per core
    monkeypatch.setattr(discover, "nvml_gpus", lambda nvml=None: gpus)
    assert topo_cli.main(["--quiet", "--plan", "64M"]) == 0
    assert "nvlink4" in capsys.readouterr().out  # the GPUs' level is planned
