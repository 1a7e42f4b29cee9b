"""The planned path: an agreement round with no payload, then ddl's own plan on the native executor — per level,
innermost first, pipelined in blocks (the planner chooses, ddl.schedule compiles, the executor runs).

Over ddl's own TCP connections an allreduce, a reduce-scatter, an allgather (its row count in the hash) or a
broadcast up to CHECKED_UP_TO has no agreement round: its messages carry the run's number and its call's hash,
which the ranks compare on receipt
(Transport::begin_run; ddl/_native's TcpTransport says how: no message of its own while calls agree), so a
rank that called differently makes every rank raise MismatchError (a broadcast's rank that had finished, in the
call it is in by then or within the next TcpTransport.RUN_AHEAD) and no message is read by another call. It
runs into a buffer of its own, delivered once the call is known to be the others': a mismatch changes neither
the input nor ``out``. (On T2 the round took about 0.45 ms of a 64 KiB
allreduce's 2.2.)

Serves every collective, valid or not: it is the last of every table. A refused call raises on every rank in
its agreement round; a large one follows its plan: an allreduce the planner's choice for its size, a
reduce-scatter and an allgather that choice's halves per level (slow links carry only reduced data), a
broadcast a pipelined chain through the subtrees (or a binomial tree per level when small), an alltoall a
pairwise exchange. -check compares an allreduce with MPI's own here.
"""
from __future__ import annotations

import math

import numpy as np

from ... import _native
from ...planner.per_level import broadcast_program, chain_program
from ...schedule.alltoall import pairwise_exchange
from ...schedule.compile import CompiledPipeline, compile_blocks
from ...errors import DDLError, MismatchError
from ..agreement import ROWS
from ..calls import broadcast_buffer, deliver, gather_counts, gathered_into, into, work_buffer
from .. import plan_check
from ..diagnostics import check_against_mpi
from ..dtypes import raw

_BYTE = _native.DType.uint8
_SUM = _native.ReduceOp.sum
CHAIN_FROM = 256 << 10  # broadcasts from this size (and 3 ranks) run as a pipelined chain ...
CHAIN_BLOCK = 64 << 10  # ... in blocks of this size: p - 1 blocks of fill, small against the whole
KEPT_UNEVEN = 1024  # allgathers remembered as uneven
EVEN_AGAIN = 64  # ... until this many calls in a row of one had even rows: then it is checked (or rides) again
CHECKED_UP_TO = 1 << 20  # over TCP, calls up to this size are checked on receipt (above it the round is a small
                         # part of the call; at 4 MiB on T1 it no longer paid for the copy: 60.0 ms against 58.3)
# (Small broadcasts too: while each checked run waited for the previous rank's notice, a root waited for the
# tree's last call and 8 B-8 KiB took 1.00-1.40x their ride's time; since runs send notices only every
# RUN_AHEAD-th, an 8 B broadcast on T1 took 280-310 us against the ride's 540-610 at one hour, and 737 against
# 922 alternating in one job at the next; 1 KiB 752 against 709: docs/benchmarks.md.)


