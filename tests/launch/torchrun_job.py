"""A job written for torchrun, run by tests/launch/test_torchrun.py without any MPI launcher.

    torchrun_job.py ddp|fsdp     dist.init_process_group("ddl"); DDP or FSDP2 trains 4 steps on this rank's
                                 share of a global batch; every rank checks its weights against one process
                                 training on the whole batch (torch alone, no collective)
    torchrun_job.py horovod      a Horovod-style script (ddl.horovod.torch: hvd.init(), broadcast_parameters,
                                 DistributedOptimizer), checked the same way
    torchrun_job.py lightning    PyTorch Lightning's Trainer with DDPStrategy(process_group_backend="ddl"), as
                                 torchrun starts it; checked the same way
    torchrun_job.py accelerate   Hugging Face Accelerate on a "ddl" process group made first (on CPU it keeps
                                 one that exists); checked the same way
    torchrun_job.py numpy REPORT ddl.init() in a plain script; an allreduce checked in closed form; rank 0 writes
                                 what ddl saw (ranks, local ranks, hosts) to REPORT
    torchrun_job.py dies         ddl.init(), then the last rank exits before an allreduce: the others must fail
                                 naming it (each prints the error's text)

    torchrun_job.py device       on an MPI whose processes cannot join (Open MPI), with the stand-in CUDA and NCCL
                                 (tests/fakes): dist.init_process_group("ddl") makes a world over torch's store;
                                 GPU arrays' allreduce, reduce_scatter, allgather and broadcast checked in closed
                                 form (NCCL at every level), then in a group of the even ranks, a mismatched call
                                 and host tensors refused on every rank; each rank prints what it saw

    torchrun_job.py restarts     on torchrun's first attempt the last rank exits after ddl.init(); on the next
                                 (--max-restarts) every rank allreduces, checked in closed form

Exits 1 with a line on stderr when a check fails.
"""
import json
import os
import sys

import numpy as np

STEPS, BATCH, FEATURES = 4, 24, 6


def model():
    import torch

    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def batch(step: int):
    import torch

    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(BATCH, FEATURES, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def train(net, rank: int, size: int, share: bool, wrap=None):
    """Plain SGD on mean squared error; with ``share`` each rank takes its contiguous BATCH/size rows; ``wrap``
    makes the optimizer distributed (Horovod's way)."""
    import torch

    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    if wrap is not None:
        opt = wrap(opt)
    for step in range(STEPS):
        x, y = batch(step)
        if share:
            rows = BATCH // size
            x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()


def check(rank: int, got: dict, want: dict) -> int:
    import torch

    for name, w in want.items():
        if not torch.allclose(got[name], w, rtol=1e-5, atol=1e-6):
            print(f"rank {rank}: {name} differs from one process on the whole batch by "
                  f"{(got[name] - w).abs().max().item():.3g}", file=sys.stderr)
            return 1
    return 0


def trained(kind: str) -> int:
    import torch
    import torch.distributed as dist

    import ddl.torch  # noqa: F401  (registers the "ddl" backend)

    dist.init_process_group("ddl")
    rank, size = dist.get_rank(), dist.get_world_size()
    reference = model()
    train(reference, 0, 1, share=False)
    net = model()
    if kind == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(net)
        train(wrapped, rank, size, share=True)
        got = dict(net.named_parameters())
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(net)
        train(net, rank, size, share=True)
        got = {n: p.full_tensor() for n, p in net.named_parameters()}
    failed = check(rank, {n: t.detach() for n, t in got.items()}, dict(reference.named_parameters()))
    dist.destroy_process_group()
    if not failed:
        print(f"rank {rank} of {size}: {kind} equals one process", flush=True)
    return failed


def horovod_style() -> int:
    """The script Horovod's documentation starts from, with only its import changed."""
    import torch

    import ddl.horovod.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    reference = model()
    train(reference, 0, 1, share=False)
    net = model()
    if rank != 0:  # another start on the other ranks: broadcast_parameters must give them rank 0's
        with torch.no_grad():
            for p in net.parameters():
                p.add_(1.0)
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    train(net, rank, size, share=True,
          wrap=lambda opt: hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters()))
    failed = check(rank, {n: t.detach() for n, t in net.named_parameters()}, dict(reference.named_parameters()))
    if not failed:
        print(f"rank {rank} of {size}: horovod equals one process", flush=True)
    hvd.shutdown()
    return failed


