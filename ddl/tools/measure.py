"""One collective, timed and checked: what ddl-bench and the benchmark scripts share.

Inputs are small integers (or +-1 for prod), so every reduction of them is exact in every dtype and a result
is either right or counted wrong. Times follow nccl-tests: the mean per call on each rank, combined over ranks
as ``-a`` says (0: rank 0's, 1: the average, 2: the minimum, 3: the maximum).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np

from ..units import bus_factor

COLLECTIVES = ("allreduce", "broadcast", "allgather", "reduce_scatter")
OPS = ("sum", "prod", "min", "max", "avg")
AVERAGES = {0: "rank 0's", 1: "average over ranks of", 2: "minimum over ranks of", 3: "maximum over ranks of"}


def inputs(rank: int, count: int, dtype: np.dtype, op: str = "sum") -> np.ndarray:
    """Small integers (sum, min, max, avg) or +-1 (prod): every reduction of them is exact in every dtype."""
    i = np.arange(count, dtype=np.int64)
    v = ((i + rank) % 2) * 2 - 1 if op == "prod" else (i + rank) % 7 - 3
    return v.astype(dtype)


def expected(size: int, count: int, dtype: np.dtype, op: str) -> np.ndarray:
    """The allreduce of ``inputs`` over ``size`` ranks, in float64."""
    stack = np.stack([inputs(r, count, np.dtype(np.float64), op) for r in range(size)]) if count else \
        np.zeros((size, 0))
    return {"sum": stack.sum(0), "avg": stack.sum(0) / size, "prod": stack.prod(0), "min": stack.min(0),
            "max": stack.max(0)}[op]


def count_wrong(got: np.ndarray, ref: np.ndarray, op: str, dtype: np.dtype) -> int:
    g = got.astype(np.float64)
    if op == "avg":  # sum then scale: one rounding in the dtype
        tol = 1e-2 if dtype.itemsize == 2 else 1e-6
        return int(np.count_nonzero(np.abs(g - ref) > tol * np.maximum(1.0, np.abs(ref))))
    return int(np.count_nonzero(g != ref))


def bus_bandwidth_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw: what each rank's link carries per byte of the result."""
    if collective == "allreduce":
        return bus_factor(n)
    return 1.0 if collective == "broadcast" else (n - 1) / n  # allgather, reduce_scatter: size is the whole


def bandwidth(nbytes: int, us: float, n: int, collective: str = "allreduce") -> tuple[float, float]:
    """(algbw, busbw) in GB/s for a time in microseconds."""
    algbw = nbytes / (us * 1e-6) / 1e9 if us > 0 else 0.0
    return algbw, algbw * bus_bandwidth_factor(collective, n)


