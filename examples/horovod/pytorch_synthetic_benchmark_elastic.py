"""Horovod's elastic synthetic benchmark for PyTorch, written as Horovod's example is: only the import line
differs. The model, optimizer and counters live in an hvd.elastic.TorchState, committed every
--batches-per-commit batches; under an elastic launch (ddlrun --min-np / horovodrun's flags) a lost rank
rolls the others back to the last commit and they go on with fewer.

    ddlrun -np 4 --min-np 2 python examples/horovod/pytorch_synthetic_benchmark_elastic.py
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

parser = argparse.ArgumentParser(description="PyTorch Elastic Synthetic Benchmark",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", help="use fp16 compression during allreduce")
parser.add_argument("--model", default="resnet18", help="model to benchmark")
parser.add_argument("--batch-size", type=int, default=8, help="input batch size")
parser.add_argument("--image-size", type=int, default=224, help="height and width of the synthetic images")
parser.add_argument("--num-warmup-batches", type=int, default=2, help="batches before timing starts")
parser.add_argument("--num-batches-per-iter", type=int, default=5, help="batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=3, help="benchmark iterations")
parser.add_argument("--batches-per-commit", type=int, default=1, help="batches between two commits of the state")
parser.add_argument("--seed", type=int, default=42, help="model and data seed (data: seed + rank)")
args = parser.parse_args()

hvd.init()
torch.manual_seed(args.seed)
model = getattr(models, args.model)()
optimizer = optim.SGD(model.parameters(), lr=0.01 * hvd.size())
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression)

torch.manual_seed(args.seed + hvd.rank())
data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
target = torch.randint(0, 1000, (args.batch_size,))


def benchmark_step(state):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()
    state.batch += 1
    if state.batch == args.batches_per_commit:
        state.batch = 0
        state.commit()


def log(s):
    if hvd.rank() == 0:
        print(s, flush=True)


@hvd.elastic.run
def run_benchmark(state):
    if not state.warm:
        log("Running warmup...")
        timeit.timeit(lambda: benchmark_step(state), number=args.num_warmup_batches)
        state.warm = True
        state.commit()
    if state.iter == 0:
        log("Running benchmark...")
    for x in range(state.iter, args.num_iters):
        seconds = timeit.timeit(lambda: benchmark_step(state), number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{x}: {img_sec:.1f} img/sec per CPU")
        state.img_secs.append(img_sec)
        state.iter = x + 1
        state.commit()


def on_state_reset():
    # the learning rate follows the ranks left
    for group in optimizer.param_groups:
        group["lr"] = 0.01 * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, img_secs=[], iter=0, batch=0, warm=False)
state.register_reset_callbacks([on_state_reset])
run_benchmark(state)

mean, conf = np.mean(state.img_secs), 1.96 * np.std(state.img_secs)
log(f"Img/sec per CPU: {mean:.1f} +-{conf:.1f}")
log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")
weights = sum(float(p.detach().double().sum()) for p in model.parameters())
every = hvd.allgather_object(weights)
log(f"weights {weights:.6f} same on every rank {all(w == weights for w in every)}")
