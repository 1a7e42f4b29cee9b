"""Sharded training on the "ddl" backend (mpi_suite.py at 2 and 4 ranks): FSDP2 and HSDP train the same weights
as one process on the global batch; a torch.distributed.checkpoint saved on one mesh loads on another; the
collectives they run (all_gather_into_tensor, reduce_scatter_tensor, their coalesced and list forms with uneven
sizes, gather, scatter, all_to_all_single) give closed-form results for every dtype and op; ddl.torch.device_mesh
lays the mesh out from the topology; bad calls are refused naming them, on every rank."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
MPI = pytest.importorskip("mpi4py.MPI")

import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

import ddl  # noqa: E402
import ddl.torch as dt  # noqa: E402
from ddl import DDLError  # noqa: E402
from ddl.core.communicator import Communicator  # noqa: E402
from ddl.options import parse  # noqa: E402
from ddl.topology.tree import leaves  # noqa: E402
from ddl.torch.mesh import mesh_rows, shard_level  # noqa: E402

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
R, P = COMM.rank, COMM.size
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]
OPS = {dist.ReduceOp.SUM: np.sum, dist.ReduceOp.AVG: np.mean, dist.ReduceOp.MAX: np.max,
       dist.ReduceOp.MIN: np.min, dist.ReduceOp.PRODUCT: np.prod}


@pytest.fixture(scope="module", autouse=True)
def process_group():
    dt.init_process_group()
    yield
    dist.destroy_process_group()


def contribution(rank: int, n: int, dtype) -> torch.Tensor:
    """Rank ``rank``'s input: small integers, exact in every dtype and in any sum or product of P of them."""
    return torch.tensor([(rank + 1 + k) % 3 + 1 for k in range(n)], dtype=torch.float64).to(dtype)


def expected(op, n: int) -> np.ndarray:
    every = np.stack([contribution(r, n, torch.float64).numpy() for r in range(P)])
    return OPS[op](every, axis=0)


def as_f64(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.float64).numpy()


# -- the collectives, in closed form ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_gather_into_tensor_puts_every_rank_in_its_rows(dtype):
    out = torch.zeros(P * 5, dtype=dtype)
    dist.all_gather_into_tensor(out, contribution(R, 5, dtype))
    want = np.concatenate([contribution(r, 5, torch.float64).numpy() for r in range(P)])
    np.testing.assert_array_equal(as_f64(out), want)
    inplace = torch.zeros(P, 3, dtype=dtype)  # FSDP's form: the input is this rank's rows of the output
    inplace[R] = contribution(R, 3, dtype)
    dist.all_gather_into_tensor(inplace, inplace[R])
    np.testing.assert_array_equal(as_f64(inplace), np.stack([contribution(r, 3, torch.float64).numpy()
                                                             for r in range(P)]))


@pytest.mark.parametrize("dtype, op", [(d, o) for d in DTYPES for o in OPS
                                       if d.is_floating_point or o != dist.ReduceOp.AVG],  # (avg of ints: not ints)
                         ids=lambda x: str(x).split(".")[-1])
def test_reduce_scatter_tensor_gives_each_rank_its_part_of_the_reduction(dtype, op):
    n = 4
    mine = torch.zeros(n, dtype=dtype)
    dist.reduce_scatter_tensor(mine, contribution(R, P * n, dtype), op=op)
    np.testing.assert_allclose(as_f64(mine), expected(op, P * n)[R * n:(R + 1) * n], rtol=1e-2)


def test_list_forms_take_uneven_sizes():
    sizes = [1 + 2 * r for r in range(P)]  # rank r's part: 1 + 2r elements
    outs = [torch.zeros(s) for s in sizes]
    dist.all_gather(outs, torch.full((sizes[R],), float(R)))
    for r, o in enumerate(outs):
        assert torch.equal(o, torch.full((sizes[r],), float(r)))
    parts = [contribution(R, s, torch.float32) * (r + 1) for r, s in enumerate(sizes)]
    mine = torch.zeros(sizes[R])
    dist.reduce_scatter(mine, parts)
    total = sum(contribution(q, sizes[R], torch.float64).numpy() for q in range(P)) * (R + 1)
    np.testing.assert_allclose(mine.numpy(), total)