class Case:
    """One collective at one size on this rank: its send buffer, its output buffer and the expected result."""

    def __init__(self, collective: str, rank: int, n: int, count: int, dtype: np.dtype, op: str, root: int):
        self.collective, self.op, self.root, self.dtype, self.rank = collective, op, root, dtype, rank
        if collective in ("allgather", "reduce_scatter"):
            # every rank gives (or gets) the same share, of at least one element: an empty call moves nothing and
            # MPI returns at once, while a ddl call still checks that every rank made it
            count = max(count - count % n, n)
        self.x = inputs(rank, count // n if collective == "allgather" else count, dtype, op)
        self.count = count
        # reduce_scatter: rank r's result is out[r * share:(r + 1) * share] (nccl-tests' in-place layout)
        self.out = np.empty(count, dtype)
        self.nbytes = count * dtype.itemsize
        self.ranks = n

    def reference(self) -> np.ndarray:
        if self.collective == "allreduce":
            return expected(self.ranks, self.count, self.dtype, self.op)
        if self.collective == "broadcast":
            return inputs(self.root, self.count, np.dtype(np.float64), self.op)
        share = self.count // self.ranks
        if self.collective == "reduce_scatter":
            return expected(self.ranks, self.count, self.dtype, "sum")[self.rank * share:(self.rank + 1) * share]
        return np.concatenate([inputs(r, share, np.dtype(np.float64), self.op) for r in range(self.ranks)]) \
            if share else np.zeros(0)

    def reset(self, inplace: bool) -> None:
        """The buffers as the call expects them: in place, the output holds this rank's input."""
        if not inplace:
            self.out[...] = 0
        elif self.collective == "allgather":
            self.out[self.rank * self.x.size:(self.rank + 1) * self.x.size] = self.x
        else:
            self.out[...] = self.x

    def wrong(self) -> int:
        if self.collective == "reduce_scatter":
            share = self.count // self.ranks
            return count_wrong(self.out[self.rank * share:(self.rank + 1) * share], self.reference(), "sum",
                               self.dtype)
        return count_wrong(self.out, self.reference(), "avg" if self.op == "avg" and
                           self.collective == "allreduce" else "sum", self.dtype)


class Runner:
    """One way of running the collective, out of place (into ``case.out``) or in place (``case.out`` holds the
    input): ``ddl`` (its own plan), ``ddl-ring`` (ddl forced to one flat ring in rank order; allreduce only),
    ``mpi`` (this MPI's own collective, whatever its components choose) or ``gloo`` (PyTorch's gloo, where
    torch is installed)."""

    ALGOS = ("ddl", "ddl-ring", "mpi", "gloo")

    def __init__(self, algo: str, comm, collective: str = "allreduce"):
        if algo not in self.ALGOS:
            raise ValueError(f"unknown algorithm {algo!r} (known: {', '.join(self.ALGOS)})")
        if collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {collective!r} (known: {', '.join(COLLECTIVES)})")
        if algo == "ddl-ring" and collective != "allreduce":
            raise ValueError(f"{algo} is compared on allreduce only, not {collective}")
        self.algo, self.comm, self.collective = algo, comm, collective
        from mpi4py import MPI

        self.MPI = MPI
        self.mpi_op = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}
        self.ddl = None
        if algo == "ddl-ring":
            import ddl
            from ddl.options import parse

            self.ddl = ddl.Communicator.from_mpi(comm, options=parse("-algo ring"),
                                                 hierarchy=list(range(comm.size)))
            # its one level was given, not measured: nominal figures, whose prediction the ring cannot meet, so
            # its plan check would warn in every job ("ran at 2 % of its prediction") about a choice made here
            self.ddl.plan_check.enabled = False
        if algo == "gloo":
            self.gloo = _Gloo(comm)

    def supports(self, dtype: np.dtype, op: str = "sum") -> bool:
        if op == "avg" and dtype.kind in "iu":
            return False  # ddl refuses an average that integers would truncate
        return self.algo.startswith("ddl") or dtype.itemsize > 2  # MPI has no float16 / bfloat16

    def __call__(self, x: np.ndarray, out: np.ndarray, op: str, inplace: bool, root: int = 0) -> None:
        if self.collective == "allreduce":
            self._allreduce(x, out, op, inplace)
        elif self.algo == "mpi":
            self._mpi_other(x, out, inplace, root)
        elif self.algo == "gloo":
            self.gloo.other(self.collective, x, out, inplace, root)
        else:
            self._ddl_other(x, out, inplace, root)

    def _allreduce(self, x, out, op, inplace):
        import ddl

        if self.algo.startswith("ddl"):
            (self.ddl or ddl).allreduce(out if inplace else x, op, out=out)
            return
        if self.algo == "gloo":
            self.gloo.allreduce(x, out, op, inplace)
            return
        self.comm.Allreduce(self.MPI.IN_PLACE if inplace else x, out, op=self.mpi_op[op])
        if op == "avg":
            out /= self.comm.size

    def _mpi_other(self, x, out, inplace, root):
        if self.collective == "reduce_scatter":  # MPI's in place leaves the result at the buffer's start
            share = out.size // self.comm.size
            mine = out[self.comm.rank * share:(self.comm.rank + 1) * share]
            if inplace:
                self.comm.Reduce_scatter_block(self.MPI.IN_PLACE, out, op=self.MPI.SUM)
                mine[...] = out[:share]  # moved to where nccl-tests' layout has it (a copy MPI's users pay too)
            else:
                self.comm.Reduce_scatter_block(x, mine, op=self.MPI.SUM)
            return
        if self.collective == "broadcast":
            if not inplace:  # nccl-tests' out-of-place broadcast: root's send buffer lands in every output
                if self.comm.rank == root:
                    out[...] = x
            self.comm.Bcast(out, root=root)
        else:
            self.comm.Allgather(self.MPI.IN_PLACE if inplace else x, out)

    def _ddl_other(self, x, out, inplace, root):
        """ddl's broadcast, allgather and reduce_scatter write the preallocated output (``out=``), as MPI's do."""
        import ddl

        if self.collective == "broadcast":  # (before anything else: MPI's column slices nothing for it)
            if not inplace and self.comm.rank == root:
                out[...] = x  # as the MPI column: root's send buffer lands in every output
            ddl.broadcast(out, root, out=out)
            return
        share = out.size // self.comm.size
        mine = out[self.comm.rank * share:(self.comm.rank + 1) * share]
        if self.collective == "allgather":
            ddl.allgather(mine if inplace else x, out=out)
        else:
            ddl.reduce_scatter(out if inplace else x, out=mine)


