"""The small path, call by call: what one 8-byte collective costs in ddl's Python, in its native call and in the
wait for the other ranks, beside MPI's own (issue 28's per-call profile and its one-rank target).

    python benchmarks/small_path.py --np 2 --repeats 7 --out benchmarks/results/small-path.md

Every rank runs, per repeat and alternating, each collective three ways on 2 float32 (8 B): ddl's call (the
public API, preallocated output), the bare native call of the host memory level underneath (the same segment,
the same prepared call), and mpi4py's collective. ddl's call minus the native call is what Python adds; the
native call is the synchronisation itself. Then, once that job has ended, this process times every call form
in a job of one rank (the target: at most 1 us). Medians over repeats, in microseconds per call.
"""
import statistics
import sys
import time

import numpy as np

ITERS = 2000


def per_call(fn, sync) -> float:
    for _ in range(100):
        fn()
    sync()
    started = time.perf_counter()
    for _ in range(ITERS):
        fn()
    return (time.perf_counter() - started) / ITERS * 1e6


def worker(repeats: int) -> dict:
    import ddl
    from mpi4py import MPI

    mpi = MPI.COMM_WORLD
    ddl.init(mpi)
    comm = ddl.communicator()
    p = comm.size
    x, g = np.ones(2, np.float32), np.empty(2 * p, np.float32)
    whole, part = np.ones(2 * p, np.float32), np.empty(2, np.float32)
    calls = {
        "allreduce": (lambda: ddl.allreduce(x, out=x), lambda: mpi.Allreduce(MPI.IN_PLACE, x)),
        "broadcast": (lambda: ddl.broadcast(x, 0, out=x), lambda: mpi.Bcast(x, 0)),
        "allgather": (lambda: ddl.allgather(x, out=g), lambda: mpi.Allgather(x, g)),
        "reduce_scatter": (lambda: ddl.reduce_scatter(whole, out=part), lambda: mpi.Reduce_scatter_block(whole, part)),
        "barrier": (ddl.barrier, mpi.Barrier),
    }
    for ddl_call, _ in calls.values():
        ddl_call()  # the first call of a signature prepares it; the ones timed take the short path
    native = {}
    if comm.host_level:  # the same segment and prepared calls the short paths use (a private seam: a benchmark)
        seg = comm.host_memory.native
        known = comm._calls._known  # each signature's Known (ddl.core.calls): its prepared native call
        native = {
            "allreduce": lambda c=known[("allreduce", x.shape, x.dtype, "sum")].prepared: seg.allreduce(x, x, c),
            "broadcast": lambda c=known[("broadcast", x.shape, x.dtype, 0)].prepared: seg.broadcast(x, 0, c),
            "allgather": lambda c=known[("allgather", x.shape, x.dtype, None)].prepared: seg.allgather_equal(x, g, c),
            "reduce_scatter": lambda c=known[("reduce_scatter", whole.shape, whole.dtype, ("sum", None))].prepared:
                seg.reduce_scatter(whole, part, c),
            "barrier": lambda c=known[("barrier",)].prepared: seg.barrier(c),
        }
    samples: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, (ddl_call, mpi_call) in calls.items():
            ways = {"ddl": ddl_call, "mpi": mpi_call}
            if name in native:
                ways["native"] = native[name]
            for way, fn in ways.items():
                samples.setdefault(f"{name} {way}", []).append(per_call(fn, mpi.Barrier))
    out = {"ranks": p, "host_level": comm.host_level, **{k: statistics.median(v) for k, v in samples.items()}}
    return out


def alone(repeats: int) -> dict:
    """Every call form of the public API in a job of one rank (this process, after the MPI job has ended)."""
    import ddl

    ddl.init()
    x, o = np.ones(2, np.float32), np.empty(2, np.float32)
    forms = {
        "allreduce(x)": lambda: ddl.allreduce(x),
        "allreduce(x, out=x)": lambda: ddl.allreduce(x, out=x),
        "allreduce(x, 'avg', out=o)": lambda: ddl.allreduce(x, "avg", out=o),
        "broadcast(x)": lambda: ddl.broadcast(x),
        "broadcast(x, out=x)": lambda: ddl.broadcast(x, 0, out=x),
        "allgather(x)": lambda: ddl.allgather(x),
        "allgather(x, out=o)": lambda: ddl.allgather(x, out=o),
        "reduce_scatter(x)": lambda: ddl.reduce_scatter(x),
        "reduce_scatter(x, out=o)": lambda: ddl.reduce_scatter(x, out=o),
        "barrier()": ddl.barrier,
    }
    for fn in forms.values():
        fn()
    return {name: statistics.median(per_call(fn, lambda: None) for _ in range(repeats)) for name, fn in forms.items()}


def report(results: dict, nranks: int) -> str:
    lines = [f"### {nranks} ranks on one host (host level {'on' if results['host_level'] else 'OFF'}), 8 B float32",
             "", "| collective | ddl (us) | native call (us) | Python's share (us) | MPI (us) | ddl / MPI |",
             "|---|---:|---:|---:|---:|---:|"]
    for name in ("allreduce", "broadcast", "allgather", "reduce_scatter", "barrier"):
        d, m, n = results[f"{name} ddl"], results[f"{name} mpi"], results.get(f"{name} native")
        native = f"{n:.2f}" if n is not None else "-"
        share = f"{d - n:.2f}" if n is not None else "-"
        lines.append(f"| {name} | {d:.2f} | {native} | {share} | {m:.2f} | {d / m:.2f} |")
    lines += ["", "### One rank, every call form (target: at most 1 us)", "", "| call | us |", "|---|---:|"]
    lines += [f"| `{name}` | {us:.2f} |" for name, us in results["alone"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    from ddl.tools.measure import self_launched

    sys.exit(self_launched(__file__, __doc__, worker, lambda results, n: report({**results, "alone": alone(7)}, n),
                           repeats=7))