class Planned:
    name = "planned"
    serves = frozenset(("allreduce", "broadcast", "allgather", "reduce_scatter", "barrier", "alltoall"))
    repeats = frozenset(("allreduce", "broadcast", "reduce_scatter", "allgather"))  # checked calls: by ``again``

    def __init__(self, comm):
        self.comm = comm
        # allgathers (their text) whose ranks' rows have differed: agreed first; with their even calls since
        self.uneven: dict[str, int] = {}

    def takes(self, call) -> str | None:
        if call.device or self.comm.size == 1 and call.collective != "alltoall":
            return None
        if call.problem:
            return "the call is refused here: its agreement round raises on every rank"
        if self.checked(call):
            return "ddl's plan per level on the native executor, the call checked on receipt (no agreement round)"
        return "ddl's plan per level on the native executor, after an agreement round"

    def checked(self, call) -> bool:
        """Whether this allreduce, reduce-scatter, allgather or broadcast is checked on receipt instead of agreed
        first (ddl's TCP; a call with bytes: one with none sends nothing to check; an allreduce not under -check,
        which compares with MPI; an allgather of a plain dtype, up to CHECKED_UP_TO gathered). An allreduce, a
        reduce-scatter or an allgather depends on every rank's data, so no rank finishes one that another called
        differently; a broadcast's rank may, having heard from its parent only, and raises in the call it is in by
        then or within the next RUN_AHEAD (TcpTransport). An allgather's check covers its row count: uneven rows
        make every rank raise there, then gather as agreed (``_allgather_checked``)."""
        comm, collective, a = self.comm, call.collective, call.array
        if collective == "allgather":
            return comm.over_tcp and call.problem is None and call.known.short and \
                a.nbytes * comm.size <= CHECKED_UP_TO and call.known.text not in self.uneven
        return collective in ("allreduce", "reduce_scatter", "broadcast") and comm.over_tcp and \
            call.problem is None and (comm.options.check is None or collective != "allreduce") and \
            not a.dtype.hasobject and 0 < a.nbytes <= CHECKED_UP_TO

    def repeatable(self, call) -> bool:
        """Whether later calls of this (valid, known) signature may take ``again``: a checked one's plan and
        options are the same every time (worked out once, in its Known's ``kept``); one after an agreement
        round is described each time."""
        return self.checked(call)

    def run(self, call):
        return getattr(self, "_" + call.collective)(call)

    def teach(self, call) -> None:
        """A checked broadcast or allreduce is run natively from its next call on (ddl._native.ShortCalls),
        but for the allreduces the plan check times (from MIN_BYTES); so is a checked allgather whose staged
        buffer is its answer (one block, ranks in order: ShortCalls' ride, on a buffer of its own)."""
        if call.collective == "allgather":
            self._teach_allgather(call)
            return
        kept = call.known.kept.get("checked")
        if kept is not None and call.collective in ("broadcast", "allreduce") and \
                (call.collective == "broadcast" or call.array.nbytes < plan_check.MIN_BYTES):
            self.comm.teach_planned(call, *kept)

    def _teach_allgather(self, call) -> None:
        comm, a, kept = self.comm, call.array, call.known.kept.get("checked")
        if kept is None or not self.checked(call):
            return
        n = a.nbytes
        plan = comm.parts_plan("allgather", [n] * comm.size, 1)
        if n and plan.nblocks == 1 and not plan.padded:  # every part whole, at its position: copied out in order
            at = plan.positions
            answer = [(at[r] * n, r * n, n) for r in range(comm.size)]
            comm.teach_planned(call, plan.compiled, kept[1],
                               (np.empty(plan.extent, np.uint8), [(at[comm.rank] * n, 0, n)], 0, None, answer))

    def again(self, known, array: np.ndarray, out):
        """A known checked call of a plain C-contiguous array (``out``: None or one that fits): the long path's
        steps without describing the call or building its plan and options again. Python's part of a small
        call is most of its CPU (an 8 B broadcast over TCP, 8 ranks on one host: 36 us described, the run 8-11)."""
        if known.collective == "broadcast":
            return self._broadcast_checked(known, array, out)
        if known.collective == "allreduce":
            return self._allreduce_checked(known, array, out)
        if known.collective == "allgather":
            return self._allgather_checked(known, array, out)
        return self._reduce_scatter_checked(known, array, out)

    def _kept(self, known, build):
        """(plan, options) of a known checked call, worked out on its first call."""
        kept = known.kept.get("checked")
        if kept is None:
            kept = known.kept["checked"] = build()
        return kept

    def _options(self, text: str, dtype=_BYTE, op=_SUM, factor: float = 1.0, checked: bool = False):
        """``checked``: the call's hash goes with its messages, compared on receipt (no agreement round)."""
        return _native.RunOptions(dtype, op, self.comm.options.timeout, text, factor=factor,
                                  check=self.comm.agreement.hash(text) if checked else 0)

    # -- the collectives ----------------------------------------------------------------------------------------

    def _barrier(self, call) -> None:
        with self.comm.lock:
            self.comm.agree(call.text, None)

    def _allreduce(self, call) -> np.ndarray:
        comm, k, a, out = self.comm, call.known, call.array, call.out
        if self.checked(call):
            return self._allreduce_checked(k, a, out)
        check = comm.options.check
        original = a.copy() if check is not None else a
        with comm.lock:
            # the plan check times the call as its caller sees it: the agreement round, staging and the run
            # (the run alone was 5 % shorter on T1's 16 MiB: the round lines the ranks up first)
            with comm.plan_check.timed(a.nbytes):
                comm.agree(k.text, call.problem)
                work, direct, source = work_buffer(a, out)
                self.allreduce(work, k.dtype, k.op, k.text, k.factor, source)
            if check is not None:
                check_against_mpi(comm.mpi_comm, comm.rank, comm.size, check, original, work, call.op, k.text)
        return deliver(work.reshape(a.shape), out, direct)

    def _allreduce_checked(self, k, a: np.ndarray, out) -> np.ndarray:
        comm = self.comm
        work = np.array(a, order="C").reshape(-1)  # (a copy: delivered once every rank has agreed)
        if work.size:
            plan, options = self._kept(k, lambda: (comm.allreduce_plan(work.size, work.itemsize),
                                                   self._options(k.text, k.dtype, k.op, k.factor, True)))
            with comm.lock, comm.plan_check.timed(a.nbytes):
                comm.execute(plan, raw(work), options)
        return deliver(work.reshape(a.shape), out, False)

    def allreduce(self, flat: np.ndarray, dtype, op, text: str, factor: float = 1.0, source=None) -> None:
        """ddl's own allreduce of a contiguous 1-D buffer, in place (or from ``source``, as many elements
        elsewhere: Executor.run), with no agreement round (the caller holds ``lock`` and has agreed)."""
        if flat.size:
            self.comm.execute(self.comm.allreduce_plan(flat.size, flat.itemsize), raw(flat),
                              self._options(text, dtype, op, factor), source=None if source is None else raw(source))

    def _broadcast(self, call) -> np.ndarray:
        comm, a, out = self.comm, call.array, call.out
        if self.checked(call):
            return self._broadcast_checked(call.known, a, out)
        result, direct = broadcast_buffer(call, comm.rank)
        data = result.reshape(-1).view(np.uint8) if not a.dtype.hasobject else np.empty(0, np.uint8)
        with comm.lock:
            comm.agree(call.text, call.problem)
            comm.execute(self._broadcast_plan_of(data.size, call.root), data, self._options(call.text))
        return deliver(result, out, direct)

    def _broadcast_checked(self, k, a: np.ndarray, out) -> np.ndarray:
        """Into a buffer of its own, delivered once the call is known to be the others'."""
        comm = self.comm
        result = np.empty(a.shape, a.dtype)
        if comm.rank == k.root:
            np.copyto(result, a)
        data = result.reshape(-1).view(np.uint8)
        plan, options = self._kept(k, lambda: (self._broadcast_plan_of(data.size, k.root),
                                               self._options(k.text, checked=True)))
        with comm.lock:
            comm.execute(plan, data, options)
        return deliver(result, out, False)

    def _broadcast_plan_of(self, nbytes: int, root: int) -> CompiledPipeline:
        return self.comm.plans.get(("broadcast", nbytes, root), lambda: self._broadcast_plan(nbytes, root))

    def _broadcast_plan(self, nbytes: int, root: int) -> CompiledPipeline:
        """A large broadcast is a pipelined chain through the subtrees (every link carries the data once each
        way); a smaller one a binomial tree per level (log2(p) rounds, the root sending every block that often)."""
        comm, o = self.comm, self.comm.options
        per_level = len(comm.grid.sizes) > 1
        if comm.size > 2 and nbytes >= CHAIN_FROM:
            return compile_blocks(lambda n: chain_program(comm.rank, comm.grid, n, root), nbytes,
                                  o.segment or CHAIN_BLOCK, o.inflight or 4,
                                  "chain per level" if per_level else "chain")
        return compile_blocks(lambda n: broadcast_program(comm.rank, comm.grid, n, root), nbytes,
                              o.segment or comm.block_bytes(nbytes), o.inflight or 2,
                              "binomial per level" if per_level else "binomial")

    def _allgather(self, call) -> np.ndarray:
        comm, a = self.comm, call.array
        if self.checked(call):
            return self._allgather_checked(call.known, a, call.out)
        rows, mine = gather_counts(call, comm.size, comm.rank)
        with comm.lock:
            # (where other ranks' rows made theirs a ride, whose round hashes the counts, the mismatch report
            # brings every rank's count, to all alike; where they made it a checked run, every rank raises in it)
            try:
                if rows.nbytes <= comm.small_bytes:
                    counted = comm.agree(call.text, call.problem, rows, _native.DType.int64, _SUM,
                                         rows=int(rows[comm.rank]))
                else:
                    counted = comm.agree(call.text, call.problem, rows=int(rows[comm.rank]))
                    if counted is None:
                        self.allreduce(rows, _native.DType.int64, _SUM, call.text)
            except MismatchError as e:
                if call.problem is not None:
                    raise
                return self.after_mismatch(e, call.text, a, call.out)
            rows = rows if counted is None else counted
            if (rows != rows[0]).any():
                self.rows_differed(call.text)
            elif call.text in self.uneven:
                self.rows_even(call.text)
            row_bytes = a.dtype.itemsize * math.prod(a.shape[1:])
            result = self.gather_rows(a, mine, rows, row_bytes, call.text, call.out)
        return gathered_into(result, call.out, comm.rank)

    def _allgather_checked(self, k, a: np.ndarray, out) -> np.ndarray:
        """Every rank's rows as many as this rank's, into a buffer of its own; the check covers the row count
        (the ride's round does the same), so where counts differ every rank raises in this run (no rank finishes
        an allgather without every rank's part), learns them all, and gathers them as agreed."""
        comm = self.comm
        mine = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        result = np.empty((a.shape[0] * comm.size,) + a.shape[1:], a.dtype)
        _, options = self._kept(k, lambda: (None, self._options(f"{k.text} {ROWS}{a.shape[0]}", checked=True)))
        try:
            with comm.lock:
                if mine.size:
                    self.parts("allgather", [mine.size] * comm.size, 1, mine, result.reshape(-1).view(np.uint8),
                               options)
                else:  # no rows: a byte each, so that a rank whose rows differ hears of it (all none: an empty answer)
                    self.parts("allgather", [1] * comm.size, 1, np.zeros(1, np.uint8), np.empty(comm.size, np.uint8),
                               options)
        except MismatchError as e:
            return self.after_mismatch(e, k.text, a, out)
        return gathered_into(result, out, comm.rank)

    def after_mismatch(self, error: MismatchError, text: str, a: np.ndarray, out) -> np.ndarray:
        """An allgather whose run raised ``error``: where it says only that row counts differ (a valid call;
        every rank raised in that run, none can finish an allgather without every part), the ranks learn every
        count and gather as agreed; otherwise it is raised."""
        if not uneven_rows(str(error), text):
            raise error
        comm = self.comm
        with comm.lock:
            rows = comm.agreement.report_mismatch(text, a.shape[0])
            self.rows_differed(text)
            mine = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            result = self.gather_rows(a, mine, rows, a.dtype.itemsize * math.prod(a.shape[1:]), text)
        return gathered_into(result, out, comm.rank)

    def rows_differed(self, text: str) -> None:
        """An allgather of ``text`` whose ranks' rows differed, as every rank learnt in the same call: its later
        calls are agreed first (the counts in the round) instead of checked on receipt or riding, where rows that
        differ again cost every rank a mismatch, a start-over and a report (T2, 64 KiB, rows differing at every
        call: 9-10 ms a call checked, 1.6-3.1 agreed)."""
        if text in self.uneven:
            self.uneven[text] = 0
            return
        if len(self.uneven) > KEPT_UNEVEN:  # (every rank meets the same texts in the same order: cleared alike)
            self.uneven.clear()
        self.uneven[text] = 0
        self.comm.forget_allgathers(text)

    def rows_even(self, text: str) -> None:
        """An agreed allgather of ``text``, once uneven, whose rows were even on every rank (as every rank learnt in
        the same round): after EVEN_AGAIN such calls in a row its uneven phase is taken to be over, and its next
        calls are checked on receipt (or ride) again, without the round."""
        self.uneven[text] += 1
        if self.uneven[text] >= EVEN_AGAIN:
            del self.uneven[text]

    def gather_rows(self, a: np.ndarray, mine: np.ndarray, rows: np.ndarray, row_bytes: int, text: str,
                    out=None) -> np.ndarray:
        """The planned allgather of ``a`` (``mine``: its bytes) once every rank's row count is known, into
        ``out`` where it is C-contiguous and of the gathered shape (``mine`` may be its own rows). The caller
        holds ``lock``."""
        shape = (int(rows.sum()),) + a.shape[1:]
        direct = out is not None and out.flags.c_contiguous and out.shape == shape
        result = out if direct else np.empty(shape, dtype=a.dtype)
        self.parts("allgather", [int(n) * row_bytes for n in rows], 1, mine, result.reshape(-1).view(np.uint8),
                   self._options(text))
        return result

    def _reduce_scatter(self, call) -> np.ndarray:
        comm, k, a, out = self.comm, call.known, call.array, call.out
        if self.checked(call):
            return self._reduce_scatter_checked(k, a, out)
        dst, direct = into(np.empty(k.shape, a.dtype), call)
        with comm.lock:
            comm.agree(k.text, call.problem)  # (slow links carry only this rank's share, reduced below them)
            self.parts("reduce_scatter", self._counts(k, a), a.dtype.itemsize,
                       raw(np.ascontiguousarray(a)).reshape(-1), raw(dst).reshape(-1), self._options(k.text, k.dtype,
                                                                                                    k.op, k.factor))
        return deliver(dst, out, direct)

    def _reduce_scatter_checked(self, k, a: np.ndarray, out) -> np.ndarray:
        """Into a part of its own, delivered once every rank has agreed."""
        dst = np.empty(k.shape, a.dtype)
        _, options = self._kept(k, lambda: (None, self._options(k.text, k.dtype, k.op, k.factor, True)))
        with self.comm.lock:
            self.parts("reduce_scatter", self._counts(k, a), a.dtype.itemsize, raw(np.ascontiguousarray(a)).reshape(-1),
                       raw(dst).reshape(-1), options)
        return deliver(dst, out, False)

    @staticmethod
    def _counts(k, a: np.ndarray) -> list[int]:
        """A reduce-scatter's parts in elements, rank by rank."""
        row = math.prod(a.shape[1:]) if a.ndim else 0
        return [n * row for n in k.rows]

    def parts(self, half: str, counts: list[int], itemsize: int, src: np.ndarray, dst: np.ndarray, options) -> None:
        """A planned reduce-scatter (``src``: the whole flat input, ``dst``: this rank's part) or allgather
        (``src``: this rank's part, ``dst``: every part in rank order) through a staged buffer (ddl.core.parts).
        The caller holds ``lock`` and has agreed."""
        comm = self.comm
        plan = comm.parts_plan(half, counts, itemsize)
        if plan.extent == 0:
            return
        if half == "allgather" and plan.in_rank_order:  # the output is the staged buffer
            plan.put(dst, comm.rank, src)
            comm.execute(plan.compiled, dst, options)
            return
        # the pieces go in and out block by block, natively, overlapping the other blocks' transfers
        comm.execute(plan.compiled, plan.staged(src.dtype, comm.scratch), options,
                     parts=(src, dst, half == "allgather", counts, plan.positions, plan.piece))

    def _alltoall(self, call) -> np.ndarray:
        """Rows ``send_rows[j]`` go to rank j (a pairwise exchange: p - 1 rounds, in each one message out and one
        in per rank; only the destination's rows travel)."""
        comm, a, send_rows, recv_rows = self.comm, call.array, call.send_rows, call.recv_rows
        with comm.lock:
            comm.agree(call.text, call.problem)
        if recv_rows is None:
            table = comm.allgather(np.asarray(send_rows, np.int64).reshape(1, -1))  # table[i][j]: i sends j
            recv_rows = table[:, comm.rank].tolist()
        recv_rows = [int(n) for n in recv_rows]
        me = comm.rank
        if len(recv_rows) != comm.size or any(n < 0 for n in recv_rows) or recv_rows[me] != send_rows[me]:
            raise DDLError(f"rank {me}: alltoall recv_rows {recv_rows} must be {comm.size} row counts, "
                           f"this rank's own {send_rows[me]} among them")
        row_bytes = a.dtype.itemsize * math.prod(a.shape[1:])
        result = np.empty((sum(recv_rows),) + a.shape[1:], a.dtype)
        sent_at = np.cumsum([0] + send_rows) * row_bytes
        got_at = np.cumsum([0] + recv_rows) * row_bytes
        mine = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        got = result.reshape(-1).view(np.uint8)
        if comm.size > 1:
            plan = self._exchange_plan(tuple(sent_at.tolist()), tuple(got_at.tolist()))
            buffer = np.empty(mine.size + got.size, np.uint8)
            buffer[:mine.size] = mine
            with comm.lock:
                comm.execute(plan, buffer, self._options(call.text))
            got[:] = buffer[mine.size:]
        got[got_at[me]:got_at[me + 1]] = mine[sent_at[me]:sent_at[me + 1]]  # its own rows never left
        return result

    def _exchange_plan(self, sent_at: tuple[int, ...], got_at: tuple[int, ...]) -> CompiledPipeline:
        """The pairwise exchange's compiled program for these byte layouts (input at 0, output after it)."""
        comm = self.comm

        def build():
            base = sent_at[-1]
            send = [(sent_at[j], sent_at[j + 1] - sent_at[j]) for j in range(comm.size)]
            recv = [(base + got_at[j], got_at[j + 1] - got_at[j]) for j in range(comm.size)]
            program = pairwise_exchange(comm.rank, send, recv)
            count = base + got_at[-1]
            return compile_blocks(lambda _: program, count, max(count, 1), 1, "pairwise exchange")

        return comm.plans.get(("alltoall", sent_at, got_at), build)


def uneven_rows(error: str, text: str) -> bool:
    """Whether a checked allgather's MismatchError names two calls of this allgather (``text``, with a row count
    or, an agreement round's, without) and none other: a valid call, gathered as agreed. (A rank that finished a
    call the others raised for, told at its next, is not: "a call this rank had finished".)"""
    said = error.partition("ranks called ddl differently: ")[2]
    if not said or "this rank had finished" in error:
        return False
    calls = [part.partition(": ")[2] for part in said.split("; ranks ")]
    calls[-1] = calls[-1].split(" (found by rank ")[0]
    return len(calls) == 2 and all(c == text or c.startswith(f"{text} {ROWS}") and
                                   c[len(text) + len(ROWS) + 1:].isdigit() for c in calls)
