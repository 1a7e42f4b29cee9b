"""Training on CUDA: DDP and FSDP2 on the "ddl" backend against "nccl", the same model, data and steps, side by
side in one run.

    python benchmarks/device_training.py --np 2           # ranks share this host's GPU, self-launched
    python benchmarks/device_training.py --np 2 --out benchmarks/results/device-training.md

The model is an MLP of 25 M parameters (100 MB of fp32 gradients). DDP: 25 MB buckets, four bucket allreduces a
step that can overlap the backward pass. FSDP2: fully_shard per layer and on the whole (an allgather per layer
forward and backward, a reduce-scatter per layer). Each rank its own batch. The models of one kind start equal
and take the same steps in alternating blocks; the table gives the median step time of each and the largest
difference of parameters between ddl's and nccl's at the end (they must train alike). Ranks that share a GPU are
separate NCCL hosts (NCCL_HOSTID); run under CUDA MPS (DDL_BENCH_MPS=1 says so in the table).
"""
import os
import statistics
import sys
import time

WIDTH, LAYERS, BATCH = 2500, 4, 256  # 4 x 2500^2 weights: 25 M parameters
BLOCK = 5  # steps per block; blocks alternate between the backends


def model(torch):
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1]).cuda()


def worker(repeats: int) -> dict:
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import ddl
    import ddl.torch  # noqa: F401  (registers the "ddl" backend)
    from ddl.tools.measure import init_torch

    comm = MPI.COMM_WORLD
    os.environ.setdefault("NCCL_HOSTID", f"ddl-bench-rank{comm.rank}")
    torch.cuda.set_device(0)
    ddl.init()
    init_torch(comm, "nccl")
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    groups = {"nccl": dist.group.WORLD, "ddl": dist.new_group(backend="ddl")}

    def sharded(group):
        net = model(torch)
        mesh = DeviceMesh.from_group(group, "cuda", mesh_dim_names=("shard",))
        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        return fully_shard(net, mesh=mesh)

    runs = {}
    for name, group in groups.items():
        for kind, wrap in (("DDP", lambda g: torch.nn.parallel.DistributedDataParallel(model(torch),
                                                                                       process_group=g)),
                           ("FSDP2", sharded)):
            net = wrap(group)
            runs[f"{kind} {name}"] = (net, torch.optim.SGD(net.parameters(), lr=0.01))
    torch.manual_seed(1 + comm.rank)
    data = torch.randn(BATCH, WIDTH, device="cuda")
    target = torch.randn(BATCH, WIDTH, device="cuda")

    def step(name: str) -> None:
        net, opt = runs[name]
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(net(data), target).backward()
        opt.step()

    for name in runs:  # warm-up: buckets rebuilt after the first step, NCCL connected
        for _ in range(2):
            step(name)
    torch.cuda.synchronize()
    times = {name: [] for name in runs}
    for r in range(repeats):
        for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(BLOCK):
                step(name)
            torch.cuda.synchronize()
            times[name].append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX) / BLOCK)
    def full(name):
        return [p.full_tensor() if hasattr(p, "full_tensor") else p for p in runs[name][0].parameters()]

    apart = {kind: max(float((a - b).abs().max()) for a, b in zip(full(f"{kind} nccl"), full(f"{kind} ddl")))
             for kind in ("DDP", "FSDP2")}
    dist.destroy_process_group()
    return {"ranks": comm.size, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "mps": os.environ.get("DDL_BENCH_MPS") == "1", "ms": {k: statistics.median(v) * 1e3
                                                                  for k, v in times.items()},
            "apart": apart}


def report(results: dict, n: int) -> str:
    ms = results["ms"]
    mps = "under CUDA MPS" if results["mps"] else "without CUDA MPS (time-sliced)"
    rows = [f"| {k} | {v:.2f} | {v / ms[k.split()[0] + ' nccl']:.3f} | {results['apart'][k.split()[0]]:.3g} |"
            for k, v in ms.items()]
    return "\n".join([
        f"# Training on CUDA: ddl against nccl ({n} ranks sharing {results['gpu']}, {mps}, "
        f"torch {results['torch']})", "",
        f"MLP of {LAYERS} x {WIDTH}^2 weights (25 M parameters, 100 MB of fp32 gradients), batch {BATCH} per "
        f"rank; median over blocks of {BLOCK} steps (slowest rank); apart = the largest parameter difference "
        f"between ddl's and nccl's model of that kind after the same steps.", "",
        "| job | step (ms) | x nccl | apart |", "|---|---:|---:|---:|", *rows])


def main() -> int:
    from ddl.tools.measure import self_launched

    return self_launched(__file__, __doc__, worker, report, repeats=8)


if __name__ == "__main__":
    sys.exit(main())
