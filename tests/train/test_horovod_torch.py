"""ddl.horovod.torch under MPI (mpi_suite.py at 2 and 4 ranks): Horovod's names with Horovod's meaning.
Expected values are closed forms, numpy, or torch run on one process over the global batch; never ddl."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
MPI = pytest.importorskip("mpi4py.MPI")

import ddl  # noqa: E402
import ddl.horovod.torch as hvd  # noqa: E402

pytestmark = pytest.mark.mpi
COMM = MPI.COMM_WORLD


@pytest.fixture(autouse=True, scope="module")
def started():
    hvd.init()
    yield


def test_ranks_and_hosts():
    assert (hvd.rank(), hvd.size()) == (COMM.rank, COMM.size)
    assert hvd.is_initialized() and hvd.mpi_enabled() and not hvd.gloo_enabled()
    # one host here: every rank local, one cross rank
    assert hvd.local_size() == hvd.size() and hvd.local_rank() == hvd.rank()
    assert (hvd.cross_rank(), hvd.cross_size()) == (0, 1) and hvd.is_homogeneous()


@pytest.mark.parametrize("op, reduce", [(None, lambda v: v.mean(0)), ("Sum", lambda v: v.sum(0)),
                                        ("Min", lambda v: v.min(0)), ("Max", lambda v: v.max(0)),
                                        ("Product", lambda v: v.prod(0))])
def test_allreduce_ops_copies_in_place_and_async(op, reduce):
    r, n = hvd.rank(), hvd.size()
    every = np.stack([(i + 1) * np.arange(1, 6, dtype=np.float64) for i in range(n)])
    want = torch.from_numpy(reduce(every))
    op = getattr(hvd, op) if op else None
    t = torch.from_numpy(every[r].copy())
    torch.testing.assert_close(hvd.allreduce(t, op=op), want)
    assert torch.equal(t, torch.from_numpy(every[r]))  # a copy: the input left alone
    torch.testing.assert_close(hvd.synchronize(hvd.allreduce_async(t, op=op)), want)
    h = hvd.allreduce_async_(t, op=op)
    hvd.synchronize(h)
    assert hvd.poll(h)
    torch.testing.assert_close(t, want)


def test_average_flag_scale_factors_and_grouped_allreduce():
    r, n = hvd.rank(), hvd.size()
    t = torch.full((3,), float(r))
    torch.testing.assert_close(hvd.allreduce(t, average=False), torch.full((3,), n * (n - 1) / 2))
    got = hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    torch.testing.assert_close(got, torch.full((3,), n * (n - 1) / 2))
    a, b, c = torch.full((2, 2), float(r)), torch.tensor([r, 1], dtype=torch.int64), torch.full((5,), 1.0)
    ga, gb, gc = hvd.grouped_allreduce([a, b, c], op=hvd.Sum)
    torch.testing.assert_close(ga, torch.full((2, 2), n * (n - 1) / 2))
    assert torch.equal(gb, torch.tensor([n * (n - 1) // 2, n])) and torch.equal(gc, torch.full((5,), float(n)))
    out = hvd.synchronize(hvd.grouped_allreduce_async([a, c]))  # Average
    torch.testing.assert_close(out[0], torch.full((2, 2), (n - 1) / 2))


def test_allreduce_is_differentiable():
    x = torch.full((4,), float(hvd.rank() + 1), requires_grad=True)
    (hvd.allreduce(x, op=hvd.Sum) * torch.arange(4.0)).sum().backward()
    # the sum over ranks of every rank's loss: each x gets size * arange
    torch.testing.assert_close(x.grad, hvd.size() * torch.arange(4.0))


def test_allgather_of_uneven_rows_and_its_gradient():
    r, n = hvd.rank(), hvd.size()
    x = torch.full((r + 1, 2), float(r), requires_grad=True)
    y = hvd.allgather(x)
    want = np.concatenate([np.full((i + 1, 2), float(i)) for i in range(n)])
    np.testing.assert_array_equal(y.detach().numpy(), want)
    weights = torch.arange(float(y.numel())).reshape(y.shape)
    (y * weights * (r + 1)).sum().backward()  # each rank's output gradient: weights times (rank + 1)
    start = sum(i + 1 for i in range(r))
    # Horovod's gradient: the ranks' output gradients averaged (weights * mean(1..n)), this rank's rows
    torch.testing.assert_close(x.grad, (n + 1) / 2 * weights[start:start + r + 1])
    out = hvd.synchronize(hvd.allgather_async(torch.tensor([r])))
    assert out.tolist() == list(range(n))


def test_broadcast_copies_in_place_and_async():
    r, n = hvd.rank(), hvd.size()
    root = n - 1
    t = torch.full((3,), float(r))
    assert torch.equal(hvd.broadcast(t, root), torch.full((3,), float(root))) and float(t[0]) == r
    hvd.synchronize(hvd.broadcast_async_(t, root))
    assert torch.equal(t, torch.full((3,), float(root)))
    assert hvd.broadcast_object({"from": r}, root_rank=root) == {"from": root}
    assert hvd.allgather_object(("rank", r)) == [("rank", i) for i in range(n)]


def test_alltoall_with_and_without_splits():
    r, n = hvd.rank(), hvd.size()
    # rank r sends j + 1 rows of value 10 r + j to rank j
    rows = torch.cat([torch.full((j + 1,), float(10 * r + j)) for j in range(n)])
    out, received = hvd.alltoall(rows, splits=[j + 1 for j in range(n)])
    want = np.concatenate([np.full(r + 1, 10 * i + r) for i in range(n)])
    np.testing.assert_array_equal(out.numpy(), want)
    assert received.tolist() == [r + 1] * n
    even = torch.arange(2 * n, dtype=torch.int32) + 100 * r  # two rows to each rank
    np.testing.assert_array_equal(hvd.alltoall(even).numpy(),
                                  np.concatenate([[100 * i + 2 * r, 100 * i + 2 * r + 1] for i in range(n)]))


def test_reducescatter_gives_each_rank_its_block_of_the_sum():
    r, n = hvd.rank(), hvd.size()
    rows = 2 * n + 1  # uneven: the first rank gets one row more
    t = torch.arange(rows * 2, dtype=torch.float64).reshape(rows, 2) * (r + 1)
    total = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) * (n * (n + 1) / 2)
    sizes = [2 + (i < 1) for i in range(n)]
    start = sum(sizes[:r])
    np.testing.assert_allclose(hvd.reducescatter(t, op=hvd.Sum).numpy(), total[start:start + sizes[r]])
    np.testing.assert_allclose(hvd.reducescatter(t).numpy(), total[start:start + sizes[r]] / n)


@pytest.mark.parametrize("op", ["sum", "average"])
def test_reducescatter_scales_and_differentiates(op):
    """Forward: prescale, reduce, postscale; backward as Horovod's: every rank's block of the gradient gathered
    back, with the same scaling, times the ranks for Sum (Horovod's own tests require that factor)."""
    r, n = hvd.rank(), hvd.size()
    hop = hvd.Sum if op == "sum" else hvd.Average
    t = torch.full((2 * n, 3), float(r + 1), requires_grad=True)
    out = hvd.reducescatter(t, op=hop, prescale_factor=2.0, postscale_factor=0.5)
    mean = 1 if op == "sum" else n
    np.testing.assert_allclose(out.detach().numpy(), np.full((2, 3), n * (n + 1) / 2 / mean))
    (out * (r + 1)).sum().backward()  # d out_r / d ... = r + 1 on rank r's block
    want = np.repeat([q + 1 for q in range(n)], 2)[:, None] * np.ones((1, 3)) * (n if op == "sum" else 1)
    np.testing.assert_allclose(t.grad.numpy(), want)
    grouped = hvd.grouped_reducescatter([torch.ones(n, 2), torch.ones(2 * n)], op=hvd.Sum)
    assert [g.tolist() for g in grouped] == [[[float(n)] * 2], [float(n)] * 2]
    handle = hvd.reducescatter_async(torch.ones(n), op=hvd.Sum)
    assert hvd.synchronize(handle).tolist() == [float(n)]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integers_average_as_horovods_truncated_toward_zero(dtype):
    """Horovod averages integer tensors: the sum divided by the ranks, truncated toward zero (ddl's own
    allreduce refuses avg for integers; its Horovod surface follows Horovod)."""
    r, n = hvd.rank(), hvd.size()
    t = torch.tensor([r + 1, -(r + 1), 3 * r, 7], dtype=dtype)
    sums = np.array([n * (n + 1) // 2, -(n * (n + 1) // 2), 3 * n * (n - 1) // 2, 7 * n])
    want = np.trunc(sums / n).astype(np.int64)
    got = hvd.allreduce(t, op=hvd.Average)
    assert got.dtype == dtype and got.tolist() == want.tolist()
    assert hvd.allreduce(t).tolist() == want.tolist()  # Average is the default op
    parts = torch.tensor([[r + 1], [-(r + 1)]] * n, dtype=dtype)  # rank k's block: rows 2k, 2k + 1
    assert hvd.reducescatter(parts).reshape(-1).tolist() == want[:2].tolist()


def test_alltoall_is_differentiable_and_its_errors_are_horovods_types():
    r, n = hvd.rank(), hvd.size()
    t = torch.arange(float(n * 2)).reshape(n * 2, 1).requires_grad_()  # two rows to each rank
    out = hvd.alltoall(t)
    (out * (r + 1)).sum().backward()  # each row's gradient: the receiving rank's r + 1
    assert t.grad.reshape(-1).tolist() == [float(j + 1) for j in range(n) for _ in range(2)]
    with pytest.raises(ValueError, match="splits"):  # Horovod raises ValueError for splits that do not add up
        hvd.alltoall(torch.ones(n + 1), torch.ones(n, dtype=torch.int32))
    with pytest.raises(ValueError, match="integer row counts"):
        hvd.alltoall(torch.ones(n), torch.ones(n, dtype=torch.float32))
    with pytest.raises(RuntimeError):  # MismatchError: ranks that called differently (Horovod: RuntimeError)
        hvd.alltoall(torch.ones(n, dtype=torch.int32 if r == 0 else torch.float32))
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n  # still in step


def test_integer_scaling_truncates_and_build_flags_are_horovods():
    n = hvd.size()
    got = hvd.grouped_allreduce([torch.full((3,), 3, dtype=torch.int32)], op=hvd.Sum, prescale_factor=0.5,
                                postscale_factor=1.5)[0]
    assert got.dtype == torch.int32 and got.tolist() == [int(int(3 * 0.5) * n * 1.5)] * 3  # trunc, then trunc
    assert hvd.ccl_built() is False and hvd.rocm_built() is False
    assert isinstance(hvd.nccl_built(), int)  # a version code (or 0), which Horovod's scripts compare


def adasum_tree(vectors):
    """Adasum's pairwise operator applied as its recursive doubling does (numpy, float64)."""
    level = list(vectors)
    while len(level) > 1:
        nxt = []
        for a, b in zip(level[::2], level[1::2]):
            d = a @ b
            nxt.append((1 - d / (2 * (a @ a))) * a + (1 - d / (2 * (b @ b))) * b)
        level = nxt
    return level[0]


def test_adasum_on_tensors_and_its_limits():
    r, n = hvd.rank(), hvd.size()
    vectors = [np.random.default_rng(i).standard_normal(7) for i in range(n)]
    others = [np.random.default_rng(100 + i).standard_normal((2, 3)) for i in range(n)]
    t, u = torch.from_numpy(vectors[r].copy()), torch.from_numpy(others[r].copy())
    if n & (n - 1):
        with pytest.raises(ddl.DDLError, match=f"rank {r}: Adasum needs a power-of-two"):
            hvd.allreduce(t, op=hvd.Adasum)
        return
    np.testing.assert_allclose(hvd.allreduce(t, op=hvd.Adasum).numpy(), adasum_tree(vectors), rtol=1e-10)
    # fused, each tensor still takes its own dot products
    gt, gu = hvd.grouped_allreduce([t, u], op=hvd.Adasum)
    np.testing.assert_allclose(gt.numpy(), adasum_tree(vectors), rtol=1e-10)
    np.testing.assert_allclose(gu.numpy().ravel(), adasum_tree([o.ravel() for o in others]), rtol=1e-10)
    with pytest.raises(ddl.DDLError, match="floating-point tensors only"):
        hvd.allreduce(torch.ones(3, dtype=torch.int64), op=hvd.Adasum)
    with pytest.raises(ddl.DDLError, match="gradient_predivide_factor is not supported with op=hvd.Adasum"):
        hvd.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1), op=hvd.Adasum,
                                 gradient_predivide_factor=2.0)


def model_and_data(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.standard_normal((8 * hvd.size(), 6)).astype(np.float32))
    y = torch.from_numpy(rng.standard_normal((8 * hvd.size(), 2)).astype(np.float32))
    return model, x, y


def one_process(steps, lr, scale=1.0):
    """Plain torch on the global batch (its mean loss, times ``scale``): what every rank's model must hold."""
    model, x, y = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        (torch.nn.functional.mse_loss(model(x), y) * scale).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("options, passes, scale, rtol", [
    ({}, 1, 1.0, 1e-5),
    ({"op": "Sum"}, 1, None, 1e-5),                        # a sum of the ranks' mean gradients
    ({"gradient_predivide_factor": 2.0}, 1, 1.0, 1e-5),
    ({"backward_passes_per_step": 2}, 2, 1.0, 1e-5),
    ({"compression": "fp16"}, 1, 1.0, 2e-3),
])
def test_distributed_optimizer_matches_one_process_on_the_global_batch(options, passes, scale, rtol):
    n, r = hvd.size(), hvd.rank()
    options = dict(options)
    if "op" in options:
        options["op"] = getattr(hvd, options["op"])
    if "compression" in options:
        options["compression"] = getattr(hvd.Compression, options["compression"])
    model, x, y = model_and_data()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(), **options)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    mine = slice(r * 8, (r + 1) * 8)
    xs, ys = x[mine], y[mine]
    for _ in range(3):
        opt.zero_grad()
        for k in range(passes):
            part = slice(k * 8 // passes, (k + 1) * 8 // passes)
            (torch.nn.functional.mse_loss(model(xs[part]), ys[part]) / passes).backward()
        opt.step()
    # every option keeps the global batch's mean gradient (passes of half the shard, each loss / passes: their
    # sum is the shard's mean), but Sum: the sum over ranks of their means, n times the global mean
    want = one_process(3, 0.05, n if scale is None else scale)
    got = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol)


