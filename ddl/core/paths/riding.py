"""The riding path: a small call rides in the agreement round itself (ddl.core.agreement), one latency-optimal
exchange for the whole collective.

Serves, off the host memory level, allreduces whose payload fits the round where recursive doubling is what
the plan would do anyway (on a slow uplink a 64 KiB payload is better scattered through the hierarchy: the cost
model decides, once per size), broadcasts, allgathers and reduce-scatters whose round carries as few bytes (a
broadcast: root's bytes, zeros elsewhere, summed; an allgather: every rank's part, each sent once; a
reduce-scatter: the whole, reduced to each host's first rank and halved between them), and barriers (a round
with no payload). Chosen after the host memory level (where rides would cost a message) and before the planned
executor (which pays an agreement round of its own before its plan). A refused broadcast or allgather of a
size that rides runs the same round with its problem, so every rank raises there. Known calls repeat through
their Ride (ddl.core.rides).
"""
from __future__ import annotations

import math
import weakref

import numpy as np

from ... import _native
from ...errors import MismatchError
from ...planner import Shape, agreement_phases, pipelined, predict, predict_allgather
from .. import rides
from ..agreement import ROWS
from ..calls import answer_into, broadcast_buffer, deliver, gather_counts, gathered_into, into
from ..dtypes import raw

_WORDS = _native.DType.int64
_BYTES = _native.DType.uint8
_SUM = _native.ReduceOp.sum
_KEPT = 1024
PLANNED_ALLGATHER_ROUNDS = 2.5  # a checked allgather's floor, in agreement rounds (Riding._fused)


