"""ddl-bench: allreduce bandwidth in nccl-tests' format, with MPI's own allreduce side by side.

    ddl-bench --np 4 -b 8 -e 64M -f 8 --algo ddl,mpi

Columns follow nccl-tests (doc/PERFORMANCE.md): algbw = size / time; busbw = algbw * 2(n-1)/n, comparable
with the hardware's per-rank bandwidth at any rank count. Out-of-place writes a preallocated output, in-place
reduces the buffer itself, for ddl and MPI alike. Each size runs every algorithm in turn, so ratios are taken
side by side in one run. Results are checked on inputs whose reduction is exact in every dtype; wrong
elements are counted per rank and the exit status is non-zero if any are found.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from ..config import launched_by_mpi
from ..units import bandwidth as _bandwidth_seconds
from .cli import Parser, one_line_errors, size

DTYPES = {"float": "float32", "float32": "float32", "half": "float16", "float16": "float16",
          "bfloat16": "bfloat16", "double": "float64", "float64": "float64", "int32": "int32", "int": "int32",
          "int64": "int64"}


def numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def inputs(rank: int, count: int, dtype: np.dtype, op: str) -> np.ndarray:
    """Small integers (sum, min, max, avg) or +-1 (prod): every reduction of them is exact in every dtype."""
    i = np.arange(count, dtype=np.int64)
    v = ((i + rank) % 2) * 2 - 1 if op == "prod" else (i + rank) % 7 - 3
    return v.astype(dtype)


def expected(size: int, count: int, dtype: np.dtype, op: str) -> np.ndarray:
    stack = np.stack([inputs(r, count, np.dtype(np.float64), op) for r in range(size)]) if count else \
        np.zeros((size, 0))
    ref = {"sum": stack.sum(0), "avg": stack.sum(0) / size, "prod": stack.prod(0), "min": stack.min(0),
           "max": stack.max(0)}[op]
    return ref


def count_wrong(got: np.ndarray, ref: np.ndarray, op: str, dtype: np.dtype) -> int:
    g = got.astype(np.float64)
    if op == "avg":  # sum then scale: one rounding in the dtype
        tol = 1e-2 if dtype.itemsize == 2 else 1e-6
        return int(np.count_nonzero(np.abs(g - ref) > tol * np.maximum(1.0, np.abs(ref))))
    return int(np.count_nonzero(g != ref))


class Runner:
    """One way of doing an allreduce, out of place (into ``out``) or in place: ``ddl`` (its own plan),
    ``ddl-ring`` (ddl forced to one flat ring in rank order), ``mpi`` (MPI_Allreduce of this MPI, whatever
    its collective components choose) or ``gloo`` (PyTorch's gloo all_reduce, where torch is installed)."""

    ALGOS = ("ddl", "ddl-ring", "mpi", "gloo")

    def __init__(self, algo: str, comm):
        if algo not in self.ALGOS:
            raise ValueError(f"unknown algorithm {algo!r} (known: {', '.join(self.ALGOS)})")
        self.algo, self.comm = algo, comm
        from mpi4py import MPI

        self.MPI = MPI
        self.mpi_op = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}
        self.ddl = None
        if algo == "ddl-ring":
            import ddl
            from ddl.options import parse

            self.ddl = ddl.Communicator.from_mpi(comm, options=parse("-algo ring"),
                                                 hierarchy=list(range(comm.size)))
        if algo == "gloo":
            self.gloo = _gloo_group(comm)

    def supports(self, dtype: np.dtype) -> bool:
        return self.algo.startswith("ddl") or dtype.itemsize > 2  # MPI has no float16 / bfloat16

    def __call__(self, x: np.ndarray, out: np.ndarray, op: str, inplace: bool) -> None:
        import ddl

        if self.algo.startswith("ddl"):
            (self.ddl or ddl).allreduce(out if inplace else x, op, out=out)
            return
        if self.algo == "gloo":
            self.gloo(x, out, op, inplace)
            return
        self.comm.Allreduce(self.MPI.IN_PLACE if inplace else x, out, op=self.mpi_op[op])
        if op == "avg":
            out /= self.comm.size


