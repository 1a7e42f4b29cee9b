"""ddl.torch under MPI (run by mpi_suite.py at 2 and 4 ranks): broadcast makes models and optimizer state
identical; k ranks with DistributedOptimizer on their shards train the same weights as one process on the
concatenated global batch. Expected values come from torch run locally on each rank, never from ddl."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
MPI = pytest.importorskip("mpi4py.MPI")

import ddl  # noqa: E402
import ddl.torch as dt  # noqa: E402

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def flat(tensors) -> np.ndarray:
    return np.concatenate([t.detach().reshape(-1).double().cpu().numpy() for t in tensors])


def optimizer_state(opt) -> np.ndarray:
    return flat([v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)])


def test_tensor_collectives_in_place_and_copies():
    r, p = ddl.rank(), ddl.size()
    t = torch.full((5,), float(r + 1))
    assert torch.equal(dt.allreduce(t, op="sum"), torch.full((5,), p * (p + 1) / 2))
    assert torch.equal(t, torch.full((5,), float(r + 1)))  # the copy left the input alone
    dt.allreduce_(t, op="max")
    assert torch.equal(t, torch.full((5,), float(p)))
    s = torch.arange(6, dtype=torch.float64).reshape(2, 3).t()  # not contiguous: copied out and back
    dt.allreduce_(s, op="sum")
    assert torch.equal(s, p * torch.arange(6, dtype=torch.float64).reshape(2, 3).t())
    b = torch.tensor([r, r], dtype=torch.bfloat16)
    assert torch.equal(dt.broadcast(b, root=p - 1), torch.tensor([p - 1, p - 1], dtype=torch.bfloat16))
    g = dt.allgather(torch.tensor([[r, 2 * r]], dtype=torch.int32))
    assert torch.equal(g, torch.tensor([[i, 2 * i] for i in range(p)], dtype=torch.int32))


def test_broadcast_makes_models_and_optimizer_state_identical():
    model = make_model(seed=100 + ddl.rank())  # different on every rank
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(4, 12)).sum().backward()  # a rank-local step: moments differ too
    opt.step()
    dt.broadcast_parameters(model.state_dict(), root_rank=0)
    dt.broadcast_optimizer_state(opt, root_rank=0)
    mine = np.concatenate([flat(model.parameters()), optimizer_state(opt)])
    every = COMM.allgather(mine)
    for other in every[1:]:
        np.testing.assert_array_equal(other, every[0])
    assert opt.state_dict()["param_groups"][0]["lr"] == 0.01


def test_distributed_optimizer_matches_one_process_on_the_global_batch():
    train_and_compare("cpu")


def train_and_compare(device: str) -> None:
    """5 steps of SGD with momentum: DistributedOptimizer on each rank's shard against one process on the
    global batch (also run by tests/gpu with device="cuda")."""
    p, r = ddl.size(), ddl.rank()
    rng = np.random.default_rng(7)
    x = torch.from_numpy(rng.standard_normal((p * 8 * 5, 12)).astype(np.float32)).to(device)
    y = torch.from_numpy(rng.integers(0, 3, p * 8 * 5)).to(device)
    loss_fn = torch.nn.CrossEntropyLoss()

    reference = make_model(seed=1).to(device)  # one process, global batches of 8p rows
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    model = make_model(seed=1).to(device)
    opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    assert isinstance(opt, torch.optim.SGD)
    for step in range(5):
        rows = slice(step * 8 * p, (step + 1) * 8 * p)
        ref_opt.zero_grad()
        loss_fn(reference(x[rows]), y[rows]).backward()
        ref_opt.step()
        shard = torch.arange(rows.start + r, rows.stop, p, device=device)  # this rank's 8 rows of the batch
        opt.zero_grad()
        loss_fn(model(x[shard]), y[shard]).backward()
        opt.step()
    mine = flat(model.parameters())
    # float32 sums in another order: agreement to 1e-5 relative after 5 steps
    np.testing.assert_allclose(mine, flat(reference.parameters()), rtol=1e-5, atol=1e-6)
    every = COMM.allgather(mine)
    for other in every[1:]:
        np.testing.assert_array_equal(other, every[0])  # every rank holds bit-identical weights


def test_a_parameter_without_gradient_on_one_rank_counts_as_zeros():
    model = make_model(seed=3)
    opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), threshold=64)
    opt.zero_grad(set_to_none=True)
    if ddl.rank() == 0:
        model(torch.ones(1, 12)).sum().backward()
    local = flat(p.grad for p in model.parameters()) if ddl.rank() == 0 else 0
    expected = COMM.allreduce(local) / ddl.size()  # rank 0's gradient, the others' zeros, averaged
    opt.synchronize()
    np.testing.assert_allclose(flat(p.grad for p in model.parameters()), expected, rtol=1e-6)
