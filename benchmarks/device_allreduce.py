"""Allreduce of GPU arrays against the host path, side by side in one run, with the copy bandwidths beside.

    python benchmarks/device_allreduce.py                 # 4 ranks on this host's GPU(s), self-launched
    python benchmarks/device_allreduce.py --np 2 --out benchmarks/results/device.md

Per size, in rotating order, median over repeats: ddl.allreduce of a torch CUDA tensor with every level over
MPI (DDL_NCCL_LEVELS=0: staged through pinned memory, each rank its own node — what one shared GPU allows),
the same with NCCL groups of two ranks (pairs share a GPU as separate NCCL hosts, NCCL_HOSTID), and
ddl.allreduce of a numpy array of the same bytes (the host path, no staging). The staging overhead is the
device time over the host time. Copy bandwidths: pinned device->host and host->device of the same bytes
(torch, timed with CUDA events). algbw/busbw in nccl-tests' units; the cost model's lower bound beside.
"""
import os
import statistics
import sys
import time

SIZES = [1 << 20, 16 << 20, 64 << 20, 256 << 20]


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
    from mpi4py import MPI

    from ddl.core.communicator import Communicator

    os.environ.setdefault("NCCL_HOSTID", f"ddl-bench-rank{MPI.COMM_WORLD.rank}")
    size = MPI.COMM_WORLD.size
    os.environ["DDL_NCCL_LEVELS"] = "0"
    staged = Communicator.from_mpi(MPI.COMM_WORLD)
    pairs = None
    if size % 2 == 0 and size > 2:
        os.environ["DDL_NCCL_LEVELS"] = "auto"
        pairs = Communicator.from_mpi(MPI.COMM_WORLD, hierarchy=[[i, i + 1] for i in range(0, size, 2)])
    rows = []
    for nbytes in SIZES:
        x = torch.full((nbytes // 4,), 1.0, device="cuda")
        h = np.ones(nbytes // 4, np.float32)
        cases = {"device, MPI levels (staged)": lambda: staged.allreduce(x, out=x),
                 "host path (numpy)": lambda: staged.allreduce(h, out=h)}
        if pairs is not None:
            cases["device, NCCL pairs + MPI"] = lambda: pairs.allreduce(x, out=x)
        for run in cases.values():
            run()
        torch.cuda.synchronize()
        samples = {k: [] for k in cases}
        names = list(cases)
        for r in range(repeats):
            for k in names[r % len(names):] + names[:r % len(names)]:
                x.fill_(1.0)
                h.fill(1.0)
                torch.cuda.synchronize()
                staged.barrier()
                start = time.perf_counter()
                cases[k]()
                torch.cuda.synchronize()
                samples[k].append(time.perf_counter() - start)
                got = float(x[-1]) if k.startswith("device") else float(h[-1])
                assert got == size, f"{k}: {got} != {size}"
        d2h, h2d = copy_bandwidth(torch, nbytes, repeats)
        bound = staged.explain(nbytes).to_dict()["lower_bound_seconds"]
        rows.append({"bytes": nbytes, "seconds": {k: statistics.median(v) for k, v in samples.items()},
                     "d2h_GBps": d2h, "h2d_GBps": h2d, "bound_seconds": bound})
    return {"ranks": size, "gpu": torch.cuda.get_device_name(), "rows": rows}


def report(results: dict) -> str:
    from ddl.tools.measure import bandwidth

    n = results["ranks"]
    lines = [f"# Device allreduce against the host path ({n} ranks sharing {results['gpu']})", "",
             "Median over repeats; algbw/busbw in GB/s (nccl-tests' units); staging overhead = device time / "
             "host time; copies pinned, one direction at a time.", "",
             "| bytes | case | time (us) | algbw | busbw | x host path | bound (us) | D2H GB/s | H2D GB/s |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in results["rows"]:
        host = row["seconds"]["host path (numpy)"]
        for k, s in row["seconds"].items():
            alg, bus = bandwidth(row["bytes"], s * 1e6, n)
            lines.append(f"| {row['bytes']} | {k} | {s * 1e6:.0f} | {alg:.2f} | {bus:.2f} | {s / host:.2f} | "
                         f"{row['bound_seconds'] * 1e6:.0f} | {row['d2h_GBps']:.1f} | {row['h2d_GBps']:.1f} |")
    return "\n".join(lines)


def main() -> int:
    from ddl.tools.measure import self_launched

    return self_launched(__file__, __doc__, worker, lambda results, n: report(results), repeats=9)


if __name__ == "__main__":
    sys.exit(main())
