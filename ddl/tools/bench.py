"""ddl-bench: collective bandwidth in nccl-tests' format, with its peers side by side.

    ddl-bench --np 4 -b 8 -e 64M -f 2 --algo ddl,mpi
    ddl-bench --np 4 --collective allgather -d all

The main table is nccl-tests' own (``size count type redop root  time algbw busbw #wrong`` out of place, then
in place), for the first algorithm of ``--algo`` alone, so parsers written for nccl-tests read it unchanged.
The other algorithms run at each size in turn with it, so ratios are side by side in one run; they are
reported after the main table in a comparison table whose every line is a comment. busbw = algbw times
2(n-1)/n (allreduce), 1 (broadcast) or (n-1)/n (allgather and reduce_scatter, whose size is the whole). Results are
checked on inputs whose reduction is exact in every dtype; wrong elements are counted and make the exit
status non-zero.
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np

from ..config import launched_by_mpi
from .cli import Parser, one_line_errors, size
from .measure import AVERAGES, COLLECTIVES, OPS, Runner, bandwidth, measure

DTYPES = {"float": "float32", "float32": "float32", "half": "float16", "float16": "float16",
          "bfloat16": "bfloat16", "double": "float64", "float64": "float64", "int32": "int32", "int": "int32",
          "int64": "int64"}
ALL_DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64")


def numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def sizes(begin: int, end: int, factor: float | None = 2.0, step: int | None = None) -> list[int]:
    """nccl-tests' sweep: multiply by ``factor`` where given, else add ``step`` bytes."""
    out, s = [], begin
    while s <= end:
        out.append(s)
        s = int(s * factor) if factor and factor > 1 else s + max(1, step or 1)
    return out


