"""A group of ranks and the collectives ddl runs on it.

Every collective starts with an *agreement round*: a recursive-doubling exchange whose messages carry a hash
of each rank's call (collective, shape, dtype, op, root, and the settings that shape the plan). Each receive
merges the hashes by max and -min, so afterwards every rank knows whether all ranks made the same call. When
they did not, every rank learns what each rank called and raises MismatchError; nothing is reduced. Small
payloads ride in the agreement round itself (one latency-optimal exchange, nothing extra); large ones follow
in a pipelined plan chosen by the cost model. A rank whose arguments are invalid still takes part, with its
error as its call, so its peers raise too instead of waiting for a message that never comes.
"""
from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from . import _native, discover, hierarchical, planner
from . import topology as topo
from .algorithms import ALLREDUCE, binomial_broadcast, recursive_doubling_allreduce, ring_allgather
from .config import get as setting
from .device_arrays import host_dtype, is_device_array
from .dtypes import FLOATING, native_dtype, native_dtype_name, native_op, native_op_name, raw
from .errors import DDLError, MismatchError
from .explain import Explanation, explain
from .options import Options, parse
from .plan import CompiledPlan, compile_blocks, native_program

# Bytes of payload every agreement receive accepts, whatever a rank's own call: a rank with a different call
# can then never overflow a receive. DDL_SMALL_BYTES is capped here.
AGREEMENT_CAPACITY = 65536
REPORT_BYTES = 512  # per rank, when ranks disagree and tell each other what they called
PLAN_CACHE_SIZE = 256
_BYTE = _native.DType.uint8