def _gloo_group(comm):
    """torch.distributed's gloo group over the ranks of ``comm`` (rendezvous at rank 0's address on the
    interface DDL_BENCH_IFACE, default eth0 when there is one, else loopback); returns an allreduce."""
    import socket

    import torch
    import torch.distributed as dist

    iface = os.environ.get("DDL_BENCH_IFACE", "eth0" if os.path.exists("/sys/class/net/eth0") else "lo")
    addr = None
    if comm.rank == 0:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.setsockopt(socket.SOL_SOCKET, 25, iface.encode())  # SO_BINDTODEVICE: this interface's address
        probe.connect(("10.255.255.255", 1))
        host = probe.getsockname()[0]
        with socket.socket() as s:
            s.bind((host, 0))
            addr = (host, s.getsockname()[1])
    host, port = comm.bcast(addr)
    os.environ["GLOO_SOCKET_IFNAME"] = iface
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=comm.rank, world_size=comm.size)
    ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
           "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}

    def allreduce(x, out, op, inplace):
        if not inplace:
            out[...] = x  # gloo reduces in place: out of place costs it a copy, as it would a user
        dist.all_reduce(torch.from_numpy(out), op=ops[op])
        if op == "avg":
            out /= comm.size
    return allreduce


def measure(runner: Runner, comm, count: int, dtype: np.dtype, op: str, iters: int, warmup: int,
            check: bool, min_seconds: float = 0.0, places: tuple[bool, ...] = (False, True)) -> dict:
    """Times (max over ranks of the mean per call) and checks one algorithm at one size. Small sizes run more
    than ``iters`` iterations when needed to fill ``min_seconds``: on a shared CPU a few microsecond-long calls
    say more about the scheduler than about the allreduce."""
    x = inputs(comm.rank, count, dtype, op)
    out = np.empty_like(x)
    ref = expected(comm.size, count, dtype, op) if check else None
    record = {}
    for inplace in places:
        key = "in" if inplace else "out"
        start = time.perf_counter()
        if check:  # the checked call warms up too: with warmup=0 it alone estimates the time per call
            out[...] = x
            runner(x, out, op, inplace)
            record[f"{key}_wrong"] = count_wrong(out, ref, op, dtype)
        if warmup:
            start = time.perf_counter()
        for _ in range(warmup):
            runner(x, out, op, inplace)
        per_call = (time.perf_counter() - start) / max(warmup, 1)
        n = max(iters, int(min_seconds / per_call) if per_call > 0 else iters)
        n = comm.allreduce(n, op=runner.MPI.MAX)  # every rank runs the same number of calls
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(n):
            runner(x, out, op, inplace)
        local = (time.perf_counter() - start) / max(n, 1)
        record[f"{key}_us"] = comm.allreduce(local, op=runner.MPI.MAX) * 1e6
    if check:
        from mpi4py import MPI

        for key in [k for k in ("out_wrong", "in_wrong") if k in record]:
            record[key] = comm.allreduce(record[key], op=MPI.SUM)
    return record


