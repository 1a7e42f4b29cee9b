"""The host memory path: ranks that share one host collect through one shared-memory segment (ddl.core.host).

Serves allreduce, broadcast, allgather, reduce_scatter and barrier of valid host arrays when the communicator
has the host level (every rank on one host, agreed at creation). Chosen before the rides and the planned
executor because no message is on its data path: each step checks every rank's call hash in the segment, so a
mismatch raises on every rank at no extra round. An allreduce under -check takes the planned path instead (the
check compares with MPI's allreduce there); an allgather of zero-byte rows has nothing to put in a slot.
Known calls repeat in one native call each (ddl._native.ShortCalls), or through ``again`` where that declines.
"""
from __future__ import annotations

import math

import numpy as np

from .. import host
from ..calls import broadcast_buffer, deliver, gathered_into, into
from ..dtypes import raw


class HostMemory:
    name = "host memory"
    serves = frozenset(("allreduce", "broadcast", "allgather", "reduce_scatter", "barrier"))
    native = True  # its known calls are found and run natively (ddl._native.ShortCalls) ...
    repeats = frozenset(("allreduce", "broadcast", "allgather", "reduce_scatter"))  # ... or by ``again``

    def __init__(self, comm):
        self.comm = comm

    def takes(self, call) -> str | None:
        comm = self.comm
        if comm.host_memory is None or call.problem or call.device:
            return None
        if call.collective == "allreduce" and comm.options.check is not None:
            return None
        if call.collective == "allgather" and call.array.dtype.itemsize * math.prod(call.array.shape[1:]) == 0:
            return None
        return f"the {comm.size} ranks share one host: one shared-memory segment, no messages"

    def run(self, call):
        comm, a, out = self.comm, call.array, call.out
        native, text = comm.host_memory.native, call.text
        if call.collective == "barrier":
            with comm.lock:
                comm.on_host(native.barrier, call.known.prepared, text=text)
            return None
        if call.collective == "allgather":
            gathered = call.known.shape
            direct = out is not None and out.flags.c_contiguous and out.shape == gathered
            dst = raw(out if direct else np.empty(gathered, a.dtype))
            with comm.lock:
                result = self.allgather(raw(np.ascontiguousarray(a)), dst, out if direct else None, call.known)
            # (a raw view of bfloat16 is seen as such again; any other result is out itself where it landed there)
            return gathered_into(result if result.dtype == a.dtype else result.view(a.dtype), out, comm.rank)
        if call.collective == "broadcast":
            dst, direct = broadcast_buffer(call, comm.rank)
            with comm.lock:
                comm.on_host(native.broadcast, raw(dst), call.root, call.known.hash, comm.options.timeout, text,
                             text=text)
            return deliver(dst, out, direct)
        dst, direct = into(np.empty(call.known.shape, a.dtype), call)
        with comm.lock:
            if call.collective == "allreduce":  # (an input that overlaps out is copied first)
                src = a if a.flags.c_contiguous and (out is None or out is a or not np.may_share_memory(a, out)) \
                    else np.ascontiguousarray(a).copy()
                k = call.known
                comm.on_host(native.allreduce, raw(src), raw(dst), k.dtype, k.op, k.factor, host.ONE_PHASE_BYTES,
                             k.hash, comm.options.timeout, text, text=text)
            else:  # (the native call copies an overlapping input first)
                comm.on_host(native.reduce_scatter, raw(np.ascontiguousarray(a)), raw(dst), call.known.prepared,
                             text=text)
        return deliver(dst, out, direct)

    def again(self, known, array: np.ndarray, out) -> np.ndarray:
        """A known call of a plain C-contiguous array, where the native lookup declined it (no lock: the segment
        takes one call at a time, and nothing else of this communicator runs meanwhile)."""
        comm, native, collective = self.comm, self.comm.host_memory.native, known.collective
        dst = np.empty(known.shape, array.dtype) if out is None else out
        if collective == "allgather":
            return gathered_into(self.allgather(array, dst, out, known), out, comm.rank)
        if collective == "allreduce":  # (an out that overlaps the input: the native call copies the input first)
            comm.on_host(native.allreduce, array, dst, known.prepared, text=known.text)
        elif collective == "reduce_scatter":
            comm.on_host(native.reduce_scatter, array, dst, known.prepared, text=known.text)
        elif dst is array:  # a broadcast in place: the usual form
            comm.on_host(native.broadcast, array, known.root, known.prepared, text=known.text)
        else:  # (root reads array and copies it to dst; the others write dst only)
            comm.on_host(native.broadcast, array, dst, known.root, known.prepared, text=known.text)
        return dst

    def allgather(self, src: np.ndarray, dst: np.ndarray, out, known) -> np.ndarray:
        """One step learns every rank's length and, when all are equal (the usual case), already carries the
        first piece into ``dst``; uneven rows take a second call with their layout, into ``out`` where it has
        their shape."""
        native = self.comm.host_memory.native
        lengths = self.comm.on_host(native.allgather_equal, src, dst, known.prepared, text=known.text)
        return dst if lengths is True else self.uneven(src, lengths, out, known.text, known.hash)

    def uneven(self, src: np.ndarray, lengths: list[int], out, text: str, h: int) -> np.ndarray:
        """The second call of an allgather whose rows were uneven: every rank's ``lengths`` in bytes are known,
        the rows land in ``out`` where it has their shape."""
        comm = self.comm
        row_bytes = src.dtype.itemsize * math.prod(src.shape[1:])
        shape = (sum(n // row_bytes for n in lengths),) + src.shape[1:]
        direct = out is not None and out.flags.c_contiguous and out.shape == shape
        result = raw(out) if direct else np.empty(shape, src.dtype)
        offsets = np.cumsum([0] + lengths[:-1]).tolist()
        comm.on_host(comm.host_memory.native.allgather, src.reshape(-1).view(np.uint8),
                     result.reshape(-1).view(np.uint8), offsets, lengths, h, comm.options.timeout, text, text=text)
        return result