def adasum_reference(steps, lr):
    """Horovod's Adasum optimizer in one process: n copies of the model, each with its own Adam on its own
    shard; after each local step, every copy takes start + the Adasum (per tensor) of the copies' changes."""
    n = hvd.size()
    copies = [model_and_data() for _ in range(n)]
    optimizers = [torch.optim.Adam(m.parameters(), lr=lr) for m, _, _ in copies]
    for _ in range(steps):
        starts = [p.detach().clone() for p in copies[0][0].parameters()]
        deltas = []
        for i, ((model, x, y), opt) in enumerate(zip(copies, optimizers)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[i * 8:(i + 1) * 8]), y[i * 8:(i + 1) * 8]).backward()
            opt.step()
            deltas.append([(p.detach() - s).double().numpy().ravel() for p, s in zip(model.parameters(), starts)])
        with torch.no_grad():
            for k, s in enumerate(starts):
                combined = torch.from_numpy(adasum_tree([d[k] for d in deltas])).float().view(s.shape)
                for model, _, _ in copies:
                    list(model.parameters())[k].copy_(s + combined)
    return torch.cat([p.detach().reshape(-1) for p in copies[0][0].parameters()])


@pytest.mark.parametrize("compression, rtol", [("none", 1e-5), ("fp16", 1e-3)])
def test_adasum_optimizer_combines_each_ranks_own_step(compression, rtol):
    n, r = hvd.size(), hvd.rank()
    model, x, y = model_and_data()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), op=hvd.Adasum,
                                   named_parameters=model.named_parameters(),
                                   compression=getattr(hvd.Compression, compression))
    assert isinstance(opt, torch.optim.Adam)
    mine = slice(r * 8, (r + 1) * 8)
    if n & (n - 1):
        torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        before = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(ddl.DDLError, match=f"rank {r}: Adasum needs a power-of-two"):
            opt.step()
        assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))  # no half-done step
        return
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        opt.step()
    got = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    want = adasum_reference(3, 0.01)
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol)


