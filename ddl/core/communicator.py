"""A group of ranks and the collectives ddl runs on it: a small face over a table of paths.

Every collective takes one road (ddl.core.road): a call of a known signature on a plain array is found and run
at once (natively, ddl._native.ShortCalls, or by its path's short form); any other is described and checked
once (ddl.core.calls), then taken by the first path of the communicator's table that serves it
(ddl.core.paths: the device path, alone, the host memory level, a ride in the agreement round, the planned
executor). A rank whose call is invalid still takes part, with its problem, so its peers raise too.

The public seam other parts build on (ddl.gpu, the frameworks): ``lock`` (held around a collective's steps),
``agree``, ``allreduce_plan``, ``execute``, ``plan_for``, ``mpi_comm``, plus the collectives themselves. The
paths use the members documented as theirs (``agreement``, ``host_memory``, ``plans``, ``scratch``, ``on_host``).
"""
from __future__ import annotations

import threading
import time
import weakref
from dataclasses import replace

import numpy as np

from .. import _native
from ..errors import DDLError, MismatchError, RankFailure, TransportError
from ..options import Options, parse
from ..planner.explain import explain
from ..planner.model import MAX_BLOCK_BYTES
from ..planner.per_level import grid_of
from ..planner.sources import choose_tree
from ..schedule.compile import CompiledPipeline
from ..topology import Topology, discover
from ..topology import tree as hierarchical
from ..topology.probe.session import doubt_cached
from ..topology.switches import switch_levels
from . import bootstrap, devices, failures, flight, host, paths, tcp, timeline
from .agreement import CAPACITY, Agreement, hash64
from .asynchronous import Submitting, Worker
from .calls import Calls, gathered_into
from .diagnostics import CallTimer
from .join import beside_joined, serve_until_all_joined
from .packing import pack_groups
from .parts import Scratch
from .plan_check import PlanCheck
from .planning import Planning
from .plans import PlanCache
from .road import Road

SCRATCH_KEPT = 256 << 20  # staging bytes a communicator keeps between calls (larger ones are made per call)
# Asynchronous runs (the caller works beside them: DDP's buckets during backward) of at least this many bytes
# sleep between polls while they wait (DDL_REST): their waits are long, and spinning through them took every
# core of the emulated clusters (8 ranks on 2: a 26 MB allreduce cost 0.65 CPU-seconds across the ranks where
# gloo's cost 0.15, and DDP's backward slowed beside it; T1's DDP step with spinning buckets 0.69x gloo's speed,
# resting 0.80-0.86x, on a slow machine). Smaller runs keep polling, their wait being their latency (on T1,
# resting from 0 bytes: 8 B allreduces 150 -> 700 us; from 1 MiB: a 1 MiB broadcast, a chain of eight ranks,
# 10.9 -> 14.2 ms); so do blocking runs and runs a caller waits for (Handle.waiting), as nothing of the
# caller's needs the core: on that slow machine a sleep overran by 60 us and more, T1's 16 MiB allreduce took
# 446 ms resting against 229-265 polling, and a lone 64 MiB allreduce submitted and waited for 1.118x the
# blocking one's time until its wait stopped the rests (0.997x).
REST_FROM_BYTES = 4 << 20
# ... and only where a level's links are slow enough that a block's message outlasts the shortest sleep Linux
# gives several times over (a rest is stretched by the thread's timer slack, 50 us): the planner's largest
# block across a network in 400 us or more (2.6 Gbit/s or slower). Over faster links a rest outlasts the message it waits for
# (4 ranks on one host, MPI's shared memory: 8 MiB allreduces 4.7 -> 6-10 ms, 64 MiB 37 -> 48 ms resting).
REST_SLOWEST_BYTES_PER_S = MAX_BLOCK_BYTES / 400e-6


def rest_seconds(levels, options: Options) -> float:
    """The longest rest of this communicator's large runs: DDL_REST where some level's links are slow, else 0."""
    slow = any(lv.bandwidth <= REST_SLOWEST_BYTES_PER_S for lv in levels)
    return options.rest * 1e-6 if slow else 0.0
