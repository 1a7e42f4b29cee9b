"""The GPU path's parts that need no GPU: library loading and its errors, the decisions (groups, trees, shards),
how device arrays are recognised and read. The orchestration under MPI is in tests/mpi/test_gpu_staged.py;
real GPUs in tests/gpu."""
import os
import subprocess
import sys

import numpy as np
import pytest

import ddl
from ddl import _native, gpu
from ddl.gpu.arrays import is_device_array, view
from ddl.errors import DDLError, DeviceError

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fakes import FakeDeviceArray, build  # noqa: E402

REAL_NCCL = [p for p in gpu.nccl_candidates({}) if os.path.isabs(p)]


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    env = build(str(tmp_path))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(gpu.libraries, "_LIBS", {})
    return env


def test_missing_driver_and_nccl_are_named(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu.libraries, "_LIBS", {})
    monkeypatch.setenv("DDL_CUDA_DRIVER", str(tmp_path / "libcuda.so.1"))
    with pytest.raises(DeviceError, match="cannot load the CUDA driver library .*libcuda.so.1"):
        gpu.load_driver()
    monkeypatch.setenv("DDL_NCCL_LIBRARY", str(tmp_path / "libnccl.so.2"))
    with pytest.raises(DeviceError, match=r"no usable NCCL library; install .*Tried: cannot load the NCCL library"):
        gpu.load_nccl()


