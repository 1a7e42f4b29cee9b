"""A communicator's cache of compiled pipelines, keyed by what they depend on (collective, size, root, ...):
a plan is chosen and compiled once per key, and -dbg_level 1 shows each new one."""
from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Callable

from ..schedule.compile import CompiledPipeline

PLAN_CACHE_SIZE = 256


class PlanCache:
    def __init__(self, rank: int, verbose: bool, capacity: int = PLAN_CACHE_SIZE):
        self._plans: OrderedDict = OrderedDict()
        self._rank, self._verbose, self._capacity = rank, verbose, capacity

    def get(self, key, build: Callable[[], CompiledPipeline]) -> CompiledPipeline:
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
            return plan
        plan = self._plans[key] = build()
        if len(self._plans) > self._capacity:
            self._plans.popitem(last=False)
        if self._verbose and self._rank == 0:
            print(f"[ddl] plan {key}: {plan.algorithm}, {plan.nblocks} block(s) of {plan.block_elems} "
                  f"elements, {plan.inflight} in flight", file=sys.stderr)
        return plan
