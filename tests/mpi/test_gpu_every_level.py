"""NCCL at every level of ddl's tree, on the stand-ins (tests/fakes): what each level's NCCL communicator carried,
as the stand-in NCCL logged it, is what ddl's plan says; with every level on NCCL no byte is copied between host
and device (the stand-in driver's counts); NCCL without ncclCommSplit (before 2.18) gets its groups from ids;
ddl.explain names each level's transport; a member that never joins is an error on every rank, within the
deadline, naming the group. Results themselves are checked per layout in test_gpu_levels.py.
"""
import os
import tempfile
from collections import OrderedDict

import numpy as np
import pytest
from mpi4py import MPI

from ddl import gpu
from ddl.core.communicator import Communicator
from ddl.errors import DeviceError
from ddl.gpu import path as path_module
from ddl.options import parse
from fakes import FakeDeviceArray, build, host_bytes, synchronize

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size
pytestmark = pytest.mark.skipif(SIZE < 4 or SIZE % 2, reason="two levels of NCCL groups need 4 or more ranks, even")


def tree():
    """Pairs of ranks that are not neighbours (r, r + size/2): level 0 groups of 2, level 1 groups of size/2."""
    half = SIZE // 2
    return [[r, r + half] for r in range(half)]


@pytest.fixture(scope="module", autouse=True)
def fakes():
    keys = ("DDL_CUDA_DRIVER", "DDL_NCCL_LIBRARY", "DDL_NCCL_LEVELS", "FAKE_NCCL_LOG", "FAKE_NCCL_VERSION")
    saved = {k: os.environ.get(k) for k in keys}
    libraries = tempfile.TemporaryDirectory(prefix="ddl-fakes-")
    os.environ.update(build(libraries.name))
    gpu.libraries._LIBS.clear()
    yield libraries.name
    gpu.libraries._LIBS.clear()
    libraries.cleanup()
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def communicator(levels: str, timeout: int = 60) -> Communicator:
    os.environ["DDL_NCCL_LEVELS"] = levels
    return Communicator.from_mpi(COMM, parse(f"-timeout {timeout}"), hierarchy=tree())


def logged(run, directory):
    """The collectives the stand-in NCCL ran on this rank during ``run()``: per communicator (in the order each
    first ran), a list of (kind, members, count, element size)."""
    log = os.path.join(directory, f"nccl-{RANK}.log")
    os.environ["FAKE_NCCL_LOG"] = log
    try:
        run()
        synchronize()
    finally:
        del os.environ["FAKE_NCCL_LOG"]
    by_comm = OrderedDict()
    with open(log) as f:
        for line in f:
            _, name, nranks, _, kind, count, size = line.split()
            by_comm.setdefault(name, []).append((kind, int(nranks), int(count), int(size)))
    os.remove(log)
    return list(by_comm.values())