def _dims_follow_hosts(dims: tuple[int, ...], hosts: list[str]) -> bool:
    """True when the innermost tier of ``dims`` is exactly the ranks of each host (packed host by host)."""
    per = dims[0]
    groups = [hosts[i:i + per] for i in range(0, len(hosts), per)]
    return all(len(set(g)) == 1 for g in groups) and len({g[0] for g in groups}) == len(groups)


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def default_block_bytes(nbytes: int) -> int:
    """Pipeline block size: blocks large enough that per-message costs stay small (at least 1 MiB: smaller
    ones measured slower on shared memory), and at least 4 blocks for buffers from 4 MiB, so that reducing
    one block overlaps moving the next."""
    return min(4 << 20, max(1 << 20, nbytes // 4))


@dataclass(frozen=True)
class _Signature:
    text: str                 # the call, as error messages show it
    dtype: object             # _native.DType, None if invalid
    op: object                # _native.ReduceOp, None if invalid
    problem: str | None       # why the call is invalid on this rank
    hash: int
    plan: CompiledPlan        # the agreement round's plan (with the payload when fused)
    fused: bool               # the payload rides in the agreement round
    factor: float             # 1/size for avg


class Communicator:
    """Runs ddl's collectives among the ranks of one executor (MPI or loopback) or alone (size 1)."""

    def __init__(self, executor, rank: int, size: int, options: Options | None = None, mpi_comm=None,
                 local: tuple[int, int, int] | None = None, hierarchy=None, topology=None,
                 reports: list[dict] | None = None):
        self.options = options or parse()
        self._executor = executor
        self._mpi = mpi_comm  # kept alive for the executor; also the reference for -check
        self.rank, self.size = rank, size
        self.local_rank, self.local_size, self.num_hosts = local or (rank, size, 1)
        self._plans: OrderedDict = OrderedDict()
        self._hashes: dict = {}
        self._signatures: dict = {}
        self._lock = threading.Lock()
        self._calls, self._call_seconds = 0, 0.0
        self._small = min(self.options.small_bytes, AGREEMENT_CAPACITY)
        if self.options.mode is not None:
            self.options.mode.check_size(size)
        self.hosts = [r["host"] for r in reports] if reports else None  # each rank's host, in rank order
        self._device_paths: dict = {}  # device id -> ddl.gpu.DevicePath, made on the first GPU collective
        self.topology: topo.Topology | None = None
        self._forced: planner.Plan | None = None
        try:
            self.tree, self.levels = self._choose_tree(hierarchy, topology, reports)
        except DDLError as e:
            raise type(e)(str(e) if str(e).startswith("rank ") else f"rank {rank}: {e}") from None
        self.hierarchy = self.tree if hierarchical.depth(self.tree) >= 2 else None
        self._algos = tuple(self.options.algo.split(","))
        self.plan_for(1)  # a forced algorithm list that does not fit the tree fails here, not mid-training
        # Settings that shape plans must match across ranks: they go into every call's hash.
        o = self.options
        shape = f"{hierarchical.describe(self.tree)} {[lv.to_dict() for lv in self.levels]} {self._forced}"
        self._settings = (f"algo={o.algo} segment={o.segment} inflight={o.inflight} small={self._small} "
                          f"tree={_hash64(shape) & 0xffffffff:08x}")

    def _choose_tree(self, given, topology, reports) -> tuple[list, tuple]:
        """The tree large allreduces follow and the cost of its levels, from the first that applies: a plan
        file (-plan, DDL_PLAN); a tree given to init; a topology (init argument, -topology, DDL_TOPOLOGY)
        checked against the hosts MPI sees; what discovery found, unless IBM's -mode dims group the ranks
        otherwise than their hosts do; the -mode dims; else one flat level."""
        network = setting("DDL_NETWORK")
        hosts = [r["host"] for r in reports] if reports else None
        if self.options.plan:
            self._forced = _load_plan(self.options.plan)
            tree = self._checked(self._forced.tree, f"plan file {self.options.plan!r}")
            return tree, self._forced.levels
        if given is not None:
            tree = self._checked(given, "the hierarchy")
            return tree, planner.default_levels(tree, link=network)
        source = topology if topology is not None else self.options.topology
        dims = self.options.mode.dims if self.options.mode is not None else ()
        if source is not None:
            self.topology = topo.load(source)
        elif reports and (len(set(hosts)) > 1 or len({r["numa"] for r in reports} - {None}) > 1):
            # several hosts, or one host's ranks on several sockets. Dims that group ranks by host as MPI
            # placed them (ddlrun's) say nothing discovery does not: its sockets, GPUs and switches are kept.
            if not dims or _dims_follow_hosts(dims, hosts):
                self.topology = discover.build(reports)
        if self.topology is None and dims:
            tree = self._checked(hierarchical.from_dims(dims), "-mode")
            return tree, planner.default_levels(tree, ("gpu", "node", "rack", "aisle"), network)
        if self.topology is not None:
            tree, levels = self.topology.hierarchy(self.topology.place(hosts, self.size))
            return self._checked(tree, f"topology {self.topology.name!r}"), tuple(levels) or \
                planner.default_levels([0])
        tree = list(range(self.size))
        return tree, planner.default_levels(tree)

    def _checked(self, tree, what: str) -> list:
        try:
            tree = hierarchical.normalize(tree)
        except ValueError as e:
            raise DDLError(f"rank {self.rank}: bad hierarchy from {what}: {e}") from None
        n = len(hierarchical.leaves(tree))
        if n != self.size:
            raise DDLError(f"rank {self.rank}: {what} holds {n} ranks, the communicator {self.size}")
        return tree

    # -- construction -----------------------------------------------------------------------------------

    @classmethod
    def from_mpi(cls, comm, options: Options | None = None, hierarchy=None, topology=None) -> "Communicator":
        """ddl on an mpi4py communicator; it works on a private duplicate so its messages never meet yours.
        At creation the ranks exchange what they see of their machine (ddl.discover); large allreduces then
        follow the topology found, or the one given (see _choose_tree)."""
        from mpi4py import MPI

        dup = comm.Dup()
        local = dup.Split_type(MPI.COMM_TYPE_SHARED)
        first = local.bcast(dup.rank)  # each host named by its processor name, made unique by its first rank
        name = local.bcast(MPI.Get_processor_name())
        gpus = local.bcast(discover.nvml_gpus() if local.rank == 0 else None)
        reports = dup.allgather({"host": name, "first": first, "numa": discover.numa_node(), "gpus": gpus})
        names = {(r["host"], r["first"]) for r in reports}
        if len({h for h, _ in names}) != len(names):  # two shared-memory groups under one name
            for r in reports:
                r["host"] = f"{r['host']}#{r['first']}"
        where = (local.rank, local.size, len(names))
        local.Free()
        executor = _native.Executor.mpi(dup) if dup.size > 1 else None
        return cls(executor, dup.rank, dup.size, options or parse(), mpi_comm=dup, local=where,
                   hierarchy=hierarchy, topology=topology, reports=reports)

    @classmethod
    def loopback(cls, hub: "_native.LoopbackHub", rank: int, options: Options | None = None,
                 hierarchy=None, topology=None) -> "Communicator":
        """One rank of an in-process group (ranks are threads); for tests without MPI."""
        return cls(_native.Executor.loopback(hub, rank), rank, hub.size, options, hierarchy=hierarchy,
                   topology=topology)

    def close(self) -> None:
        """Releases the communicator; any later collective on it raises DDLError. After a transport failure
        the MPI duplicate is kept, never freed: messages of the failed call may still be queued under its
        context id, and MPI would give that id to the next communicator, where they would match."""
        broken = self._executor is not None and not isinstance(self._executor, _Closed) and self._executor.broken
        for path in self._device_paths.values():
            path.close()
        self._device_paths.clear()
        self._executor = _Closed()
        if self._mpi is not None:
            if broken:
                _KEPT_AFTER_FAILURE.append(self._mpi)
            else:
                self._mpi.Free()
            self._mpi = None

    # -- the agreement round ----------------------------------------------------------------------------

    def _call_hash(self, call: str) -> int:
        h = self._hashes.get(call)
        if h is None:
            if len(self._hashes) > 4 * PLAN_CACHE_SIZE:
                self._hashes.clear()
            h = self._hashes[call] = _hash64(f"{call} | {self._settings}")
        return h

    def _plan(self, key, build) -> CompiledPlan:
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
        else:
            plan = build()
            self._plans[key] = plan
            if len(self._plans) > PLAN_CACHE_SIZE:
                self._plans.popitem(last=False)
            if self.options.dbg_level >= 1 and self.rank == 0:
                print(f"[ddl] plan {key}: {plan.algorithm}, {plan.nblocks} block(s) of {plan.block_elems} "
                      f"elements, {plan.inflight} in flight", file=sys.stderr)
        return plan

    def _agreement_plan(self, count: int) -> CompiledPlan:
        # Rank order, never the tree: ranks whose settings differ must still pair up to find out that they do.
        return self._plan(("agree", count), lambda: compile_blocks(
            lambda n: recursive_doubling_allreduce(self.rank, self.size, n, keep_empty=True),
            count, max(count, 1), 1, "recursive_doubling"))

    def _agree(self, call: str, problem: str | None, work: np.ndarray, dtype, op) -> None:
        """The agreement round; ``work`` (possibly empty) is reduced in it. Raises on every rank if ranks
        disagree, or if they all agree on the same invalid call."""
        h = self._call_hash(problem or call)
        plan = self._agreement_plan(work.size)
        merged = self._executor.run_header(plan.native, raw(work), dtype, op, self.options.timeout, call,
                                           h, -h, AGREEMENT_CAPACITY)
        if merged != (h, -h):
            self._report_mismatch(problem or call)
        if problem:
            raise DDLError(f"rank {self.rank}: {problem}")

    def _report_mismatch(self, mine: str) -> None:
        """All ranks are here together: exchange what each called and with which settings (fixed-size slots,
        summed in a plan that no setting can change), then raise the same MismatchError everywhere."""
        slots = np.zeros(self.size * REPORT_BYTES, dtype=np.uint8)
        text = f"{mine} | {self._settings}".encode()[:REPORT_BYTES]
        slots[self.rank * REPORT_BYTES:self.rank * REPORT_BYTES + len(text)] = np.frombuffer(text, np.uint8)
        words = slots.view(np.int64)
        plan = compile_blocks(lambda n: ALLREDUCE["ring"](self.rank, self.size, n), words.size, words.size, 1,
                              "ring")
        self._executor.run(plan.native, words, _native.DType.int64, _native.ReduceOp.sum, self.options.timeout,
                           "ddl mismatch report")
        reports = [slots[r * REPORT_BYTES:(r + 1) * REPORT_BYTES].tobytes().rstrip(b"\0").decode(errors="replace")
                   for r in range(self.size)]
        calls = [t.split(" | ")[0] for t in reports]
        # Name the calls; only when every rank made the same call did the settings differ.
        keys = reports if len(set(calls)) == 1 else calls
        groups: dict[str, list[int]] = {}
        for r, k in enumerate(keys):
            groups.setdefault(k, []).append(r)
        detail = "; ".join(f"ranks {_ranges(rs)}: {k}" for k, rs in groups.items())
        raise MismatchError(f"rank {self.rank}: ranks called ddl differently: {detail}")

    # -- plans ------------------------------------------------------------------------------------------

    def plan_for(self, nbytes: int) -> planner.Plan:
        """The plan an allreduce of ``nbytes`` follows (the same on every rank)."""
        if self._forced is not None:
            return self._forced
        o, flat = self.options, len(self.levels) == 1
        try:
            return planner.choose(self.tree, self.levels, nbytes, self._algos,
                                  o.segment or (default_block_bytes(nbytes) if flat else None),
                                  o.inflight or (2 if flat else None))
        except ValueError as e:
            raise DDLError(f"rank {self.rank}: {e}") from None

    def explain(self, nbytes: int) -> Explanation:
        """What an allreduce of ``nbytes`` would do here: levels, groups, algorithms, bytes per link kind,
        predicted time against the topology's lower bound (the same as ``ddl-topo --plan``)."""
        return explain(self.plan_for(nbytes), nbytes)

    def _run_allreduce(self, flat: np.ndarray, dtype, op, label: str) -> None:
        """ddl's own allreduce of a contiguous 1-D buffer, in place, with no agreement round."""
        if flat.size == 0:
            return
        plan = self._allreduce_plan(flat.size, flat.itemsize)
        self._executor.run(plan.native, raw(flat), dtype, op, self.options.timeout, label)

    def _allreduce_plan(self, count: int, itemsize: int) -> CompiledPlan:
        def build():
            choice = self.plan_for(count * itemsize)
            return compile_blocks(lambda n: planner.program(self.rank, choice, n), count,
                                  max(1, choice.block_bytes // itemsize), choice.inflight, planner.label(choice))

        return self._plan(("allreduce", count, itemsize), build)

    def _fused(self, nbytes: int) -> bool:
        """Small payloads ride in the agreement round where recursive doubling is what the plan would do
        anyway (on a slow uplink a 64 KiB payload is better scattered through the hierarchy)."""
        if nbytes > self._small or self.options.algo not in ("auto", "recursive_doubling"):
            return False
        plan = self.plan_for(nbytes)
        if len(self.levels) == 1 or plan.shape == "latency":
            return True
        # The planned path pays a separate agreement round (no payload) before its own rounds.
        shape = planner.Shape.of(self.tree)
        fused = planner.pipelined(planner.latency_phases(shape, self.levels, nbytes), 1)
        agreement = planner.pipelined(planner.latency_phases(shape, self.levels, 0), 1)
        return fused <= planner.predict(plan, nbytes)[0] + agreement

    # -- collectives ------------------------------------------------------------------------------------

    def _signature(self, shape, dtype: np.dtype, op) -> "_Signature":
        """What an allreduce call signature means, worked out once and cached: small allreduces would
        otherwise spend most of their time formatting, hashing and validating."""
        key = (shape, dtype, op if isinstance(op, str) else repr(op))
        sig = self._signatures.get(key)
        if sig is None:
            problem, code, rop = None, None, None
            try:
                code, rop = native_dtype(dtype), native_op(op, dtype)
            except DDLError as e:
                problem = str(e)
            count = int(np.prod(shape, dtype=np.int64))
            fused = problem is None and self._fused(count * dtype.itemsize)
            text = f"allreduce(shape={shape}, dtype={dtype}, op={op})"
            sig = _Signature(text, code, rop, problem, self._call_hash(problem or text),
                             self._agreement_plan(count if fused else 0), fused,
                             1.0 / self.size if op == "avg" else 1.0)
            if len(self._signatures) > 4 * PLAN_CACHE_SIZE:
                self._signatures.clear()
            self._signatures[key] = sig
        return sig

    def allreduce(self, array, op: str = "sum", out: np.ndarray | None = None) -> np.ndarray:
        if is_device_array(array):
            return self._device_allreduce(array, op, out)
        started = time.perf_counter() if self.options.dump_iter else 0.0
        a = np.asarray(array)
        sig = self._signature(a.shape, a.dtype, op)
        problem = sig.problem
        if out is not None and problem is None:
            try:
                _check_out(out, a)
            except DDLError as e:
                problem = str(e)
        if self.size == 1:
            result = _deliver(self._alone(a, problem), out)
        elif problem is None and sig.fused and self.options.check is None:
            result = self._small_allreduce(a, out, sig)
        else:
            result = self._large_allreduce(a, out, op, sig, problem)
        if self.options.dump_iter:
            self._dump(time.perf_counter() - started, a.nbytes)
        return result

    def _small_allreduce(self, a: np.ndarray, out, sig: "_Signature") -> np.ndarray:
        """The whole call is the agreement round: one native call, one latency-optimal exchange."""
        src = a if a.flags.c_contiguous else np.ascontiguousarray(a)
        dst = out if out is not None and out.flags.c_contiguous else np.empty(a.shape, a.dtype)
        with self._lock:
            agreed = self._executor.run_small(sig.plan.native, raw(src), raw(dst), sig.dtype, sig.op,
                                              self.options.timeout, sig.text, sig.hash, AGREEMENT_CAPACITY,
                                              sig.factor)
            if not agreed:
                self._report_mismatch(sig.text)
        return _deliver(dst, out)

    def _large_allreduce(self, a: np.ndarray, out, op: str, sig: "_Signature", problem: str | None) -> np.ndarray:
        """Agreement round without payload, then the pipelined plan on the result buffer."""
        original = a.copy() if self.options.check is not None else a
        with self._lock:
            self._agree(sig.text, problem, np.empty(0, np.float32), _native.DType.float32, _native.ReduceOp.sum)
            work = _work_buffer(a, out)
            self._run_allreduce(work, sig.dtype, sig.op, sig.text)
            if sig.factor != 1.0:
                _native.scale(raw(work), sig.dtype, sig.factor)
            if self.options.check is not None:
                self._check_against_mpi(original, work, op, sig.text)
        return _deliver(work.reshape(a.shape), out)

    def allreduce_n(self, arrays, op: str = "sum") -> list[np.ndarray]:
        """Many arrays in one allreduce per dtype: packed into one buffer, reduced, unpacked (IBM's name)."""
        if any(is_device_array(x) for x in arrays):
            return self._device_allreduce_n(list(arrays), op)
        arrays = [np.asarray(x) for x in arrays]
        out: list[np.ndarray | None] = [None] * len(arrays)
        groups: dict[str, list[int]] = {}
        for i, x in enumerate(arrays):
            groups.setdefault(x.dtype.str, []).append(i)
        for key in sorted(groups):  # same order on every rank
            idx = groups[key]
            packed = np.concatenate([arrays[i].reshape(-1) for i in idx]) if idx else None
            reduced = self.allreduce(packed, op)
            start = 0
            for i in idx:
                n = arrays[i].size
                out[i] = reduced[start:start + n].reshape(arrays[i].shape)
                start += n
        return out  # type: ignore[return-value]

    def broadcast(self, array, root: int = 0) -> np.ndarray:
        """A copy of root's array on every rank (any fixed-size dtype; every rank passes the same shape)."""
        if is_device_array(array):
            return self._device_staged("broadcast", array, lambda host: self.broadcast(host, root), f"root={root}")
        a = np.asarray(array)
        problem = _unmovable(a, "broadcast")
        if not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            problem = f"broadcast root {root!r} is not a rank of this communicator (0..{self.size - 1})"
        if self.size == 1:
            return self._alone(a, problem)
        call = f"broadcast(shape={a.shape}, dtype={a.dtype}, root={root})"
        result = np.array(a, order="C")
        data = result.reshape(-1).view(np.uint8)
        with self._lock:
            self._agree(call, problem, np.empty(0, np.uint8), _BYTE, _native.ReduceOp.sum)
            block = self.options.segment or default_block_bytes(data.size)
            plan = self._plan(("broadcast", data.size, root), lambda: compile_blocks(
                lambda n: binomial_broadcast(self.rank, self.size, n, root), data.size, block,
                self.options.inflight or 2, "binomial"))
            self._executor.run(plan.native, data, _BYTE, _native.ReduceOp.sum, self.options.timeout, call)
        return result

    bcast = broadcast

    def allgather(self, array) -> np.ndarray:
        """Every rank's array concatenated along the first axis, in rank order (first dims may differ)."""
        if is_device_array(array):
            return self._device_staged("allgather", array, self.allgather, "")
        a = np.asarray(array)
        problem = _unmovable(a, "allgather")
        if a.ndim == 0:
            problem = "allgather needs at least one dimension (it concatenates along the first)"
        if self.size == 1:
            return self._alone(a, problem)
        call = f"allgather(shape=(*, {', '.join(map(str, a.shape[1:]))}), dtype={a.dtype})"
        rows = np.zeros(self.size, dtype=np.int64)
        rows[self.rank] = a.shape[0] if a.ndim else 0
        with self._lock:
            if rows.nbytes <= self._small:
                self._agree(call, problem, rows, _native.DType.int64, _native.ReduceOp.sum)
            else:
                self._agree(call, problem, np.empty(0, np.int64), _native.DType.int64, _native.ReduceOp.sum)
                self._run_allreduce(rows, _native.DType.int64, _native.ReduceOp.sum, call)
            row_bytes = a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
            ends = np.cumsum(rows) * row_bytes
            layout = tuple((int(e - n * row_bytes), int(n * row_bytes)) for e, n in zip(ends, rows))
            result = np.empty((int(rows.sum()),) + a.shape[1:], dtype=a.dtype)
            data = result.reshape(-1).view(np.uint8)
            off, n = layout[self.rank]
            data[off:off + n] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
            plan = self._plan(("allgather", layout), lambda: CompiledPlan(
                _native.Plan([native_program(ring_allgather(self.rank, self.size, layout))],
                             np.zeros((1, 2), np.int64), 1), "ring", data.size, data.size, 1, 1))
            self._executor.run(plan.native, data, _BYTE, _native.ReduceOp.sum, self.options.timeout, call)
        return result

    def barrier(self) -> None:
        """Returns once every rank has entered the barrier (an agreement round with no data)."""
        if self.size == 1:
            return
        with self._lock:
            self._agree("barrier()", None, np.empty(0, np.uint8), _BYTE, _native.ReduceOp.sum)

    def _alone(self, a: np.ndarray, problem: str | None) -> np.ndarray:
        """Any collective on one rank: a copy of the input, or the error."""
        if problem:
            raise DDLError(f"rank {self.rank}: {problem}")
        return np.array(a, order="C")

    # -- GPU arrays (ddl.gpu) -----------------------------------------------------------------------------

    def _device_path(self, device: int):
        from . import gpu

        path = self._device_paths.get(device)
        if path is None:
            path = self._device_paths[device] = gpu.DevicePath(self, device)
        return path

    def _device_ready(self) -> str | None:
        """Loads the CUDA driver and NCCL before any collective step, so a rank without them fails in the
        agreement round with its reason instead of leaving its peers waiting."""
        from . import gpu
        from .errors import DeviceError

        try:
            gpu.load_driver()
            gpu.load_nccl()
        except DeviceError as e:
            return str(e)
        return None

    def _device_allreduce(self, array, op: str, out):
        from .device_arrays import view

        problem, a, dst = self._device_ready(), None, None
        try:
            a = view(array, "allreduce input")
            native_dtype_name(a.dtype), native_op_name(op, a.dtype)
            if out is not None:
                dst = view(out, "out") if is_device_array(out) else None
                if dst is None or (dst.shape, dst.dtype, dst.device) != (a.shape, a.dtype, a.device):
                    raise DDLError(f"out must be a GPU array of shape {a.shape}, dtype {a.dtype} on device "
                                   f"{a.device}")
        except DDLError as e:
            problem = problem or str(e)
        # An unusable input still takes part in the agreement round (as its error), so every rank raises.
        text = problem if a is None else f"allreduce(cuda, shape={a.shape}, dtype={a.dtype}, op={op})"
        with self._lock:
            self._agree_or_raise(text, problem)
            dst = dst or view(a.empty(), "result")
            if a.size:
                self._device_path(a.device).allreduce(a, dst, op, text)
        return dst.obj

    def _device_allreduce_n(self, arrays: list, op: str) -> list:
        """allreduce_n of GPU arrays: one allreduce per dtype on the framework's concatenation."""
        from .device_arrays import view

        views = [view(x, f"allreduce_n array {i}") if is_device_array(x) else None for i, x in enumerate(arrays)]
        if any(v is None for v in views):
            raise DDLError(f"rank {self.rank}: allreduce_n got GPU and host arrays together; pass one kind")
        out: list = [None] * len(arrays)
        groups: dict[str, list[int]] = {}
        for i, v in enumerate(views):
            groups.setdefault(f"{v.dtype}@{v.device}", []).append(i)
        for key in sorted(groups):
            idx = groups[key]
            reduced = self._device_allreduce(_concat([arrays[i] for i in idx], views[idx[0]].framework), op, None)
            start = 0
            for i in idx:
                out[i] = reduced[start:start + views[i].size].reshape(views[i].shape)
                start += views[i].size
        return out

    def _device_staged(self, name: str, array, host_collective, extra: str):
        """Broadcast or allgather of a GPU array, staged whole through host memory."""
        from .device_arrays import view

        problem = self._device_ready()
        try:
            a = view(array, f"{name} input")
        except DDLError as e:  # still takes part in the agreement round, as its error
            a, problem = None, str(e)
        shape = a and (a.shape if name == "broadcast" else f"(*, {', '.join(map(str, a.shape[1:]))})")  # rows vary
        text = f"{name}(cuda, shape={shape}, dtype={a and a.dtype}{', ' + extra if extra else ''})"
        with self._lock:
            self._agree_or_raise(text, problem)
            path = self._device_path(a.device)
            host = path.to_host(a, text).view(host_dtype(a.dtype)).reshape(a.shape)
        result = host_collective(host)
        dst = view(a.empty(result.shape), "result")
        path.to_device(result, dst, text)
        return dst.obj

    def _agree_or_raise(self, call: str, problem: str | None) -> None:
        if self.size > 1:
            self._agree(call, problem, np.empty(0, np.float32), _native.DType.float32, _native.ReduceOp.sum)
        elif problem:
            raise DDLError(f"rank {self.rank}: {problem}")

    # -- diagnostics ------------------------------------------------------------------------------------

    def _check_against_mpi(self, original: np.ndarray, result: np.ndarray, op: str, call: str) -> None:
        """IBM DDL's -check TOL: MPI_Allreduce of the same input on a copy; every rank raises on a difference."""
        from mpi4py import MPI

        if self._mpi is None:
            raise DDLError("-check needs an MPI communicator to compare with")
        wide = original.astype(np.float64 if original.dtype.name in FLOATING else original.dtype).reshape(-1)
        ref = np.empty_like(wide)
        mpi_op = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}[op]
        self._mpi.Allreduce(wide, ref, op=mpi_op)
        if op == "avg":
            ref = ref / self.size
        got = result.reshape(-1).astype(ref.dtype)
        bad = np.abs(got - ref) > self.options.check * np.maximum(np.abs(ref), np.finfo(np.float64).tiny)
        nbad = int(np.count_nonzero(bad))
        worst = self._mpi.allreduce((nbad, self.rank), op=MPI.MAXLOC)
        if worst[0]:
            raise DDLError(f"rank {self.rank}: -check {self.options.check}: {call} differs from MPI_Allreduce "
                           f"in {worst[0]} elements on rank {worst[1]} (and {nbad} here)")

    def _dump(self, seconds: float, nbytes: int) -> None:
        """IBM DDL's -dump_iter N: every N allreduce calls, rank 0 prints the mean time per call."""
        self._calls += 1
        self._call_seconds += seconds
        if self._calls % self.options.dump_iter == 0:
            if self.rank == 0:
                mean = self._call_seconds / self.options.dump_iter
                print(f"[ddl] iter {self._calls}: allreduce {mean * 1e6:.1f} us per call over the last "
                      f"{self.options.dump_iter} (last {nbytes} bytes)", file=sys.stderr)
            self._call_seconds = 0.0


_KEPT_AFTER_FAILURE: list = []  # MPI communicators of failed calls (see Communicator.close)


class _Closed:
    """Stands in for the executor of a closed communicator."""

    def __getattr__(self, name):
        raise DDLError("this ddl communicator was closed (ddl.finalize() or Communicator.close())")


def _concat(arrays: list, framework: str):
    """One flat GPU array of many, by their own framework."""
    if framework == "torch":
        import torch

        return torch.cat([x.reshape(-1) for x in arrays])
    if framework == "cupy":
        import cupy

        return cupy.concatenate([x.reshape(-1) for x in arrays])
    raise DDLError(f"allreduce_n of {type(arrays[0]).__name__} GPU arrays: ddl packs only cupy and torch arrays")


def _unmovable(a: np.ndarray, what: str) -> str | None:
    return f"cannot {what} dtype {a.dtype} (objects have no fixed size)" if a.dtype.hasobject else None


def _check_out(out, a: np.ndarray) -> None:
    if out is None:
        return
    if not isinstance(out, np.ndarray):
        raise DDLError(f"out must be a numpy array, not {type(out).__name__}")
    if not out.flags.writeable:
        raise DDLError("out is read-only")
    if out.shape != a.shape or out.dtype != a.dtype:
        raise DDLError(f"out has shape {out.shape} and dtype {out.dtype}; the input has {a.shape}, {a.dtype}")


def _work_buffer(a: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """The flat buffer the plan runs on: out itself when it can be (in place), else a fresh C-ordered copy."""
    if out is not None and out.flags.c_contiguous:
        if out is not a:  # copy through a temporary when the two may overlap
            np.copyto(out, a.copy() if np.may_share_memory(out, a) else a)
        return out.reshape(-1)
    return np.array(a, order="C").reshape(-1)


def _deliver(result: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """``result`` into ``out`` unless it already lives there (as out itself or a reshaped view of it)."""
    if out is None:
        return result
    if result is not out and (result.__array_interface__["data"][0] != out.__array_interface__["data"][0]
                              or result.shape != out.shape):
        np.copyto(out, result)
    return out


def _load_plan(path: str) -> planner.Plan:
    try:
        with open(path) as f:
            return planner.Plan.from_dict(json.load(f))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DDLError(f"plan file {path!r} cannot be used: {e!r}") from None


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'"""
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(f"{start}-{r}" if r > start else f"{r}")
            start = None
    return ",".join(parts)
