"""The synthetic benchmark of examples/horovod/pytorch_synthetic_benchmark.py as a PyTorch DDP user writes it,
for benchmarks/horovod_synthetic.py: the same model, data, optimizer and steps, under
DistributedDataParallel on gloo (``--peer ddp-gloo``), or with no averaging at all (``--peer compute``: what
the ranks do between collectives, the ceiling). Run under MPI (the ranks and gloo's rendezvous come from it).
Prints, on rank 0, the same "Total img/sec" line as the Horovod script."""
import argparse
import os
import sys
import timeit

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "horovod"))
import resnet  # noqa: E402  (torchvision's ResNet-18, built here)

from ddl.tools.measure import init_torch  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--peer", choices=("ddp-gloo", "compute"), required=True)
ap.add_argument("--batch-size", type=int, default=8)
ap.add_argument("--image-size", type=int, default=224)
ap.add_argument("--num-warmup-batches", type=int, default=2)
ap.add_argument("--num-batches-per-iter", type=int, default=5)
ap.add_argument("--num-iters", type=int, default=3)
ap.add_argument("--seed", type=int, default=42)
args = ap.parse_args()

comm = MPI.COMM_WORLD
torch.manual_seed(args.seed)
model = resnet.resnet18()
if args.peer == "ddp-gloo":
    init_torch(comm)
    model = torch.nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's parameters
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * comm.size)
torch.manual_seed(args.seed + comm.rank)
data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
target = torch.randint(0, 1000, (args.batch_size,))


def step():
    optimizer.zero_grad()
    F.cross_entropy(model(data), target).backward()
    optimizer.step()


timeit.timeit(step, number=args.num_warmup_batches)
img_secs = []
for _ in range(args.num_iters):
    comm.Barrier()  # the ranks start each iteration together, as the collectives make them in the other peers
    img_secs.append(args.batch_size * args.num_batches_per_iter / timeit.timeit(step, number=args.num_batches_per_iter))
mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
if comm.rank == 0:
    print(f"Total img/sec on {comm.size} CPU(s): {comm.size * mean:.1f} +-{comm.size * conf:.1f}", flush=True)
if args.peer == "ddp-gloo":
    dist.destroy_process_group()