@pytest.mark.mpi
@pytest.mark.parametrize("blocks", [1, 4])
def test_each_level_carries_what_the_plan_says_and_nothing_is_staged(fakes, blocks):
    n = 1 << 18  # float32: 1 MiB, a multiple of every level's groups
    comm = communicator("all")
    saved = path_module.PIPELINE_BYTES, path_module.MAX_BLOCKS
    path_module.PIPELINE_BYTES, path_module.MAX_BLOCKS = (n * 4) // blocks, blocks
    try:
        x = np.full(n, RANK + 1, np.float32)
        comm.allreduce(FakeDeviceArray(x), out=FakeDeviceArray(x))  # makes the groups
        synchronize()
        before = host_bytes()
        y = np.arange(n, dtype=np.float32) * (RANK + 1)
        levels = logged(lambda: comm.allreduce(FakeDeviceArray(y), out=FakeDeviceArray(y)), fakes)
        assert host_bytes() == before, "a device byte went through host memory"
        np.testing.assert_allclose(y, np.arange(n, dtype=np.float32) * (SIZE * (SIZE + 1) / 2), rtol=1e-6)
        # closed form: level 0 (pairs) reduce-scatters n elements into halves, level 1 (size/2 members) the half
        # into size/2 parts; the all-gathers undo them; in `blocks` pieces of each
        want = [[("reduce_scatter", 2, n // 2 // blocks), ("all_gather", 2, n // 2 // blocks)],
                [("reduce_scatter", SIZE // 2, n // SIZE // blocks), ("all_gather", SIZE // 2, n // SIZE // blocks)]]
        assert len(levels) == 2, f"rank {RANK}: {len(levels)} NCCL communicators ran collectives, not 2"
        for j, calls in enumerate(levels):
            got = sorted({(k, m, c) for k, m, c, _ in calls})
            assert got == sorted(want[j]), f"rank {RANK}, level {j}: {got}"
            assert len(calls) == 2 * blocks and all(size == 4 for *_, size in calls)
        # ... which is what ddl's plan (ddl.explain) says each level sends per rank
        plan = comm.explain(n * 4).device
        assert [lv.transport for lv in plan.levels] == ["nccl", "nccl"]
        carried = [sum(c * s * (m - 1) for _, m, c, s in calls) for calls in levels]
        assert carried == [lv.sends for lv in plan.levels]
    finally:
        path_module.PIPELINE_BYTES, path_module.MAX_BLOCKS = saved
        comm.close()


@pytest.mark.mpi
def test_a_staged_level_copies_through_the_host_and_runs_no_nccl_above(fakes):
    comm = communicator("1")
    try:
        n = 1 << 16
        x = np.ones(n, np.float32)
        comm.allreduce(FakeDeviceArray(x), out=FakeDeviceArray(x))
        synchronize()
        before = host_bytes()
        levels = logged(lambda: comm.allreduce(FakeDeviceArray(x), out=FakeDeviceArray(x)), fakes)
        down, up = (a - b for a, b in zip(host_bytes(), before))
        assert down == up == n * 4 // 2, f"rank {RANK}: {down}, {up} bytes staged, not half the buffer each way"
        assert [{m for _, m, _, _ in calls} for calls in levels] == [{2}]  # the pairs' level alone on NCCL
        assert np.all(x == SIZE * SIZE)  # (reduced twice in place)
        plan = comm.explain(n * 4)
        assert [lv.transport for lv in plan.device.levels] == ["nccl", "mpi (staged)"]
        assert "GPU arrays, per level: " in plan.text() and "mpi (staged)" in plan.text()
    finally:
        comm.close()


@pytest.mark.mpi
def test_nccl_without_split_makes_each_group_from_an_id(fakes):
    os.environ["FAKE_NCCL_VERSION"] = "21700"  # NCCL 2.17: no ncclCommSplit
    gpu.libraries._LIBS.clear()
    comm = communicator("all")
    try:
        x = np.arange(10007, dtype=np.float64) + RANK
        got = np.empty_like(x)
        comm.allreduce(FakeDeviceArray(x), out=FakeDeviceArray(got))
        synchronize()
        np.testing.assert_allclose(got, SIZE * np.arange(10007) + SIZE * (SIZE - 1) / 2)
        path = comm.road.named("device")._paths[0]
        assert [g.nranks for g in path.groups] == [2, SIZE // 2]
    finally:
        del os.environ["FAKE_NCCL_VERSION"]
        gpu.libraries._LIBS.clear()
        comm.close()


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_a_member_that_never_joins_is_an_error_naming_the_group_on_every_rank(fakes):
    comm = communicator("all", timeout=2)
    if RANK == SIZE - 1:
        os.environ["FAKE_NCCL_HANG"] = "1"  # its NCCL never finishes joining
    try:
        with pytest.raises(DeviceError, match=r"making the NCCL communicator of every rank.*(never joined|no "
                                              r"progress for 2)"):
            comm.allreduce(FakeDeviceArray(np.ones(8, np.float32)))
    finally:
        os.environ.pop("FAKE_NCCL_HANG", None)
        comm.close()