def test_sparse_gradients_are_averaged_and_handed_back_sparse():
    n, r = hvd.size(), hvd.rank()
    for dense in (False, True):  # as Horovod: sparse either way (SparseAdam takes nothing else)
        emb = torch.nn.Embedding(5, 3, sparse=True)
        with torch.no_grad():
            emb.weight.fill_(1.0)
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
                                       sparse_as_dense=dense)
        emb(torch.tensor([r % 5])).sum().backward()
        opt.synchronize()
        assert emb.weight.grad.is_sparse
        want = np.zeros((5, 3))
        for i in range(n):
            want[i % 5] += 1.0 / n
        np.testing.assert_allclose(emb.weight.grad.to_dense().numpy(), want, rtol=1e-6)
        with opt.skip_synchronize():
            opt.step()  # SparseAdam refuses dense gradients


def test_sync_batch_norm_normalises_over_the_global_batch():
    n, r = hvd.size(), hvd.rank()
    torch.manual_seed(3)
    x = torch.randn(4 * n, 3, 5)
    weight, bias = torch.randn(3), torch.randn(3)
    ref = torch.nn.BatchNorm1d(3)
    sync = hvd.SyncBatchNorm(3)
    with torch.no_grad():
        for bn in (ref, sync):
            bn.weight.copy_(weight)
            bn.bias.copy_(bias)
    xg = x.clone().requires_grad_(True)
    want = ref(xg)
    (want * want).mean().backward()  # one process: mean over the global batch
    mine = x[r * 4:(r + 1) * 4].clone().requires_grad_(True)
    out = sync(mine)
    torch.testing.assert_close(out, want[r * 4:(r + 1) * 4].detach(), rtol=1e-4, atol=1e-5)
    ((out * out).sum() / want.numel()).backward()  # this rank's share of the global mean
    grads = [hvd.allreduce(g, op=hvd.Sum) for g in (sync.weight.grad, sync.bias.grad)]
    torch.testing.assert_close(grads[0], ref.weight.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads[1], ref.bias.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(mine.grad, xg.grad[r * 4:(r + 1) * 4], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(sync.running_mean, ref.running_mean, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(sync.running_var, ref.running_var, rtol=1e-4, atol=1e-6)


def test_process_sets_reduce_their_own_tensors_at_once():
    n, r = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("two sets of different ranks need two ranks (one rank's would be the same set twice)")
    everyone = hvd.add_process_set(list(range(n)))    # the world's ranks, a communicator of their own
    firsts = hvd.add_process_set(list(range(max(1, n - 1))))  # overlapping: all but the last rank
    try:
        assert everyone.included() and everyone.size() == n and everyone.rank() == r
        assert firsts.included() is (r < max(1, n - 1))
        # both sets' reductions in flight together, each on its own communicator and worker
        h1 = hvd.allreduce_async(torch.full((4,), float(r)), op=hvd.Sum, process_set=everyone)
        if firsts.included():
            h2 = hvd.allreduce_async(torch.full((4,), 1.0), op=hvd.Sum, process_set=firsts)
            assert torch.equal(hvd.synchronize(h2), torch.full((4,), float(firsts.size())))
        else:
            with pytest.raises(ddl.DDLError, match="not in process set"):
                hvd.allreduce(torch.ones(1), process_set=firsts)
        assert torch.equal(hvd.synchronize(h1), torch.full((4,), n * (n - 1) / 2))
    finally:
        hvd.remove_process_set(firsts)
        hvd.remove_process_set(everyone)


@pytest.mark.mpi(min_size=2)
def test_process_sets_that_differ_across_ranks_are_an_error_everywhere():
    mine = [0] if hvd.rank() == 0 else [0, 1]
    with pytest.raises(ddl.MismatchError, match="add_process_set"):
        hvd.add_process_set(mine)


def test_elastic_states_keep_and_restore_values():
    model, _, _ = model_and_data()
    state = hvd.elastic.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), epoch=3)
    before = [p.detach().clone() for p in model.parameters()]
    state.commit()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    state.epoch = 4
    state.restore()
    assert state.epoch == 3 and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    objects = hvd.elastic.ObjectState(batch=7)
    objects.commit()
    objects.batch = 9
    objects.restore()
    assert objects.batch == 7
    with pytest.raises(ddl.DDLError, match="ElasticSampler is not supported"):
        hvd.elastic.ElasticSampler


# -- what Horovod's own suite checks (issue 30): expectations from closed forms --------------------------------

def test_broadcast_gradient_is_the_ranks_mean_on_the_root_only():
    r, n = hvd.rank(), hvd.size()
    for root in range(n):
        x = torch.full((3,), float(r), requires_grad=True)
        (hvd.broadcast(x, root) * (r + 1)).sum().backward()  # each rank's output gradient: rank + 1
        want = torch.full((3,), (n + 1) / 2 if r == root else 0.0)
        torch.testing.assert_close(x.grad, want)


def test_sparse_allreduce_async_matches_the_dense_sum_and_mean():
    r, n = hvd.rank(), hvd.size()
    dense = np.zeros((n + 2, 3))
    dense[r, r % 3] = r + 1.0
    dense[n + 1, 0] = 2.0  # a row every rank holds: its entries are summed
    everyone = [np.zeros((n + 2, 3)) for _ in range(n)]
    for i, d in enumerate(everyone):
        d[i, i % 3], d[n + 1, 0] = i + 1.0, 2.0
    total = np.sum(everyone, axis=0)
    t = torch.from_numpy(dense).to_sparse()
    got_sum = hvd.sparse_allreduce_async(t, name="sparse.sum", op=hvd.Sum)()
    got_mean = hvd.sparse_allreduce_async(t, name="sparse.mean", op=hvd.Average)()
    assert got_sum.is_sparse and got_mean.is_sparse
    np.testing.assert_allclose(got_sum.to_dense().numpy(), total)
    np.testing.assert_allclose(got_mean.to_dense().numpy(), total / n)
    with pytest.raises(ValueError, match="sparse COO"):
        hvd.sparse_allreduce_async(torch.ones(2), name="dense", op=hvd.Sum)


@pytest.mark.mpi(min_size=2)
def test_a_name_in_flight_is_refused_on_its_rank_and_barrier_does_not_wait_for_it():
    r = hvd.rank()
    t = torch.full((5,), float(r))
    handle = None
    if r == 0:  # rank 0 submits first; the others only after the barrier, which must not wait for it
        handle = hvd.allreduce_async(t, name="twice", op=hvd.Sum)
        with pytest.raises(ValueError, match="twice"):
            hvd.allreduce_async(t, name="twice", op=hvd.Sum)
    hvd.barrier()
    if r != 0:
        handle = hvd.allreduce_async(t, name="twice", op=hvd.Sum)
        with pytest.raises(ValueError, match="twice"):
            hvd.allgather_async(t, name="twice")
    n = hvd.size()
    assert torch.equal(hvd.synchronize(handle), torch.full((5,), n * (n - 1) / 2))
    # synchronized: the name is free again
    again = hvd.synchronize(hvd.allreduce_async(t, name="twice", op=hvd.Sum))
    assert torch.equal(again, torch.full((5,), n * (n - 1) / 2))


@pytest.mark.mpi(min_size=2)
def test_root_rank_of_a_process_set_is_a_world_rank():
    r, n = hvd.rank(), hvd.size()
    tail = hvd.add_process_set(list(range(1, n)))  # every rank but 0: set rank i is world rank i + 1
    try:
        if tail.included():
            root = n - 1  # a world rank; the set's rank n - 2
            got = hvd.broadcast(torch.full((2,), float(r)), root, process_set=tail)
            assert torch.equal(got, torch.full((2,), float(root)))
            assert hvd.broadcast_object(("from", r), root, process_set=tail) == ("from", root)
            with pytest.raises(ddl.DDLError, match="root_rank 0 is not in process set"):
                hvd.broadcast(torch.ones(2), 0, process_set=tail)  # on every member alike
    finally:
        hvd.remove_process_set(tail)


def test_join_serves_the_others_allreduces_with_zeros():
    r, n = hvd.rank(), hvd.size()
    for first in range(n):
        a, b = torch.full((4,), float(r + 1)), torch.arange(6, dtype=torch.int32) * (r + 1)
        if r == first:
            last = hvd.join()
        else:  # the joined rank counts with zeros; Average still divides by every rank
            others = [i + 1 for i in range(n) if i != first]
            got_a = hvd.synchronize(hvd.allreduce_async(a, name="join.a"))
            got_b = hvd.allreduce(b, op=hvd.Sum)
            torch.testing.assert_close(got_a, torch.full((4,), sum(others) / n))
            assert torch.equal(got_b, torch.arange(6, dtype=torch.int32) * sum(others))
            if n > 1:
                with pytest.raises(ddl.MismatchError, match="join"):  # only allreduces are served
                    hvd.allgather(a)
            last = hvd.join()
        assert hvd.allgather_object(last) == [last] * n
        assert n == 1 or last != first


def test_init_again_brings_a_rank_that_left_early_back_in_step():
    """A rank leaves a loop of collectives early (an error on it alone) and calls hvd.init() (a script's or the
    suite's next test): the others' calls meanwhile fail naming init, then every rank meets there, in step."""
    r, n = hvd.rank(), hvd.size()
    if r != 0:
        with pytest.raises(ddl.MismatchError, match=r"hvd\.init\(\)"):
            hvd.allreduce(torch.ones(3))
    hvd.init()
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))


