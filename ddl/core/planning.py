"""What a communicator plans (mixed into ddl.core.communicator.Communicator): the plan each allreduce size
follows, chosen once per size; the compiled pipelines of allreduces and of reduce-scatters' and allgathers'
halves per level; and ddl.explain, which says what a call of a given size would do here — its plan, its
transport, its agreement round and the path of the communicator's road it takes (ddl.core.road)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import config
from ..errors import DDLError
from ..planner import Plan, choose, label, program
from ..planner.explain import Explanation, explain
from ..planner.per_level import scatter_algorithms
from ..planner.programs import round_phases
from ..schedule.compile import CompiledPipeline, compile_blocks
from ..units import format_size
from . import bootstrap, host
from .calls import KEPT
from .parts import PartsPlan, parts_plan
from .road import said


def default_block_bytes(nbytes: int) -> int:
    """Pipeline block size: blocks large enough that per-message costs stay small (at least 1 MiB: smaller
    ones measured slower on shared memory), and at least 4 blocks for buffers from 4 MiB, so that reducing
    one block overlaps moving the next."""
    return min(4 << 20, max(1 << 20, nbytes // 4))


class Planning:
    """The communicator's ``_plan_tree``, ``levels``, ``options``, ``plans`` (a PlanCache) and ``_chosen``, ``_forced``,
    ``_algos``, ``_grid`` and ``over_tcp`` are what these read."""

    def plan_for(self, nbytes: int) -> Plan:
        """The plan an allreduce of ``nbytes`` follows (the same on every rank), chosen once per size."""
        if self._forced is not None:
            return self._forced
        plan = self._chosen.get(nbytes)
        if plan is None:
            o, flat = self.options, len(self.levels) == 1
            try:
                plan = choose(self._plan_tree, self.levels, nbytes, self._algos,
                              o.segment or (default_block_bytes(nbytes) if flat else None),
                              o.inflight or (2 if flat else None), tcp=self.over_tcp)
            except ValueError as e:
                raise DDLError(f"rank {self.rank}: {e}") from None
            if len(self._chosen) > KEPT:
                self._chosen.clear()
            self._chosen[nbytes] = plan
        return plan

    @staticmethod
    def block_bytes(nbytes: int) -> int:
        return default_block_bytes(nbytes)

    def allreduce_plan(self, count: int, itemsize: int) -> CompiledPipeline:
        """This rank's compiled pipeline for an allreduce of ``count`` elements of ``itemsize`` bytes."""
        def build():
            choice = self.plan_for(count * itemsize)
            return compile_blocks(lambda n: program(self.rank, choice, n), count,
                                  max(1, choice.block_bytes // itemsize), choice.inflight, label(choice),
                                  tuple(round_phases(choice)))

        return self.plans.get(("allreduce", count, itemsize), build)

    def parts_plan(self, half: str, counts: list[int], itemsize: int) -> PartsPlan:
        """This rank's plan for a reduce-scatter (``half`` "reduce_scatter") or allgather of parts ``counts``
        (elements of ``itemsize`` bytes, in rank order), per level as the allreduce of as many bytes is."""
        def build():
            choice = self.plan_for(sum(counts) * itemsize)
            algorithms = scatter_algorithms(self._grid, choice.algorithms, choice.shape == "latency")
            return parts_plan(self.rank, self._grid, algorithms, counts, max(1, choice.block_bytes // itemsize),
                              choice.inflight, half)

        return self.plans.get((half, tuple(counts), itemsize), build)

    def explain(self, nbytes: int, collective: str = "allreduce") -> Explanation:
        """What an allreduce of ``nbytes`` would do here: levels, groups, algorithms, bytes per link kind,
        predicted time against the topology's lower bound (the same as ``ddl-topo --plan``), and the path a call
        of ``collective`` moving that many bytes of float32 takes, and why (ddl.core.road)."""
        agreement = "" if self.size == 1 else \
            f"{self.agreement.describe()}; calls of up to {format_size(self.small_bytes)} ride in it"
        said_ = replace(explain(self.plan_for(nbytes), nbytes), transport=self._transport(), agreement=agreement,
                        path=f"{collective} of {format_size(nbytes)} takes {said(self.route(collective, nbytes))}",
                        device=self._device_levels(nbytes))
        if self.host_memory is None:
            return said_
        native = self.host_memory.native
        how = ("one phase: every rank reduces every rank's data" if nbytes <= host.ONE_PHASE_BYTES else
               f"reduce-scatter then allgather in {-(-nbytes // native.slot_bytes)} step(s) of "
               f"{format_size(native.slot_bytes)} per rank")
        direct = native.single_copy_bytes
        copies = (f"; broadcasts and allgathers from {format_size(direct)} per rank copy straight from the "
                  f"writer's buffer" if direct else "")
        return replace(said_, runs_on=f"runs on the host memory level instead (the {self.size} ranks share one "
                                      f"host: one shared-memory segment, no messages): {how}{copies}")

    def _device_levels(self, nbytes: int):
        """What an allreduce of GPU arrays of ``nbytes`` would run per level (the device path's explain)."""
        device = next((p for p in self.road.paths if p.name == "device"), None)
        levels = getattr(device, "levels_for", None)
        return levels(nbytes) if levels is not None else None

    def route(self, collective: str, nbytes: int) -> list[tuple[str, str | None]]:
        """The paths a valid call of ``collective`` moving ``nbytes`` (float32, this rank's part) tries, in order,
        each with its reason to take it or None (the first with a reason takes it)."""
        dtype = np.dtype(np.float32)
        array = np.broadcast_to(np.zeros(1, dtype), (max(1, nbytes // dtype.itemsize),))  # (no memory of its own)
        describe = {"allreduce": lambda: self._calls.allreduce(array, "sum", None),
                    "broadcast": lambda: self._calls.broadcast(array, 0, None),
                    "allgather": lambda: self._calls.allgather(array, None),
                    "reduce_scatter": lambda: self._calls.reduce_scatter(array, "sum", None, None),
                    "barrier": self._calls.barrier,
                    "alltoall": lambda: self._calls.alltoall(array[:self.size * (array.size // self.size)], None,
                                                             None)}
        if collective not in describe:
            raise DDLError(f"rank {self.rank}: no collective {collective!r}; the collectives are "
                           f"{', '.join(describe)}")
        return self.road.route(describe[collective]())

    def _transport(self) -> str:
        """Every level's messages go over MPI point-to-point or ddl's own TCP connections (NCCL's levels say so in
        their "via" column)."""
        if self._mpi is None:
            return ""
        how = ("the ranks joined through the launcher's store (no MPI launcher)" if bootstrap.joined_through
               else "the ranks started by an MPI launcher")
        if self.over_tcp:
            local = ("loopback TCP" if config.get("DDL_TCP_UNIX") == "0" else "a Unix socket" if
                     config.get("DDL_TCP_SHM") == "0" else "shared memory, a Unix socket to wake them")
            return (f"ddl's TCP connections between ranks (DDL_TRANSPORT; set up over {bootstrap.mpi_library()}; "
                    f"ranks of one host through {local}), {how}")
        return f"MPI point-to-point messages ({bootstrap.mpi_library()}), {how}"
