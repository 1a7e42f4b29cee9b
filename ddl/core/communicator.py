"""A group of ranks and the collectives ddl runs on it (host arrays; GPU arrays go through ddl.core.devices).

Every collective starts with an agreement round (ddl.core.agreement): ranks whose calls differ all raise
MismatchError and nothing is reduced. Small payloads ride in that round (one latency-optimal exchange); large
ones follow a pipelined plan chosen by the planner and compiled once per size (ddl.core.plans). A rank whose
arguments are invalid still takes part, with its error as its call, so its peers raise too instead of
waiting for a message that never comes.

The public seam other parts build on (ddl.gpu, the frameworks): ``lock`` (held around a collective's steps),
``agree``, ``allreduce_plan``, ``execute``, ``plan_for``, ``mpi_comm``, plus the collectives themselves.
"""
from __future__ import annotations

import itertools
import json
import math
import socket
import sys
import threading
import time
from dataclasses import dataclass, replace

import numpy as np

from .. import _native
from ..errors import DDLError, MismatchError, RankFailure, TransportError
from ..options import Options, parse
from ..planner import Plan, Shape, choose, label, latency_phases, pipelined, predict, program
from ..planner.programs import round_phases
from ..planner.explain import Explanation, explain
from ..planner.sources import choose_tree
from ..planner.per_level import broadcast_program, chain_program, grid_of, scatter_algorithms
from ..schedule.alltoall import pairwise_exchange
from ..schedule.compile import CompiledPipeline, compile_blocks
from ..topology import discover
from ..units import format_size
from ..topology.switches import switch_levels
from ..topology import tree as hierarchical
from . import bootstrap, devices, flight, host, rides, rollcall, timeline
from .asynchronous import Handle, Worker
from .agreement import CAPACITY, Agreement, hash64
from .diagnostics import CallTimer, check_against_mpi
from .dtypes import native_dtype, native_op, raw
from .join import beside_joined, serve_until_all_joined
from .packing import pack_groups
from .parts import PartsPlan, Scratch, parts_plan, split_rows
from .plans import PlanCache

_BYTE = _native.DType.uint8
_SUM = _native.ReduceOp.sum
_WORDS = _native.DType.int64
_SIGNATURE_CACHE = 1024
CHAIN_FROM = 256 << 10  # broadcasts from this size (and 3 ranks) run as a pipelined chain ...
CHAIN_BLOCK = 64 << 10  # ... in blocks of this size: p - 1 blocks of fill, small against the whole
SCRATCH_KEPT = 256 << 20  # staging bytes a communicator keeps between calls (larger ones are made per call)
TIMELINE_CALLS = 100_000  # calls a DDL_TIMELINE keeps per rank (the oldest go first)