def test_join_serves_the_optimizers_gradient_allreduces():
    """Uneven data under DistributedOptimizer: rank 0 runs out after one step and joins; the others' later
    steps average their gradients with its zeros (divided by every rank), as Horovod's join does."""
    r, n = hvd.rank(), hvd.size()
    model = torch.nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    grad = [torch.tensor([[k + 1.0, 2.0 * k, -1.0]]) for k in range(n)]  # d(sum(model(x)))/dw = x
    for _ in range(1 if r == 0 else 3):
        opt.zero_grad()
        model(grad[r]).sum().backward()
        opt.step()
    hvd.join()
    want = 1.0 - 0.1 * (sum(grad) / n + 2 * sum(grad[1:]) / n)
    if r != 0:
        torch.testing.assert_close(model.weight.detach(), want)


def test_optimizer_checks_named_parameters_as_horovod():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(list(a.parameters()) + list(b.parameters()), lr=0.1)
    with pytest.raises(ValueError, match="more than once"):  # both name theirs weight and bias
        hvd.DistributedOptimizer(opt, named_parameters=list(a.named_parameters()) + list(b.named_parameters()))
    with pytest.raises(ValueError, match="unnamed"):
        hvd.DistributedOptimizer(opt, named_parameters=list(a.named_parameters()))
    wrapped = hvd.DistributedOptimizer(torch.optim.SGD([{"params": a.parameters()}, {"params": b.parameters()}],
                                                       lr=0.1))
    names = list(wrapped._parameter_names.values())
    assert len(names) == 4 and len(set(names)) == 4


