"""A Horovod PyTorch script, written as Horovod's own pytorch_mnist.py example is (generated digits in place of a
download), for tests/launch/test_horovod_scripts.py: only its import line differs from a Horovod script.
Prints, on rank 0, the final training loss and the weights' sum."""
import argparse

import numpy as np
import torch
import torch.nn.functional as F
import torch.utils.data.distributed

import ddl.horovod.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--use-adasum", action="store_true")
args = parser.parse_args()

hvd.init()
torch.manual_seed(42)
torch.set_num_threads(1)

rng = np.random.default_rng(0)
images = torch.from_numpy(rng.standard_normal((256, 1, 8, 8)).astype(np.float32))
labels = torch.from_numpy((images.mean(dim=(1, 2, 3)) > 0).long().numpy())
dataset = torch.utils.data.TensorDataset(images, labels)
sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(),
                                                          shuffle=False)
loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, kernel_size=3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 2)

    def forward(self, x):
        return F.log_softmax(self.fc(F.relu(self.conv(x)).flatten(1)), dim=1)


model = Net()
lr_scaler = hvd.size() if not args.use_adasum else 1
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=0.5)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression, op=hvd.Adasum if args.use_adasum else hvd.Average)


def metric_average(val, name):
    return hvd.allreduce(torch.tensor(val), name=name).item()


for epoch in range(args.epochs):
    model.train()
    sampler.set_epoch(epoch)
    total = 0.0
    for data, target in loader:
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        total += loss.item()
    train_loss = metric_average(total / len(loader), "avg_loss")

weights = sum(float(p.detach().double().sum()) for p in model.parameters())
if hvd.rank() == 0:
    print(f"final loss {train_loss:.6f} weights {weights:.6f} ranks {hvd.size()}")