def test_coalesced_forms_as_dtensor_and_funcol_call_them():
    group = dist.group.WORLD
    a, b = contribution(R, 3, torch.float32), contribution(R, 2, torch.float64)
    gathered = funcol.all_gather_into_tensor_coalesced([a, b], group)
    np.testing.assert_array_equal(gathered[0].numpy(), np.concatenate([contribution(r, 3, torch.float64).numpy()
                                                                       for r in range(P)]))
    np.testing.assert_array_equal(gathered[1].numpy(), np.concatenate([contribution(r, 2, torch.float64).numpy()
                                                                       for r in range(P)]))
    x, y = contribution(R, 2 * P, torch.float32), contribution(R, 3 * P, torch.float64)
    reduced = funcol.reduce_scatter_tensor_coalesced([x, y], "sum", [0, 0], group)
    np.testing.assert_allclose(reduced[0].numpy(), expected(dist.ReduceOp.SUM, 2 * P)[2 * R:2 * R + 2])
    np.testing.assert_allclose(reduced[1].numpy(), expected(dist.ReduceOp.SUM, 3 * P)[3 * R:3 * R + 3])


def test_gather_scatter_and_all_to_all_single():
    root = P - 1
    outs = [torch.zeros(2) for _ in range(P)] if R == root else None
    dist.gather(torch.full((2,), float(R)), outs, dst=root)
    if R == root:
        assert all(torch.equal(o, torch.full((2,), float(r))) for r, o in enumerate(outs))
    mine = torch.zeros(3)
    dist.scatter(mine, [torch.full((3,), 10.0 + r) for r in range(P)] if R == 0 else None, src=0)
    assert torch.equal(mine, torch.full((3,), 10.0 + R))
    # rank i sends j + 1 rows of value 100 i + j to rank j
    send = torch.cat([torch.full((j + 1,), 100.0 * R + j) for j in range(P)])
    got = torch.zeros(P * (R + 1))
    dist.all_to_all_single(got, send, [R + 1] * P, [j + 1 for j in range(P)])
    assert torch.equal(got, torch.cat([torch.full((R + 1,), 100.0 * i + R) for i in range(P)]))


def test_bad_calls_are_refused_naming_them_on_every_rank():
    with pytest.raises(DDLError, match="reduce_scatter_tensor's input has 7 elements"):
        dist.reduce_scatter_tensor(torch.zeros(3), torch.ones(7))
    with pytest.raises(DDLError, match="one tensor per rank"):
        dist.reduce_scatter(torch.zeros(2), [torch.ones(2)] * (P + 1))
    with pytest.raises(DDLError, match="one dtype"):
        dist.all_gather_into_tensor(torch.zeros(P, dtype=torch.float64), torch.ones(1))
    with pytest.raises(DDLError, match="reduce op"):
        dist.reduce_scatter_tensor(torch.zeros(1, dtype=torch.int32), torch.ones(P, dtype=torch.int32),
                                   op=dist.ReduceOp.BAND)
    with pytest.raises(DDLError, match="counts"):
        ddl.reduce_scatter(np.ones(P + 1), counts=[1] * P)
    t = torch.ones(2)
    dist.all_reduce(t)  # the refusals happened alike everywhere: the ranks are still in step
    assert torch.equal(t, torch.full((2,), float(P)))


# -- training ---------------------------------------------------------------------------------------------------

def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3))


def batches(steps: int, per_rank: int):
    g = torch.Generator().manual_seed(11)
    return [(torch.randn(P * per_rank, 6, generator=g), torch.randn(P * per_rank, 3, generator=g))
            for _ in range(steps)]


def train(model, data, per_rank: int, mine: bool):
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for x, y in data:
        if mine:
            x, y = x[R * per_rank:(R + 1) * per_rank], y[R * per_rank:(R + 1) * per_rank]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def sharded(mesh) -> torch.nn.Module:
    model = make_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def full(model) -> list[torch.Tensor]:
    return [p.full_tensor().detach() for p in model.parameters()]


