"""ddl on real GPUs (marker gpu; skipped where there is none): cupy and torch inputs, every dtype and op,
results on the same device, stream order, the MPI levels staged through pinned memory (every rank its own
node: DDL_NCCL_LEVELS=0), NCCL groups of several processes on one GPU with MPI between them (DDL_NCCL_LEVELS=1)
and NCCL at every level (DDL_NCCL_LEVELS=all)."""
import os

import numpy as np
import pytest
from mpi4py import MPI

import ddl
from ddl.errors import DDLError

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size
pytestmark = [pytest.mark.gpu, pytest.mark.mpi]

try:
    from ddl import gpu as _gpu
    _DRIVER = _gpu.load_driver()
    HAVE_GPU = _DRIVER.devices > 0
except DDLError:
    HAVE_GPU = False
if not HAVE_GPU:
    pytest.skip("no GPU here", allow_module_level=True)

from test_collectives import OPS, assert_reduced, contribution, valid  # noqa: E402  (tests/mpi on the path)

FRAMEWORKS = ["cupy", "torch"]
DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64"]
SIZES = [0, 1, 10007, (6 << 20) // 4 + 3]


def numpy_dtype(name):
    import ml_dtypes

    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


def to_device(framework, host):
    if framework == "cupy":
        cupy = pytest.importorskip("cupy")
        return cupy.asarray(host)
    torch = pytest.importorskip("torch")
    if host.dtype.name == "bfloat16":
        return torch.from_numpy(host.astype(np.float32)).to(torch.bfloat16).cuda()
    return torch.from_numpy(host).cuda()


def to_host(framework, x):
    if framework == "cupy":
        return x.get()
    if str(x.dtype) == "torch.bfloat16":
        import ml_dtypes

        return x.float().cpu().numpy().astype(ml_dtypes.bfloat16)
    return x.cpu().numpy()


def device_of(framework, x):
    return x.device.id if framework == "cupy" else x.device.index


@pytest.fixture(scope="module", params=["0", "1", "all"], ids=["mpi-levels", "nccl-groups", "nccl-every-level"])
def world(request):
    os.environ["DDL_NCCL_LEVELS"] = request.param
    ddl.finalize()
    # nccl-groups: pairs of ranks form a "node" (one NCCL group), the pairs talk over MPI; nccl-every-level: the
    # same tree with NCCL between the pairs too
    tree = [list(range(i, min(i + 2, SIZE))) for i in range(0, SIZE, 2)] if SIZE > 1 else None
    ddl.init(COMM, options="-timeout 60", hierarchy=tree if request.param != "0" and SIZE % 2 == 0 else None)
    yield request.param
    ddl.finalize()


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("n", SIZES)
def test_allreduce_on_the_device(world, framework, dtype, op, n):
    if not valid(numpy_dtype(dtype), op):
        pytest.skip("avg is refused for integers")
    if framework == "cupy" and dtype == "bfloat16":
        pytest.skip("cupy has no bfloat16")
    host = contribution(RANK, n, numpy_dtype(dtype), op)
    x = to_device(framework, host)
    result = ddl.allreduce(x, op)
    assert type(result) is type(x) and device_of(framework, result) == device_of(framework, x)
    assert_reduced(to_host(framework, result), n, numpy_dtype(dtype), op)
    assert np.array_equal(to_host(framework, x).view(np.uint8), host.view(np.uint8))  # input untouched
    ddl.allreduce(x, op, out=x)
    assert_reduced(to_host(framework, x), n, numpy_dtype(dtype), op)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_broadcast_allgather_and_allreduce_n(world, framework):
    root = SIZE - 1
    got = ddl.broadcast(to_device(framework, np.full(5, RANK, np.int64)), root=root)
    assert to_host(framework, got).tolist() == [root] * 5
    rows = to_device(framework, np.full((RANK + 1, 3), RANK, np.float32))
    want = np.concatenate([np.full((r + 1, 3), r, np.float32) for r in range(SIZE)])
    assert np.array_equal(to_host(framework, ddl.allgather(rows)), want)
    a, b = np.arange(7, dtype=np.float32) + RANK, np.full((2, 2), RANK + 1, np.float64)
    ra, rb = ddl.allreduce_n([to_device(framework, a), to_device(framework, b)])
    assert np.array_equal(to_host(framework, ra), sum(np.arange(7, dtype=np.float32) + r for r in range(SIZE)))
    assert np.array_equal(to_host(framework, rb), np.full((2, 2), SIZE * (SIZE + 1) / 2))


def test_ddl_follows_and_precedes_the_callers_stream(world):
    """Work queued on a side stream before the call is seen by ddl; work queued after it sees the result."""
    torch = pytest.importorskip("torch")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.zeros(1 << 22, device="cuda")
        torch.cuda._sleep(50_000_000)  # keeps the stream busy, so a ddl that ignored it would read zeros
        x.fill_(RANK + 1)
        ddl.allreduce(x, out=x)
        y = x * 2
    side.synchronize()
    assert float(y[0]) == float(y[-1]) == SIZE * (SIZE + 1)


def test_mismatched_device_calls_raise_everywhere(world):
    if SIZE == 1:
        pytest.skip("needs peers")
    torch = pytest.importorskip("torch")
    x = torch.ones(8, device="cuda", dtype=torch.float32 if RANK else torch.float64)
    with pytest.raises(ddl.MismatchError):
        ddl.allreduce(x)
    assert float(ddl.allreduce(torch.ones(4, device="cuda"))[0]) == SIZE


def test_torch_distributed_optimizer_on_cuda_matches_one_process(world):
    """ddl.torch with CUDA parameters: gradients in fused device buffers, averaged by the GPU path."""
    pytest.importorskip("torch")
    from test_torch import train_and_compare

    train_and_compare("cuda")


def test_torch_tensor_helpers_stay_on_the_device(world):
    torch = pytest.importorskip("torch")
    import ddl.torch as dt

    t = torch.full((3, 4), float(RANK + 1), device="cuda").t()  # not contiguous
    dt.allreduce_(t, "sum")
    assert t.is_cuda and float(t[0, 0]) == SIZE * (SIZE + 1) / 2
    b = dt.broadcast(torch.full((5,), float(RANK), device="cuda"), root=0)
    assert b.is_cuda and b.tolist() == [0.0] * 5
    g = dt.allgather(torch.full((1, 2), float(RANK), device="cuda"))
    assert g.is_cuda and g[:, 0].tolist() == [float(r) for r in range(SIZE)]


def test_ddp_on_the_ddl_backend_with_cuda_tensors_equals_one_process(world):
    """DDP's buckets on the GPU go through the backend's CUDA route (ddl's GPU path, in stream order)."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import ddl.torch as dt
    from test_torch_backend import batches, make_model, reference

    dt.init_process_group()
    try:
        data = batches(3, 4)
        ddp = DistributedDataParallel(make_model(0).cuda())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for x, y in data:
            opt.zero_grad()
            mine = slice(RANK * 4, (RANK + 1) * 4)
            torch.nn.functional.mse_loss(ddp(x[mine].cuda()), y[mine].cuda()).backward()
            opt.step()
        for got, want in zip(ddp.module.parameters(), reference(data)):
            assert got.is_cuda and torch.allclose(got.cpu(), want, atol=1e-5), (got.cpu() - want).abs().max()
        t = torch.full((3,), float(RANK + 1), device="cuda")
        dist.all_reduce(t)
        assert t.is_cuda and torch.equal(t.cpu(), torch.full((3,), SIZE * (SIZE + 1) / 2))
        gathered = torch.empty(SIZE, 3, device="cuda")
        dist.all_gather_into_tensor(gathered, t)
        assert torch.equal(gathered.cpu(), torch.full((SIZE, 3), SIZE * (SIZE + 1) / 2))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("op", ["sum", "avg", "max"])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_reduce_scatter_on_the_device(world, framework, op):
    """Every rank's part of the reduction, per level (NCCL's reduce-scatter inside a group), even and uneven."""
    for rows, counts in ((3 * SIZE, None), (2 * SIZE + 1, None), (SIZE * (SIZE + 1) // 2, list(range(1, SIZE + 1)))):
        host = contribution(RANK, rows * 5, np.float32, op).reshape(rows, 5)
        every = np.stack([contribution(r, rows * 5, np.float64, op).reshape(rows, 5) for r in range(SIZE)])
        want = {"sum": every.sum(0), "avg": every.mean(0), "max": every.max(0)}[op]
        parts = counts or [rows // SIZE + (r < rows % SIZE) for r in range(SIZE)]
        start = sum(parts[:RANK])
        got = ddl.reduce_scatter(to_device(framework, host), op, counts=counts)
        assert device_of(framework, got) == device_of(framework, to_device(framework, host))
        assert np.allclose(to_host(framework, got), want[start:start + parts[RANK]], rtol=1e-6)


def test_fsdp2_on_cuda_equals_one_process(world):
    """FSDP2 on the ddl backend with CUDA parameters: its all-gathers and reduce-scatters take the device path
    (into its own buffers, on its own streams); the trained model equals one process on the global batch."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    import ddl.torch as dt
    from test_torch_fsdp import batches, full, make_model, sharded, train

    dt.init_process_group()
    try:
        out = torch.zeros(SIZE * 3, device="cuda")
        dist.all_gather_into_tensor(out, torch.full((3,), float(RANK), device="cuda"))
        assert out.cpu().tolist() == [float(r) for r in range(SIZE) for _ in range(3)]
        mine = torch.zeros(2, device="cuda")
        dist.reduce_scatter_tensor(mine, torch.arange(2.0 * SIZE, device="cuda") + RANK)
        assert mine.cpu().tolist() == [sum(2.0 * RANK + k + r for r in range(SIZE)) for k in range(2)]
        data = batches(4, 3)
        model = sharded(DeviceMesh("cuda", torch.arange(SIZE), mesh_dim_names=("shard",)))
        opt = torch.optim.Adam(model.parameters(), lr=0.05)
        for x, y in data:
            opt.zero_grad()
            part = slice(RANK * 3, (RANK + 1) * 3)
            torch.nn.functional.mse_loss(model(x[part].cuda()), y[part].cuda()).backward()
            opt.step()
        want = [p.detach() for p in train(make_model(), data, 3, mine=False).parameters()]
        for got, w in zip(full(model), want):
            assert got.is_cuda and torch.allclose(got.cpu(), w, atol=1e-5), (got.cpu() - w).abs().max()
    finally:
        dist.destroy_process_group()
