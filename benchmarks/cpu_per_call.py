"""What one large allreduce costs the CPUs of an emulated cluster (as root), ddl beside gloo and MPI in one job:

    python benchmarks/cpu_per_call.py --topology T1 --mbytes 26 --transports mpi,auto
    python benchmarks/cpu_per_call.py --topology T1 --mbytes 8e-6 --calls 500 --in-a-row --collective broadcast \
        --transports auto   # small calls: the CPU a call costs where the call's time is its CPU

The cores a collective takes are the cores DDP's backward does not get (8 ranks share 2 cores here). For each
DDL_TRANSPORT setting one job runs, per library, CALLS calls of a float32 sum allreduce, each started together:
ddl blocking, ddl submitted while its caller sleeps (as DDP's buckets are: nobody waits on them), gloo, MPI's
own. Per call: the slowest rank's time (median), CPU-seconds (user and system) summed over every rank, and the
bytes the hosts sent, on loopback (within a host) and on their NICs. ``--in-a-row``: the calls run back to back
after one barrier, time = the slowest rank's whole loop / calls (a small call's own cost, no barrier's beside
it: with 8 ranks on 2 cores a small call's time is the CPU it takes, all ranks' per call / 2). ``--collective
broadcast``: broadcasts from rank 0 instead. ``--copies MB``: each library's call once more beside a memory copy of
MB per rank made while it runs (started asynchronously, the copy, then waited on: DDP's end of backward, which
copies the earlier buckets' results into the gradients while the last bucket's allreduce runs), and the copy
alone; on this VM the copy and the transfers share the memory bandwidth as well as the cores.

    python benchmarks/cpu_per_call.py --topology T1 --mbytes 21.1 --copies 81 --calls 8 --transports auto
"""
import argparse
import os
import resource
import socket
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIBRARIES = ("ddl", "ddl submitted", "gloo", "mpi")


def sent_bytes() -> dict:
    """Bytes sent per network interface of this rank's host (its network namespace)."""
    out = {}
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, rest = line.split(":", 1)
        out[name.strip()] = int(rest.split()[8])
    return out