def parser() -> Parser:
    ap = Parser(prog="ddl-bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("-b", "--minbytes", type=size, default=8)
    ap.add_argument("-e", "--maxbytes", type=size, default=64 << 20)
    ap.add_argument("-f", "--stepfactor", type=float, help="multiply the size by this (default 2)")
    ap.add_argument("-i", "--stepbytes", type=size, help="add this to the size (where -f is not given)")
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("-w", "--warmup_iters", type=int, default=5)
    ap.add_argument("-N", "--run_cycles", type=int, default=1, help="run the whole sweep this many times")
    ap.add_argument("-a", "--average", type=int, default=1, choices=sorted(AVERAGES),
                    help="time reported: 0 rank 0's, 1 average over ranks, 2 minimum, 3 maximum")
    ap.add_argument("-c", "--check", type=int, default=1, help="verify results (1) or not (0)")
    ap.add_argument("-d", "--datatype", default="float", choices=sorted(DTYPES) + ["all"])
    ap.add_argument("-o", "--op", default="sum", choices=list(OPS) + ["all"])
    ap.add_argument("-r", "--root", type=int, default=0, help="broadcast's root")
    ap.add_argument("-J", "--output_file", help="write the results as JSON (nccl-tests' layout)")
    ap.add_argument("--collective", default="allreduce", choices=COLLECTIVES)
    ap.add_argument("--min-seconds", type=float, default=0.2,
                    help="run more iterations where needed to time at least this long (0: exactly -n)")
    ap.add_argument("--algo", default="ddl,mpi", help="comma list of " + ", ".join(Runner.ALGOS))
    ap.add_argument("--np", type=int, default=0, help="launch this many ranks with mpiexec (this host)")
    return ap


def parse_args(argv):
    ap = parser()
    args = ap.parse_args(argv)
    if args.run_cycles < 1:
        ap.error("-N/--run_cycles must be at least 1 (nccl-tests' 0 runs forever; ddl-bench does not)")
    if args.iters < 1 or args.warmup_iters < 0:
        ap.error("-n must be at least 1 and -w at least 0")
    if args.stepfactor is not None and args.stepfactor <= 1 and not args.stepbytes:
        ap.error("-f must be greater than 1 (or give -i for a linear sweep)")
    if args.minbytes > args.maxbytes:
        ap.error(f"-b {args.minbytes} is larger than -e {args.maxbytes}")
    args.algos = [a for a in args.algo.split(",") if a]
    unknown = [a for a in args.algos if a not in Runner.ALGOS]
    if unknown or not args.algos:
        ap.error(f"unknown algorithm {','.join(unknown) or '(none)'} in --algo (known: {', '.join(Runner.ALGOS)})")
    if args.collective != "allreduce":
        if "ddl-ring" in args.algos:
            ap.error(f"--algo ddl-ring runs allreduce only, not {args.collective}")
        args.op = "sum"
    if args.stepfactor is None and args.stepbytes is None:
        args.stepfactor = 2.0
    return args


def launch_self(args, argv) -> int:
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


def header(args, n: int, hosts: int, mpi: str) -> str:
    how = AVERAGES[args.average]
    step = f"factor {args.stepfactor:g}" if args.stepfactor else f"step {args.stepbytes} B"
    top = " " * 35 + f"{'out-of-place':>30}{'in-place':>32}"
    names = (f"{'size':>10} {'count':>12} {'type':>8} {'redop':>6} {'root':>5} "
             f"{'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}  {'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}")
    units = (f"{'(B)':>10} {'(elements)':>12} {'':>8} {'':>6} {'':>5} "
             f"{'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}  {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7}")
    return "\n".join([
        f"# ddl-bench {args.collective}: {n} ranks on {hosts} host(s), {mpi}; main table: {args.algos[0]}",
        f"# minBytes {args.minbytes} maxBytes {args.maxbytes} step: {step} warmup iters: {args.warmup_iters} "
        f"iters: {args.iters} (at least {args.min_seconds} s) cycles: {args.run_cycles} validation: {args.check}",
        f"# time = {how} the mean per call",
        "#", "#" + top, "# " + names, "# " + units])


def row_text(rec: dict) -> str:
    def side(key):
        wrong = str(rec.get(f"{key}_wrong", "N/A"))
        return f"{rec[f'{key}_us']:>9.1f} {rec[f'{key}_algbw']:>7.3f} {rec[f'{key}_busbw']:>7.3f} {wrong:>6}"
    return (f"{rec['size']:>10} {rec['count']:>12} {rec['type']:>8} {rec['redop']:>6} {rec['root']:>5} "
            f"{side('out')}  {side('in')}")


def sweep(args, comm, runners, emit) -> list[dict]:
    """Every cycle, dtype, op and size, each algorithm in turn; ``emit(rec)`` gets each record as it lands."""
    dtypes = ALL_DTYPES if args.datatype == "all" else (DTYPES[args.datatype],)
    ops = OPS if args.op == "all" else (args.op,)
    n, rows = comm.size, []
    for cycle in range(args.run_cycles):
        for dtype in map(numpy_dtype, dtypes):
            for op in ops:
                for nbytes in sizes(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes):
                    for runner in runners:
                        if not runner.supports(dtype, op):
                            continue
                        rec = measure(runner, comm, nbytes // dtype.itemsize, dtype, op, args.iters,
                                      args.warmup_iters, bool(args.check), args.min_seconds, root=args.root,
                                      average=args.average)
                        rec.update(type=dtype.name, redop=op if args.collective == "allreduce" else "none",
                                   root=args.root if args.collective == "broadcast" else -1, algo=runner.algo,
                                   ranks=n, cycle=cycle)
                        for key in ("out", "in"):
                            rec[f"{key}_algbw"], rec[f"{key}_busbw"] = bandwidth(
                                rec["size"], rec[f"{key}_us"], n, args.collective)
                        rows.append(rec)
                        emit(rec)
    return rows


def comparison(rows: list[dict], algos: list[str]) -> list[str]:
    """The side-by-side table: every algorithm's in-place busbw, and its time over the first algorithm's."""
    if len(algos) < 2:
        return []
    first = algos[0]
    key = lambda r: (r["cycle"], r["type"], r["redop"], r["size"])
    by = {(key(r), r["algo"]): r for r in rows}
    lines = ["#", f"# Side by side (in-place busbw GB/s; time / {first}'s time, out-of-place and in-place):",
             "# " + f"{'size':>10} {'type':>8} {'redop':>6}" + "".join(f" {a:>26}" for a in algos)]
    for k in sorted({key(r) for r in rows if r["algo"] == first}):
        base = by[(k, first)]
        cells = []
        for a in algos:
            r = by.get((k, a))
            cells.append(f" {'-':>26}" if r is None else
                         f" {r['in_busbw']:>8.3f} {r['out_us'] / base['out_us']:>8.2f}x {r['in_us'] / base['in_us']:>6.2f}x")
        lines.append("# " + f"{k[3]:>10} {k[1]:>8} {k[2]:>6}" + "".join(cells))
    return lines


def as_nccl_tests_json(args, argv, rows: list[dict], n: int, hosts: int, mpi: str, wrong: int) -> dict:
    """nccl-tests' -J layout (config, results with out_of_place / in_place, out_of_bounds); the other
    algorithms' rows under ``peers`` in the same shape."""
    def entry(r):
        side = lambda k: {"time": r[f"{k}_us"], "alg_bw": r[f"{k}_algbw"], "bus_bw": r[f"{k}_busbw"],
                          "nwrong": r.get(f"{k}_wrong", "N/A")}
        return {"size": r["size"], "count": r["count"], "type": r["type"], "redop": r["redop"], "root": r["root"],
                "cycle": r["cycle"], "out_of_place": side("out"), "in_place": side("in")}
    first = args.algos[0]
    main_rows = [r for r in rows if r["algo"] == first]
    return {
        "version": 1, "tool": "ddl-bench", "args": list(argv if argv is not None else sys.argv[1:]),
        "collective": args.collective, "algo": first,
        "config": {"nranks": n, "hosts": hosts, "mpi": mpi, "minimum_bytes": args.minbytes,
                   "maximum_bytes": args.maxbytes, "step_factor": args.stepfactor, "step_bytes": args.stepbytes,
                   "iterations": args.iters, "warmup_iters": args.warmup_iters, "run_cycles": args.run_cycles,
                   "average": args.average, "validation": args.check, "min_seconds": args.min_seconds},
        "results": [entry(r) for r in main_rows],
        "peers": {a: [entry(r) for r in rows if r["algo"] == a] for a in args.algos[1:]},
        "out_of_bounds": {"count": wrong, "okay": "true" if wrong == 0 else "false"},
        "average_bus_bandwidth": (sum(r["in_busbw"] for r in main_rows) / len(main_rows)) if main_rows else 0.0,
        "end_time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


@one_line_errors("ddl-bench")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.np and not launched_by_mpi():
        return launch_self(args, argv)

    import ddl
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    ddl.init(comm)
    if args.collective == "broadcast" and not 0 <= args.root < comm.size:
        raise ValueError(f"-r {args.root} is not a rank (0..{comm.size - 1})")
    runners = [Runner(a, comm, args.collective) for a in args.algos]
    n, hosts, mpi = comm.size, ddl.num_hosts(), MPI.Get_library_version().splitlines()[0].strip("\x00 ")
    lead = comm.rank == 0
    if lead:
        print(header(args, n, hosts, mpi), flush=True)
    first = args.algos[0]
    rows = sweep(args, comm, runners,
                 lambda rec: lead and rec["algo"] == first and print("  " + row_text(rec), flush=True))
    wrong = sum(r.get("out_wrong", 0) + r.get("in_wrong", 0) for r in rows)
    if lead:
        main_rows = [r for r in rows if r["algo"] == first]
        print(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
        if main_rows:
            avg = sum(r["in_busbw"] for r in main_rows) / len(main_rows)
            print(f"# Avg bus bandwidth    : {avg:.3f} ({first}, in-place)")
        print("\n".join(comparison(rows, args.algos)))
        if args.output_file:
            with open(args.output_file, "w") as f:
                json.dump(as_nccl_tests_json(args, argv, rows, n, hosts, mpi, wrong), f, indent=1)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
