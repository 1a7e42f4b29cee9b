"""torch.distributed's "ddl" backend under MPI (mpi_suite.py at 2 and 4 ranks): the torch collectives give
closed-form results; DistributedDataParallel on "ddl" trains the same weights as one process on the global
batch (torch run locally on each rank), with no_sync accumulation, unused parameters, the fp16 hook and
gradient_as_bucket_view; a new group gets its own communicator; what the backend cannot do is refused naming
it."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
MPI = pytest.importorskip("mpi4py.MPI")

import torch.distributed as dist  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import ddl  # noqa: E402
import ddl.torch as dt  # noqa: E402
from ddl import DDLError  # noqa: E402

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD
R, P = COMM.rank, COMM.size


@pytest.fixture(scope="module", autouse=True)
def process_group():
    dt.init_process_group()
    yield
    dist.destroy_process_group()


def test_the_backend_is_ddl_and_ranks_are_mpis():
    assert dist.get_backend() == "ddl"
    assert (dist.get_rank(), dist.get_world_size()) == (R, P)


def test_collectives_give_closed_form_results():
    t = torch.full((7,), float(R + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((7,), P * (P + 1) / 2))
    m = torch.tensor([R, -R], dtype=torch.int64)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    assert torch.equal(m, torch.tensor([P - 1, 0]))
    a = torch.full((3,), float(R))
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
    assert torch.allclose(a, torch.full((3,), (P - 1) / 2))
    works = [dist.all_reduce(torch.full((1000 * (i + 1),), float(i)), async_op=True) for i in range(5)]
    for w in works:
        w.wait()
    outs = [torch.zeros(2, 2) for _ in range(P)]
    dist.all_gather(outs, torch.full((2, 2), float(R)))
    assert all(torch.equal(o, torch.full((2, 2), float(i))) for i, o in enumerate(outs))
    flat = torch.zeros(P * 3)
    dist.all_gather_into_tensor(flat, torch.full((3,), float(R)))
    assert torch.equal(flat, torch.arange(P).repeat_interleave(3).float())
    mine = torch.zeros(2)
    dist.reduce_scatter_tensor(mine, torch.arange(2 * P, dtype=torch.float32) * (R + 1))
    want = torch.arange(2 * R, 2 * R + 2, dtype=torch.float32) * (P * (P + 1) / 2)
    assert torch.equal(mine, want)
    b = torch.full((4,), float(R))
    dist.broadcast(b, src=P - 1)
    assert torch.equal(b, torch.full((4,), float(P - 1)))
    dist.barrier()


def test_unsupported_ops_and_tensors_are_refused_naming_them():
    with pytest.raises(DDLError, match="reduce op"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND)
    sparse = torch.sparse_coo_tensor([[0]], [1.0], (3,))
    with pytest.raises(DDLError, match="dense tensors"):
        dist.all_reduce(sparse)
    dist.barrier()  # the refusals happened alike everywhere: the ranks are still in step


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def batches(steps: int, per_rank: int):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(P * per_rank, 6, generator=g), torch.randn(P * per_rank, 2, generator=g))
            for _ in range(steps)]


def reference(steps, lr=0.1) -> list[torch.Tensor]:
    """One process on the global batch: what every rank's DDP model must equal."""
    model = make_model(0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in steps:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("hook", [None, "fp16", "bucket-view"])
def test_ddp_equals_one_process_on_the_global_batch(hook):
    data = batches(3, 4)
    ddp = DDP(make_model(0), gradient_as_bucket_view=hook == "bucket-view")  # .grad: views of DDP's buckets
    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x[R * 4:(R + 1) * 4]), y[R * 4:(R + 1) * 4]).backward()
        opt.step()
    tol = 1e-3 if hook == "fp16" else 1e-6
    for got, want in zip(ddp.module.parameters(), reference(data)):
        assert torch.allclose(got, want, atol=tol), (got - want).abs().max()


def test_ddp_no_sync_accumulates_then_averages_once():
    data = batches(2, 4)  # two micro-batches of 2 per rank make one step of the global batch
    ddp = DDP(make_model(0))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    (x, y) = data[0]
    mine = [(x[R * 4 + k:R * 4 + k + 2], y[R * 4 + k:R * 4 + k + 2]) for k in (0, 2)]
    opt.zero_grad()
    with ddp.no_sync():
        (torch.nn.functional.mse_loss(ddp(mine[0][0]), mine[0][1]) / 2).backward()
    (torch.nn.functional.mse_loss(ddp(mine[1][0]), mine[1][1]) / 2).backward()
    opt.step()
    for got, want in zip(ddp.module.parameters(), reference(data[:1])):
        assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.body, self.used, self.unused = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.used(self.body(x))


def test_ddp_with_unused_parameters_leaves_them_alone():
    ddp = DDP(TwoHeads(), find_unused_parameters=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    before = [p.detach().clone() for p in ddp.module.unused.parameters()]
    for _ in range(2):
        opt.zero_grad()
        ddp(torch.randn(3, 4)).sum().backward()
        opt.step()
    assert all(p.grad is None for p in ddp.module.unused.parameters())
    assert all(torch.equal(p, b) for p, b in zip(ddp.module.unused.parameters(), before))
    body = [torch.from_numpy(COMM.allgather(p.detach().numpy())[0]) for p in ddp.module.body.parameters()]
    assert all(torch.equal(p.detach(), b) for p, b in zip(ddp.module.body.parameters(), body))  # in step


def test_a_new_group_has_its_own_communicator():
    members = [0, P - 1]
    group = dist.new_group(members)
    t = torch.full((3,), float(R + 1))
    if R in members:
        dist.all_reduce(t, group=group)
        assert torch.equal(t, torch.full((3,), float(1 + P)))
        assert dist.get_world_size(group) == 2
    else:
        assert torch.equal(t, torch.full((3,), float(R + 1)))
    dist.barrier()
    assert np.isfinite(t.numpy()).all()
    assert ddl.size() == P  # ddl's world is untouched


def test_join_with_uneven_inputs_equals_one_process_on_what_was_fed():
    from torch.distributed.algorithms.join import Join

    batches_of = [2 + r for r in range(P)]  # rank r feeds 2 + r batches of 2 rows
    g = torch.Generator().manual_seed(9)
    data = [[(torch.randn(2, 6, generator=g), torch.randn(2, 2, generator=g)) for _ in range(2 + r)] for r in range(P)]
    ddp = DDP(make_model(0))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    with Join([ddp]):
        for x, y in data[R]:
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
    # DDP's Join: at step k the ranks still feeding average their gradients with zeros from the joined ones
    model = make_model(0)
    ref = torch.optim.SGD(model.parameters(), lr=0.1)
    for k in range(max(batches_of)):
        ref.zero_grad()
        grads = []
        for r in range(P):
            model.zero_grad()
            if k < batches_of[r]:
                torch.nn.functional.mse_loss(model(data[r][k][0]), data[r][k][1]).backward()
                grads.append([p.grad.clone() for p in model.parameters()])
        for p, parts in zip(model.parameters(), zip(*grads)):
            p.grad = sum(parts) / P
        ref.step()
    for got, want in zip(ddp.module.parameters(), model.parameters()):
        assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()
