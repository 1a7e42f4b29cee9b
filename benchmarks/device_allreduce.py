"""Allreduce of GPU arrays against NCCL alone and the host path, side by side in one run, with the copy
bandwidths beside.

    python benchmarks/device_allreduce.py                 # 4 ranks on this host's GPU(s), self-launched
    python benchmarks/device_allreduce.py --np 2 --out benchmarks/results/device.md

Per size, in rotating order, median over repeats (a sample of a small size is the mean of a burst of calls):
ddl.allreduce of a torch CUDA tensor as a user gets it (one host: one NCCL group of every rank), the same with
every level over MPI (DDL_NCCL_LEVELS=0: staged through pinned memory, each rank its own node), with NCCL
groups of two ranks (4+ ranks: pairs, MPI between them: DDL_NCCL_LEVELS=1) and with NCCL at both levels of
that tree (DDL_NCCL_LEVELS=all), torch.distributed's "nccl" allreduce of the same
tensor (NCCL alone: the peer), and ddl.allreduce of a numpy array of the same bytes (the host path). Ranks that
share a GPU are separate NCCL hosts (NCCL_HOSTID); run under CUDA MPS for their kernels to run together
(DDL_BENCH_MPS=1 says so in the table). Copy bandwidths: pinned device->host and host->device (CUDA events).
algbw/busbw in nccl-tests' units; the cost model's lower bound beside.
"""
import os
import statistics
import sys
import time