def init_torch(comm, backend: str = "gloo") -> None:
    """torch.distributed's default group on gloo (or ``backend``: "nccl" for the GPU peers) over the ranks of
    ``comm`` (rendezvous at rank 0's address on the interface DDL_BENCH_IFACE, default eth0 when there is one,
    else loopback)."""
    import socket

    import torch
    import torch.distributed as dist

    if dist.is_initialized():  # (a runner per collective: the group of the first serves them all)
        if dist.get_backend() != backend:
            raise RuntimeError(f"torch.distributed already runs {dist.get_backend()}, not {backend}")
        return
    iface = os.environ.get("DDL_BENCH_IFACE", "eth0" if os.path.exists("/sys/class/net/eth0") else "lo")
    addr = None
    if comm.rank == 0:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, 25, iface.encode())  # SO_BINDTODEVICE: its address
                probe.connect(("10.255.255.255", 1))
                host = probe.getsockname()[0]
        except OSError:  # no route from it (a machine with no network): ranks of one host meet on loopback
            host = "127.0.0.1"
        with socket.socket() as s:
            s.bind((host, 0))
            addr = (host, s.getsockname()[1])
    host, port = comm.bcast(addr)
    os.environ["GLOO_SOCKET_IFNAME"] = iface
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=comm.rank, world_size=comm.size)


class _Gloo:
    """gloo's collectives over the ranks of ``comm`` (init_torch), on numpy arrays as the other runners take
    them (nccl-tests' layout: a rank's share of an allgather's or a reduce-scatter's output is its slot)."""

    def __init__(self, comm):
        import torch
        import torch.distributed as dist

        init_torch(comm)
        self.comm, self.dist, self.tensor = comm, dist, torch.from_numpy
        self.ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
                    "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
        # (torch 2.13 renamed the tensor-in, tensor-out pair; earlier ones have only the old names)
        self.all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self.reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def allreduce(self, x, out, op, inplace):
        if not inplace:
            out[...] = x  # gloo reduces in place: out of place costs it a copy, as it would a user
        self.dist.all_reduce(self.tensor(out), op=self.ops[op])
        if op == "avg":
            out /= self.comm.size

    def other(self, collective, x, out, inplace, root):
        t = self.tensor
        if collective == "broadcast":
            if not inplace and self.comm.rank == root:
                out[...] = x  # as the MPI column: root's send buffer lands in every output
            self.dist.broadcast(t(out), src=root)
            return
        share = out.size // self.comm.size
        mine = out[self.comm.rank * share:(self.comm.rank + 1) * share]
        if collective == "allgather":
            self.all_gather(t(out), t(mine if inplace else x))
        else:
            self.reduce_scatter(t(mine), t(out if inplace else x))


def combine(comm, local: float, average: int) -> float:
    """One time from every rank's, as nccl-tests' ``-a``: 0 rank 0's, 1 mean, 2 min, 3 max."""
    from mpi4py import MPI

    if average == 0:
        return comm.bcast(local, root=0)
    if average == 1:
        return comm.allreduce(local, op=MPI.SUM) / comm.size
    return comm.allreduce(local, op=MPI.MIN if average == 2 else MPI.MAX)


DISTURBED = 1.4  # a round whose every library ran at least this much slower than its usual is left out


