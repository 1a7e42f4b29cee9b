"""ddl.elastic for PyTorch: a state holding a model and its optimizer.

    state = ddl.torch.elastic.TorchState(model, optimizer, epoch=0, step=0)

``commit()`` copies the model's and optimizer's state_dicts in memory; after a failure they are put back,
then sent from the new rank 0 (ddl.torch.broadcast_parameters and broadcast_optimizer_state), and a
DistributedOptimizer forgets the collectives it had in flight on the old communicator.
"""
from __future__ import annotations

import copy

import torch

from ..elastic import State
from . import broadcast_optimizer_state, broadcast_parameters


class TorchState(State):
    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **values):
        super().__init__(**values)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "optimizer", optimizer)

    def save(self):
        return {"values": super().save(),
                "model": copy.deepcopy(self.model.state_dict()) if self.model is not None else None,
                "optimizer": copy.deepcopy(self.optimizer.state_dict()) if self.optimizer is not None else None}

    def load(self, saved) -> None:
        super().load(saved["values"])
        if self.model is not None:
            self.model.load_state_dict(saved["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(saved["optimizer"])
            averaging = getattr(self.optimizer, "_ddl_averaging", None)
            if averaging is not None:
                averaging.abandon()

    def sync(self, root: int = 0) -> None:
        super().sync(root)
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root)