def test_step_after_synchronize_warns_and_zero_grads_come_with_empty_state():
    model = torch.nn.Linear(3, 1)
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(list(model.parameters()) + [frozen], lr=0.1, momentum=0.9))
    hvd.broadcast_optimizer_state(opt, root_rank=0)  # no state yet: trainable parameters get zero gradients
    assert torch.equal(model.weight.grad, torch.zeros(1, 3)) and frozen.grad is None
    model(torch.ones(1, 3)).sum().backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()
    model(torch.ones(1, 3)).sum().backward()
    opt.synchronize()
    with opt.skip_synchronize(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        opt.step()
    assert not [w for w in seen if "skip_synchronize" in str(w.message)]


@pytest.mark.mpi(min_size=2)
def test_a_rank_outside_the_optimizers_process_set_steps_on_its_own_gradients():
    r, n = hvd.rank(), hvd.size()
    firsts = hvd.add_process_set(list(range(n - 1)))  # the last rank is outside
    try:
        w = torch.nn.Parameter(torch.zeros(2))
        opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), process_set=firsts)
        (w * (r + 1)).sum().backward()
        opt.step()
        mean_inside = sum(range(1, n)) / (n - 1)  # ranks 0..n-2 average their gradients r + 1
        want = -(mean_inside if firsts.included() else float(r + 1))
        torch.testing.assert_close(w.detach(), torch.full((2,), want))
    finally:
        hvd.remove_process_set(firsts)
