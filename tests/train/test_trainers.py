"""The trainers people use, on the "ddl" backend (mpi_suite.py at 2 ranks): PyTorch Lightning's DDPStrategy and
Hugging Face Accelerate train the same weights as one process over the global batch (plain torch, run locally on
each rank: never ddl)."""
import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")
accelerate = pytest.importorskip("accelerate")
MPI = pytest.importorskip("mpi4py.MPI")

import torch.distributed as dist  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402

import ddl  # noqa: E402
import ddl.torch as dt  # noqa: E402

pytestmark = pytest.mark.mpi
R, P = MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size
SAMPLES, BATCH, EPOCHS, LR = 16, 2, 2, 0.1


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 3, generator=g)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.3


def model():
    torch.manual_seed(1)
    return torch.nn.Linear(3, 1)


def one_process(global_batches):
    """SGD over ``global_batches(epoch)``, each step the mean loss over the batch's samples (DDP averages the
    ranks' means: the same, as every rank's batch has as many samples)."""
    x, y = data()
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    for epoch in range(EPOCHS):
        for idx in global_batches(epoch):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x[idx]), y[idx]).backward()
            opt.step()
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def weights(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = model()

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


def test_lightning_ddp_strategy_on_ddl():
    x, y = data()
    module = Regression()
    trainer = L.Trainer(accelerator="cpu", devices=ddl.local_size(), num_nodes=ddl.num_hosts(),
                        strategy=DDPStrategy(process_group_backend="ddl"), max_epochs=EPOCHS, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH))
    assert dist.get_backend() == "ddl" and (trainer.global_rank, trainer.world_size) == (R, P)
    # Lightning's DistributedSampler shuffles training data: each epoch a permutation seeded with 0 + epoch,
    # rank r taking every P-th sample from r; step k, each rank's k-th batch of its share
    def steps(epoch):
        perm = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(epoch)).tolist()
        mine = [perm[r::P] for r in range(P)]
        return [sum((m[k * BATCH:(k + 1) * BATCH] for m in mine), []) for k in range(SAMPLES // P // BATCH)]
    torch.testing.assert_close(weights(module), one_process(steps))


def test_accelerate_on_ddl_created_first():
    """Accelerate on CPU replaces any backend but MPI's by gloo (InitProcessGroupKwargs(backend="ddl") raises
    there), and keeps a process group that exists: create ddl's first."""
    from accelerate import Accelerator

    if not dist.is_initialized():
        dt.init_process_group()
    x, y = data()
    acc = Accelerator(cpu=True)
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
    m, opt, loader = acc.prepare(m, opt, loader)
    assert dist.get_backend() == "ddl" and (acc.process_index, acc.num_processes) == (R, P)
    for _ in range(EPOCHS):
        for xb, yb in loader:
            opt.zero_grad()
            acc.backward(torch.nn.functional.mse_loss(m(xb), yb))
            opt.step()
    # Accelerate shards whole batches: step k, rank r takes batch k * P + r (consecutive samples)
    steps = [list(range(k * P * BATCH, (k + 1) * P * BATCH)) for k in range(SAMPLES // P // BATCH)]
    torch.testing.assert_close(weights(acc.unwrap_model(m)), one_process(lambda epoch: steps))
