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


# -- the silent failures of issue 16, each a regression test -------------------------------------------------


def count_collectives(monkeypatch) -> list:
    """Every allreduce ddl runs from here on (a submitted one runs it on the worker: ddl.barrier(), which
    waits for submitted collectives, makes the count current)."""
    comm, calls = ddl.communicator(), []
    original = comm.allreduce
    monkeypatch.setattr(comm, "allreduce", lambda *a, **k: (calls.append(a[0].size), original(*a, **k))[1])
    return calls


def shard_step(model, opt, seed: int, rows: int = 4):
    """One backward on this rank's rows of a global batch drawn alike on every rank; returns the batch."""
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(rows * ddl.size(), 12, generator=g), torch.randn(rows * ddl.size(), 3, generator=g)
    mine = slice(ddl.rank() * rows, (ddl.rank() + 1) * rows)
    torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
    return x, y


def test_parameters_added_or_unfrozen_after_wrapping_are_averaged():
    model = make_model(seed=5)
    extra = torch.nn.Parameter(torch.zeros(3))
    model[2].bias.requires_grad_(False)
    opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0))
    opt.add_param_group({"params": [extra]})
    model[2].bias.requires_grad_(True)
    opt.zero_grad()
    (model(torch.ones(1, 12)).sum() * (ddl.rank() + 1) + (extra * (ddl.rank() + 1)).sum()).backward()
    opt.step()
    mean = (ddl.size() + 1) / 2  # each rank's gradient was (rank + 1) x the same one
    assert torch.allclose(extra.detach(), torch.full((3,), -mean))
    assert torch.allclose(model[2].bias.detach(), make_model(seed=5)[2].bias.detach() - mean)
    every = COMM.allgather(flat(model.parameters()))
    for other in every[1:]:
        np.testing.assert_array_equal(other, every[0])


def test_sparse_gradients_are_averaged_and_stay_sparse():
    torch.manual_seed(11)
    emb = torch.nn.Embedding(10, 4, sparse=True)
    start = emb.weight.detach().clone()
    opt = dt.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=1.0))
    opt.zero_grad()
    emb(torch.tensor([ddl.rank() % 10, 9])).sum().backward()
    opt.synchronize()
    assert emb.weight.grad.is_sparse
    want = torch.zeros(10, 4)
    for r in range(ddl.size()):
        want[r % 10] += 1.0 / ddl.size()
    want[9] += 1.0
    assert torch.allclose(emb.weight.grad.to_dense(), want)
    opt.step()
    assert torch.allclose(emb.weight.detach(), start - want)


def test_a_parameter_no_rank_used_keeps_no_gradient_and_does_not_move():
    model = make_model(seed=3)
    unused = torch.nn.Parameter(torch.ones(2))
    opt = dt.DistributedOptimizer(torch.optim.SGD([*model.parameters(), unused], lr=0.1, momentum=0.9,
                                                  weight_decay=0.5))
    for step in range(2):
        opt.zero_grad()
        shard_step(model, opt, seed=step)
        opt.step()
    assert unused.grad is None
    assert torch.equal(unused.detach(), torch.ones(2))


def test_synchronize_then_step_averages_once_and_skip_synchronize_skips(monkeypatch):
    model = make_model(seed=3)
    opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), threshold=1 << 30, overlap=False)
    calls = count_collectives(monkeypatch)
    opt.zero_grad()
    shard_step(model, opt, seed=1)
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    assert len(calls) == 1  # one fused buffer, averaged once
    opt.zero_grad()
    shard_step(model, opt, seed=2)
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()
    ddl.barrier()
    assert len(calls) == 2


def test_buffers_start_during_backward_and_training_matches_one_process():
    reference = make_model(seed=1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    model = make_model(seed=1)
    opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), threshold=64)
    averaging = opt._ddl_averaging
    for step in range(3):
        opt.zero_grad()
        x, y = shard_step(model, opt, seed=step)
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()  # one process, the whole global batch
        ref_opt.step()
        assert averaging.buckets.next == len(averaging.buckets.buckets) > 1  # all started before step()
        opt.step()
    np.testing.assert_allclose(flat(model.parameters()), flat(reference.parameters()), rtol=1e-5, atol=1e-6)


def test_backward_passes_per_step_accumulates_then_averages_once(monkeypatch):
    p = ddl.size()
    reference = make_model(seed=2)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(4 * p, 12, generator=g), torch.randn(4 * p, 3, generator=g)
    torch.nn.functional.mse_loss(reference(x), y).backward()
    ref_opt.step()
    model = make_model(seed=2)
    opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), backward_passes_per_step=2,
                                  threshold=1 << 30)
    calls = count_collectives(monkeypatch)
    opt.zero_grad()
    mine = torch.arange(ddl.rank() * 4, ddl.rank() * 4 + 4)
    for k, half in enumerate((mine[:2], mine[2:])):  # two passes of half this rank's rows
        (torch.nn.functional.mse_loss(model(x[half]), y[half]) / 2).backward()
        if k == 0:
            assert opt._ddl_averaging.buckets.next == 0  # nothing started after the first pass
    assert opt._ddl_averaging.buckets.next == 1  # started by the second, during backward
    opt.step()
    ddl.barrier()
    assert len(calls) == 1
    np.testing.assert_allclose(flat(model.parameters()), flat(reference.parameters()), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("compression, ulp", [("fp16", 2.0 ** -10), ("bf16", 2.0 ** -7)])
def test_compression_sends_the_narrow_dtype_and_rounds_to_it(monkeypatch, compression, ulp):
    # a gradient of 1 + ulp/4 on every rank: float32 holds it, the wire dtype rounds it to 1 (closed form)
    w = torch.nn.Parameter(torch.zeros(4))
    opt = dt.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), compression=getattr(dt.Compression, compression))
    comm, wire = ddl.communicator(), []
    original = comm.allreduce
    monkeypatch.setattr(comm, "allreduce", lambda *a, **k: (wire.append(str(a[0].dtype)), original(*a, **k))[1])
    opt.zero_grad()
    (w * (1 + ulp / 4)).sum().backward()
    opt.step()
    ddl.barrier()
    assert wire == [{"fp16": "float16", "bf16": "bfloat16"}[compression]]
    assert w.grad.dtype == torch.float32
    assert torch.equal(w.detach(), torch.full((4,), -1.0))
    plain = torch.nn.Parameter(torch.zeros(4))
    opt = dt.DistributedOptimizer(torch.optim.SGD([plain], lr=1.0))
    (plain * (1 + ulp / 4)).sum().backward()
    opt.step()
    assert torch.equal(plain.detach(), torch.full((4,), -(1 + ulp / 4)))  # uncompressed keeps the bits


def test_fp16_compression_trains_like_one_process_within_fp16_precision():
    reference = make_model(seed=1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    model = make_model(seed=1)
    opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), threshold=64,
                                  compression=dt.Compression.fp16)
    for step in range(3):
        opt.zero_grad()
        x, y = shard_step(model, opt, seed=step)
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        opt.step()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    # gradients rounded to 11 significant bits, 3 steps of lr 0.1: within 1e-3 of float32 training
    np.testing.assert_allclose(flat(model.parameters()), flat(reference.parameters()), rtol=0, atol=1e-3)
    every = COMM.allgather(flat(model.parameters()))
    for other in every[1:]:
        np.testing.assert_array_equal(other, every[0])


def test_unknown_compression_is_refused():
    with pytest.raises(ddl.DDLError, match="compression 'fp16'"):
        dt.DistributedOptimizer(torch.optim.SGD(make_model(seed=1).parameters(), lr=0.1), compression="fp16")