class Riding:
    name = "riding"
    serves = frozenset(("allreduce", "broadcast", "allgather", "reduce_scatter", "barrier"))
    repeats = frozenset(("allreduce", "broadcast", "allgather", "reduce_scatter"))  # known calls: their round again

    def __init__(self, comm, planned):
        self.comm, self.planned = comm, planned
        self.agreement = comm.agreement
        self._small = comm.small_bytes
        self._riding: dict[tuple[int, str], bool] = {}  # (payload bytes, its shape) -> whether they ride
        self._ranks: np.ndarray | None | bool = False  # where each rank's part lies in a round (False: not yet known)

    def takes(self, call) -> str | None:
        comm, collective = self.comm, call.collective
        if comm.size == 1 or call.device:
            return None
        if collective == "barrier":
            return None if comm.host_memory is not None else "the whole call is the agreement round"
        if collective == "allreduce":
            if call.problem or comm.options.check is not None or not self.rides(call.array.nbytes):
                return None
        elif collective == "allgather" and call.known.text in self.planned.uneven:  # (its counts go first)
            return None
        elif collective == "broadcast" and self.planned.checked(call):  # (its tree, checked on receipt, lets
            return None                                                 # the root go on: shorter than the round)
        elif collective == "reduce_scatter":
            if comm.host_memory is not None or call.problem or not self.rides(call.array.nbytes, "halving"):
                return None
        elif not self.rides(self.payload(call), "gathering" if collective == "allgather" and call.known.short
                            else "whole"):
            return None
        return f"{self._small} bytes or fewer ride in the agreement round: one latency-optimal exchange"

    def payload(self, call) -> int:
        """The bytes a broadcast's or an allgather's round carries (an invalid call's: none of its own)."""
        a = call.array
        if call.collective == "broadcast":
            return 0 if a.dtype.hasobject else a.nbytes
        if call.problem is None and call.known.short:  # a known call's round gathers the parts alone
            return self.comm.size * a.nbytes
        # (as the round of a call that is not known sums them: the counts and every part)
        return 8 * self.comm.size + self.comm.size * (a.nbytes if call.problem is None else 0)

    def rides(self, nbytes: int, payload: str = "whole") -> bool:
        """Whether ``nbytes`` ride in the agreement round (``payload``: "whole", "halving" a reduce-scatter's,
        "gathering" a known allgather's, each against its planned path), decided once per size (the model's
        walk over the tree costs more than a small call on a busy host)."""
        rides = self._riding.get((nbytes, payload))
        if rides is None:
            if len(self._riding) > _KEPT:
                self._riding.clear()
            rides = self._riding[(nbytes, payload)] = self._fused(nbytes, payload)
        return rides

    def _fused(self, nbytes: int, payload: str) -> bool:
        comm = self.comm
        if nbytes > self._small or comm.options.algo not in ("auto", "recursive_doubling"):
            return False
        plan = comm.plan_for(nbytes)
        if len(comm.levels) == 1 or plan.shape == "latency":
            return True
        # The planned path pays a separate agreement round (no payload) before its own rounds. Both priced as
        # the round runs: across hosts once per host where it does (the whole payload through each host's
        # first rank, not through every rank's NIC share at once: priced that way, an allgather of 1 KiB a
        # rank on T1 took the planned path at 650 us where riding takes 170-190). A reduce-scatter's round halves
        # the vector, a known allgather's doubles the parts; a reduce-scatter's planned path runs one half of
        # the allreduce's plan (about half its time), an allgather's gathers per level (its own prediction).
        # Over ddl's TCP a known allgather's planned path is checked on receipt, with no round, but its messages
        # per level (every rank to every peer of a level) cost CPU on shared cores that no phase prices: T1/T2,
        # one job each, the checked plan took 314-340 us from 8 B to 8 KiB (the round priced 130, the plan
        # 69-226), the ride 263-332; from 32 KiB the plan won (T1 387 against 466, T2 410 against 571). So it is
        # priced no lower than PLANNED_ALLGATHER_ROUNDS rounds.
        shape = Shape.of(comm.tree)
        groups = self.agreement.groups
        by_host = groups is not None and len(groups) == shape.groups[0] and \
            {len(g) for g in groups} == set(shape.sizes[0])
        fused = pipelined(agreement_phases(shape, comm.levels, nbytes, by_host, payload), 1)
        agreement = pipelined(agreement_phases(shape, comm.levels, 0, by_host), 1)
        if payload != "gathering":
            return fused <= predict(plan, nbytes)[0] / (1 if payload == "whole" else 2) + agreement
        planned = predict_allgather(plan, nbytes, shape)
        if comm.over_tcp:
            return fused <= max(planned, PLANNED_ALLGATHER_ROUNDS * agreement)
        return fused <= planned + agreement

    def run(self, call):
        return getattr(self, "_" + call.collective)(call)

    def repeatable(self, call) -> bool:
        """Whether later calls of this signature may take ``again``: not an allgather whose rows have differed
        (Planned.rows_differed: its calls go to the planned path, agreed first)."""
        return call.collective != "allgather" or call.known.text not in self.planned.uneven

    def teach(self, call) -> None:
        """A known allreduce's, allgather's or reduce-scatter's round is run natively from its next call on
        (ddl._native.ShortCalls; an allgather's where the round's order of ranks is rank order)."""
        k, collective = call.known, call.collective
        if collective == "allreduce" and "fused" in k.kept:
            self.comm.teach_planned(call, *k.kept["fused"])
            return
        ride = k.kept.get("ride")
        if ride is None or collective not in ("allgather", "reduce_scatter") or not self.repeatable(call) or \
                collective == "allgather" and self._rank_order() is not None or \
                collective == "reduce_scatter" and call.key[3][1] is not None:  # (row counts given: not native)
            return
        a, buffer = call.array, ride.buffer
        at = lambda view: view.__array_interface__["data"][0] - buffer.__array_interface__["data"][0]  # noqa: E731
        if collective == "allgather":
            pieces, disagreed = [(at(ride.mine), 0, a.nbytes)], _uneven_rows(self, ride)
        else:
            size = a.dtype.itemsize
            pieces = [(b * size, i * size, n * size) for b, i, n in ride.runs] or [(0, 0, a.nbytes)]
            disagreed = None  # (a reduce-scatter's round that does not agree is a mismatch)
        self.comm.teach_planned(call, ride.plan, ride.options, (buffer, pieces, at(ride.answer), disagreed))

    def again(self, known, array: np.ndarray, out):
        if known.collective == "allreduce":
            return self._reduce(known, array, np.empty(array.shape, array.dtype) if out is None else out)
        ride = known.kept["ride"]
        if known.collective == "broadcast":
            return self._broadcast_ride(ride, array, np.empty(array.shape, array.dtype) if out is None else out)
        if known.collective == "allgather":
            return gathered_into(self._allgather_ride(ride, array, out), out, self.comm.rank)
        return self._reduce_scatter_ride(ride, array, out)

    # -- the collectives ----------------------------------------------------------------------------------------

    def _barrier(self, call) -> None:
        with self.comm.lock:
            self.agreement.agree(call.text, None)

    def _allreduce(self, call) -> np.ndarray:
        a = call.array
        dst, direct = into(np.empty(a.shape, a.dtype), call)
        self._reduce(call.known, a if a.flags.c_contiguous else np.ascontiguousarray(a), dst)
        return deliver(dst, call.out, direct)

    def _reduce(self, known, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """The payload reduced in the round (the executor copies ``src`` in, ``dst`` may be ``src``)."""
        fused = known.kept.get("fused")
        if fused is None:
            fused = known.kept["fused"] = (self.agreement.plan(src.size), self.agreement.options(
                known.text, known.dtype, known.op, factor=known.factor))
        with self.comm.lock:
            if not self.comm.execute(fused[0], raw(src), fused[1], raw(dst)):
                self.agreement.report_mismatch(known.text)
        return dst

    def _broadcast(self, call) -> np.ndarray:
        comm, k, a, out = self.comm, call.known, call.array, call.out
        result, direct = broadcast_buffer(call, comm.rank)
        if call.problem is None and k.short:  # root's bytes, zeros elsewhere, summed
            ride = self._ride(k, lambda: rides.broadcast(
                k.text, self.agreement.plan(-(-a.nbytes // 8)), self.agreement.options(k.text, _WORDS, _SUM),
                a.shape, a.dtype, comm.rank == call.root))
            return deliver(self._broadcast_ride(ride, a, result), out, direct)
        # (a refused call, or a dtype numpy does not build in: the same round, which raises on every refusal)
        data = result.reshape(-1).view(np.uint8) if not a.dtype.hasobject else np.empty(0, np.uint8)
        words, payload = rides.words(data.size)
        if comm.rank == call.root:
            payload[...] = data
        with comm.lock:
            self.agreement.agree(k.text, call.problem, words, _WORDS, _SUM)
        data[...] = payload
        return deliver(result, out, direct)

    def _allgather(self, call) -> np.ndarray:
        comm, k, a, out = self.comm, call.known, call.array, call.out
        if call.problem is None and k.short:
            agreement = self.agreement
            ride = self._ride(k, lambda: rides.allgather(
                k.text, agreement.gather_plan(a.nbytes), agreement.options(f"{k.text} {ROWS}{a.shape[0]}", _BYTES,
                                                                           _SUM),
                a.shape, a.dtype, agreement.order.index(comm.rank), comm.size))
            return gathered_into(self._allgather_ride(ride, np.ascontiguousarray(a), out), out, comm.rank)
        # One round: the row counts and every rank's bytes in its slot (zeros elsewhere, summed as bytes), sized as
        # if all ranks had this rank's rows; uneven rows then take their planned allgather.
        rows, mine = gather_counts(call, comm.size, comm.rank)
        words, work = rides.words(rows.nbytes + comm.size * mine.size)
        work[:rows.nbytes] = rows.view(np.uint8)
        at = rows.nbytes + comm.rank * mine.size
        work[at:at + mine.size] = mine
        with comm.lock:
            counted = self.agreement.agree(k.text, call.problem, words, _WORDS, _SUM, rows=int(rows[comm.rank]))
            rows = work[:rows.nbytes].view(np.int64) if counted is None else counted
            if counted is None and (rows == rows[comm.rank]).all():
                return gathered_into(work[rows.nbytes:].view(a.dtype).reshape(k.shape), out, comm.rank)
            row_bytes = a.dtype.itemsize * math.prod(a.shape[1:])
            return gathered_into(self.planned.gather_rows(a, mine, rows, row_bytes, k.text), out, comm.rank)

    def _reduce_scatter(self, call) -> np.ndarray:
        comm, k, a, out = self.comm, call.known, call.array, call.out
        row = math.prod(a.shape[1:])

        def make():
            plan, layout = self.agreement.scatter_plan(tuple(n * row for n in k.rows))
            return rides.reduce_scatter(k.text, plan, self.agreement.options(k.text, k.dtype, k.op, factor=k.factor),
                                        a.shape, a.dtype, layout, k.rows[comm.rank], comm.rank)
        # (a dtype numpy does not build in, bfloat16, is not kept: its Ride is made per call)
        ride = self._ride(k, make) if k.short else make()
        direct = out is not None and out.flags.c_contiguous
        return deliver(self._reduce_scatter_ride(ride, raw(np.ascontiguousarray(a)), out if direct else None),
                       out, direct)

    # -- a Ride: the round of a known call, worked out once --------------------------------------------------------

    @staticmethod
    def _ride(known, make) -> rides.Ride:
        ride = known.kept.get("ride")
        if ride is None:
            ride = known.kept["ride"] = make()
        return ride

    def _run_ride(self, ride: rides.Ride, src: np.ndarray | None = None) -> None:
        """The round (the caller holds ``lock``): on the buffer as filled, or on a copy of ``src`` into it (as the
        executor takes it: ddl.core.dtypes.raw)."""
        agreed = self.comm.execute(ride.plan, ride.buffer, ride.options) if src is None else \
            self.comm.execute(ride.plan, src, ride.options, ride.buffer)
        if not agreed:
            self.agreement.report_mismatch(ride.text)

    def _broadcast_ride(self, ride: rides.Ride, a: np.ndarray, result: np.ndarray) -> np.ndarray:
        with self.comm.lock:
            ride.buffer.fill(0)
            if ride.mine is not None:
                np.copyto(ride.mine, a)
            self._run_ride(ride)
            np.copyto(result, ride.answer)
        return result

    def _allgather_ride(self, ride: rides.Ride, a: np.ndarray, out) -> np.ndarray:
        """The parts gathered in the round, into ``out`` where it is C-contiguous and of the gathered shape."""
        comm, answer = self.comm, ride.answer
        gathered = (answer.shape[0] * answer.shape[1],) + answer.shape[2:]
        result = out if out is not None and out.flags.c_contiguous and out.shape == gathered else \
            np.empty(gathered, a.dtype)
        with comm.lock:
            np.copyto(ride.mine, a)
            order = self._rank_order()
            try:
                if order is None:  # the round's order is rank order: the executor writes the answer, if agreed
                    agreed = comm.execute(ride.plan, ride.buffer, ride.options, raw(result))
                else:
                    agreed = comm.execute(ride.plan, ride.buffer, ride.options)
                    if agreed:
                        np.copyto(result.reshape(answer.shape), answer[order])
            except MismatchError as e:  # (others' rows made theirs a run checked on receipt: Planned.checked)
                return self.planned.after_mismatch(e, ride.text, a, out)
            if agreed:
                return result
            return self._disagreed(ride, a, out)

    def _disagreed(self, ride: rides.Ride, a: np.ndarray, out) -> np.ndarray:
        """An allgather's round that did not agree: ranks called differently (raised here), or rows were uneven,
        whose planned allgather follows now that every rank's count is known."""
        with self.comm.lock:
            rows = self.agreement.report_mismatch(ride.text, a.shape[0])
            self.planned.rows_differed(ride.text)
            mine = a.reshape(-1).view(np.uint8)
            return self.planned.gather_rows(a, mine, rows, a.dtype.itemsize * math.prod(a.shape[1:]), ride.text, out)

    def _rank_order(self) -> np.ndarray | None:
        """Where each rank's part lies in the round's order of ranks (None: in rank order)."""
        if self._ranks is False:
            order = self.agreement.order
            self._ranks = None if order == sorted(order) else np.argsort(order)
        return self._ranks

    def _reduce_scatter_ride(self, ride: rides.Ride, a: np.ndarray, out) -> np.ndarray:
        with self.comm.lock:
            if ride.runs:  # the round's layout: the pieces go in, the round runs on them
                flat, buffer = a.reshape(-1), ride.buffer
                for at, start, n in ride.runs:
                    buffer[at:at + n] = flat[start:start + n]
                self._run_ride(ride)
            else:
                self._run_ride(ride, a)
            return answer_into(ride.answer, out)


def _uneven_rows(riding: Riding, ride: rides.Ride):
    """The native allgather's answer where its round did not agree (Riding._disagreed), holding the path weakly:
    the communicator's native table keeps it."""
    ref = weakref.ref(riding)

    def disagreed(a: np.ndarray, out) -> np.ndarray:
        return gathered_into(ref()._disagreed(ride, a, out), out, ref().comm.rank)

    return disagreed
