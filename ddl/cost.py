"""The alpha-beta-gamma cost model that picks a flat allreduce algorithm (Thakur, Rabenseifner, Gropp).

alpha: seconds per message; beta: seconds per byte sent; gamma: seconds per byte reduced. Constants for one
level live in ``LinkCost``; the hierarchical planner will feed one per level from the topology's links.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkCost:
    alpha: float
    beta: float
    gamma: float


# Shared memory between processes of one host (measured order of magnitude on the 2-core CI machine).
SHARED_MEMORY = LinkCost(alpha=3e-6, beta=1 / 4e9, gamma=1 / 4e9)


def _fold(p: int) -> tuple[int, int]:
    pof2 = 1 << (p.bit_length() - 1)
    return pof2, p - pof2


def ring(p: int, nbytes: float, c: LinkCost) -> float:
    if p == 1:
        return 0.0
    return 2 * (p - 1) * c.alpha + (p - 1) / p * nbytes * (2 * c.beta + c.gamma)


def recursive_doubling(p: int, nbytes: float, c: LinkCost) -> float:
    pof2, rem = _fold(p)
    fold = (2 * c.alpha + nbytes * (2 * c.beta + c.gamma)) if rem else 0.0
    return math.log2(pof2) * (c.alpha + nbytes * (c.beta + c.gamma)) + fold


def rabenseifner(p: int, nbytes: float, c: LinkCost) -> float:
    pof2, rem = _fold(p)
    fold = (2 * c.alpha + nbytes * (2 * c.beta + c.gamma)) if rem else 0.0
    return 2 * math.log2(pof2) * c.alpha + (pof2 - 1) / pof2 * nbytes * (2 * c.beta + c.gamma) + fold


MODELS = {"ring": ring, "rabenseifner": rabenseifner, "recursive_doubling": recursive_doubling}


def predict(algorithm: str, p: int, nbytes: float, c: LinkCost = SHARED_MEMORY) -> float:
    return MODELS[algorithm](p, nbytes, c)


def choose(p: int, nbytes: float, c: LinkCost = SHARED_MEMORY) -> str:
    """The algorithm with the lowest predicted time; ties go to the earlier name in MODELS."""
    return min(MODELS, key=lambda a: MODELS[a](p, nbytes, c))
