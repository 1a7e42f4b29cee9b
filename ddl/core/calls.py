"""A collective call, described once: what it is, how error messages name it, and whether it is valid here.

Every collective of a communicator starts here (NCCL's enqueue makes one task of every call the same way): the
caller's arguments become a ``Call`` — the collective, its input and ``out``, its op, root or row counts, the
signature's ``Known`` (its text, hash and the host level's prepared native call, worked out once per signature:
formatting and hashing cost more than a small collective), and ``problem``, this rank's reason the call is
invalid. One set of rules checks every collective on every path, host arrays and GPU arrays alike; a path
then runs the call (ddl.core.road). A rank whose call is invalid still takes part, with its problem, so its
peers raise too instead of waiting for a message that never comes.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from .. import _native
from ..errors import DDLError
from . import devices, host
from .dtypes import native_dtype, native_dtype_name, native_op, native_op_name
from .parts import split_rows

KEPT = 1024  # signatures kept per communicator (a job making ever new shapes stays bounded)


@dataclass(eq=False)
class Known:
    """What one call signature means on this communicator, worked out the first time it is made."""
    collective: str
    text: str                    # the call, as error messages and MismatchError name it
    hash: int                    # its hash, with the plan-shaping settings (checked in every step)
    problem: str | None          # why every call of this signature is invalid here (None: valid)
    shape: tuple                 # the result's shape on this rank (allgather: as if every rank had these rows)
    dtype: object = None         # _native.DType of the reductions (None where nothing is reduced)
    op: object = None            # _native.ReduceOp
    factor: float = 1.0          # 1/size for avg
    prepared: object = None      # the host level's native call (HostCall, HostAllreduce, HostReduceScatter)
    rows: tuple = ()             # reduce_scatter: every rank's rows
    root: int = 0                # broadcast
    short: bool = False          # valid and of a dtype numpy builds in: later calls may take a short form
    kept: dict = field(default_factory=dict)  # what paths work out once for this signature (a ride, a plan)


@dataclass(eq=False)
class Call:
    """One call: its input (a numpy array, or a GPU array's view), ``out``, its signature and its problem."""
    collective: str
    array: object                # np.ndarray, the device view (ddl.gpu.arrays.DeviceArray), or None (unusable)
    out: object
    known: Known
    problem: str | None          # the signature's, or this call's own (its out, its device)
    key: tuple = ()              # the signature: where the known calls are kept
    op: str | None = None
    root: int = 0
    device: bool = False         # a GPU array
    send_rows: list | None = None  # alltoall: rows to each rank, and from each (None: learnt in the call)
    recv_rows: list | None = None
    target: object = None          # a GPU array's out, as the device sees it (viewed once, when described)

    @property
    def text(self) -> str:
        return self.known.text


class Calls:
    """One communicator's call descriptions: the rules, and the signatures met so far."""

    def __init__(self, rank: int, size: int, agreement, timeout: float, host_level: bool, alone_known: bool):
        self.rank, self.size, self._agreement, self._timeout = rank, size, agreement, timeout
        self._host = host_level        # prepared native calls for the host memory level
        self._learns = alone_known     # ... or for a job of one rank's known calls
        self._known: dict = {}

    def forget(self) -> None:
        self._known.clear()

    def _signature(self, key: tuple, make) -> Known:
        known = self._known.get(key)
        if known is None:
            if len(self._known) > KEPT:
                self._known.clear()
            known = self._known[key] = make()
        return known

    def _named(self, collective: str, text: str, problem: str | None, shape: tuple, **rest) -> Known:
        return Known(collective, text, self._agreement.hash(text), problem, shape, **rest)

    def _host_call(self, known: Known) -> Known:
        """The prepared native call of a broadcast, allgather or barrier (one rank's known calls take it too)."""
        if known.problem is None and (self._host or self._learns):
            known.prepared = _native.HostCall(known.hash, self._timeout, known.text)
        return known

    # -- the collectives -------------------------------------------------------------------------------------

    def allreduce(self, array, op, out) -> Call:
        if devices.is_device_array(array):
            return self._device("allreduce", array, out, op=op)
        a = np.asarray(array)
        key = ("allreduce", a.shape, a.dtype, op if isinstance(op, str) else repr(op))

        def make() -> Known:
            problem = code = rop = None
            try:
                code, rop = native_dtype(a.dtype), native_op(op, a.dtype)
            except DDLError as e:
                problem = str(e)
            known = self._named("allreduce", f"allreduce(shape={a.shape}, dtype={a.dtype}, op={op})", problem, a.shape,
                                dtype=code, op=rop, factor=1.0 / self.size if op == "avg" else 1.0,
                                short=problem is None and a.dtype.isbuiltin == 1)
            if self._host and problem is None and a.dtype.name != "bfloat16":  # (bfloat16: raw())
                known.prepared = _native.HostAllreduce(code, rop, known.factor, host.ONE_PHASE_BYTES, known.hash,
                                                       self._timeout, known.text)
            return known

        known = self._signature(key, make)
        return Call("allreduce", a, out, known, known.problem or out_problem(out, a.shape, a.dtype), key, op=op)

    def broadcast(self, array, root, out) -> Call:
        if devices.is_device_array(array):
            return self._device("broadcast", array, out, root=root)
        a = np.asarray(array)
        valid_root = isinstance(root, (int, np.integer)) and 0 <= root < self.size
        key = ("broadcast", a.shape, a.dtype, root if type(root) is int else repr(root))

        def make() -> Known:
            problem = unmovable(a, "broadcast")
            if not valid_root:
                problem = f"broadcast root {root!r} is not a rank of this communicator (0..{self.size - 1})"
            return self._host_call(self._named(
                "broadcast", f"broadcast(shape={a.shape}, dtype={a.dtype}, root={root})", problem, a.shape,
                root=int(root) if valid_root else 0, short=problem is None and a.dtype.isbuiltin == 1))

        known = self._signature(key, make)
        return Call("broadcast", a, out, known, known.problem or out_problem(out, a.shape, a.dtype), key,
                    root=int(root) if valid_root else 0)

    def allgather(self, array, out) -> Call:
        if devices.is_device_array(array):
            return self._device("allgather", array, out)
        a = np.asarray(array)
        key = ("allgather", a.shape, a.dtype, None)  # (keys are alike: the road looks known calls up by them)

        def make() -> Known:
            problem = unmovable(a, "allgather")
            if a.ndim == 0:
                problem = "allgather needs at least one dimension (it concatenates along the first)"
            row_bytes = a.dtype.itemsize * math.prod(a.shape[1:])
            # (the text is the same whatever the first dimension: uneven rows are a valid call)
            return self._host_call(self._named(
                "allgather", f"allgather(shape=(*, {', '.join(map(str, a.shape[1:]))}), dtype={a.dtype})", problem,
                (a.shape[0] * self.size,) + a.shape[1:] if a.ndim else (),
                short=problem is None and row_bytes > 0 and a.dtype.isbuiltin == 1))

        known = self._signature(key, make)
        return Call("allgather", a, out, known, known.problem or out_problem(out, a.shape, a.dtype, rows=True), key)

    def reduce_scatter(self, array, op, out, counts) -> Call:
        if devices.is_device_array(array):
            return self._device("reduce_scatter", array, out, op=op, counts=counts)
        a = np.asarray(array)
        split = None if counts is None else tuple(counts)
        key = ("reduce_scatter", a.shape, a.dtype, (op if isinstance(op, str) else repr(op), split))

        def make() -> Known:
            problem = "reduce_scatter needs at least one dimension (it splits along the first)" if a.ndim == 0 \
                else None
            code = rop = None
            try:
                code, rop = native_dtype(a.dtype), native_op(op, a.dtype)
            except DDLError as e:
                problem = problem or str(e)
            length = a.shape[0] if a.ndim else 0
            rows, wrong = self.rows_of(length, split)
            problem = problem or wrong
            known = self._named("reduce_scatter", f"reduce_scatter(shape={a.shape}, dtype={a.dtype}, op={op}"
                                f"{'' if split is None else f', counts={list(split)}'})", problem,
                                (rows[self.rank],) + a.shape[1:], dtype=code, op=rop,
                                factor=1.0 / self.size if op == "avg" else 1.0, rows=tuple(rows),
                                short=problem is None and a.dtype.isbuiltin == 1)
            if self._host and problem is None:
                row = math.prod(a.shape[1:])
                known.prepared = _native.HostReduceScatter(
                    [n * row for n in itertools.accumulate(rows[:-1], initial=0)], [n * row for n in rows], code,
                    rop, known.factor, known.hash, self._timeout, known.text)
            return known

        known = self._signature(key, make)
        return Call("reduce_scatter", a, out, known,
                    known.problem or out_problem(out, known.shape, a.dtype), key, op=op)

    def barrier(self) -> Call:
        known = self._signature(("barrier",), lambda: self._host_call(
            self._named("barrier", "barrier()", None, (), short=True)))
        return Call("barrier", None, None, known, None, ("barrier",))

    def alltoall(self, array, send_rows, recv_rows) -> Call:
        if devices.is_device_array(array):
            raise DDLError(f"rank {self.rank}: alltoall takes host arrays")
        a = np.asarray(array)
        problem = unmovable(a, "alltoall") or ("alltoall needs at least one dimension (it splits along the first)"
                                               if a.ndim == 0 else None)
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
        known = self._signature(("alltoall", a.shape[1:], a.dtype), lambda: self._named(
            "alltoall", f"alltoall(shape=(*, {', '.join(map(str, a.shape[1:]))}), dtype={a.dtype})", None, ()))
        return Call("alltoall", a, None, known, problem, send_rows=send_rows, recv_rows=recv_rows)

    def rows_of(self, length: int, split) -> tuple[list[int], str | None]:
        """A reduce-scatter's rows per rank (``split``, or as even as can be) and why ``split`` is wrong."""
        rows = split_rows(length, self.size)
        if split is None:
            return rows, None
        if len(split) != self.size or any(not isinstance(n, (int, np.integer)) or n < 0 for n in split) \
                or sum(split) != length:
            return rows, (f"reduce_scatter counts {list(split)} must be {self.size} row counts (one per rank, "
                          f"none negative) summing to the first dimension, {length}")
        return [int(n) for n in split], None

    def _device(self, collective: str, array, out, op: str | None = None, root: int = 0, counts=None) -> Call:
        """A GPU array's call: the same rules through the device's view of it (ddl.gpu.arrays), the same
        agreement. An unusable input still takes part, as its error. ``out`` must be a GPU array of the result's
        shape and dtype on the input's device (an allgather's first dimension is checked once every rank's rows
        are known, in the agreement round)."""
        problem, a, dst, rows, split = None, None, None, (), None if counts is None else tuple(counts)
        try:
            a = devices.view(array, f"{collective} input")
            shape = a.shape
            if collective in ("allreduce", "reduce_scatter"):
                native_dtype_name(a.dtype), native_op_name(op, a.dtype)
            if collective in ("reduce_scatter", "allgather") and not a.shape:
                raise DDLError(f"{collective} needs at least one dimension (it works along the first)")
            if collective == "reduce_scatter":
                rows, wrong = self.rows_of(a.shape[0], split)
                if wrong:
                    raise DDLError(wrong)
                shape = (rows[self.rank],) + a.shape[1:]
            if collective == "broadcast" and not (isinstance(root, (int, np.integer)) and 0 <= root < self.size):
                raise DDLError(f"broadcast root {root!r} is not a rank of this communicator (0..{self.size - 1})")
            if out is not None:
                dst = a if out is array else devices.view(out, "out") if devices.is_device_array(out) else None
                fit = dst is not None and (dst.dtype, dst.device) == (a.dtype, a.device) and (
                    dst.shape[1:] == shape[1:] if collective == "allgather" else dst.shape == shape)
                if not fit:
                    first = "*" if collective == "allgather" else ", ".join(map(str, shape[:1]))
                    raise DDLError(f"out must be a GPU array of shape ({', '.join([first, *map(str, shape[1:])])}"
                                   f"{',' if len(shape) == 1 else ''}), dtype {a.dtype} on device {a.device}")
        except DDLError as e:
            problem = str(e)
        if a is None:
            text = problem
        elif collective == "allreduce":
            text = f"allreduce(cuda, shape={a.shape}, dtype={a.dtype}, op={op})"
        elif collective == "reduce_scatter":
            text = (f"reduce_scatter(cuda, shape={a.shape}, dtype={a.dtype}, op={op}"
                    f"{'' if split is None else f', counts={list(split)}'})")
        else:
            shape = a.shape if collective == "broadcast" else f"(*, {', '.join(map(str, a.shape[1:]))})"
            where = f", root={root}" if collective == "broadcast" else ""
            text = f"{collective}(cuda, shape={shape}, dtype={a.dtype}{where})"
        known = Known(collective, text, self._agreement.hash(text), None, a.shape if a is not None else (),
                      rows=tuple(rows))
        return Call(collective, a, out, known, problem, op=op, root=int(root) if problem is None else 0,
                    device=True, target=dst if problem is None and out is not None else None)


# -- the rules for out, and where a result lands ---------------------------------------------------------------


def unmovable(a: np.ndarray, what: str) -> str | None:
    return f"cannot {what} dtype {a.dtype} (objects have no fixed size)" if a.dtype.hasobject else None


def out_problem(out, shape: tuple, dtype, rows: bool = False) -> str | None:
    """Why ``out`` cannot take a result of ``shape`` and ``dtype`` (None: it can, or there is none). ``rows``:
    an allgather's, whose first dimension is known only once every rank's rows are."""
    if out is None:
        return None
    if not isinstance(out, np.ndarray):
        return f"out must be a numpy array, not {type(out).__name__}"
    if not out.flags.writeable:
        return "out is read-only"
    if rows and (out.dtype != dtype or out.shape[1:] != shape[1:]):
        return f"out has shape {out.shape} and dtype {out.dtype}; the gathered rows are (*, {shape[1:]}), {dtype}"
    if not rows and (out.shape != shape or out.dtype != dtype):
        return f"out has shape {out.shape} and dtype {out.dtype}; the input has {shape}, {dtype}"
    return None


def fits(out, shape: tuple, dtype) -> bool:
    """Whether a short form may write its result of ``shape`` and ``dtype`` to ``out``: a plain writable
    C-contiguous array of both; any other out takes the described call, with its checks and errors."""
    return type(out) is np.ndarray and out.shape == shape and out.dtype == dtype and out.flags.c_contiguous \
        and out.flags.writeable


def into(result: np.ndarray, call: Call) -> tuple[np.ndarray, bool]:
    """(where a path writes the call's result: its out when that is C-contiguous, else ``result``; whether that
    is out). A refused call's out is never written: it may be why the call was refused."""
    out = call.out
    if out is not None and call.problem is None and out.flags.c_contiguous:
        return out, True
    return result, False


def broadcast_buffer(call: Call, rank: int) -> tuple[np.ndarray, bool]:
    """(where a broadcast's result lands, whether that is out), root's data already in it: only root's data
    travels, the others just receive."""
    a = call.array
    result, direct = into(np.empty(a.shape, a.dtype), call)
    if rank == call.root and result is not a:
        copy_in(result, a)
    return result, direct


def gather_counts(call: Call, size: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """An allgather's (every rank's row count, zeros but this rank's; this rank's bytes, none when refused)."""
    a = call.array
    rows = np.zeros(size, dtype=np.int64)
    rows[rank] = a.shape[0] if a.ndim else 0
    mine = np.ascontiguousarray(a).reshape(-1).view(np.uint8) if call.problem is None else np.empty(0, np.uint8)
    return rows, mine


def copy_in(dst: np.ndarray, a: np.ndarray) -> None:
    """``a`` into ``dst``, through a temporary where the two may overlap."""
    np.copyto(dst, a.copy() if np.may_share_memory(dst, a) else a)


def deliver(result: np.ndarray, out, in_out: bool) -> np.ndarray:
    """What the call returns: ``result``, or ``out`` (filled from result unless result is out's memory)."""
    if out is None:
        return result
    if not in_out:
        np.copyto(out, result)
    return out


def answer_into(answer: np.ndarray, out) -> np.ndarray:
    """An answer in a reused buffer, copied out: into ``out``, or a new array."""
    if out is None:
        return answer.copy()
    np.copyto(out, answer)
    return out


def gathered_into(result: np.ndarray, out, rank: int) -> np.ndarray:
    """allgather's answer: ``result``, or ``out`` filled from it (where the rows were uneven, or out was not the
    shape of equal rows)."""
    if out is None or result is out:
        return result
    if result.shape != out.shape:
        raise DDLError(f"rank {rank}: out has shape {out.shape}; the gathered rows are {result.shape}")
    np.copyto(out, result)
    return out


def work_buffer(a: np.ndarray, out) -> tuple[np.ndarray, bool, np.ndarray | None]:
    """(the flat buffer a reduction runs on in place, whether it is out's memory, the input the run copies into
    it block by block as each block starts, or None where the buffer holds the input already): out itself when
    it can be, else a new buffer. Where ``a`` is contiguous and apart from that buffer, the run copies it in
    (RunOptions.source): a copy up front delayed the first block (T2, 16 MiB out of place: 285-296 ms against
    274-280 in place)."""
    if out is not None and out.flags.c_contiguous:
        if out is a:
            return out.reshape(-1), True, None
        if a.flags.c_contiguous and not np.may_share_memory(out, a):
            return out.reshape(-1), True, a.reshape(-1)
        copy_in(out, a)
        return out.reshape(-1), True, None
    if a.flags.c_contiguous:
        return np.empty(a.size, a.dtype), False, a.reshape(-1)
    return np.array(a, order="C").reshape(-1), False, None