SIZES = [8, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
BURST_BELOW = 1 << 20  # sizes under this are timed as bursts of BURST calls
BURST = 20
NCCL = "NCCL alone (torch nccl)"
HOST = "host path (numpy)"


def copy_bandwidth(torch, nbytes: int, repeats: int) -> tuple[float, float]:
    """GB/s of pinned device->host and host->device copies of nbytes."""
    dev = torch.empty(nbytes // 4, device="cuda")
    host = torch.empty(nbytes // 4, pin_memory=True)
    out = []
    for src, dst in ((dev, host), (host, dev)):
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        out.append(nbytes / statistics.median(times) / 1e9)
    return out[0], out[1]


def worker(repeats: int) -> dict:
    import numpy as np
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    from ddl.core.communicator import Communicator
    from ddl.tools.measure import init_torch

    os.environ.setdefault("NCCL_HOSTID", f"ddl-bench-rank{MPI.COMM_WORLD.rank}")
    size = MPI.COMM_WORLD.size
    torch.cuda.set_device(0)
    init_torch(MPI.COMM_WORLD, "nccl")
    def made(levels: str, hierarchy=None):
        """A communicator whose device path has these levels (DDL_NCCL_LEVELS as it is made), made at once."""
        os.environ["DDL_NCCL_LEVELS"] = levels
        comm = Communicator.from_mpi(MPI.COMM_WORLD, hierarchy=hierarchy)
        comm.allreduce(torch.ones(1, device="cuda"))
        return comm

    default, staged = made("auto"), made("0")
    tree = [[i, i + 1] for i in range(0, size, 2)]
    pairs = made("1", tree) if size % 2 == 0 and size > 2 else None
    every = made("all", tree) if size % 2 == 0 and size > 2 else None
    assert default.road.named("device")._paths[0].lead.nranks == size, "the default is one NCCL group"
    rows = []
    for nbytes in SIZES:
        count = max(1, nbytes // 4)
        x = torch.full((count,), 1.0, device="cuda")
        h = np.ones(count, np.float32)
        cases = {"ddl (one NCCL group)": lambda: default.allreduce(x, out=x),
                 "ddl, MPI levels (staged)": lambda: staged.allreduce(x, out=x),
                 NCCL: lambda: dist.all_reduce(x),
                 HOST: lambda: staged.allreduce(h, out=h)}
        if pairs is not None:
            cases["ddl, NCCL pairs + MPI"] = lambda: pairs.allreduce(x, out=x)
            cases["ddl, NCCL at both levels"] = lambda: every.allreduce(x, out=x)
        burst = BURST if nbytes < BURST_BELOW else 1

        def reset():
            x.fill_(1.0)
            h.fill(1.0)

        def check(k):
            got = float(h[-1]) if k == HOST else float(x[-1])
            want = float(size) ** burst  # (float32 rounds it where size is no power of two)
            assert abs(got - want) <= 1e-5 * want, f"{k}: {got} != {want}"

        seconds = timed(torch, staged, cases, repeats, burst, reset, check)
        d2h, h2d = copy_bandwidth(torch, max(nbytes, 4), repeats)
        bound = staged.explain(nbytes).to_dict()["lower_bound_seconds"]
        rows.append({"bytes": nbytes, "seconds": seconds, "d2h_GBps": d2h, "h2d_GBps": h2d,
                     "bound_seconds": bound})
    others = sharded_collectives(torch, dist, default, size, repeats)
    dist.destroy_process_group()
    return {"ranks": size, "gpu": torch.cuda.get_device_name(), "mps": os.environ.get("DDL_BENCH_MPS") == "1",
            "rows": rows, "others": others}


def sharded_collectives(torch, dist, comm, size: int, repeats: int) -> list:
    """reduce-scatter and allgather of CUDA tensors (FSDP's collectives): ddl's device path against NCCL alone,
    ``nbytes`` the whole buffer; in rotating order, median over repeats."""
    out = []
    for nbytes in (64 << 10, 1 << 20, 16 << 20, 64 << 20):
        whole = torch.ones(nbytes // 4, device="cuda")
        part = torch.ones(nbytes // 4 // size, device="cuda")
        cases = {("reduce_scatter", "ddl"): lambda: comm.reduce_scatter(whole.view(size, -1), "sum",
                                                                       out=part.view(1, -1)),
                 ("reduce_scatter", "NCCL alone"): lambda: dist.reduce_scatter_tensor(part, whole),
                 ("allgather", "ddl"): lambda: comm.allgather(part.view(1, -1), out=whole.view(size, -1)),
                 ("allgather", "NCCL alone"): lambda: dist.all_gather_into_tensor(whole, part)}
        seconds = timed(torch, comm, cases, repeats, BURST if nbytes < BURST_BELOW else 1)
        out += [{"collective": c, "who": who, "bytes": nbytes, "seconds": t} for (c, who), t in seconds.items()]
    return out


def timed(torch, comm, cases: dict, repeats: int, burst: int, reset=lambda: None, check=lambda k: None) -> dict:
    """Each case's median seconds per call: every case once to warm up, then ``repeats`` rounds in rotating
    order, each a burst of calls between barriers and device synchronisations (``reset`` before, ``check``
    after each)."""
    for run in cases.values():
        run()
    samples = {k: [] for k in cases}
    names = list(cases)
    for r in range(repeats):
        for k in names[r % len(names):] + names[:r % len(names)]:
            reset()
            torch.cuda.synchronize()
            comm.barrier()
            start = time.perf_counter()
            for _ in range(burst):
                cases[k]()
            torch.cuda.synchronize()
            samples[k].append((time.perf_counter() - start) / burst)
            check(k)
    return {k: statistics.median(v) for k, v in samples.items()}


def report(results: dict) -> str:
    from ddl.tools.measure import bandwidth

    n = results["ranks"]
    mps = "under CUDA MPS" if results.get("mps") else "without CUDA MPS (time-sliced)"
    lines = [f"# Device allreduce against NCCL alone and the host path ({n} ranks sharing {results['gpu']}, "
             f"{mps})", "",
             "Median over repeats; algbw/busbw in GB/s (nccl-tests' units); x NCCL = time / NCCL alone's time; "
             "x host = time / the host path's; copies pinned, one direction at a time.", "",
             "| bytes | case | time (us) | algbw | busbw | x NCCL | x host | bound (us) | D2H GB/s | H2D GB/s |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in results["rows"]:
        host, nccl = row["seconds"][HOST], row["seconds"][NCCL]
        for k, s in row["seconds"].items():
            alg, bus = bandwidth(row["bytes"], s * 1e6, n)
            lines.append(f"| {row['bytes']} | {k} | {s * 1e6:.0f} | {alg:.2f} | {bus:.2f} | {s / nccl:.2f} | "
                         f"{s / host:.2f} | {row['bound_seconds'] * 1e6:.0f} | {row['d2h_GBps']:.1f} | "
                         f"{row['h2d_GBps']:.1f} |")
    lines += ["", "## reduce-scatter and allgather (FSDP's collectives)", "",
              "bytes: the whole buffer (each rank's part is 1/ranks of it); busbw in nccl-tests' units.", "",
              "| collective | bytes | who | time (us) | busbw | x NCCL |", "|---|---:|---|---:|---:|---:|"]
    nccl = {(o["collective"], o["bytes"]): o["seconds"] for o in results.get("others", ()) if o["who"] != "ddl"}
    for o in results.get("others", ()):
        _, bus = bandwidth(o["bytes"], o["seconds"] * 1e6, n, o["collective"])
        lines.append(f"| {o['collective']} | {o['bytes']} | {o['who']} | {o['seconds'] * 1e6:.0f} | {bus:.2f} | "
                     f"{o['seconds'] / nccl[o['collective'], o['bytes']]:.2f} |")
    return "\n".join(lines)


def main() -> int:
    from ddl.tools.measure import self_launched

    return self_launched(__file__, __doc__, worker, lambda results, n: report(results), repeats=9)


if __name__ == "__main__":
    sys.exit(main())