def assert_equal_to_one_process(model, data, per_rank):
    want = [p.detach() for p in train(make_model(), data, per_rank, mine=False).parameters()]
    for got, w in zip(full(model), want):
        assert torch.allclose(got, w, atol=1e-5), (got - w).abs().max()


def test_fsdp2_equals_one_process_on_the_global_batch():
    data = batches(4, 3)
    mesh = DeviceMesh("cpu", torch.arange(P), mesh_dim_names=("shard",))
    assert_equal_to_one_process(train(sharded(mesh), data, 3, mine=True), data, 3)


@pytest.mark.skipif(P < 4 or P % 2, reason="HSDP needs two groups of two ranks or more")
@pytest.mark.parametrize("tree", ["blocks", "interleaved"])
def test_hsdp_from_the_topology_equals_one_process(tree):
    hierarchy = ([[r, r + 1] for r in range(0, P, 2)] if tree == "blocks"
                 else [[r, r + P // 2] for r in range(P // 2)])
    comm = Communicator.from_mpi(COMM, parse(None), hierarchy=hierarchy)
    try:
        mesh = dt.device_mesh(comm=comm)
    finally:
        comm.close()
    assert mesh.mesh_dim_names == ("replicate", "shard")
    assert mesh.mesh.tolist() == hierarchy  # shard inside each pair the topology names, replicate across them
    data = batches(4, 2)
    assert_equal_to_one_process(train(sharded(mesh), data, 2, mine=True), data, 2)


def test_a_checkpoint_saved_on_one_mesh_loads_on_another(tmp_path_factory):
    path = COMM.bcast(str(tmp_path_factory.mktemp("dcp")) if R == 0 else None)
    data = batches(2, 2)
    saved = train(sharded(DeviceMesh("cpu", torch.arange(P), mesh_dim_names=("shard",))), data, 2, mine=True)
    dcp.save({"model": saved.state_dict()}, checkpoint_id=path)
    halves = (2, P // 2) if P % 2 == 0 else (P, 1)  # HSDP: replicated over 2 groups (or unsharded replicas)
    other = DeviceMesh("cpu", torch.arange(P).reshape(halves), mesh_dim_names=("replicate", "shard"))
    loaded = sharded(other)
    state = {"model": loaded.state_dict()}
    dcp.load(state, checkpoint_id=path)
    loaded.load_state_dict(state["model"])
    for got, want in zip(full(loaded), full(saved)):
        assert torch.equal(got, want)


def test_the_default_mesh_shards_inside_the_innermost_groups_of_several_ranks():
    """One row per group of the innermost level of the topology's tree whose groups have more than one rank,
    in tree order; 1-D when that group is every rank (one host)."""
    levels, frontier = [], [ddl.communicator().tree]
    while isinstance(frontier[0], list):  # from the whole tree down: each level's groups, as rank lists
        levels.append([leaves(g) for g in frontier])
        frontier = [child for g in frontier for child in g]
    rows = next(groups for groups in reversed(levels) if len(groups[0]) > 1)
    mesh = dt.device_mesh()
    if len(rows) == 1:
        assert mesh.mesh_dim_names == ("shard",) and mesh.mesh.tolist() == list(range(P))
    else:
        assert mesh.mesh_dim_names == ("replicate", "shard") and mesh.mesh.tolist() == rows


# -- the mesh's layout, without torch ---------------------------------------------------------------------------

def test_shard_level_is_the_fastest_level_that_holds_the_model():
    assert shard_level((4, 2, 3), None, None) == 0
    assert shard_level((4, 2, 3), 100, 30) == 0  # 4 ranks x 30 >= 100
    assert shard_level((4, 2, 3), 200, 30) == 1  # 8 x 30
    assert shard_level((4, 2, 3), 10_000, 30) == 2  # none holds it: every rank
    assert shard_level((1, 4), None, None) == 1  # one rank per host shards nothing there


def test_mesh_rows_group_the_ranks_of_each_group():
    coords = ((0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2))  # three hosts of two, ranks in order
    assert mesh_rows(coords, (2, 3), 0) == [[0, 1], [2, 3], [4, 5]]
    spread = ((0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2))  # hosts' ranks round-robin
    assert mesh_rows(spread, (2, 3), 0) == [[0, 3], [1, 4], [2, 5]]