def disturbed_rounds(per_round: list[dict], slower: float = DISTURBED) -> dict[int, float]:
    """The rounds a disturbed machine spoiled: ``per_round[r][library][size]`` is a time; a library's usual time
    at a size is its median over the rounds, its slowdown in a round the median over sizes of time / usual. A
    round is disturbed when every library's slowdown is ``slower`` or more (all slow alike: the machine, not a
    library). Returns {round: the smallest slowdown in it}. With fewer than 3 rounds nothing can be told apart;
    at most a minority of the rounds is ever left out."""
    if len(per_round) < 3:
        return {}
    usual = {}
    for lib in per_round[0]:
        for size in per_round[0][lib]:
            usual[lib, size] = statistics.median(r[lib][size] for r in per_round if size in r.get(lib, {}))
    found = {}
    for i, r in enumerate(per_round):
        slow = [statistics.median(t / usual[lib, size] for size, t in by_size.items() if usual.get((lib, size)))
                for lib, by_size in r.items() if by_size]
        if slow and min(slow) >= slower:
            found[i] = min(slow)
    worst_first = sorted(found, key=found.get, reverse=True)
    return {i: found[i] for i in worst_first[:(len(per_round) - 1) // 2]}


def spread(values: list[float]) -> float:
    """(largest - smallest) / median: how far apart the rounds' results lie."""
    return (max(values) - min(values)) / statistics.median(values) if values else 0.0


def measure(runner: Runner, comm, count: int, dtype: np.dtype, op: str, iters: int, warmup: int,
            check: bool, min_seconds: float = 0.0, places: tuple[bool, ...] = (False, True),
            root: int = 0, average: int = 3) -> dict:
    """Times and checks one algorithm at one size; ``{out,in}_us`` combined over ranks by ``average`` (the
    maximum by default: the slowest rank is what a training step waits for), ``{out,in}_wrong`` summed over
    ranks. Small sizes run more than ``iters`` iterations when needed to fill ``min_seconds``: on a shared CPU
    a few microsecond-long calls say more about the scheduler than about the collective."""
    from mpi4py import MPI

    case = Case(runner.collective, comm.rank, comm.size, count, dtype, op, root)
    record = {"size": case.nbytes, "count": case.count}
    for inplace in places:
        key = "in" if inplace else "out"
        start = time.perf_counter()
        if check:  # the checked call warms up too: with warmup=0 it alone estimates the time per call
            case.reset(inplace)
            runner(case.x, case.out, op, inplace, root)
            record[f"{key}_wrong"] = comm.allreduce(case.wrong(), op=MPI.SUM)
        if warmup:
            start = time.perf_counter()
        for _ in range(warmup):
            runner(case.x, case.out, op, inplace, root)
        per_call = (time.perf_counter() - start) / max(warmup, 1)
        n = max(iters, int(min_seconds / per_call) if per_call > 0 else iters)
        n = comm.allreduce(n, op=MPI.MAX)  # every rank runs the same number of calls
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(n):
            runner(case.x, case.out, op, inplace, root)
        record[f"{key}_us"] = combine(comm, (time.perf_counter() - start) / max(n, 1), average) * 1e6
    return record


def answer_as_worker(worker, repeats: int) -> int:
    """The launched side of a self-launched benchmark: every rank runs ``worker(repeats)``; rank 0 prints its
    dict as one JSON line (what mpirun.worker_json reads)."""
    results = worker(repeats)
    import ddl

    if ddl.rank() == 0:
        sys.stdout.write(json.dumps(results) + "\n")
    return 0


def self_launched(script: str, doc: str, worker, report, repeats: int = 7, note=None) -> int:
    """main() of a benchmark script that launches itself under mpiexec: ``worker(repeats)`` runs on every rank
    (rank 0's dict comes back as JSON), ``report(results, nranks)`` makes the table, printed and written to
    --out with the command (and ``note(args)``, if given) under it."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--out", help="also write the table to this file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return answer_as_worker(worker, args.repeats)
    from ..runner import mpirun

    results = mpirun.worker_json(args.np, [sys.executable, os.path.abspath(script), "--worker",
                                           "--repeats", str(args.repeats)])
    if results is None:
        return 1
    name = os.path.relpath(os.path.abspath(script))
    text = (report(results, args.np) + f"\n\nCommand: `python {name} --np {args.np} --repeats {args.repeats}`"
            + (f" {note(args)}" if note else "") + "\n")
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0