def worker(mbytes: float, calls: int, collective: str = "allreduce", in_a_row: bool = False,
           copies: float = 0.0) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import ddl
    from ddl.tools.measure import init_torch

    comm = MPI.COMM_WORLD
    ddl.init()
    init_torch(comm)
    n = int(mbytes * 1e6) // 4
    a, t = np.ones(n, np.float32), torch.ones(n)

    def submitted(handle):
        while not handle.done():
            time.sleep(0.002)  # the caller works elsewhere (backward); it looks now and then

    run = {"allreduce": {"ddl": lambda: ddl.allreduce(a, "sum", out=a),
                         "ddl submitted": lambda: submitted(ddl.allreduce_async(a, "sum", out=a)),
                         "gloo": lambda: dist.all_reduce(t),
                         "mpi": lambda: comm.Allreduce(MPI.IN_PLACE, a)},
           "broadcast": {"ddl": lambda: ddl.broadcast(a, root=0, out=a),
                         "ddl submitted": lambda: submitted(ddl.broadcast_async(a, root=0)),
                         "gloo": lambda: dist.broadcast(t, 0),
                         "mpi": lambda: comm.Bcast(a, root=0)}}[collective]
    if copies:
        source = np.ones(int(copies * 1e6) // 4, np.float32)
        target = np.empty_like(source)

        def beside_copy(start):  # start() begins the call and returns what waits for it
            def call():
                wait = start()
                np.copyto(target, source)
                wait()
            return call

        begin = {"allreduce": {"ddl": lambda: ddl.allreduce_async(a, "sum", out=a).wait,
                               "gloo": lambda: dist.all_reduce(t, async_op=True).wait,
                               "mpi": lambda: comm.Iallreduce(MPI.IN_PLACE, a).Wait},
                 "broadcast": {"ddl": lambda: ddl.broadcast_async(a, root=0).wait,
                               "gloo": lambda: dist.broadcast(t, 0, async_op=True).wait,
                               "mpi": lambda: comm.Ibcast(a, root=0).Wait}}[collective]
        for library, start in begin.items():
            run[f"{library} beside copy"] = beside_copy(start)
        run["copy alone"] = lambda: np.copyto(target, source)

    rows = []
    # (in a row, a submitted call's time would be its caller's 2 ms naps: left out)
    libraries = [lib for lib in LIBRARIES if not (in_a_row and lib == "ddl submitted")]
    for library in libraries + [k for k in run if k not in LIBRARIES]:
        one = run[library]
        one()  # plans, connections, warm caches
        times = []
        if in_a_row:
            comm.Barrier()
        r0, n0 = resource.getrusage(resource.RUSAGE_SELF), sent_bytes()
        if in_a_row:
            t0 = time.perf_counter()
            for _ in range(calls):
                one()
            took = time.perf_counter() - t0
        else:
            for _ in range(calls):
                comm.Barrier()
                t0 = time.perf_counter()
                one()
                times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        r1, n1 = resource.getrusage(resource.RUSAGE_SELF), sent_bytes()
        if in_a_row:
            times.append(comm.allreduce(took, op=MPI.MAX) / calls)
        user = comm.allreduce(r1.ru_utime - r0.ru_utime) / calls
        system = comm.allreduce(r1.ru_stime - r0.ru_stime) / calls
        per_host = {}
        for host, sent in comm.allgather((socket.gethostname(), {k: n1[k] - n0.get(k, 0) for k in n1})):
            per_host[host] = sent  # (ranks of one host share its counters)
        loopback = sum(s.get("lo", 0) for s in per_host.values()) / calls
        nics = sum(v for s in per_host.values() for k, v in s.items() if k != "lo") / calls
        rows.append((library, statistics.median(times), user, system, loopback, nics))
    if comm.rank == 0:
        transport = ddl.communicator()._executor.transport
        for library, wall, user, system, loopback, nics in rows:
            print(f"| {transport} | {library} | {wall * 1e3:.3f} | {user + system:.5f} ({user:.5f} + {system:.5f}) "
                  f"| {loopback / 1e6:.3f} | {nics / 1e6:.3f} |", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topology", default="T1")
    ap.add_argument("--mbytes", type=float, default=26.0, help="MB per allreduce (26: a DDP bucket of ResNet-50)")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--transports", default="mpi,auto", help="DDL_TRANSPORT settings, one job each")
    ap.add_argument("--collective", choices=("allreduce", "broadcast"), default="allreduce")
    ap.add_argument("--in-a-row", action="store_true", help="calls back to back after one barrier (small calls)")
    ap.add_argument("--copies", type=float, default=0.0,
                    help="MB per rank copied in memory beside a second call of each library (DDP's end of backward)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.mbytes, args.calls, args.collective, args.in_a_row, args.copies)
        return 0
    from ddl.cluster import Cluster
    from ddl.cluster import spec as emulate

    print(f"{args.topology}, {args.mbytes:g} MB float32 {'sum allreduce' if args.collective == 'allreduce' else 'broadcast'}"
          f", {args.calls} calls per library{' in a row' if args.in_a_row else ''}"
          f"{f', and beside a copy of {args.copies:g} MB a rank' if args.copies else ''}\n")
    print("| ddl's transport | library | time (ms) | CPU-s per call, all ranks (user + system) | sent on loopback "
          "(MB) | sent on NICs (MB) |\n|:---|:---|---:|---:|---:|---:|")
    for transport in args.transports.split(","):
        with Cluster(emulate.topology(args.topology)) as cluster:
            done = cluster.mpirun([sys.executable, __file__, "--worker", "--mbytes", str(args.mbytes),
                                   "--calls", str(args.calls), "--collective", args.collective]
                                  + (["--in-a-row"] if args.in_a_row else []) + ["--copies", str(args.copies)],
                                  env={"DDL_TRANSPORT": transport},
                                  timeout=900, quiet=True, capture=True)
        if done.returncode:
            print(f"DDL_TRANSPORT={transport}: the job failed ({done.returncode}):\n{done.stderr[-3000:]}",
                  file=sys.stderr)
            return 1
        print("\n".join(line for line in done.stdout.splitlines() if line.startswith("|")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