TIMELINE_CALLS = 100_000  # calls a DDL_TIMELINE keeps per rank (the oldest go first)


class Communicator(Planning, Submitting):
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
        # One collective's steps at a time; re-entrant: ddl.gpu holds it around its own, whose staged levels
        # may be this communicator's collectives.
        self.lock = threading.RLock()
        self.hosts = [r["host"] for r in reports] if reports else None  # each rank's host, in rank order
        if o.mode is not None:
            o.mode.check_size(size)
        try:
            choice = choose_tree(o, rank, size, hierarchy, topology, reports, probed)
        except DDLError as e:  # the same error type, always naming the rank
            raise type(e)(str(e) if str(e).startswith("rank ") else f"rank {rank}: {e}") from None
        self.levels, self.topology, self._forced = choice.levels, choice.topology, choice.forced
        # The planner reads the tree as it came (a compact machine's is its group sizes, tree.Regular: no walk
        # over every rank); users and the per-level collectives read nested lists.
        self._plan_tree, self.tree = choice.tree, hierarchical.nested(choice.tree)
        self.tree_source = choice.source
        self.over_tcp = executor is not None and executor.transport == "tcp"  # ddl's own sockets (ddl.core.tcp)
        if self.over_tcp:  # its waits are event-driven: any run nobody waits for may block until bytes move
            executor.rest(o.rest * 1e-6, 0)
        elif executor is not None:
            executor.rest(rest_seconds(self.levels, o), REST_FROM_BYTES)
        self.hierarchy = self.tree if hierarchical.depth(self.tree) >= 2 else None
        self._grid = grid_of(self.tree)  # the ranks as coordinates: what broadcast, allgather, reduce_scatter follow
        self._algos = tuple(o.algo.split(","))
        self.small_bytes = min(o.small_bytes, CAPACITY)  # payloads that ride in the agreement round
        self._chosen: dict = {}  # allreduce bytes -> their Plan (ddl.core.planning)
        self.plans = PlanCache(rank, o.dbg_level >= 1)
        self._timer = CallTimer(o.dump_iter, rank, [lv.name for lv in self.levels]) if o.dump_iter else None
        # The executor's round spans: for -dump_iter's per-level times and the timeline (ddl.core.timeline)
        self._recorder = None
        if executor is not None and (o.timeline or o.dump_iter):
            self._recorder = timeline.Recorder(executor, TIMELINE_CALLS if o.timeline else o.dump_iter)
        self.failure: RankFailure | None = None  # the rank failure that broke this communicator, if one did
        # every native run, kept in a small ring and written out when one fails (ddl.core.flight)
        runs = flight.runs_kept()
        self._flight = None if executor is None or runs <= 0 else flight.FlightRecorder(
            executor, rank, size, [lv.name for lv in self.levels], runs, failures.world_ranks(mpi_comm))
        if self._flight is not None and flight.folder():
            flight.install_signal_handler()  # kill -USR1 writes it too
        self.scratch = Scratch(SCRATCH_KEPT)  # the staging buffers of planned allgathers and reduce-scatters
        self._worker: Worker | None = None  # runs the *_async collectives in order (made on first use)
        self.plan_for(1)  # a forced algorithm list that does not fit the tree fails here, not mid-training
        # Settings that shape plans (and the path forced) must match across ranks: they go into every call's hash.
        shape = f"{hierarchical.describe(self.tree)} {[lv.to_dict() for lv in self.levels]} {self._forced}"
        settings = (f"algo={o.algo} segment={o.segment} inflight={o.inflight} small={self.small_bytes} "
                    f"tree={hash64(shape) & 0xffffffff:08x}" + (f" path={o.path}" if o.path else ""))
        self.agreement = Agreement(rank, size, settings, self.plans, self.execute, o.timeout, self.hosts)
        # Ranks that share one host collect through memory (ddl.core.host); agreed by all ranks, or none use it.
        self.host_memory = None
        if mpi_comm is not None and size > 1:
            wanted = host.eligible(size, self.hosts, o) and hierarchy is None and topology is None \
                and self._forced is None and len(self.levels) == 1
            self.host_memory = self.agreement.host = host.HostLevel.create(mpi_comm, wanted,
                                                                           single_copy=o.shm != "slots")
        # known calls' short forms: not where each call feeds a timer, a timeline or a check
        quick = not o.dump_iter and not o.timeline and o.check is None
        # ... found and run natively on the host level or alone, or across hosts as the executor's planned runs
        # of the calls that repeat them (Python's road stays for what they decline)
        self._native = _native.ShortCalls(self.host_memory.native if self.host_memory is not None else None,
                                          _weakly(self.agreement.report_mismatch), _weakly(self._host_failure),
                                          executor if self.host_memory is None and size > 1 else None) \
            if quick and (self.host_memory is not None or size == 1 or executor is not None) else None
        self._calls = Calls(rank, size, self.agreement, o.timeout, self.host_memory is not None, size == 1)
        self.road = Road(paths.table(self), o.path, quick, self._native, self.drain,
                         self._timed if self._timer is not None or self._recorder is not None else None)
        # large allreduces timed against the plan's prediction, five calls at a time, the slowest rank's
        # mean deciding and rank 0 saying it (ddl.core.plan_check)
        self.plan_check = PlanCheck(lambda n: explain(self.plan_for(n), n), self._doubt_probe, o.dbg_level >= 1,
                                    enabled=mpi_comm is not None and len(set(self.hosts or ())) > 1,
                                    slowest=self._slowest, speaks=rank == 0)
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
        hosts = [r["host"] for r in reports] if reports else None
        executor = None
        if tcp.wanted(dup.size, hosts):  # ddl's own sockets across hosts (ddl.core.tcp)
            executor = tcp.executor(dup, hosts or [""] * dup.size, options.timeout, yield_when_idle=True)
        elif dup.size > 1:
            executor = _native.Executor.mpi(dup, yield_when_idle=_mpi_spins())
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
            topology = Topology(topology.name, topology.graph, [topology.placement[r] for r in ranks])
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
        broken = broken or self.failure is not None or (self.host_memory is not None and self.host_memory.native.broken)
        if self._recorder is not None and self.options.timeline:
            timeline.write_gathered(self, self._recorder, self.options.timeline, self._origin, broken)
        self._recorder = None
        if self._flight is not None:
            flight.forget(self._flight)
        for path in self.road.paths:
            if hasattr(path, "close"):
                path.close()
        self._native = self.road.native = self.road.quick = None  # (the native table holds the segment mapped)
        self._calls.forget()
        if self.host_memory is not None:
            self.host_memory.close()
            self.host_memory = self.agreement.host = None
        if not broken:  # (after a failure, receives the MPI could not cancel may still land in it)
            self.scratch.release()
        self._executor = _Closed()
        for mpi in (self._mpi, self._roll):
            if mpi is not None:  # (after a failure, words of the failed call or a roll call may still come)
                failures.KEPT_AFTER_FAILURE.append(mpi) if broken else mpi.Free()
        self._mpi = self._roll = None

    # -- the seam other parts build on ------------------------------------------------------------------

    @property
    def mpi_comm(self):
        """The MPI communicator ddl runs on (a private duplicate; None for loopback or alone)."""
        return self._mpi

    def execute(self, plan: CompiledPipeline, buffer, options, out=None, parts: tuple | None = None,
                source=None) -> bool:
        """Runs a compiled pipeline on this communicator's executor (``_native.RunOptions``; ``out`` and
        ``source``: see _native.Executor.run; ``parts``: run_parts' arguments after the staged ``buffer``); returns
        whether every rank's header agreed (True without one). The caller holds ``lock`` and has agreed first."""
        executor = self._executor
        # a blocking call's caller waits for its run (it polls); a submitted one's may work beside it
        # (asynchronous.waiting_on, spelt out: a small call's Python is most of its time)
        waits = self._worker is None or not self._worker.on_worker()
        try:
            if waits:
                executor.caller_waits(True)
            try:
                if parts is not None:
                    executor.run_parts(plan.native, buffer, *parts, options)
                    return True
                return executor.run(plan.native, buffer, options, out, source)
            finally:
                if waits:
                    executor.caller_waits(False)
        except DDLError as e:
            failure = self.run_failure(e, plan, options.label)
            if failure is not e:
                raise failure from None
            raise
        finally:
            if self._recorder is not None:
                self._recorder.ran(plan.phases, plan.algorithm, options.label)

    def run_failure(self, e: DDLError, plan: CompiledPipeline, label: str) -> DDLError:
        """A run's error as its caller gets it: a dead rank named (and kept, for ddl.elastic), a deadline with the
        ranks that never reached the call, the flight recorder written; others as they came."""
        failure = failures.name_failure(self, e, label, plan) if isinstance(e, RankFailure) else \
            self._name_absent(e, label) if failures.is_deadline(e) else e
        if isinstance(failure, RankFailure):
            self.failure = failure  # for ddl.elastic, where a framework wrapped the error in its own
        if self._flight is not None and isinstance(e, TransportError):
            # an agreement round's phases are level -1 (all ranks): name it so
            what = plan.phases[0][1] if plan.phases and plan.phases[0][0] < 0 else plan.algorithm
            self._flight.failed(failure, what, plan.phases)
            failures.write_flight_recorder(self.rank, failure, self.options.dbg_level >= 1)
        return failure

    def forget_allgathers(self, text: str) -> None:
        """Known allgathers of ``text`` are forgotten (the native table forgets every allgather): their next calls
        are described again and take the path their rows now call for."""
        quick = self.road.quick
        if quick is not None:
            for key in [k for k, (_, known) in quick.items() if k[0] == "allgather" and known.text == text]:
                del quick[key]
        if self._native is not None:
            self._native.forget_allgathers()

    def teach_planned(self, call, plan: CompiledPipeline, options, ride=None) -> None:
        """ddl._native.ShortCalls learns a known call's planned run (its plan and options, the same every time):
        later calls of its signature are found and run natively (across hosts). A broadcast or an allreduce
        runs on the call's arrays; an allgather or a reduce-scatter rides with ``ride``: (its Ride's buffer, the
        input's pieces in it as (buffer byte, input byte, bytes), where the answer lies, disagreed(array, out):
        the answer where the round did not agree, None where that is a mismatch[, the answer's pieces in the
        buffer as (buffer byte, output byte, bytes)]); a checked allgather likewise, on a buffer of its own."""
        if self._native is None:
            return
        a, k, label = call.array, call.known, options.label
        failed = _weakly(self.run_failure)
        named = lambda e: failed(e, plan, label)  # noqa: E731 (the table holds it: no reference to self)
        if call.collective == "broadcast":
            self._native.learn_planned_broadcast(a.dtype, a.shape, call.root, plan.native, options, named)
        elif call.collective == "allreduce":
            self._native.learn_planned_allreduce(a.dtype, a.shape, call.op, plan.native, options, named)
        else:
            op = call.op if call.collective == "reduce_scatter" else None
            self._native.learn_ride(a.dtype, a.shape, op, k.shape, plan.native, options, *ride[:3], named, ride[3],
                                    *ride[4:])

    def _slowest(self, seconds: float) -> float:
        """The largest of every rank's ``seconds`` (the plan check's windows: a check, so MPI's own allreduce,
        nonblocking under ddl's deadline; past it, a peer gone, this rank's own and the check ends here)."""
        from mpi4py import MPI

        mine, out = np.array([seconds]), np.empty(1)
        request = self._mpi.Iallreduce(mine, out, op=MPI.MAX)
        deadline = time.monotonic() + self.options.timeout
        while not request.Test():
            if time.monotonic() > deadline:
                failures.KEPT_AFTER_FAILURE.append((request, mine, out))  # MPI may still write into them
                self.plan_check.enabled = False
                return seconds
            time.sleep(50e-6)
        return float(out[0])

    def _doubt_probe(self, text: str) -> str:
        """Marks the probe's cached result for these hosts doubtful (when the plan came from it); says what was done."""
        if self.tree_source != "probe" or not self.hosts:
            return f"the levels came from {self.tree_source}, not from the probe"
        return doubt_cached(self.hosts, text)

    def _name_absent(self, e: TransportError, label: str) -> TransportError:
        seq = self._executor.runs()[-1][0] if self._flight is not None and self._executor.runs() else -1
        return failures.name_absent(self, self._roll, e, label, seq)

    def on_host(self, collective, *args, text: str):
        """Runs one of the host memory level's collectives; a mismatch raises the same MismatchError on every
        rank, a failure is named as the executor's are."""
        try:
            agreed = collective(*args)
        except DDLError as e:
            raise self._host_failure(e, text) from None
        if agreed is False:
            self.agreement.report_mismatch(text)
        return agreed

    def _host_failure(self, e: DDLError, text: str) -> DDLError:
        """The host level's error as the caller sees it: a dead rank kept for ddl.elastic, a deadline with the
        ranks that never reached the call."""
        if isinstance(e, RankFailure):
            self.failure = e
        elif failures.is_deadline(e):
            return self._name_absent(e, text)
        return e

    def agree(self, call: str, problem: str | None = None, *payload, rows: int | None = None):
        """An agreement round (``payload``: work, dtype, op as Agreement.agree takes them): raises on every rank
        when ranks called differently, or when ``problem`` (this rank's reason its call is invalid) is set
        anywhere. ``rows``: an allgather's row count (Agreement.agree)."""
        if self.size > 1:
            return self.agreement.agree(call, problem, *payload, rows=rows)
        if problem:
            raise DDLError(f"rank {self.rank}: {problem}")
        return None

    @property
    def grid(self):
        """The ranks as coordinates per level of the planned tree (ddl.planner.per_level.Grid): group sizes
        innermost first, each rank's position in its group at each level."""
        return self._grid

    @property
    def host_level(self) -> bool:
        """Whether this communicator's collectives run through host memory (ddl.core.host)."""
        return self.host_memory is not None

    # -- the collectives: a known call at once, any other down the road ------------------------------------

    def allreduce(self, array, op: str = "sum", out: np.ndarray | None = None) -> np.ndarray:
        try:
            if self._native is not None and self._worker is None:  # a known call, found and run natively
                got = self._native.allreduce(array, op, out)
                if got is not None:
                    return got
            return self.road.take("allreduce", op, array, out, self._calls.allreduce, array, op, out)
        except MismatchError as e:
            if not beside_joined(e, self.rank, self.size):
                raise
            return self.road.take("allreduce", op, array, out, self._calls.allreduce, array, op, out)  # with zeros

    def broadcast(self, array, root: int = 0, out: np.ndarray | None = None) -> np.ndarray:
        """A copy of root's array on every rank (any fixed-size dtype; every rank passes the same shape), or
        written to ``out`` (its shape and dtype; it may be ``array`` itself)."""
        if self._native is not None and self._worker is None:
            got = self._native.broadcast(array, root, out)
            if got is not None:
                return got
        # (a root of another type that equals a known one, 1.0 for 1, is described: it is refused there)
        return self.road.take("broadcast", root if type(root) is int else repr(root), array, out,
                          self._calls.broadcast, array, root, out)

    bcast = broadcast

    def allgather(self, array, out: np.ndarray | None = None) -> np.ndarray:
        """Every rank's array concatenated along the first axis, in rank order (first dims may differ). With
        ``out`` (C-contiguous, of the gathered shape and the dtype) the result is written there; in place when
        this rank's rows of ``out`` are ``array`` itself."""
        if self._native is not None and self._worker is None:
            try:
                got = self._native.allgather(array, out)
            except MismatchError as e:  # (a run checked on receipt: where only row counts differed, gathered)
                return self.road.named("planned").after_mismatch(e, self._calls.allgather(array, out).text, array,
                                                                 out)
            if type(got) is np.ndarray:
                return got
            if got is not None:  # the rows were uneven: (every rank's length, the call's text and hash)
                lengths, text, h = got
                uneven = self.road.named("host memory").uneven(array, lengths, out, text, h)
                return gathered_into(uneven, out, self.rank)
        return self.road.take("allgather", None, array, out, self._calls.allgather, array, out)

    def reduce_scatter(self, array, op: str = "sum", out: np.ndarray | None = None,
                       counts=None) -> np.ndarray:
        """The reduction of every rank's ``array`` (same shape everywhere), scattered along the first axis:
        rank r gets the r-th of ``size`` parts, ``counts[r]`` rows long (the same list on every rank, summing to
        the first dimension; by default as numpy.array_split makes them, the first ``len % size`` parts one row
        longer). Ops as allreduce's. With ``out`` (this rank's part's shape) the result lands there."""
        if self._native is not None and self._worker is None and counts is None:
            got = self._native.reduce_scatter(array, op, out)
            if got is not None:
                return got
        return self.road.take("reduce_scatter", (op, None if counts is None else tuple(counts)), array, out,
                          self._calls.reduce_scatter, array, op, out, counts)

    def barrier(self) -> None:
        """Returns once every rank has entered the barrier."""
        if self._native is not None and self._worker is None and self._native.barrier():  # known: run natively
            return None
        self.drain()
        return self.road.run(self._calls.barrier())

    def alltoall(self, array, send_rows=None, recv_rows=None) -> np.ndarray:
        """Rows ``send_rows[j]`` of ``array`` (in order; default: equal parts) go to rank j; returns the rows
        every rank sent here, concatenated in rank order. ``recv_rows[i]``: how many rows come from rank i, when
        the caller knows (else one small allgather learns them). A pairwise exchange (ddl.schedule.alltoall):
        p - 1 rounds, in each one message out and one in per rank; only the destination's rows travel."""
        self.drain()
        return self.road.run(self._calls.alltoall(array, send_rows, recv_rows))

    def _timed(self, path, call):
        """-dump_iter's and DDL_TIMELINE's allreduce: its time, and its executor runs as one call."""
        started = time.perf_counter()
        if self._recorder is not None:
            self._recorder.begin("allreduce", call.array.nbytes)
        try:
            result = path.run(call)
        finally:
            timed = self._recorder.end() if self._recorder is not None else None
        if self._timer:
            self._timer.add(time.perf_counter() - started, call.array.nbytes, timed)
        return result

    def allreduce_n(self, arrays, op: str = "sum", average: bool | None = None) -> list[np.ndarray]:
        """Many arrays in one allreduce per dtype: packed into one buffer, reduced, unpacked (IBM's name;
        IBM's ``average=True`` means op 'avg')."""
        if average is not None:
            op = "avg" if average else op
        arrays = list(arrays)
        if any(devices.is_device_array(x) for x in arrays):
            return self.road.named("device").allreduce_n(arrays, op)
        arrays = [np.asarray(x) for x in arrays]
        return pack_groups(arrays, [x.dtype.str for x in arrays], lambda idx: self.allreduce(
            np.concatenate([arrays[i].reshape(-1) for i in idx]), op))

    def join(self) -> None:
        """This rank has no more data (uneven inputs): until every rank has called join, it takes part in the
        others' allreduces with zeros (an average still divides by every rank). Any other collective of theirs
        meanwhile fails on their ranks with MismatchError naming join. Returns when all have joined."""
        serve_until_all_joined(self)

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


class _Closed:
    """Stands in for the executor of a closed communicator."""

    def __getattr__(self, name):
        raise DDLError("this ddl communicator was closed (ddl.finalize() or Communicator.close())")


def _weakly(method):
    """``method`` without a reference to its object (the native table must not keep the communicator alive)."""
    ref = weakref.WeakMethod(method)
    return lambda *args: ref()(*args)


def _mpi_spins() -> bool:
    """Whether this MPI polls without ever giving its core away (MPICH): the executor then yields between polls,
    or ranks that outnumber cores starve the one they wait for. Open MPI yields itself when told to (ddlrun
    and the emulated cluster set mpi_yield_when_idle)."""
    return not bootstrap.mpi_library().startswith("Open MPI")