def default_block_bytes(nbytes: int) -> int:
    """Pipeline block size: blocks large enough that per-message costs stay small (at least 1 MiB: smaller
    ones measured slower on shared memory), and at least 4 blocks for buffers from 4 MiB, so that reducing
    one block overlaps moving the next."""
    return min(4 << 20, max(1 << 20, nbytes // 4))


@dataclass(frozen=True)
class _Signature:
    """What an allreduce call signature means, worked out once: small allreduces would otherwise spend most
    of their time formatting, hashing and validating."""
    text: str                    # the call, as error messages show it
    dtype: object                # _native.DType, None if invalid
    op: object                   # _native.ReduceOp, None if invalid
    problem: str | None          # why the call is invalid on this rank
    plan: CompiledPipeline       # the agreement round's plan (with the payload when fused)
    fused: bool                  # the payload rides in the agreement round
    factor: float                # 1/size for avg
    options: object              # _native.RunOptions of the fused run (None otherwise)
    hash: int                    # the call's hash (the host memory level checks it in every step)
    host: object = None          # _native.HostAllreduce for the host memory level; None: not that path


class Communicator:
    """Runs ddl's collectives among the ranks of one executor (MPI or loopback) or alone (size 1)."""

    def __init__(self, executor, rank: int, size: int, options: Options | None = None, mpi_comm=None,
                 local: tuple[int, int, int] | None = None, hierarchy=None, topology=None,
                 reports: list[dict] | None = None, probed=None):
        self.options = o = options or parse()
        self._executor = executor
        self._mpi = mpi_comm  # kept alive for the executor; also the reference for -check
        # the deadline's roll call (ddl.core.rollcall) talks on a communicator of its own: the executor's
        # receives left posted by a failed call must never take its words
        self._roll = mpi_comm.Dup() if mpi_comm is not None and size > 1 else None
        self.rank, self.size = rank, size
        self.local_rank, self.local_size, self.num_hosts = local or (rank, size, 1)
        self.lock = threading.Lock()  # one collective's steps at a time (ddl.gpu holds it around its own)
        self.hosts = [r["host"] for r in reports] if reports else None  # each rank's host, in rank order
        if o.mode is not None:
            o.mode.check_size(size)
        try:
            choice = choose_tree(o, rank, size, hierarchy, topology, reports, probed)
        except DDLError as e:  # the same error type, always naming the rank
            raise type(e)(str(e) if str(e).startswith("rank ") else f"rank {rank}: {e}") from None
        self.tree, self.levels, self.topology, self._forced = choice.tree, choice.levels, choice.topology, choice.forced
        self.tree_source = choice.source
        self.hierarchy = self.tree if hierarchical.depth(self.tree) >= 2 else None
        self._grid = grid_of(self.tree)  # the ranks as coordinates: what broadcast, allgather, reduce_scatter follow
        self._algos = tuple(o.algo.split(","))
        self._small = min(o.small_bytes, CAPACITY)
        self._chosen: dict[int, Plan] = {}
        self._signatures: dict = {}
        self._riding: dict[int, bool] = {}  # payload bytes -> whether they ride in the agreement round
        self._calls: dict = {}  # (collective, shape, dtype, ...) -> (the call as text, its hash)
        self._plans = PlanCache(rank, o.dbg_level >= 1)
        self._timer = CallTimer(o.dump_iter, rank, [lv.name for lv in self.levels]) if o.dump_iter else None
        # The executor's round spans: for -dump_iter's per-level times and the timeline (ddl.core.timeline)
        self._recorder = None
        if executor is not None and (o.timeline or o.dump_iter):
            self._recorder = timeline.Recorder(executor, TIMELINE_CALLS if o.timeline else o.dump_iter)
        self.failure: RankFailure | None = None  # the rank failure that broke this communicator, if one did
        # every native run, kept in a small ring and written out when one fails (ddl.core.flight)
        runs = flight.runs_kept()
        self._flight = flight.FlightRecorder(executor, rank, size, [lv.name for lv in self.levels], runs,
                                             _world_ranks(mpi_comm)) if executor is not None and runs > 0 else None
        if self._flight is not None and flight.folder():
            flight.install_signal_handler()  # kill -USR1 writes it too
        self._devices = None  # ddl.core.devices' collectives, made on the first GPU array
        self._scratch = Scratch(SCRATCH_KEPT)  # the staging buffers of planned allgathers and reduce-scatters
        self._worker: Worker | None = None  # runs the *_async collectives in order (made on first use)
        self.plan_for(1)  # a forced algorithm list that does not fit the tree fails here, not mid-training
        # Settings that shape plans must match across ranks: they go into every call's hash.
        shape = f"{hierarchical.describe(self.tree)} {[lv.to_dict() for lv in self.levels]} {self._forced}"
        settings = (f"algo={o.algo} segment={o.segment} inflight={o.inflight} small={self._small} "
                    f"tree={hash64(shape) & 0xffffffff:08x}")
        self._agreement = Agreement(rank, size, settings, self._plans, self.execute, o.timeout, self.hosts)
        # Ranks that share one host collect through memory (ddl.core.host); agreed by all ranks, or none use it.
        self._host = None
        if mpi_comm is not None and size > 1:
            wanted = host.eligible(size, self.hosts, o) and hierarchy is None and topology is None \
                and self._forced is None and len(self.levels) == 1
            self._host = self._agreement.host = host.HostLevel.create(mpi_comm, wanted,
                                                                      single_copy=o.shm != "slots")
        # the short paths (the host level's, or one rank's): no per-call timer, timeline or check to feed
        self._fast = (self._host is not None or size == 1) and not o.dump_iter and not o.timeline and o.check is None
        # the short paths found and run natively (Python's short paths stay for what they decline)
        self._native = _native.ShortCalls(self._host.native if self._host is not None else None) \
            if self._fast else None
        # off the host level: small calls that ride in the agreement round, worked out once (ddl.core.rides)
        self._ride_fast = self._host is None and size > 1 and not o.dump_iter and not o.timeline and o.check is None
        self._rides_known: dict = {}
        self._origin = 0
        if self._recorder is not None:  # one time origin for every rank's track: right after a barrier (hosts'
            if mpi_comm is not None:    # clocks differ; loopback ranks are threads sharing one clock)
                self.barrier()
                self._recorder.calls.clear()
            self._origin = _native.clock_ns()

    # -- construction -----------------------------------------------------------------------------------

    @classmethod
    def from_mpi(cls, comm, options: Options | None = None, hierarchy=None, topology=None) -> "Communicator":
        """ddl on an mpi4py communicator; it works on a private duplicate so its messages never meet yours.
        At creation the ranks exchange what they see of their machine (ddl.topology.discover); large
        allreduces then follow the topology found, or the one given (ddl.planner.sources)."""
        dup = comm.Dup()
        options = options or parse()
        reports, where = discover.exchange(dup, by_name=bootstrap.joined_through is not None)
        probed = switch_levels(dup, reports, options, hierarchy, topology)
        executor = _native.Executor.mpi(dup, yield_when_idle=_mpi_spins()) if dup.size > 1 else None
        return cls(executor, dup.rank, dup.size, options, mpi_comm=dup, local=where,
                   hierarchy=hierarchy, topology=topology, reports=reports, probed=probed)

    def group(self, ranks: list[int]) -> "Communicator":
        """A communicator of ``ranks`` (ranks of this one; the group's rank i is ``ranks[i]``), planned for
        where they run: the topology this one found (file, probe or discovery) narrowed to them, so a group
        neither probes again nor reads the world's -mode, plan or placement as its own. Collective over the
        members only (MPI_Comm_create_group): ranks outside ``ranks`` must not call it."""
        if self._mpi is None:
            raise DDLError(f"rank {self.rank}: groups need an MPI communicator")
        if sorted(set(ranks)) != sorted(ranks) or not all(0 <= r < self.size for r in ranks) or self.rank not in ranks:
            raise DDLError(f"rank {self.rank}: bad group {ranks}: distinct ranks of 0..{self.size - 1}, "
                           f"this rank among them")
        group = self._mpi.Get_group().Incl(ranks)
        sub = self._mpi.Create_group(group)
        group.Free()
        try:
            return self.on_members(sub, ranks)
        finally:
            sub.Free()

    def on_members(self, mpi_comm, ranks: list[int]) -> "Communicator":
        """A communicator on ``mpi_comm``, whose rank i is this one's rank ``ranks[i]`` (a group, or the
        survivors after a failure), planned on this one's topology narrowed to them: no second probe, and the
        world's -mode, plan file or placement are not read as its own."""
        topology = self.topology
        if topology is not None and topology.placement is not None:
            topology = type(topology)(topology.name, topology.graph, [topology.placement[r] for r in ranks])
        options = replace(self.options, mode=None, plan=None, topology=None, probe="0")
        return Communicator.from_mpi(mpi_comm, options, topology=topology)

    @classmethod
    def loopback(cls, hub, rank: int, options: Options | None = None,
                 hierarchy=None, topology=None) -> "Communicator":
        """One member of an in-process group (threads of one process share ``hub``, a _native.LoopbackHub)."""
        return cls(_native.Executor.loopback(hub, rank), rank, hub.size, options, hierarchy=hierarchy,
                   topology=topology)

    def close(self) -> None:
        """Releases the communicator; any later collective on it raises DDLError. After a transport failure
        the MPI duplicate is kept, never freed: messages of the failed call may still be queued under its
        context id, and MPI would give that id to the next communicator, where they would match."""
        if self._worker is not None:  # what was submitted finishes (or fails on its deadline) first
            self._worker.close(self.options.timeout + 5)
            self._worker = None
        broken = self._executor is not None and not isinstance(self._executor, _Closed) and self._executor.broken
        # a failure seen on the host memory level broke the job too: ULFM still needs the MPI communicator
        broken = broken or self.failure is not None or (self._host is not None and self._host.native.broken)
        if self._recorder is not None and self.options.timeline:
            self._write_timeline(broken)
        self._recorder = None
        if self._flight is not None:
            flight.forget(self._flight)
        if self._devices is not None:
            self._devices.close()
            self._devices = None
        self._native = None  # (it holds the segment mapped)
        if self._host is not None:
            self._host.close()
            self._host = self._agreement.host = None
        self._fast = self._ride_fast = False
        if not broken:  # (after a failure, receives the MPI could not cancel may still land in it)
            self._scratch.release()
        self._executor = _Closed()
        if self._mpi is not None:
            if broken:
                _KEPT_AFTER_FAILURE.append(self._mpi)
            else:
                self._mpi.Free()
            self._mpi = None
        if self._roll is not None:
            if broken:  # words of a roll call may still be on their way
                _KEPT_AFTER_FAILURE.append(self._roll)
            else:
                self._roll.Free()
            self._roll = None

    # -- the seam other parts build on ------------------------------------------------------------------

    @property
    def mpi_comm(self):
        """The MPI communicator ddl runs on (a private duplicate; None for loopback or alone)."""
        return self._mpi

    def execute(self, plan: CompiledPipeline, buffer, options, out=None, parts: tuple | None = None) -> bool:
        """Runs a compiled pipeline on this communicator's executor (``_native.RunOptions``; ``out``: see
        _native.Executor.run; ``parts``: run_parts' arguments after the staged ``buffer``); returns whether every
        rank's header agreed (True without one). The caller holds ``lock`` and has agreed first."""
        try:
            if parts is not None:
                self._executor.run_parts(plan.native, buffer, *parts, options)
                return True
            return self._executor.run(plan.native, buffer, options, out)
        except DDLError as e:
            failure = self._name_failure(e, options.label, plan) if isinstance(e, RankFailure) else \
                self._name_absent(e, options.label) if _is_deadline(e) else e
            if isinstance(failure, RankFailure):
                self.failure = failure  # for ddl.elastic, where a framework wrapped the error in its own
            if self._flight is not None and isinstance(e, TransportError):
                # an agreement round's phases are level -1 (all ranks): name it so
                what = plan.phases[0][1] if plan.phases and plan.phases[0][0] < 0 else plan.algorithm
                self._flight.failed(failure, what, plan.phases)
                self._write_flight_recorder(failure)
            if failure is not e:
                raise failure from None
            raise
        finally:
            if self._recorder is not None:
                self._recorder.ran(plan.phases, plan.algorithm, options.label)

    def _name_failure(self, e: RankFailure, label: str, plan) -> RankFailure:
        """The native failure, said for people: which ranks died, on which hosts, in which call. A rank that saw
        only the revoke asks MPI who failed for up to a second (the runtime's notice is on its way)."""
        ranks = list(e.ranks)
        deadline = time.monotonic() + 1.0
        while not ranks and self._mpi is not None and hasattr(self._mpi, "Get_failed") and time.monotonic() < deadline:
            ranks = _failed_ranks(self._mpi)
            if not ranks:  # the notice arrives through MPI's progress engine: turn it (measured: 10-35 ms)
                from mpi4py import MPI

                MPI.COMM_SELF.Iprobe()
                time.sleep(0.005)
        e = RankFailure(str(e), ranks)
        if e.ranks:
            hosts = self.hosts or []
            dead = ", ".join(f"{r} ({hosts[r]})" if r < len(hosts) else str(r) for r in e.ranks)
            who = f"rank{'s' if len(e.ranks) > 1 else ''} {dead} failed"
        else:
            who = "a rank failed (a peer revoked the communicator; which one is not known here yet)"
        step = "its agreement round" if plan.phases and plan.phases[0][0] < 0 else f"its {plan.algorithm} plan"
        return RankFailure(f"rank {self.rank}: {who} during {label} ({step}); MPI said: {e}", e.ranks)

    def _name_absent(self, e: TransportError, label: str) -> TransportError:
        """A deadline's error, with the ranks that never reached the call (ddl.core.rollcall)."""
        if self._roll is None:
            return e
        seq = self._executor.runs()[-1][0] if self._flight is not None and self._executor.runs() else -1
        seconds = rollcall.window(self.options.timeout)
        try:
            missing = rollcall.absent(self._roll, self.rank, self.size, f"{seq} {label}", seconds)
        except Exception as why:  # the deadline's own error matters more
            return type(e)(f"{e}; (no roll call: {why})")
        return type(e)(f"{e}{rollcall.said(missing, self.size, self.hosts, seconds)}")

    def _write_flight_recorder(self, error: BaseException) -> None:
        try:
            written = flight.dump(f"rank {self.rank}: {error}")
        except OSError as e:  # the collective's own error matters more: say why there is no file, go on
            print(f"ddl: rank {self.rank}: cannot write the flight recorder: {e}", file=sys.stderr, flush=True)
            return
        if written is not None and self.options.dbg_level >= 1:
            print(f"ddl: rank {self.rank}: flight recorder written to {written}", file=sys.stderr, flush=True)

    def _write_timeline(self, broken: bool) -> None:
        """DDL_TIMELINE: every rank's calls gathered to rank 0, which writes one Chrome trace. After a failure
        (or if the gathering fails) each rank writes its own part to <file>.rank<r> instead."""
        rec, path = self._recorder, self.options.timeline
        rec.stop()  # the gathering is not part of the trace
        host = self.hosts[self.rank] if self.hosts else socket.gethostname()
        part = timeline.rank_part(self.rank, host, self._origin, [lv.name for lv in self.levels], rec.calls)
        if not broken:
            data = np.frombuffer(json.dumps(part).encode(), np.uint8)
            try:
                sizes = self.allgather(np.array([data.size], np.int64))
                everything = self.allgather(data)
            except DDLError as e:
                print(f"[ddl] rank {self.rank}: timeline not gathered ({e})", file=sys.stderr)
            else:
                if self.rank == 0:
                    cuts = np.cumsum(sizes)[:-1]
                    timeline.write(path, [json.loads(bytes(b)) for b in np.split(everything, cuts)])
                return
        own = f"{path}.rank{self.rank}"
        timeline.write(own, [part])
        print(f"[ddl] rank {self.rank}: timeline of this rank written to {own}", file=sys.stderr)

    def agree(self, call: str, problem: str | None = None) -> None:
        """An agreement round with no payload: raises on every rank when ranks called differently, or when
        ``problem`` (this rank's reason its call is invalid) is set anywhere."""
        if self.size > 1:
            self._agreement.agree(call, problem)
        elif problem:
            raise DDLError(f"rank {self.rank}: {problem}")

    def plan_for(self, nbytes: int) -> Plan:
        """The plan an allreduce of ``nbytes`` follows (the same on every rank), chosen once per size."""
        if self._forced is not None:
            return self._forced
        plan = self._chosen.get(nbytes)
        if plan is None:
            o, flat = self.options, len(self.levels) == 1
            try:
                plan = choose(self.tree, self.levels, nbytes, self._algos,
                              o.segment or (default_block_bytes(nbytes) if flat else None),
                              o.inflight or (2 if flat else None))
            except ValueError as e:
                raise DDLError(f"rank {self.rank}: {e}") from None
            if len(self._chosen) > _SIGNATURE_CACHE:
                self._chosen.clear()
            self._chosen[nbytes] = plan
        return plan

    def allreduce_plan(self, count: int, itemsize: int) -> CompiledPipeline:
        """This rank's compiled pipeline for an allreduce of ``count`` elements of ``itemsize`` bytes."""
        def build():
            choice = self.plan_for(count * itemsize)
            return compile_blocks(lambda n: program(self.rank, choice, n), count,
                                  max(1, choice.block_bytes // itemsize), choice.inflight, label(choice),
                                  tuple(round_phases(choice)))

        return self._plans.get(("allreduce", count, itemsize), build)

    def parts_plan(self, half: str, counts: list[int], itemsize: int) -> PartsPlan:
        """This rank's plan for a reduce-scatter (``half`` "reduce_scatter") or allgather of parts ``counts``
        (elements of ``itemsize`` bytes, in rank order), per level as the allreduce of as many bytes is."""
        def build():
            total = sum(counts) * itemsize
            choice = self.plan_for(total)
            algorithms = scatter_algorithms(self._grid, choice.algorithms, choice.shape == "latency")
            return parts_plan(self.rank, self._grid, algorithms, counts, max(1, choice.block_bytes // itemsize),
                              choice.inflight, half)

        return self._plans.get((half, tuple(counts), itemsize), build)

    def explain(self, nbytes: int) -> Explanation:
        """What an allreduce of ``nbytes`` would do here: levels, groups, algorithms, bytes per link kind,
        predicted time against the topology's lower bound (the same as ``ddl-topo --plan``)."""
        agreement = "" if self.size == 1 else \
            f"{self._agreement.describe()}; calls of up to {format_size(self._small)} ride in it"
        said = replace(explain(self.plan_for(nbytes), nbytes), transport=self._transport(), agreement=agreement)
        if self._host is None:
            return said
        steps = -(-nbytes // self._host.native.slot_bytes)
        how = ("one phase: every rank reduces every rank's data" if nbytes <= host.ONE_PHASE_BYTES else
               f"reduce-scatter then allgather in {steps} step(s) of {format_size(self._host.native.slot_bytes)} "
               f"per rank")
        direct = self._host.native.single_copy_bytes
        copies = (f"; broadcasts and allgathers from {format_size(direct)} per rank copy straight from the "
                  f"writer's buffer" if direct else "")
        return replace(said, runs_on=f"runs on the host memory level instead (the {self.size} ranks share one "
                                     f"host: one shared-memory segment, no messages): {how}{copies}")

    def _transport(self) -> str:
        """Every level's messages go over MPI point-to-point (NCCL's levels say so in their "via" column)."""
        if self._mpi is None:
            return ""
        how = ("the ranks joined through the launcher's store (no MPI launcher)" if bootstrap.joined_through
               else "the ranks started by an MPI launcher")
        return f"MPI point-to-point messages ({bootstrap.mpi_library()}), {how}"

    @property
    def grid(self):
        """The ranks as coordinates per level of the planned tree (ddl.planner.per_level.Grid): group sizes
        innermost first, each rank's position in its group at each level."""
        return self._grid

    @property
    def host_level(self) -> bool:
        """Whether this communicator's collectives run through host memory (ddl.core.host)."""
        return self._host is not None

    # -- allreduce ----------------------------------------------------------------------------------------

    def _fused(self, nbytes: int) -> bool:
        """Small payloads ride in the agreement round where recursive doubling is what the plan would do
        anyway (on a slow uplink a 64 KiB payload is better scattered through the hierarchy)."""
        if nbytes > self._small or self.options.algo not in ("auto", "recursive_doubling"):
            return False
        plan = self.plan_for(nbytes)
        if len(self.levels) == 1 or plan.shape == "latency":
            return True
        # The planned path pays a separate agreement round (no payload) before its own rounds.
        shape = Shape.of(self.tree)
        fused = pipelined(latency_phases(shape, self.levels, nbytes), 1)
        agreement = pipelined(latency_phases(shape, self.levels, 0), 1)
        return fused <= predict(plan, nbytes)[0] + agreement

    def _rides(self, nbytes: int) -> bool:
        """Whether a collective moving ``nbytes`` in an allreduce-shaped round (a broadcast's, a small allgather's
        slots, a reduce-scatter's whole) rides in the agreement round: one latency-optimal exchange in all.
        Decided once per size (the model's walk over the tree costs more than a small call on a busy host)."""
        rides = self._riding.get(nbytes)
        if rides is None:
            if len(self._riding) > _SIGNATURE_CACHE:
                self._riding.clear()
            rides = self._riding[nbytes] = self.size > 1 and self._fused(nbytes)
        return rides

    def _signature(self, shape, dtype: np.dtype, op) -> _Signature:
        key = (shape, dtype, op if isinstance(op, str) else repr(op))
        sig = self._signatures.get(key)
        if sig is None:
            problem, code, rop = None, None, None
            try:
                code, rop = native_dtype(dtype), native_op(op, dtype)
            except DDLError as e:
                problem = str(e)
            count = int(np.prod(shape, dtype=np.int64))
            fused = problem is None and self.size > 1 and self._fused(count * dtype.itemsize)
            text = f"allreduce(shape={shape}, dtype={dtype}, op={op})"
            factor = 1.0 / self.size if op == "avg" else 1.0
            plan = self._agreement.plan(count if fused else 0) if self.size > 1 else None
            options = self._agreement.options(text, code, rop, factor=factor) if fused else None
            h = self._agreement.hash(text)
            on_host = self._host is not None and problem is None and dtype.name != "bfloat16"  # (bfloat16: raw())
            sig = _Signature(text, code, rop, problem, plan, fused, factor, options, h,
                             _native.HostAllreduce(code, rop, factor, host.ONE_PHASE_BYTES, h, self.options.timeout,
                                                   text) if on_host else None)
            if self._native is not None and (sig.host is not None or self.size == 1 and problem is None):
                self._native.learn_allreduce(dtype, shape, op, sig.host)
            if len(self._signatures) > _SIGNATURE_CACHE:
                self._signatures.clear()
            self._signatures[key] = sig
        return sig

    def allreduce(self, array, op: str = "sum", out: np.ndarray | None = None) -> np.ndarray:
        try:
            return self._allreduce(array, op, out)
        except MismatchError as e:
            if not beside_joined(e, self.rank, self.size):
                raise
            return self._allreduce(array, op, out)  # the joined ranks now take part, with zeros

    def join(self) -> None:
        """This rank has no more data (uneven inputs): until every rank has called join, it takes part in the
        others' allreduces with zeros (an average still divides by every rank). Any other collective of theirs
        meanwhile fails on their ranks with MismatchError naming join. Returns when all have joined."""
        serve_until_all_joined(self)

    def _allreduce(self, array, op: str, out: np.ndarray | None) -> np.ndarray:
        if self._native is not None and self._worker is None:  # a known call, found and run natively
            try:
                got = self._native.allreduce(array, op, out)
            except DDLError as e:
                raise self._host_failure(e, self._native.last_text) from None
            if got is not None:
                return got if type(got) is not str else self._agreement.report_mismatch(got)
        if self._fast and type(array) is np.ndarray:  # the short paths: a known call, plain arrays
            sig = self._signatures.get((array.shape, array.dtype, op))
            if sig is not None and array.flags.c_contiguous:
                if sig.host is not None:
                    # (an out that overlaps the input is fine: the native call copies the input first if needed)
                    dst = np.empty(array.shape, array.dtype) if out is None else _short_out(array, out)
                    if dst is not None:
                        if self._worker is not None:
                            self._worker.drain()
                        try:
                            agreed = self._host.native.allreduce(array, dst, sig.host)
                        except DDLError as e:
                            raise self._host_failure(e, sig.text) from None
                        if agreed is False:
                            self._agreement.report_mismatch(sig.text)
                        return dst
                elif self._host is None and sig.problem is None:  # one rank
                    if out is None or _short_out(array, out) is not None:
                        return self._alone_short(array, out)
        if devices.is_device_array(array):
            return self._device().allreduce(array, op, out)
        self.drain()
        started = time.perf_counter() if self._timer else 0.0
        a = np.asarray(array)
        if self._recorder is not None:
            self._recorder.begin("allreduce", a.nbytes)
        try:
            sig = self._signature(a.shape, a.dtype, op)
            problem = sig.problem
            if out is not None and problem is None:
                problem = _out_problem(out, a)
            if self.size == 1:
                result = self._alone_into(a, problem, out)
            elif problem is None and self._host is not None and self.options.check is None:
                result = self._host_allreduce(a, out, sig)
            elif problem is None and sig.fused and self.options.check is None:
                result = self._small_allreduce(a, out, sig)
            else:
                result = self._large_allreduce(a, out, op, sig, problem)
        finally:
            call = self._recorder.end() if self._recorder is not None else None
        if self._timer:
            self._timer.add(time.perf_counter() - started, a.nbytes, call)
        return result

    def _small_allreduce(self, a: np.ndarray, out, sig: _Signature) -> np.ndarray:
        """The whole call is the agreement round: one native call, one latency-optimal exchange."""
        src = a if a.flags.c_contiguous else np.ascontiguousarray(a)
        direct = out is not None and out.flags.c_contiguous
        dst = out if direct else np.empty(a.shape, a.dtype)
        with self.lock:
            if not self.execute(sig.plan, raw(src), sig.options, raw(dst)):
                self._agreement.report_mismatch(sig.text)
        return _deliver(dst, out, direct)

    def _host_allreduce(self, a: np.ndarray, out, sig: _Signature) -> np.ndarray:
        """The whole call on the host memory level: one native call, the call's hash checked in its steps."""
        src = a if a.flags.c_contiguous and (out is None or out is a or not np.may_share_memory(a, out)) \
            else np.ascontiguousarray(a).copy()
        direct = out is not None and out.flags.c_contiguous
        dst = out if direct else np.empty(a.shape, a.dtype)
        with self.lock:
            self._on_host(self._host.native.allreduce, raw(src), raw(dst), sig.dtype, sig.op, sig.factor,
                          host.ONE_PHASE_BYTES, sig.hash, self.options.timeout, sig.text, text=sig.text)
        return _deliver(dst, out, direct)

    def _call(self, key: tuple, text, short: bool = False, extra=None) -> tuple:
        """(the call as error messages say it, its hash, the host level's HostCall, ``extra``), worked out once per
        key: formatting shapes and dtypes costs more than a small collective on the host level. ``short``: a
        valid call, whose key the short paths may find (a bad call is kept under another key: it fails on every
        rank, and always by the long path)."""
        key = key if short else ("refused",) + key
        known = self._calls.get(key)
        if known is None:
            if len(self._calls) > _SIGNATURE_CACHE:
                self._calls.clear()
            said = text()
            h = self._agreement.hash(said)
            known = self._calls[key] = (said, h, _native.HostCall(h, self.options.timeout, said),
                                        extra(said, h) if extra is not None else None)
        return known

    def _short(self, text: str, collective, *args) -> None:
        """A short path's native call on the host level, in order after the submitted collectives. No ``lock``:
        the segment takes one call at a time itself, and nothing else of this communicator runs meanwhile."""
        if self._worker is not None:
            self._worker.drain()
        self._on_host(collective, *args, text=text)

    def _alone_short(self, array: np.ndarray, out) -> np.ndarray:
        """One rank's collective on a short path (``out`` checked): a copy of the input, or the input in ``out``,
        after the submitted collectives."""
        if self._worker is not None:
            self._worker.drain()
        if out is None:
            return array.copy()
        if out is not array:
            np.copyto(out, array)
        return out

    def _on_host(self, collective, *args, text: str):
        """Runs one of the host memory level's collectives (the long paths hold ``lock``; the short ones need not,
        the segment takes one call at a time); a mismatch raises the same MismatchError on every rank, a failure
        is named as the executor's are."""
        try:
            agreed = collective(*args)
        except DDLError as e:
            raise self._host_failure(e, text) from None
        if agreed is False:
            self._agreement.report_mismatch(text)
        return agreed

    def _host_failure(self, e: DDLError, text: str) -> DDLError:
        """The host level's error as the caller sees it: a dead rank kept for ddl.elastic, a deadline with the
        ranks that never reached the call."""
        if isinstance(e, RankFailure):
            self.failure = e
        elif _is_deadline(e):
            return self._name_absent(e, text)
        return e

    def _large_allreduce(self, a: np.ndarray, out, op: str, sig: _Signature, problem: str | None) -> np.ndarray:
        """Agreement round without payload, then the pipelined plan on the result buffer."""
        original = a.copy() if self.options.check is not None else a
        with self.lock:
            self._agreement.agree(sig.text, problem)
            work, direct = _work_buffer(a, out)
            self._run_allreduce(work, sig.dtype, sig.op, sig.text, sig.factor)
            if self.options.check is not None:
                check_against_mpi(self._mpi, self.rank, self.size, self.options.check, original, work, op, sig.text)
        return _deliver(work.reshape(a.shape), out, direct)

    def _run_allreduce(self, flat: np.ndarray, dtype, op, label: str, factor: float = 1.0) -> None:
        """ddl's own allreduce of a contiguous 1-D buffer, in place, with no agreement round."""
        if flat.size == 0:
            return
        plan = self.allreduce_plan(flat.size, flat.itemsize)
        self.execute(plan, raw(flat), _native.RunOptions(dtype, op, self.options.timeout, label, factor=factor))

    def allreduce_n(self, arrays, op: str = "sum", average: bool | None = None) -> list[np.ndarray]:
        """Many arrays in one allreduce per dtype: packed into one buffer, reduced, unpacked (IBM's name;
        IBM's ``average=True`` means op 'avg')."""
        if average is not None:
            op = "avg" if average else op
        arrays = list(arrays)
        if any(devices.is_device_array(x) for x in arrays):
            return self._device().allreduce_n(arrays, op)
        arrays = [np.asarray(x) for x in arrays]
        return pack_groups(arrays, [x.dtype.str for x in arrays], lambda idx: self.allreduce(
            np.concatenate([arrays[i].reshape(-1) for i in idx]), op))

    # -- asynchronous (ddl.core.asynchronous) ------------------------------------------------------------

    def submit(self, name: str, fn, *args) -> Handle:
        """Runs ``fn(*args)`` (a collective of this communicator) on its worker thread after everything
        submitted before; returns the Handle. Every rank must submit in the same order."""
        if self._worker is None:
            if self._mpi is not None:  # another thread will call MPI (ddl's own calls never at once)
                from mpi4py import MPI

                if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
                    raise DDLError(f"rank {self.rank}: {name} needs MPI initialised with at least "
                                   f"MPI_THREAD_SERIALIZED (mpi4py asks for MPI_THREAD_MULTIPLE unless "
                                   f"mpi4py.rc.thread_level was lowered)")
            self._worker = Worker(f"ddl-collectives-rank{self.rank}")
        return self._worker.submit(name, fn, *args)

    def drain(self) -> None:
        """Waits for the submitted collectives to finish (a blocking collective does first, so the order stays
        the same everywhere)."""
        if self._worker is not None:
            self._worker.drain()

    def _host_only(self, array, call: str) -> None:
        if devices.is_device_array(array):
            raise DDLError(f"rank {self.rank}: {call} takes host arrays; GPU arrays follow their stream with the "
                           f"blocking call ({call.replace('_async', '')})")

    def allreduce_async(self, array, op: str = "sum", out: np.ndarray | None = None) -> Handle:
        """allreduce on the worker thread; leave ``array`` (and ``out``) alone until the handle is done."""
        self._host_only(array, "allreduce_async")
        return self.submit("allreduce_async", self.allreduce, array, op, out)

    def broadcast_async(self, array, root: int = 0) -> Handle:
        self._host_only(array, "broadcast_async")
        return self.submit("broadcast_async", self.broadcast, array, root)

    def allgather_async(self, array) -> Handle:
        self._host_only(array, "allgather_async")
        return self.submit("allgather_async", self.allgather, array)

    # -- broadcast, allgather, barrier -------------------------------------------------------------------

    def broadcast(self, array, root: int = 0, out: np.ndarray | None = None) -> np.ndarray:
        """A copy of root's array on every rank (any fixed-size dtype; every rank passes the same shape), or
        written to ``out`` (its shape and dtype; it may be ``array`` itself)."""
        if self._native is not None and self._worker is None:  # a known call, found and run natively
            try:
                got = self._native.broadcast(array, root, out)
            except DDLError as e:
                raise self._host_failure(e, self._native.last_text) from None
            if got is not None:
                return got if type(got) is not str else self._agreement.report_mismatch(got)
        # (a root of another type that equals a known one, 1.0 for 1, takes the long path: it is refused there)
        if self._fast and type(array) is np.ndarray and type(root) is int:  # the short paths: a known call
            known = self._calls.get(("broadcast", array.shape, array.dtype, root))
            if known is not None and array.flags.c_contiguous:
                if self._host is None:  # one rank
                    if out is None or _short_out(array, out) is not None:
                        return self._alone_short(array, out)
                elif out is array and array.flags.writeable:  # in place: the usual form
                    if self._worker is not None:
                        self._worker.drain()
                    try:
                        agreed = self._host.native.broadcast(array, root, known[2])
                    except DDLError as e:
                        raise self._host_failure(e, known[0]) from None
                    if agreed is False:
                        self._agreement.report_mismatch(known[0])
                    return array
                else:
                    dst = _short_out(array, out)
                    if dst is not None:  # (root reads array and copies it to dst; the others write dst only)
                        self._short(known[0], self._host.native.broadcast, array, dst, root, known[2])
                        return dst
        if self._ride_fast and type(array) is np.ndarray and type(root) is int and array.flags.c_contiguous:
            ride = self._rides_known.get(("broadcast", array.shape, array.dtype, root))
            result = _short_out(array, out) if ride is not None else None
            if result is not None:
                return self._ride_broadcast(ride, array, result)
        if devices.is_device_array(array):
            return self._device().broadcast(array, root)
        self.drain()
        a = np.asarray(array)
        problem = _unmovable(a, "broadcast")
        if not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            problem = f"broadcast root {root!r} is not a rank of this communicator (0..{self.size - 1})"
        if out is not None and problem is None:
            problem = _out_problem(out, a)
        short = problem is None and a.dtype.isbuiltin == 1
        call, h, prepared, _ = self._call(("broadcast", a.shape, a.dtype, root),
                                          lambda: f"broadcast(shape={a.shape}, dtype={a.dtype}, root={root})",
                                          short=short)
        if short and self._native is not None:
            self._native.learn_broadcast(a.dtype, a.shape, root, prepared)
        if self.size == 1:
            return self._alone_into(a, problem, out)
        direct = out is not None and out.flags.c_contiguous
        result = out if direct else np.empty(a.shape, a.dtype)
        if self.rank == root and result is not a:  # only root's data travels: the others just receive
            np.copyto(result, a.copy() if np.may_share_memory(result, a) else a)
        if self._host is not None and problem is None:
            with self.lock:
                self._on_host(self._host.native.broadcast, raw(result), root, h, self.options.timeout, call,
                              text=call)
            return _deliver(result, out, direct)
        # (objects have no bytes to move: the round below refuses them on every rank)
        data = result.reshape(-1).view(np.uint8) if not a.dtype.hasobject else np.empty(0, np.uint8)
        if short and self._rides(data.size):  # one round: root's bytes, zeros elsewhere, summed
            ride = self._ride(("broadcast", a.shape, a.dtype, root), lambda: rides.broadcast(
                call, self._agreement.plan(-(-data.size // 8)), self._agreement.options(call, _WORDS, _SUM), a.shape,
                a.dtype, self.rank == root))
            return _deliver(self._ride_broadcast(ride, a, result), out, direct)
        if self._rides(data.size):  # (a refused call: the same round, which raises on every rank)
            words, payload = rides.words(data.size)
            if self.rank == root:
                payload[...] = data
            with self.lock:
                self._agreement.agree(call, problem, words, _WORDS, _SUM)
            data[...] = payload
            return _deliver(result, out, direct)
        with self.lock:
            self._agreement.agree(call, problem)
            plan = self._plans.get(("broadcast", data.size, root), lambda: self._broadcast_plan(data.size, root))
            self.execute(plan, data, _native.RunOptions(_BYTE, _SUM, self.options.timeout, call))
        return _deliver(result, out, direct)

    bcast = broadcast

    def _broadcast_plan(self, nbytes: int, root: int) -> CompiledPipeline:
        """A large broadcast is a pipelined chain through the subtrees (every link carries the data once each
        way); a smaller one a binomial tree per level (log2(p) rounds, the root sending every block that often)."""
        per_level = len(self._grid.sizes) > 1
        o = self.options
        if self.size > 2 and nbytes >= CHAIN_FROM:
            return compile_blocks(lambda n: chain_program(self.rank, self._grid, n, root), nbytes,
                                  o.segment or CHAIN_BLOCK, o.inflight or 4, "chain per level" if per_level else "chain")
        return compile_blocks(lambda n: broadcast_program(self.rank, self._grid, n, root), nbytes,
                              o.segment or default_block_bytes(nbytes), o.inflight or 2,
                              "binomial per level" if per_level else "binomial")

    def allgather(self, array, out: np.ndarray | None = None) -> np.ndarray:
        """Every rank's array concatenated along the first axis, in rank order (first dims may differ). With
        ``out`` (C-contiguous, of the gathered shape and the dtype) the result is written there; in place when
        this rank's rows of ``out`` are ``array`` itself."""
        if self._native is not None and self._worker is None:  # a known call, found and run natively
            try:
                got = self._native.allgather(array, out)
            except DDLError as e:
                raise self._host_failure(e, self._native.last_text) from None
            if type(got) is np.ndarray:
                return got
            if type(got) is str:  # ranks called differently
                self._agreement.report_mismatch(got)
            if got is not None:  # the rows were uneven: (every rank's length, the call's text and hash)
                lengths, text, h = got
                return _gathered_into(self._uneven_allgather(array, lengths, out, text, h), out, self.rank)
        if self._fast and type(array) is np.ndarray and array.flags.c_contiguous:  # the short path: a known call
            known = self._calls.get(("allgather", array.shape, array.dtype))
            if known is not None:
                gathered = known[3]
                fits = _out_fits(out, gathered, array.dtype)
                if fits and self._host is None:  # one rank
                    return self._alone_short(array, out)
                dst = np.empty(gathered, array.dtype) if out is None else out if fits else None
                if dst is not None:  # (an out that overlaps the input: the native call copies the input first)
                    if self._worker is not None:
                        self._worker.drain()
                    return _gathered_into(self._host_allgather(array, dst, out, known), out, self.rank)
        if self._ride_fast and type(array) is np.ndarray and array.flags.c_contiguous:
            ride = self._rides_known.get(("allgather", array.shape, array.dtype))
            if ride is not None and _out_fits(out, ride.answer.shape, array.dtype):
                return _gathered_into(self._ride_allgather(ride, array, out), out, self.rank)
        if devices.is_device_array(array):
            return self._device().allgather(array)
        self.drain()
        a = np.asarray(array)
        problem = _unmovable(a, "allgather")
        if a.ndim == 0:
            problem = "allgather needs at least one dimension (it concatenates along the first)"
        if out is not None and problem is None:
            problem = _gathered_out_problem(out, a, self.size)
        row_bytes = a.dtype.itemsize * math.prod(a.shape[1:])
        # (the call's text is the same whatever the first dimension: uneven rows are a valid call)
        short = problem is None and row_bytes > 0 and a.dtype.isbuiltin == 1
        known = self._call(("allgather", a.shape, a.dtype),
                           lambda: f"allgather(shape=(*, {', '.join(map(str, a.shape[1:]))}), dtype={a.dtype})",
                           short=short, extra=lambda *_: (a.shape[0] * self.size,) + a.shape[1:])
        if short and self._native is not None:
            self._native.learn_allgather(a.dtype, a.shape, known[3], known[2])
        if self.size == 1:
            return self._alone_into(a, problem, out)
        call, h, _, gathered = known
        if self._host is not None and problem is None and row_bytes > 0:
            src = raw(np.ascontiguousarray(a))
            direct = out is not None and out.flags.c_contiguous and out.shape == gathered
            dst = raw(out if direct else np.empty(gathered, a.dtype))
            with self.lock:
                result = self._host_allgather(src, dst, out if direct else None, known)
            # (a raw view of bfloat16 is seen as such again; any other result is out itself where it landed there)
            return _gathered_into(result if result.dtype == a.dtype else result.view(a.dtype), out, self.rank)
        rows = np.zeros(self.size, dtype=np.int64)
        rows[self.rank] = a.shape[0] if a.ndim else 0
        mine = np.ascontiguousarray(a).reshape(-1).view(np.uint8) if problem is None else np.empty(0, np.uint8)
        if short and self._rides(rows.nbytes + self.size * mine.size):
            ride = self._ride(("allgather", a.shape, a.dtype), lambda: rides.allgather(
                call, self._agreement.plan(-(-(rows.nbytes + self.size * mine.size) // 8)),
                self._agreement.options(call, _WORDS, _SUM), a.shape, a.dtype, self.rank, self.size))
            fits = out is not None and out.shape == ride.answer.shape
            return _gathered_into(self._ride_allgather(ride, np.ascontiguousarray(a), out if fits else None), out,
                                  self.rank)
        if self._rides(rows.nbytes + self.size * mine.size):
            # One round: the row counts and every rank's bytes in its slot (zeros elsewhere, summed as bytes),
            # sized as if all ranks had this rank's rows; uneven rows then take their planned allgather.
            words, work = rides.words(rows.nbytes + self.size * mine.size)
            work[:rows.nbytes] = rows.view(np.uint8)
            at = rows.nbytes + self.rank * mine.size
            work[at:at + mine.size] = mine
            with self.lock:
                self._agreement.agree(call, problem, words, _WORDS, _SUM)
                rows = work[:rows.nbytes].view(np.int64)
                if (rows == rows[self.rank]).all():
                    return _gathered_into(work[rows.nbytes:].view(a.dtype).reshape(gathered), out, self.rank)
                return _gathered_into(self._gather_rows(a, mine, rows, row_bytes, call), out, self.rank)
        with self.lock:
            if rows.nbytes <= self._small:
                self._agreement.agree(call, problem, rows, _native.DType.int64, _SUM)
            else:
                self._agreement.agree(call, problem)
                self._run_allreduce(rows, _native.DType.int64, _SUM, call)
            result = self._gather_rows(a, mine, rows, row_bytes, call, out)
        return _gathered_into(result, out, self.rank)

    def _gather_rows(self, a: np.ndarray, mine: np.ndarray, rows: np.ndarray, row_bytes: int,
                     call: str, out=None) -> np.ndarray:
        """The planned allgather of ``a`` (``mine``: its bytes) once every rank's row count is known, into
        ``out`` where it is C-contiguous and of the gathered shape (``mine`` may be its own rows). The caller
        holds ``lock``."""
        shape = (int(rows.sum()),) + a.shape[1:]
        direct = out is not None and out.flags.c_contiguous and out.shape == shape
        result = out if direct else np.empty(shape, dtype=a.dtype)
        self._run_parts("allgather", [int(n) * row_bytes for n in rows], 1, mine, result.reshape(-1).view(np.uint8),
                        _native.RunOptions(_BYTE, _SUM, self.options.timeout, call))
        return result

    def _host_allgather(self, src: np.ndarray, dst: np.ndarray, out, known: tuple) -> np.ndarray:
        """allgather on the host memory level: one step learns every rank's length
        and, when all are equal (the usual case), already carries the first piece into ``dst``; uneven rows take
        a second call with their layout, into ``out`` where it has their shape."""
        text, h, call, _ = known
        lengths = self._on_host(self._host.native.allgather_equal, src, dst, call, text=text)
        return dst if lengths is True else self._uneven_allgather(src, lengths, out, text, h)

    def _uneven_allgather(self, src: np.ndarray, lengths: list[int], out, text: str, h: int) -> np.ndarray:
        """The second call of a host level allgather whose rows were uneven: every rank's ``lengths`` in bytes are
        known, the rows land in ``out`` where it has their shape."""
        native = self._host.native
        row_bytes = src.dtype.itemsize * math.prod(src.shape[1:])
        shape = (sum(n // row_bytes for n in lengths),) + src.shape[1:]
        direct = out is not None and out.flags.c_contiguous and out.shape == shape
        result = raw(out) if direct else np.empty(shape, src.dtype)
        offsets = np.cumsum([0] + lengths[:-1]).tolist()
        self._on_host(native.allgather, src.reshape(-1).view(np.uint8), result.reshape(-1).view(np.uint8),
                      offsets, lengths, h, self.options.timeout, text, text=text)
        return result

    def reduce_scatter(self, array, op: str = "sum", out: np.ndarray | None = None,
                       counts=None) -> np.ndarray:
        """The reduction of every rank's ``array`` (same shape everywhere), scattered along the first axis:
        rank r gets the r-th of ``size`` parts, ``counts[r]`` rows long (the same list on every rank, summing to
        the first dimension; by default as numpy.array_split makes them, the first ``len % size`` parts one row
        longer). Ops as allreduce's. With ``out`` (this rank's part's shape) the result lands there."""
        split = None if counts is None else tuple(counts)
        if self._native is not None and self._worker is None and split is None:  # a known call, found and run natively
            try:
                got = self._native.reduce_scatter(array, op, out)
            except DDLError as e:
                raise self._host_failure(e, self._native.last_text) from None
            if got is not None:
                return got if type(got) is not str else self._agreement.report_mismatch(got)
        if self._fast and type(array) is np.ndarray and array.flags.c_contiguous:  # the short path: a known call
            known = self._calls.get(("reduce_scatter", array.shape, array.dtype, op, split))
            if known is not None:
                mine, prepared = known[3]
                fits = _out_fits(out, mine, array.dtype)
                if fits and self._host is None:  # one rank
                    return self._alone_short(array, out)
                dst = np.empty(mine, array.dtype) if out is None else out if fits else None
                if dst is not None:  # (an out that overlaps the input: the native call copies the input first)
                    self._short(known[0], self._host.native.reduce_scatter, array, dst, prepared)
                    return dst
        if self._ride_fast and type(array) is np.ndarray and array.flags.c_contiguous:
            ride = self._rides_known.get(("reduce_scatter", array.shape, array.dtype, op, split))
            if ride is not None and _out_fits(out, ride.answer.shape, array.dtype):
                return self._ride_reduce_scatter(ride, array, out)
        if devices.is_device_array(array):
            raise DDLError(f"rank {self.rank}: reduce_scatter takes host arrays (GPU arrays: allreduce)")
        self.drain()
        a = np.asarray(array)
        problem = "reduce_scatter needs at least one dimension (it splits along the first)" if a.ndim == 0 else None
        code = rop = None
        try:
            code, rop = native_dtype(a.dtype), native_op(op, a.dtype)
        except DDLError as e:
            problem = problem or str(e)
        length = a.shape[0] if a.ndim else 0
        rows = split_rows(length, self.size)
        if split is not None:
            if len(split) != self.size or any(not isinstance(n, (int, np.integer)) or n < 0 for n in split) \
                    or sum(split) != length:
                problem = problem or (f"reduce_scatter counts {list(split)} must be {self.size} row counts "
                                      f"(one per rank, none negative) summing to the first dimension, {length}")
            else:
                rows = [int(n) for n in split]
        row = math.prod(a.shape[1:]) if a.ndim else 0
        mine = (rows[self.rank],) + a.shape[1:]
        if out is not None and problem is None:
            problem = _out_problem(out, np.empty(mine, a.dtype))
        starts = [n * row for n in itertools.accumulate(rows[:-1], initial=0)]
        counts = [n * row for n in rows]
        factor = 1.0 / self.size if op == "avg" else 1.0
        text, h, _, (_, prepared) = self._call(
            ("reduce_scatter", a.shape, a.dtype, op, split),
            lambda: f"reduce_scatter(shape={a.shape}, dtype={a.dtype}, op={op}"
                    f"{'' if split is None else f', counts={list(split)}'})",
            short=problem is None and a.dtype.isbuiltin == 1,
            extra=lambda said, h: (mine, _native.HostReduceScatter(starts, counts, code, rop, factor, h,
                                                                   self.options.timeout, said)
                                   if problem is None and self._host is not None else None))
        if self._native is not None and problem is None and split is None and a.dtype.isbuiltin == 1:
            self._native.learn_reduce_scatter(a.dtype, a.shape, op, mine, prepared)
        if problem or self.size == 1:
            with self.lock:
                self.agree(text, problem)  # raises everywhere on a bad call; one rank: nothing to agree
            return _deliver(np.ascontiguousarray(self.allreduce(a, op)), out, False)
        if self._host is None and self._rides(a.nbytes):  # one round: the whole reduced in it, then this rank's rows
            start = sum(rows[:self.rank])

            def make():
                return rides.reduce_scatter(text, self._agreement.plan(a.size), self._agreement.options(
                    text, code, rop, factor=factor), a.shape, a.dtype, start, start + rows[self.rank])
            # (a dtype numpy does not build in, bfloat16, keeps the long path: its Ride is not kept)
            ride = self._ride(("reduce_scatter", a.shape, a.dtype, op, split), make) if a.dtype.isbuiltin == 1 \
                else make()
            direct = out is not None and out.flags.c_contiguous
            return _deliver(self._ride_reduce_scatter(ride, raw(np.ascontiguousarray(a)), out if direct else None),
                            out, direct)
        if self._host is None:  # planned per level: slow links carry only this rank's share, reduced below them
            direct = out is not None and out.flags.c_contiguous
            dst = out if direct else np.empty(mine, a.dtype)
            whole = raw(np.ascontiguousarray(a)).reshape(-1)
            with self.lock:
                self.agree(text, problem)
                self._run_parts("reduce_scatter", counts, a.dtype.itemsize, whole, raw(dst).reshape(-1),
                                _native.RunOptions(code, rop, self.options.timeout, text, factor=factor))
            return _deliver(dst, out, direct)
        src = np.ascontiguousarray(a)
        direct = out is not None and out.flags.c_contiguous  # (the native call copies an overlapping input first)
        dst = out if direct else np.empty(mine, a.dtype)
        with self.lock:
            self._on_host(self._host.native.reduce_scatter, raw(src), raw(dst), prepared, text=text)
        return _deliver(dst, out, direct)

    def alltoall(self, array, send_rows=None, recv_rows=None) -> np.ndarray:
        """Rows ``send_rows[j]`` of ``array`` (in order; default: equal parts) go to rank j; returns the rows
        every rank sent here, concatenated in rank order. ``recv_rows[i]``: how many rows come from rank i, when
        the caller knows (else one small allgather learns them). A pairwise exchange (ddl.schedule.alltoall):
        p - 1 rounds, in each one message out and one in per rank; only the destination's rows travel."""
        self.drain()
        if devices.is_device_array(array):
            raise DDLError(f"rank {self.rank}: alltoall takes host arrays")
        a = np.asarray(array)
        problem = _unmovable(a, "alltoall") or ("alltoall needs at least one dimension (it splits along the "
                                                "first)" if a.ndim == 0 else None)
        length = a.shape[0] if a.ndim else 0
        if send_rows is None:
            if problem is None and length % self.size:
                problem = f"alltoall without send_rows needs a first dimension divisible by {self.size}: {length}"
            send_rows = [length // self.size] * self.size
        send_rows = [int(n) for n in send_rows]
        if problem is None and (len(send_rows) != self.size or any(n < 0 for n in send_rows)
                                or sum(send_rows) != length):
            problem = (f"alltoall send_rows {send_rows} must be {self.size} row counts (none negative) summing "
                       f"to the first dimension, {length}")
        text = f"alltoall(shape=(*, {', '.join(map(str, a.shape[1:]))}), dtype={a.dtype})"
        with self.lock:
            self.agree(text, problem)
        if recv_rows is None:
            table = self.allgather(np.asarray(send_rows, np.int64).reshape(1, -1))  # table[i][j]: i sends j
            recv_rows = table[:, self.rank].tolist()
        recv_rows = [int(n) for n in recv_rows]
        if len(recv_rows) != self.size or any(n < 0 for n in recv_rows) or recv_rows[self.rank] != send_rows[self.rank]:
            raise DDLError(f"rank {self.rank}: alltoall recv_rows {recv_rows} must be {self.size} row counts, "
                           f"this rank's own {send_rows[self.rank]} among them")
        row_bytes = a.dtype.itemsize * math.prod(a.shape[1:])
        result = np.empty((sum(recv_rows),) + a.shape[1:], a.dtype)
        sent_at = np.cumsum([0] + send_rows) * row_bytes
        got_at = np.cumsum([0] + recv_rows) * row_bytes
        mine = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        into = result.reshape(-1).view(np.uint8)
        if self.size > 1:
            plan = self._exchange_plan(tuple(sent_at.tolist()), tuple(got_at.tolist()))
            buffer = np.empty(mine.size + into.size, np.uint8)
            buffer[:mine.size] = mine
            with self.lock:
                self.execute(plan, buffer, _native.RunOptions(_BYTE, _SUM, self.options.timeout, text))
            into[:] = buffer[mine.size:]
        me = self.rank
        into[got_at[me]:got_at[me + 1]] = mine[sent_at[me]:sent_at[me + 1]]  # its own rows never left
        return result

    def _exchange_plan(self, sent_at: tuple[int, ...], got_at: tuple[int, ...]) -> CompiledPipeline:
        """The pairwise exchange's compiled program for these byte layouts (input at 0, output after it)."""
        def build():
            base = sent_at[-1]
            send = [(sent_at[j], sent_at[j + 1] - sent_at[j]) for j in range(self.size)]
            recv = [(base + got_at[j], got_at[j + 1] - got_at[j]) for j in range(self.size)]
            program = pairwise_exchange(self.rank, send, recv)
            count = base + got_at[-1]
            return compile_blocks(lambda _: program, count, max(count, 1), 1, "pairwise exchange")

        return self._plans.get(("alltoall", sent_at, got_at), build)

    def _run_parts(self, half: str, counts: list[int], itemsize: int, src: np.ndarray, dst: np.ndarray,
                   options) -> None:
        """A planned reduce-scatter (``src``: the whole flat input, ``dst``: this rank's part) or allgather
        (``src``: this rank's part, ``dst``: every part in rank order) through a staged buffer (ddl.core.parts).
        The caller holds ``lock`` and has agreed."""
        plan = self.parts_plan(half, counts, itemsize)
        if plan.extent == 0:
            return
        if half == "allgather" and plan.in_rank_order:  # the output is the staged buffer
            plan.put(dst, self.rank, src)
            self.execute(plan.compiled, dst, options)
            return
        # the pieces go in and out block by block, natively, overlapping the other blocks' transfers
        self.execute(plan.compiled, plan.staged(src.dtype, self._scratch), options,
                     parts=(src, dst, half == "allgather", counts, plan.positions, plan.piece))

    # -- small calls that ride in the agreement round (ddl.core.rides) -----------------------------------

    def _ride(self, key: tuple, make) -> rides.Ride:
        """The known call ``key``'s Ride, made the first time (after its checks: the long path's)."""
        ride = self._rides_known.get(key)
        if ride is None:
            if len(self._rides_known) > _SIGNATURE_CACHE:
                self._rides_known.clear()
            ride = self._rides_known[key] = make()
        return ride

    def _run_ride(self, ride: rides.Ride, src: np.ndarray | None = None) -> None:
        """The round (the caller holds ``lock``): on the buffer as filled, or on a copy of ``src`` into it (as the
        executor takes it: ddl.core.dtypes.raw)."""
        agreed = self.execute(ride.plan, ride.buffer, ride.options) if src is None else \
            self.execute(ride.plan, src, ride.options, ride.buffer)
        if not agreed:
            self._agreement.report_mismatch(ride.text)

    def _ride_broadcast(self, ride: rides.Ride, a: np.ndarray, result: np.ndarray) -> np.ndarray:
        self.drain()
        with self.lock:
            ride.buffer.fill(0)
            if ride.mine is not None:
                np.copyto(ride.mine, a)
            self._run_ride(ride)
            np.copyto(result, ride.answer)
        return result

    def _ride_allgather(self, ride: rides.Ride, a: np.ndarray, out) -> np.ndarray:
        self.drain()
        with self.lock:
            ride.buffer.fill(0)
            ride.rows[self.rank] = a.shape[0]
            np.copyto(ride.mine, a)
            self._run_ride(ride)
            if ride.rows.tobytes() == ride.equal:
                return _answer_into(ride.answer, out)
            rows = ride.rows.copy()  # uneven: their planned allgather, now that every rank's count is known
            mine = a.reshape(-1).view(np.uint8)
            return self._gather_rows(a, mine, rows, a.dtype.itemsize * math.prod(a.shape[1:]), ride.text, out)

    def _ride_reduce_scatter(self, ride: rides.Ride, a: np.ndarray, out) -> np.ndarray:
        self.drain()
        with self.lock:
            self._run_ride(ride, a)
            return _answer_into(ride.answer, out)

    def broadcast_bytes(self, data: bytes | None, root: int = 0) -> bytes:
        """Root's bytes on every rank, whatever their length (it travels first); ``data`` is read on root only.
        The objects ddl moves (pickles, torch.save's output) go this way."""
        payload = np.frombuffer(data, np.uint8) if self.rank == root else np.empty(0, np.uint8)
        length = int(self.broadcast(np.array([payload.size], np.int64), root)[0])
        if self.rank != root:
            payload = np.empty(length, np.uint8)
        return self.broadcast(payload, root).tobytes()

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's bytes, in rank order (lengths may differ)."""
        payload = np.frombuffer(data, np.uint8)
        lengths = self.allgather(np.array([payload.size], np.int64))
        return [part.tobytes() for part in np.split(self.allgather(payload), np.cumsum(lengths)[:-1])]

    def barrier(self) -> None:
        """Returns once every rank has entered the barrier (an agreement round with no data)."""
        if self._native is not None and self._worker is None:  # known after the first, run natively
            try:
                got = self._native.barrier()
            except DDLError as e:
                raise self._host_failure(e, "barrier()") from None
            if got is not None:
                return None if got is True else self._agreement.report_mismatch(got)
        self.drain()
        prepared = self._call(("barrier",), lambda: "barrier()", short=True)[2]
        if self._native is not None:
            self._native.learn_barrier(prepared)
        if self.size > 1:
            with self.lock:
                if self._host is not None:
                    self._on_host(self._host.native.barrier, prepared, text="barrier()")
                else:
                    self._agreement.agree("barrier()", None)

    def _alone_into(self, a: np.ndarray, problem: str | None, out) -> np.ndarray:
        """allreduce on one rank: the input itself, as a copy or into ``out``."""
        if problem or out is None:
            return self._alone(a, problem)
        if out is not a:
            np.copyto(out, a)
        return out

    def _alone(self, a: np.ndarray, problem: str | None) -> np.ndarray:
        """Any collective on one rank: a copy of the input, or the error."""
        if problem:
            raise DDLError(f"rank {self.rank}: {problem}")
        return np.array(a, order="C")

    def _device(self):
        if self._devices is None:
            self._devices = devices.collectives_for(self)
        return self._devices


_KEPT_AFTER_FAILURE: list = []  # MPI communicators of failed calls (see Communicator.close)


class _Closed:
    """Stands in for the executor of a closed communicator."""

    def __getattr__(self, name):
        raise DDLError("this ddl communicator was closed (ddl.finalize() or Communicator.close())")


def _unmovable(a: np.ndarray, what: str) -> str | None:
    return f"cannot {what} dtype {a.dtype} (objects have no fixed size)" if a.dtype.hasobject else None


def _out_problem(out, a: np.ndarray) -> str | None:
    if not isinstance(out, np.ndarray):
        return f"out must be a numpy array, not {type(out).__name__}"
    if not out.flags.writeable:
        return "out is read-only"
    if out.shape != a.shape or out.dtype != a.dtype:
        return f"out has shape {out.shape} and dtype {out.dtype}; the input has {a.shape}, {a.dtype}"
    return None


def _writable_contiguous(flags) -> bool:
    return flags.c_contiguous and flags.writeable


def _gathered_out_problem(out, a: np.ndarray, size: int) -> str | None:
    if not isinstance(out, np.ndarray):
        return f"out must be a numpy array, not {type(out).__name__}"
    if not out.flags.writeable:
        return "out is read-only"
    if out.dtype != a.dtype or out.shape[1:] != a.shape[1:]:
        return f"out has shape {out.shape} and dtype {out.dtype}; the gathered rows are (*, {a.shape[1:]}), {a.dtype}"
    return None


def _short_out(array: np.ndarray, out) -> np.ndarray | None:
    """Where a short path writes a result of ``array``'s shape and dtype: a new array, ``array`` itself (in
    place), or ``out``; None where out needs the long path (its checks and errors)."""
    if out is None:
        return np.empty(array.shape, array.dtype)
    if out is array:
        return array if array.flags.writeable else None
    return out if _out_fits(out, array.shape, array.dtype) else None


def _out_fits(out, shape: tuple, dtype) -> bool:
    """Whether a short path may write its result of ``shape`` and ``dtype`` to ``out``: None (it makes one) or a
    plain writable C-contiguous array of both; any other out takes the long path, with its checks and errors."""
    return out is None or (type(out) is np.ndarray and out.shape == shape and out.dtype == dtype
                           and _writable_contiguous(out.flags))


def _answer_into(answer: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """A ride's answer, copied out of its reused buffer: into ``out``, or a new array."""
    if out is None:
        return answer.copy()
    np.copyto(out, answer)
    return out


def _gathered_into(result: np.ndarray, out, rank: int) -> np.ndarray:
    """allgather's answer: ``result``, or ``out`` filled from it (where the rows were uneven, or out was not the
    shape of equal rows)."""
    if out is None or result is out:
        return result
    if result.shape != out.shape:
        raise DDLError(f"rank {rank}: out has shape {out.shape}; the gathered rows are {result.shape}")
    np.copyto(out, result)
    return out


def _work_buffer(a: np.ndarray, out: np.ndarray | None) -> tuple[np.ndarray, bool]:
    """(the flat buffer the plan runs on, whether it is out's memory): out itself when it can be (in place),
    else a fresh C-ordered copy."""
    if out is not None and out.flags.c_contiguous:
        if out is not a:  # copy through a temporary when the two may overlap
            np.copyto(out, a.copy() if np.may_share_memory(out, a) else a)
        return out.reshape(-1), True
    return np.array(a, order="C").reshape(-1), False


def ranks_in(group, comm) -> list[int]:
    """The rank in ``comm`` of each member of ``group`` (an mpi4py Group, freed here), in the group's order;
    members not in ``comm`` are left out."""
    everyone = comm.Get_group()
    try:
        ranks = type(group).Translate_ranks(group, list(range(group.size)), everyone)
    finally:
        everyone.Free()
        group.Free()
    return [r for r in ranks if r >= 0]


def _world_ranks(mpi_comm) -> list[int] | None:
    """The MPI_COMM_WORLD rank of each rank of ``mpi_comm`` (None without one)."""
    if mpi_comm is None:
        return None
    from mpi4py import MPI

    return ranks_in(mpi_comm.Get_group(), MPI.COMM_WORLD)


def _is_deadline(e: BaseException) -> bool:
    """The executor's "made no progress for N s (DDL_TIMEOUT)" (native/src/executor.cpp, fail())."""
    return isinstance(e, TransportError) and not isinstance(e, RankFailure) and "(DDL_TIMEOUT)" in str(e)


def _failed_ranks(mpi_comm) -> list[int]:
    """The ranks of ``mpi_comm`` its MPI knows to have failed (ULFM's MPI_Comm_get_failed)."""
    return sorted(ranks_in(mpi_comm.Get_failed(), mpi_comm))


def _deliver(result: np.ndarray, out: np.ndarray | None, in_out: bool) -> np.ndarray:
    """What the call returns: ``result``, or ``out`` (filled from result unless result is out's memory)."""
    if out is None:
        return result
    if not in_out:
        np.copyto(out, result)
    return out


def _mpi_spins() -> bool:
    """Whether this MPI polls without ever giving its core away (MPICH): the executor then yields between polls,
    or ranks that outnumber cores starve the one they wait for. Open MPI yields itself when told to (ddlrun
    and the emulated cluster set mpi_yield_when_idle)."""
    return not bootstrap.mpi_library().startswith("Open MPI")