def bandwidth(nbytes: int, us: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for a time in microseconds."""
    return _bandwidth_seconds(nbytes, us * 1e-6, n)


def self_launched(script: str, doc: str, worker, report, repeats: int = 7, note=None) -> int:
    """main() of a benchmark script that launches itself under mpiexec: ``worker(repeats)`` runs on every rank
    (rank 0's dict comes back as JSON), ``report(results, nranks)`` makes the table, printed and written to
    --out with the command (and ``note(args)``, if given) under it."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--out", help="also write the table to this file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        results = worker(args.repeats)
        import ddl

        if ddl.rank() == 0:
            sys.stdout.write(json.dumps(results) + "\n")
        return 0
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


def sizes(begin: int, end: int, factor: float) -> list[int]:
    out, s = [], begin
    while s <= end:
        out.append(s)
        s = int(s * factor) if factor > 1 else s + max(1, int(factor))
    return out


@one_line_errors("ddl-bench")
def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="ddl-bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("-b", "--minbytes", type=size, default=8)
    ap.add_argument("-e", "--maxbytes", type=size, default=64 << 20)
    ap.add_argument("-f", "--stepfactor", type=float, default=2.0)
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("-w", "--warmup_iters", type=int, default=5)
    ap.add_argument("-N", "--min-seconds", type=float, default=0.2,
                    help="run more iterations where needed to time at least this long (0: exactly -n)")
    ap.add_argument("-c", "--check", type=int, default=1, help="verify results (1) or not (0)")
    ap.add_argument("-d", "--datatype", default="float", choices=sorted(DTYPES))
    ap.add_argument("-o", "--op", default="sum", choices=["sum", "avg", "prod", "min", "max"])
    ap.add_argument("-J", "--output_file", help="write the results as JSON")
    ap.add_argument("--algo", default="ddl,mpi", help="comma list of " + ", ".join(Runner.ALGOS))
    ap.add_argument("--np", type=int, default=0, help="launch this many ranks with mpiexec (this host)")
    args = ap.parse_args(argv)

    if args.np and not launched_by_mpi():
        from ..runner.mpirun import run

        forward = list(argv if argv is not None else sys.argv[1:])
        i = forward.index("--np") if "--np" in forward else None
        if i is not None:
            del forward[i:i + 2]
        forward = [a for a in forward if not a.startswith("--np=")]
        # Not `python -m ddl.tools.bench`: that puts the working directory first on sys.path, and from a source
        # checkout it would import the uncompiled tree instead of the installed ddl.
        start = "import sys; del sys.path[0]; from ddl.tools.bench import main; sys.exit(main())"
        return run(args.np, [sys.executable, "-c", start, *forward], timeout=1800)

    import ddl
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    ddl.init(comm)
    dtype = numpy_dtype(DTYPES[args.datatype])
    runners = [Runner(a, comm) for a in args.algo.split(",")]
    n = comm.size
    rows = []
    if comm.rank == 0:
        print(f"# ddl-bench allreduce: {n} ranks on {ddl.num_hosts()} host(s), {MPI.Get_library_version().splitlines()[0]}")
        print(f"# dtype {dtype.name}, op {args.op}, at least {args.iters} iterations and {args.min_seconds} s "
              f"after {args.warmup_iters} warm-up; time = max over ranks of the mean per call")
        print("#")
        print(f"# {'':>55}{'out-of-place':>30}{'in-place':>32}")
        print(f"# {'size':>10} {'count':>12} {'type':>9} {'redop':>6} {'root':>5} {'algo':>8}"
              f" {'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}  {'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}")
        print(f"# {'(B)':>10} {'(elements)':>12} {'':>9} {'':>6} {'':>5} {'':>8}"
              f" {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}  {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7}")
    for nbytes in sizes(args.minbytes, args.maxbytes, args.stepfactor):
        count = max(nbytes // dtype.itemsize, 0)
        for runner in runners:
            if not runner.supports(dtype):
                continue
            rec = measure(runner, comm, count, dtype, args.op, args.iters, args.warmup_iters, bool(args.check),
                          args.min_seconds)
            rec.update(size=count * dtype.itemsize, count=count, type=dtype.name, redop=args.op, algo=runner.algo,
                       ranks=n)
            for key in ("out", "in"):
                rec[f"{key}_algbw"], rec[f"{key}_busbw"] = bandwidth(rec["size"], rec[f"{key}_us"], n)
            rows.append(rec)
            if comm.rank == 0:
                w = lambda k: str(rec.get(k, "N/A"))
                print(f"  {rec['size']:>10} {count:>12} {dtype.name:>9} {args.op:>6} {-1:>5} {runner.algo:>8}"
                      f" {rec['out_us']:>9.1f} {rec['out_algbw']:>7.3f} {rec['out_busbw']:>7.3f} {w('out_wrong'):>6}"
                      f"  {rec['in_us']:>9.1f} {rec['in_algbw']:>7.3f} {rec['in_busbw']:>7.3f} {w('in_wrong'):>6}",
                      flush=True)
    wrong = sum(r.get("out_wrong", 0) + r.get("in_wrong", 0) for r in rows)
    if comm.rank == 0:
        print(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
        ddl_rows = {r["size"]: r for r in rows if r["algo"] == "ddl"}
        mpi_rows = {r["size"]: r for r in rows if r["algo"] == "mpi"}
        if ddl_rows and mpi_rows:
            print("# ddl time / MPI_Allreduce time (out-of-place, in-place):")
            for s in sorted(set(ddl_rows) & set(mpi_rows)):
                d, m = ddl_rows[s], mpi_rows[s]
                print(f"#   {s:>10} B: {d['out_us'] / m['out_us']:.2f}  {d['in_us'] / m['in_us']:.2f}")
        if ddl_rows:
            avg = sum(r["in_busbw"] for r in ddl_rows.values()) / len(ddl_rows)
            print(f"# Avg bus bandwidth (ddl, in-place) : {avg:.3f} GB/s")
        if args.output_file:
            with open(args.output_file, "w") as f:
                json.dump({"ranks": n, "hosts": ddl.num_hosts(), "mpi": MPI.Get_library_version().splitlines()[0],
                           "results": rows}, f, indent=1)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
