"""One job of the sharded-training benchmark (benchmarks/fsdp.py launches it on an emulated cluster): a model of
``--layers`` layers of ``--elements`` float32 parameters each, trained one step at a time with FSDP2 by every
configuration in turn:

- ``fsdp-ddl``: fully_shard over every rank, the mesh's group on the "ddl" backend;
- ``fsdp-gloo``: the same on gloo (torch's CPU backend);
- ``hsdp-ddl``: fully_shard on ``ddl.torch.device_mesh()`` (shard inside the topology's innermost groups,
  replicate across them), on "ddl".

A layer's forward and backward wait ``--compute-ms`` in all (forward a third, backward two thirds; 0 by
default: the step is FSDP's communication, its allgathers and reduce-scatters), leaving the CPU free as an
accelerator would. Then ddl's reduce-scatter of 16 MiB against ddl's allreduce of the same buffer,
alternating. Rank 0 writes JSON: per configuration the step times (max over ranks), and the two collectives'.
"""
import argparse
import json
import sys
import time

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--configs", default="fsdp-ddl,fsdp-gloo,hsdp-ddl")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--elements", type=int, default=2 << 20, help="parameters per layer (float32)")
    ap.add_argument("--compute-ms", type=float, default=0.0, help="forward + backward compute per step")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    from mpi4py import MPI
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    import ddl
    import ddl.torch as dt
    from ddl.tools.measure import init_torch

    comm = MPI.COMM_WORLD
    ddl.init()
    init_torch(comm)  # the default group: gloo; ddl's groups beside it
    ddl_world = dist.new_group(backend="ddl")
    share = args.compute_ms / 1e3 / args.layers

    def slowest(seconds: float) -> float:
        return comm.allreduce(seconds, op=MPI.MAX)

    class Layer(torch.autograd.Function):
        """Identity forward (a third of the layer's compute); backward the other two thirds, and a gradient of
        ones for the weight."""

        @staticmethod
        def forward(ctx, x, w):
            time.sleep(share / 3)
            ctx.shape = w.shape
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            time.sleep(2 * share / 3)
            return g, torch.full(ctx.shape, 1e-3)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(args.elements))

        def forward(self, x):
            return Layer.apply(x, self.weight)

    meshes = {"fsdp-gloo": lambda: DeviceMesh("cpu", torch.arange(comm.size), mesh_dim_names=("shard",)),
              "fsdp-ddl": lambda: DeviceMesh.from_group(ddl_world, "cpu", mesh_dim_names=("shard",)),
              "hsdp-ddl": lambda: dt.device_mesh(device_type="cpu", backend="ddl")}

    def build(name):
        mesh = meshes[name]()
        model = torch.nn.Sequential(*[Block() for _ in range(args.layers)])
        for block in model:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.SGD(model.parameters(), lr=0.0), mesh.mesh.tolist()

    configs = args.configs.split(",")
    runs = {c: build(c) for c in configs}
    steps: dict[str, list[float]] = {c: [] for c in configs}
    for k in range(args.steps + 1):  # the first round warms up
        for c in configs[k % len(configs):] + configs[:k % len(configs)]:  # alternate, rotating the order
            model, opt, _ = runs[c]
            comm.Barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            model(torch.zeros(1, requires_grad=True)).sum().backward()
            opt.step()
            took = slowest(time.perf_counter() - t0)
            if k:
                steps[c].append(took)

    # ddl's reduce-scatter of 16 MiB against its allreduce of the same buffer (half the bytes cross the links)
    big = np.ones(4 << 20, np.float32)
    part = np.empty(big.size // comm.size, np.float32)
    collectives = {"reduce_scatter": [], "allreduce": []}
    for k in range(10):
        for how in (("reduce_scatter", "allreduce") if k % 2 == 0 else ("allreduce", "reduce_scatter")):
            big.fill(1.0)
            comm.Barrier()
            t0 = time.perf_counter()
            if how == "allreduce":
                ddl.allreduce(big, "sum", out=big)
            else:
                ddl.reduce_scatter(big.reshape(comm.size, -1), "sum", out=part.reshape(1, -1))
            collectives[how].append(slowest(time.perf_counter() - t0))
    if comm.rank == 0:
        with open(args.out, "w") as f:
            json.dump({"ranks": comm.size, "layers": args.layers, "bytes": 4 * args.layers * args.elements,
                       "compute": args.compute_ms / 1e3, "steps": steps, "meshes": {c: runs[c][2] for c in configs},
                       "collectives_16mib": collectives}, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