def whole_data():
    """Every step's global batch, one after the other: a loader of BATCH/size rows per rank that splits each
    global batch among the ranks (Lightning's sampler interleaves rows, Accelerate deals out whole batches) gives
    step k the rows of batch(k) on all ranks together."""
    import torch

    parts = [batch(step) for step in range(STEPS)]
    return torch.utils.data.TensorDataset(torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts]))


def lightning_trained() -> int:
    import lightning as L
    import torch
    from lightning.pytorch.strategies import DDPStrategy

    import ddl.torch  # noqa: F401  (registers the "ddl" backend)

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model()

        def training_step(self, b, _):
            x, y = b
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    module = Regression()
    trainer = L.Trainer(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), max_epochs=1,
                        strategy=DDPStrategy(process_group_backend="ddl"), use_distributed_sampler=False,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    data = whole_data()  # (Lightning's own sampler would shuffle: this one interleaves the rows in order)
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=size, rank=rank, shuffle=False)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=BATCH // size, sampler=sampler))
    return compared("lightning", trainer.global_rank, trainer.world_size, module.net)


def accelerate_trained() -> int:
    import torch
    import torch.distributed as dist
    from accelerate import Accelerator

    import ddl.torch  # noqa: F401  (registers the "ddl" backend)

    dist.init_process_group("ddl")  # Accelerate on CPU would make gloo's; it keeps one that exists
    acc = Accelerator(cpu=True)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(whole_data(), batch_size=BATCH // acc.num_processes)
    wrapped, opt, loader = acc.prepare(net, opt, loader)
    for x, y in loader:
        opt.zero_grad()
        acc.backward(torch.nn.functional.mse_loss(wrapped(x), y))
        opt.step()
    return compared("accelerate", acc.process_index, acc.num_processes, acc.unwrap_model(wrapped))


def compared(kind: str, rank: int, size: int, net) -> int:
    """Checks the trained ``net`` against one process trained on the whole batch; says so when they equal."""
    import torch.distributed as dist

    if dist.get_backend() != "ddl":
        print(f"rank {rank}: {kind} ran on {dist.get_backend()}, not ddl", file=sys.stderr)
        return 1
    reference = model()
    train(reference, 0, 1, share=False)
    failed = check(rank, {n: t.detach() for n, t in net.named_parameters()}, dict(reference.named_parameters()))
    if not failed:
        print(f"rank {rank} of {size}: {kind} equals one process", flush=True)
    return failed


def plain(report: str) -> int:
    import ddl

    ddl.init()
    rank, size = ddl.rank(), ddl.size()
    y = ddl.allreduce(np.arange(1000, dtype=np.float64) * (rank + 1))
    if not np.array_equal(y, np.arange(1000, dtype=np.float64) * size * (size + 1) / 2):
        print(f"rank {rank}: wrong allreduce", file=sys.stderr)
        return 1
    seen = ddl.communicator().mpi_comm.gather({"rank": rank, "env_rank": int(os.environ["RANK"]), "size": size,
                                               "local_rank": ddl.local_rank(), "local_size": ddl.local_size(),
                                               "hosts": ddl.num_hosts(), "transport": ddl.explain(1 << 20).transport})
    if rank == 0:
        with open(report, "w") as f:
            json.dump(seen, f)
    return 0


def dies() -> int:
    import ddl

    ddl.init()
    rank, size = ddl.rank(), ddl.size()
    if rank == size - 1:
        os._exit(3)
    try:
        ddl.allreduce(np.ones(1 << 16, np.float32))
    except ddl.DDLError as e:
        print(f"rank {rank} failed: {e}", flush=True)
        return 0
    print(f"rank {rank}: the allreduce succeeded without rank {size - 1}", file=sys.stderr)
    return 1


def restarts() -> int:
    import ddl

    ddl.init()
    rank, size, attempt = ddl.rank(), ddl.size(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 0 and rank == size - 1:
        os._exit(3)
    y = ddl.allreduce(np.full(1000, rank + 1.0))
    if not np.all(y == size * (size + 1) / 2):
        print(f"rank {rank}: wrong allreduce on attempt {attempt}", file=sys.stderr)
        return 1
    print(f"rank {rank} of {size}: attempt {attempt} allreduced", flush=True)
    return 0


def device_world() -> int:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the stand-ins
    import ddl.torch  # noqa: F401 (registers the backend)
    from ddl import DDLError, MismatchError
    from ddl.gpu.world import DeviceWorld
    from ddl.torch import backend
    from fakes import FakeDeviceArray, read, synchronize

    dist.init_process_group("ddl")
    rank, size = dist.get_rank(), dist.get_world_size()
    world = backend._device_world
    if not isinstance(world, DeviceWorld):
        print(f"rank {rank}: the world is {world!r}, not a DeviceWorld", file=sys.stderr)
        return 1
    x = np.arange(10007, dtype=np.float32) * (rank + 1)
    world.allreduce(FakeDeviceArray(x), out=FakeDeviceArray(x))
    synchronize()
    rows = np.arange(4 * size * 3, dtype=np.float64).reshape(4 * size, 3) + rank
    part = read(world.reduce_scatter(FakeDeviceArray(rows), "sum"), np.float64)
    mine = np.full((2, 5), rank, np.int32)
    gathered = read(world.allgather(FakeDeviceArray(mine)), np.int32)
    sent = np.arange(100, dtype=np.uint8) * (rank + 1)
    world.broadcast(FakeDeviceArray(sent), size - 1, out=FakeDeviceArray(sent))
    synchronize()
    whole = size * np.arange(4 * size * 3, dtype=np.float64).reshape(4 * size, 3) + size * (size - 1) / 2
    checks = {"allreduce": np.array_equal(x, np.arange(10007, dtype=np.float32) * size * (size + 1) / 2),
              "reduce_scatter": np.array_equal(part, whole[4 * rank:4 * rank + 4]),
              "allgather": np.array_equal(gathered, np.repeat(np.arange(size, dtype=np.int32), 2)[:, None]
                                          * np.ones((1, 5), np.int32)),
              "broadcast": np.array_equal(sent, np.arange(100, dtype=np.uint8) * size)}
    wrong = [name for name, ok in checks.items() if not ok]
    if wrong:
        print(f"rank {rank}: wrong {wrong}", file=sys.stderr)
        return 1
    try:
        world.allreduce(FakeDeviceArray(np.ones(8 + (rank == 0), np.float32)))
        print(f"rank {rank}: a mismatched allreduce ran", file=sys.stderr)
        return 1
    except MismatchError as e:
        print(f"rank {rank} mismatch: {e}", flush=True)
    try:
        dist.all_reduce(torch.ones(3))
        print(f"rank {rank}: a host tensor's allreduce ran", file=sys.stderr)
        return 1
    except DDLError as e:
        print(f"rank {rank} host refused: {e}", flush=True)
    evens = dist.new_group([r for r in range(size) if r % 2 == 0])  # a group of the world's: its own store keys
    if rank % 2 == 0:
        y = np.full(100, rank, np.float64)
        evens.comm.allreduce(FakeDeviceArray(y), out=FakeDeviceArray(y))
        synchronize()
        if not np.all(y == sum(range(0, size, 2))) or evens.comm.size != (size + 1) // 2:
            print(f"rank {rank}: the group of even ranks reduced {y[0]} over {evens.comm.size}", file=sys.stderr)
            return 1
    path = world._device._paths[0]
    levels = [g.nranks if g is not None else 1 for g in path.groups]
    print(f"rank {rank} of {size}: device world ran every collective, NCCL groups {levels}, "
          f"mpi4py initialised MPI: {_mpi_initialized()}", flush=True)
    dist.destroy_process_group()
    return 0


def _mpi_initialized() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    return bool(mpi is not None and mpi.Is_initialized())


if __name__ == "__main__":
    what = sys.argv[1]
    jobs = {"horovod": horovod_style, "lightning": lightning_trained, "accelerate": accelerate_trained,
            "numpy": lambda: plain(sys.argv[2]), "restarts": restarts, "dies": dies, "device": device_world}
    sys.exit(trained(what) if what in ("ddp", "fsdp") else jobs[what]())
