"""Horovod's synthetic benchmark for PyTorch, written as Horovod's example is: only the import line differs
(ddl.horovod.torch in place of horovod.torch). Synthetic images, a torchvision model (ResNet-18 from resnet.py where
torchvision cannot be installed), images per second per rank and in total. ``--seed`` makes runs comparable:
rank 0 ends with the weights' sum and whether every rank holds the same weights.

    ddlrun -np 4 python examples/horovod/pytorch_synthetic_benchmark.py --model resnet18 --batch-size 8
"""
import argparse
import timeit

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim

import ddl.horovod.torch as hvd

try:
    from torchvision import models
except Exception:  # PyPI's torchvision needs CUDA's torch: the same ResNet-18, built here
    import resnet as models

parser = argparse.ArgumentParser(description="PyTorch Synthetic Benchmark",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", help="use fp16 compression during allreduce")
parser.add_argument("--model", default="resnet18", help="model to benchmark")
parser.add_argument("--batch-size", type=int, default=8, help="input batch size")
parser.add_argument("--image-size", type=int, default=224, help="height and width of the synthetic images")
parser.add_argument("--num-warmup-batches", type=int, default=2, help="batches before timing starts")
parser.add_argument("--num-batches-per-iter", type=int, default=5, help="batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=3, help="benchmark iterations")
parser.add_argument("--use-adasum", action="store_true", help="use the Adasum reduction")
parser.add_argument("--seed", type=int, default=42, help="model and data seed (data: seed + rank)")
args = parser.parse_args()

hvd.init()
torch.manual_seed(args.seed)
model = getattr(models, args.model)()

# Adasum does not need the learning rate scaled up by the ranks
lr_scaler = hvd.size() if not args.use_adasum else 1
optimizer = optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression, op=hvd.Adasum if args.use_adasum else hvd.Average)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

torch.manual_seed(args.seed + hvd.rank())
data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
target = torch.randint(0, 1000, (args.batch_size,))


def benchmark_step():
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()


def log(s):
    if hvd.rank() == 0:
        print(s, flush=True)


log(f"Model: {args.model}")
log(f"Batch size: {args.batch_size}")
log(f"Number of CPUs: {hvd.size()}")
log("Running warmup...")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)
log("Running benchmark...")
img_secs = []
for x in range(args.num_iters):
    seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_secs.append(args.batch_size * args.num_batches_per_iter / seconds)
    log(f"Iter #{x}: {img_secs[-1]:.1f} img/sec per CPU")
mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
log(f"Img/sec per CPU: {mean:.1f} +-{conf:.1f}")
log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")

weights = sum(float(p.detach().double().sum()) for p in model.parameters())
every = hvd.allgather_object(weights)
log(f"weights {weights:.6f} same on every rank {all(w == weights for w in every)}")
