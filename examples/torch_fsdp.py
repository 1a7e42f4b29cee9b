"""Sharded training (FSDP2) on ddl: a small transformer reads handwritten digits (scikit-learn's copy: nothing
is downloaded) row by row; every layer's parameters, gradients and optimizer state are sharded over the ranks.
torch.distributed runs on the "ddl" backend, so FSDP's allgathers and reduce-scatters are ddl's, planned per
level of the machine; ddl.torch.device_mesh() lays the mesh out from the topology: shard inside a host,
replicate across hosts (HSDP) when the job spans several, plain FSDP on one.

    ddlrun -np 2 python examples/torch_fsdp.py
    ddlrun -np 4 python examples/torch_fsdp.py --epochs 20 --checkpoint /tmp/digits-ckpt
"""
import argparse

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.distributed.fsdp import fully_shard

import ddl.torch as dt


class RowReader(torch.nn.Module):
    """Each of the image's 8 rows is a token; two encoder layers; the mean token classifies."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.embed = torch.nn.Linear(8, width)
        self.position = torch.nn.Parameter(torch.zeros(8, width))
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=2 * width, dropout=0.0,
                                             batch_first=True) for _ in range(2))
        self.head = torch.nn.Linear(width, 10)

    def forward(self, images):
        x = self.embed(images) + self.position
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--checkpoint", help="a directory every rank can reach: the sharded model is saved there")
    args = ap.parse_args()
    dt.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # one initialisation everywhere: fully_shard keeps each rank's shard of it
    torch.set_num_threads(1)  # ranks share the cores

    digits = load_digits()
    x = torch.from_numpy((digits.images / 16.0).astype(np.float32))  # N x 8 rows x 8 pixels
    y = torch.from_numpy(digits.target.astype(np.int64))
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    steps = len(x_train) // (args.batch_size * size)  # every rank takes the same number of steps

    model = RowReader()
    mesh = dt.device_mesh()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if rank == 0:
        print(f"mesh {mesh.mesh_dim_names} {mesh.mesh.tolist()}", flush=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))  # the same everywhere
        total = torch.zeros(1)
        for i in range(steps):
            batch = order[(i * size + rank) * args.batch_size:(i * size + rank + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[batch]), y_train[batch])
            loss.backward()  # FSDP reduce-scatters the gradients (averaged over ranks) into each rank's shard
            optimizer.step()
            total += loss.detach()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {total.item() / steps:.4f} (mean over {size} ranks)",
                  flush=True)

    with torch.no_grad():  # every rank evaluates its own slice of the test set; the counts are summed
        mine = slice(rank, None, size)
        right = (model(x_test[mine]).argmax(dim=1) == y_test[mine]).sum().reshape(1).float()
    dist.all_reduce(right)
    if args.checkpoint:
        dcp.save({"model": model.state_dict()}, checkpoint_id=args.checkpoint)
    if rank == 0:
        print(f"ranks {size}: test accuracy {right.item() / len(x_test):.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
