"""One job of the training benchmark (benchmarks/training.py launches it on an emulated cluster): a model with
ResNet-50's gradient sizes (161 tensors, ~102 MB float32) whose backward is an emulated accelerator (each
layer waits a time proportional to its size, leaving the CPU free, as a GPU would), trained one step at a time
by every configuration in turn:

- ``ddp-ddl``: DistributedDataParallel on the "ddl" backend;  ``ddp-gloo``: DDP on gloo;
- ``opt-overlap`` / ``opt-blocking``: ddl.torch.DistributedOptimizer with and without overlap.

First the communication alone is measured (ddl's blocking allreduce of every gradient, fused), and the
backward's compute is set equal to it unless given. Rank 0 writes JSON: per configuration the step times (max
over ranks), the communication and compute times, and a lone 64 MiB allreduce blocking and asynchronous.
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np


def resnet50_sizes() -> list[int]:
    """161 tensors of ResNet-50's sizes, in forward order: 53 convolutions (9,408 to 2,359,296 elements,
    ~23.5 M in all), 106 batch-norm scales and shifts, the classifier's weight and bias."""
    convs = np.geomspace(9_408, 2_359_296, 53)
    convs = (convs * (23_454_912 / convs.sum())).astype(int)
    widths = [64, 256, 512, 1024, 2048]
    sizes = []
    for i, c in enumerate(convs):
        w = widths[min(i * len(widths) // len(convs), len(widths) - 1)]
        sizes += [int(c), w, w]
    return sizes + [2_048_000, 1_000]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--configs", default="ddp-ddl,ddp-gloo,opt-overlap,opt-blocking")
    ap.add_argument("--compute-ms", type=float, default=0.0, help="backward's compute per step (0: = comm)")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb and the optimizer's")
    ap.add_argument("--scale", type=float, default=1.0, help="every tensor this times its size (smoke tests)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--buckets", action="store_true",
                    help="DDP through a comm hook that times each bucket: when backward made it ready, when its "
                         "allreduce finished (rank 0's, per step, seconds from the step's start)")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import ddl
    import ddl.torch as dt
    from ddl.tools.measure import init_torch

    comm = MPI.COMM_WORLD
    ddl.init()
    init_torch(comm)  # the default group: gloo; ddl's is a group over every rank
    ddl_group = dist.new_group(backend="ddl")
    sizes = [max(1, int(n * args.scale)) for n in resnet50_sizes()]
    total = sum(sizes)

    def slowest(seconds: float) -> float:
        return comm.allreduce(seconds, op=MPI.MAX)

    # communication alone: ddl's blocking allreduce of every gradient, fused
    flat = np.ones(total, np.float32)
    comm_times = []
    for _ in range(3):
        comm.Barrier()
        t0 = time.perf_counter()
        ddl.allreduce(flat, "avg", out=flat)
        comm_times.append(slowest(time.perf_counter() - t0))
    t_comm = statistics.median(comm_times)
    compute = args.compute_ms / 1e3 if args.compute_ms else t_comm
    compute = comm.bcast(compute)

    class Layer(torch.autograd.Function):
        """Identity forward; backward waits its share of the compute (the CPU stays free) and yields a
        gradient of ones for its weight."""

        @staticmethod
        def forward(ctx, x, w, seconds):
            ctx.seconds, ctx.shape = seconds, w.shape
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            time.sleep(ctx.seconds)
            return g, torch.full(ctx.shape, 1e-3), None

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(n)) for n in sizes])
            self.seconds = [compute * n / total for n in sizes]

        def forward(self, x):
            for w, s in zip(self.weights, self.seconds):
                x = Layer.apply(x, w, s)
            return x

    step_start = [0.0]
    buckets: dict[str, list] = {}

    def timed_hook(name):
        """DDP's default hook (average: divide, allreduce) that notes each bucket's ready and done times."""
        def hook(group, bucket):
            ready = time.perf_counter() - step_start[0]
            tensor = bucket.buffer().div_(group.size())
            fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

            def done(f):
                buckets[name][-1].append((bucket.index(), tensor.numel() * tensor.element_size(), ready,
                                          time.perf_counter() - step_start[0]))
                return f.value()[0]
            return fut.then(done)
        return hook

    def build(name):
        model = Model()
        if name.startswith("ddp"):
            group = ddl_group if name == "ddp-ddl" else None
            net = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=args.bucket_mb)
            if args.buckets:
                net.register_comm_hook(group or dist.group.WORLD, timed_hook(name))
                buckets[name] = []
            return net, torch.optim.SGD(net.parameters(), lr=0.0)
        opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                      threshold=int(args.bucket_mb * (1 << 20)), overlap=name == "opt-overlap")
        return model, opt

    configs = args.configs.split(",")
    runs = {c: build(c) for c in configs}
    steps: dict[str, list[float]] = {c: [] for c in configs}
    for k in range(args.steps + 1):  # the first round warms up
        for c in configs[k % len(configs):] + configs[:k % len(configs)]:  # alternate, rotating the order
            net, opt = runs[c]
            comm.Barrier()
            t0 = step_start[0] = time.perf_counter()
            if c in buckets:
                buckets[c].append([])
            opt.zero_grad()
            net(torch.zeros(1)).sum().backward()
            opt.step()
            took = slowest(time.perf_counter() - t0)
            if k:
                steps[c].append(took)

    # a lone 64 MiB allreduce, blocking against asynchronous (submitted, then waited at once)
    big = np.ones(max(1, int((16 << 20) * args.scale)), np.float32)
    lone = {"blocking": [], "async": []}
    for k in range(10):
        for how in (("blocking", "async") if k % 2 == 0 else ("async", "blocking")):
            comm.Barrier()
            t0 = time.perf_counter()
            if how == "blocking":
                ddl.allreduce(big, "sum", out=big)
            else:
                ddl.allreduce_async(big, "sum", out=big).wait()
            lone[how].append(slowest(time.perf_counter() - t0))
            big.fill(1.0)
    if comm.rank == 0:
        with open(args.out, "w") as f:
            json.dump({"ranks": comm.size, "tensors": len(sizes), "bytes": 4 * total, "comm": comm_times,
                       "compute": compute, "steps": steps, "lone_64mib": lone,
                       "buckets": {c: [sorted(step) for step in b[1:]] for c, b in buckets.items()}}, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