def test_a_library_without_the_entry_points_is_refused_naming_one(tmp_path, monkeypatch):
    lib = tmp_path / "libempty.so"
    src = tmp_path / "empty.c"
    src.write_text("int nothing_here(void) { return 0; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    with pytest.raises(DeviceError, match="has no ncclGetVersion"):
        _native.NcclLibrary(str(lib))
    with pytest.raises(DeviceError, match="has no cuInit"):
        _native.CudaDriver(str(lib))


def test_no_device_and_old_nccl_are_refused(fakes, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "0")
    with pytest.raises(DeviceError, match="cuInit .*no CUDA-capable device"):
        _native.CudaDriver(fakes["DDL_CUDA_DRIVER"])
    monkeypatch.setenv("FAKE_NCCL_VERSION", "21305")
    with pytest.raises(DeviceError, match="version 21305; ddl needs 2.14"):
        _native.NcclLibrary(fakes["DDL_NCCL_LIBRARY"])


def test_a_group_that_never_forms_times_out_instead_of_hanging(fakes, monkeypatch):
    monkeypatch.setenv("FAKE_NCCL_HANG", "1")
    lib, drv = _native.NcclLibrary(fakes["DDL_NCCL_LIBRARY"]), _native.CudaDriver(fakes["DDL_CUDA_DRIVER"])
    with pytest.raises(DeviceError, match="creating the NCCL communicator.*no progress for 0.2"):
        _native.NcclGroup(lib, drv, 0, lib.unique_id(), 1, 0, 0.2)
    with pytest.raises(DeviceError, match="device 3 does not exist"):
        _native.NcclGroup(lib, drv, 3, lib.unique_id(), 1, 0, 1.0)
    with pytest.raises(ValueError, match="128 bytes"):
        _native.NcclGroup(lib, drv, 0, b"short", 1, 0, 1.0)


@pytest.mark.skipif(not REAL_NCCL, reason="no nvidia-nccl wheel installed")
def test_the_real_nccl_wheel_loads_without_a_gpu():
    lib = _native.NcclLibrary(REAL_NCCL[0])
    assert lib.version >= 21400
    a, b = lib.unique_id(), lib.unique_id()
    assert len(a) == 128 and a != b


def test_nccl_is_looked_for_in_the_setting_then_wheels_then_the_system(tmp_path):
    wheel = tmp_path / "site" / "nvidia" / "nccl" / "lib"
    wheel.mkdir(parents=True)
    (wheel / "libnccl.so.2").write_bytes(b"")
    assert gpu.nccl_candidates({}, [str(tmp_path / "site")]) == [str(wheel / "libnccl.so.2"), "libnccl.so.2"]
    assert gpu.nccl_candidates({"DDL_NCCL_LIBRARY": "/x/libnccl.so"}, [str(tmp_path / "site")]) == ["/x/libnccl.so"]


# -- decisions ----------------------------------------------------------------------------------------------

def test_level_groups_hold_the_members_that_share_every_other_position():
    racks = [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]  # 2 racks x 2 nodes x 2 GPUs
    assert gpu.level_groups(racks) == [
        [[0, 1], [2, 3], [4, 5], [6, 7]],  # the GPUs of a node
        [[0, 2], [4, 6], [1, 3], [5, 7]],  # GPU k of the nodes of a rack
        [[0, 4], [2, 6], [1, 5], [3, 7]],  # GPU k of node i of every rack
    ]
    assert gpu.level_groups([[0, 2], [1, 3]]) == [[[0, 2], [1, 3]], [[0, 1], [2, 3]]]  # round-robin placement
    assert gpu.level_groups([0, 1, 2]) == [[[0, 1, 2]]]
    assert gpu.level_groups([[0, 1, 2], [3, 4]]) == []  # uneven nodes: nothing NCCL's equal blocks can serve
    # even nodes, uneven racks: the node level only
    assert gpu.level_groups([[[0, 1], [2, 3]], [[4, 5]]]) == [[[0, 1], [2, 3], [4, 5]]]


def test_nccl_levels_follow_the_setting():
    assert [gpu.nccl_levels(s, 3, 1) for s in ("0", "1", "2", "5", "all", "auto")] == [0, 1, 2, 3, 3, 1]
    assert gpu.nccl_levels("auto", 2) == 2  # nothing priced: every regular level
    for bad in ("two", "-1", ""):
        with pytest.raises(DDLError, match=f"DDL_NCCL_LEVELS={bad!r}"):
            gpu.nccl_levels(bad, 2)


def test_layout_places_each_rank_where_in_place_reduce_scatters_leave_it():
    racks = [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    every = gpu.Layout(racks, 3, 5)
    assert every.position == (1, 0, 1)  # second GPU of node [4, 5]; its node first in [5, 7]; rack 2 of [1, 5]
    assert every.flat[5] == 1 * 4 + 0 * 2 + 1
    assert sorted(every.flat.values()) == list(range(8)) and every.outer_size == 1 and every.outer_tree == [0]
    # 16 elements: level 0 leaves the second half, level 1 its first half, level 2 that one's second half
    assert every.spans(16) == [(0, 16), (8, 8), (8, 4), (10, 2)]
    nodes = gpu.Layout(racks, 1, 5)  # NCCL in the node, MPI above among GPU 1 of every node: ranks 1, 3, 5, 7
    assert nodes.across == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert nodes.outer_tree == [[0, 1], [2, 3]]  # still two racks
    assert gpu.Layout([[0, 2], [1, 3]], 1, 0).outer_tree == [0, 1]
    assert gpu.Layout(racks, 0, 3).outer_tree == racks and gpu.Layout(racks, 0, 3).spans(5) == [(0, 5)]
    uneven = gpu.Layout([[[0, 1], [2, 3]], [[4, 5]]], 1, 4)
    assert uneven.across == [[0, 2, 4], [1, 3, 5]] and uneven.outer_tree == [[0, 1], [2]]


def test_the_cost_model_puts_network_levels_on_nccl_and_says_what_each_carries():
    from ddl.gpu.levels import choose_levels, level_sizes
    from ddl.topology.costs import LevelCost

    assert level_sizes([[[0, 1], [2, 3]], [[4, 5]]]) == [2, 2, 2] and level_sizes([0, 1, 2]) == [3]

    tree = [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    levels = [LevelCost("node", "nvlink4", 3e-6, 25e9 * 18, 1 / 4e9, "peer"),
              LevelCost("leaf", "ib_ndr", 5e-6, 48e9, 1 / 4e9),
              LevelCost("spine", "ib_ndr", 5e-6, 12e9, 1 / 4e9)]
    auto = choose_levels(tree, levels, "auto")
    # staging adds PCIe copies and CPU reductions on the same wires: NCCL at every level is cheapest
    assert auto.nccl == 3 and min(auto.seconds.values()) == auto.seconds[3] < auto.seconds[0]
    assert [lv.transport for lv in auto.levels] == ["nccl"] * 3
    # bytes per rank at 32 MiB: 2 S (g-1)/g on S, S/2, S/4
    assert [lv.sends for lv in auto.levels] == [32 << 20, 16 << 20, 8 << 20]
    staged = choose_levels(tree, levels, "1")
    assert [lv.transport for lv in staged.levels] == ["nccl", "mpi (staged)", "mpi (staged)"]
    assert "node (2 per group): nccl, 32 MiB sent per rank" in staged.text() and "DDL_NCCL_LEVELS=1" in staged.text()


def test_a_thin_uplink_above_the_node_is_staged_where_the_host_plan_overlaps_the_levels():
    from ddl.gpu.levels import choose_levels, model
    from ddl.topology.costs import LevelCost

    node = LevelCost("node", "shm", 3e-6, 4e9, 1 / 4e9, "peer")
    nic, uplink = 125e6, 62.5e6  # bytes/s: the emulated T2's 1 Gbit/s NICs, 500 Mbit/s between its racks
    t2 = [node, LevelCost("rack", "veth", 62e-6, nic, 1 / 4e9), LevelCost("spine", "veth", 62e-6, uplink, 1 / 4e9)]
    racks = [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    # NCCL's levels run one after another: the rack level's NICs, then the uplink (4 ranks' 8 MiB shards)
    s = 32 << 20
    rack, spine = 2 * (s / 4) * 2 / (nic * 0.92), 2 * (s / 8) * 4 / (uplink * 0.92)
    assert model(t2, [2, 2, 2], 3, s) > rack + spine
    # staged, ddl's host plan pipelines its blocks through both: about the uplink's time alone
    staged = model(t2, [2, 2, 2], 1, s)
    assert spine < staged < 1.1 * spine and model(t2, [2, 2, 2], 3, s) > 1.4 * staged
    assert choose_levels(racks, t2, "auto").nccl == 1  # measured on an H200: 1.81x NCCL alone; every level 0.80x
    # T1 (one switch, NICs alike): nothing to overlap, NCCL at both levels
    t1 = [node, LevelCost("switch", "veth", 62e-6, nic, 1 / 4e9)]
    assert choose_levels([[0, 1], [2, 3], [4, 5], [6, 7]], t1, "auto").nccl == 2


@pytest.mark.parametrize("count,g", [(0, 4), (1, 4), (10, 4), (12, 4), (7, 1), (1000003, 8)])
def test_shards_cover_the_buffer_once(count, g):
    blocks = [gpu.shard(count, g, k) for k in range(g)]
    per, padded, _ = blocks[0]
    assert padded % g == 0 and padded - count < g and padded >= count
    assert sum(valid for _, _, valid in blocks) == count
    covered = np.zeros(padded, np.int32)
    for k, (_, _, valid) in enumerate(blocks):
        covered[k * per:k * per + valid] += 1
    assert covered[:count].tolist() == [1] * count and not covered[count:].any()


# -- device arrays ------------------------------------------------------------------------------------------

def test_host_arrays_are_not_device_arrays():
    assert not is_device_array(np.ones(3))
    assert not is_device_array([1.0, 2.0])
    assert is_device_array(FakeDeviceArray(np.ones(3)))


def test_a_cpu_dlpack_capsule_is_read_but_refused_as_device_memory():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)[1:]
    info = _native.dlpack_info(a.__dlpack__())
    assert info["ptr"] == a.__array_interface__["data"][0]
    assert info["shape"] == (2, 4) and (info["code"], info["bits"], info["lanes"]) == (2, 32, 1)

    class CpuOnly:
        def __dlpack__(self, stream=None):
            return a.__dlpack__()

        def __dlpack_device__(self):
            return (2, 0)  # claims CUDA, hands out host memory

    with pytest.raises(DDLError, match="not in GPU memory"):
        view(CpuOnly())


def test_device_array_views_see_pointer_shape_dtype_stream():
    x = np.zeros((3, 5), np.int64)
    v = view(FakeDeviceArray(x, stream=2))
    assert (v.ptr, v.shape, v.dtype, v.device, v.stream) == (x.__array_interface__["data"][0], (3, 5), "int64", 0, 2)
    assert view(FakeDeviceArray(x)).stream == 0  # no stream named: the legacy default stream
    with pytest.raises(DDLError, match="not C-contiguous"):
        view(FakeDeviceArray(x[:, 1:]))


def test_without_a_gpu_ddl_says_why_on_a_device_call(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu.libraries, "_LIBS", {})
    monkeypatch.setenv("DDL_CUDA_DRIVER", str(tmp_path / "nothing.so"))
    comm = ddl.Communicator(None, 0, 1)
    with pytest.raises(DDLError, match="cannot load the CUDA driver library"):
        comm.allreduce(FakeDeviceArray(np.ones(4, np.float32)))
    assert comm.allreduce(np.ones(4, np.float32)).tolist() == [1.0] * 4  # host arrays are unaffected


def test_a_world_without_mpi_groups_ranks_by_host_when_hosts_hold_alike():
    from ddl.gpu.world import hosts_tree

    assert hosts_tree(["a", "a", "b", "b"]) == [[0, 1], [2, 3]]
    assert hosts_tree(["a", "b", "a", "b"]) == [[0, 2], [1, 3]]
    assert hosts_tree(["a", "a", "a"]) == [0, 1, 2]  # one host: one group
    assert hosts_tree(["a", "a", "b"]) == [0, 1, 2]  # uneven hosts: NCCL alone over every rank


def test_the_store_exchange_gathers_in_rank_order_forgets_old_rounds_and_names_who_never_came():
    import threading

    dist = pytest.importorskip("torch.distributed")
    from ddl.gpu.exchange import StoreExchange

    store = dist.HashStore()
    got = {}

    def rank(r):
        ex = StoreExchange(store, r, 3, timeout=20)
        got[r] = [ex.allgather(f"{r}-{n}") for n in range(4)] + [ex.broadcast(r * 10)]

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert got == {r: [[f"{q}-{n}" for q in range(3)] for n in range(4)] + [0] for r in range(3)}
    assert not store.check(["ddl/device/0/1", "ddl/device/2/2"])  # rounds two behind are removed
    assert store.check(["ddl/device/4/0"])
    lonely = StoreExchange(dist.HashStore(), 1, 3, timeout=0.5)
    with pytest.raises(DDLError, match=r"rank 1: waited 0.5 s in the store for rank\(s\) \[0, 2\]"):
        lonely.allgather("x")
