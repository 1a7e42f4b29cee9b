"""Data-parallel PyTorch on ddl: handwritten digits (scikit-learn's copy, shipped inside the package: nothing
is downloaded) with a small network; gradients averaged across ranks by ddl.torch.DistributedOptimizer.

    ddlrun -np 2 python examples/torch_digits.py
    ddlrun -np 4 python examples/torch_digits.py --epochs 20
"""
import argparse

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ddl
import ddl.torch as dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.02, help="for one rank; scaled by the ranks")
    args = ap.parse_args()
    torch.manual_seed(1234 + ddl.rank())  # different initial weights: the broadcast makes them agree
    torch.set_num_threads(1)  # ranks share the cores

    digits = load_digits()
    x = torch.from_numpy((digits.images / 16.0).astype(np.float32)).unsqueeze(1)  # N x 1 x 8 x 8
    y = torch.from_numpy(digits.target.astype(np.int64))
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    x_train, y_train = x_train[ddl.rank()::ddl.size()], y_train[ddl.rank()::ddl.size()]  # this rank's shard

    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(32 * 4 * 4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr * ddl.size(), momentum=0.9))
    dt.broadcast_parameters(model.state_dict(), root_rank=0)
    dt.broadcast_optimizer_state(optimizer, root_rank=0)
    loss_fn = torch.nn.CrossEntropyLoss()

    steps = len(x_train) // args.batch_size  # the same on every rank (shards differ by at most one row)
    steps = int(ddl.allreduce(np.array([steps]), op="min")[0])
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch * 1000 + ddl.rank()))
        total = 0.0
        for i in range(steps):
            batch = order[i * args.batch_size:(i + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            total += loss.item()
        mean_loss = float(ddl.allreduce(np.array([total / steps]), op="avg")[0])
        if ddl.rank() == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {mean_loss:.4f} (mean over {ddl.size()} ranks)", flush=True)

    model.eval()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    if ddl.rank() == 0:
        print(f"ranks {ddl.size()}: test accuracy {accuracy:.4f} on {len(y_test)} held-out digits")


if __name__ == "__main__":
    main()
