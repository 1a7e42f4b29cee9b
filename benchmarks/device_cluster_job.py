"""One MPI job of benchmarks/device_cluster.py on an emulated cluster: allreduce of GPU arrays, per size, ddl with
NCCL at every level (DDL_NCCL_LEVELS=all), ddl with NCCL in the node and the levels above staged over MPI
(DDL_NCCL_LEVELS=1), ddl as its cost model chooses (auto), and NCCL alone (torch.distributed's "nccl", on a
GPU only), in rotating order; a sample is the slowest rank's time of one call after a barrier, the device
synchronised. Rank 0 writes JSON: per case and size the median seconds, the lower bound of ddl's topology, the
transports ddl's cost model chose, and the device.

    mpiexec ... python benchmarks/device_cluster_job.py --sizes 1M,32M --repeats 5 --out r.json [--stand-ins]

--stand-ins: the stand-in CUDA and NCCL of tests/fakes (DDL_CUDA_DRIVER, DDL_NCCL_LIBRARY set by the driver):
a dry run of the machinery on a machine without a GPU; the stand-in NCCL moves bytes through shared memory, not
over the emulated links, so its times say nothing of speed.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

import numpy as np

CASES = {"ddl, NCCL at every level": "all", "ddl, NCCL in the node, staged above": "1", "ddl (auto)": "auto"}
# --cases: DDL_NCCL_LEVELS settings instead (e.g. all,2,1,auto); "all/4": every level on NCCL in up to 4
# blocks, a wavefront of NCCL group calls (ddl.gpu.path.MAX_BLOCKS; ddl's default is 1)
NCCL = "NCCL alone (torch nccl)"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stand-ins", action="store_true")
    ap.add_argument("--cases", help="DDL_NCCL_LEVELS settings to compare (default: all, 1 and auto)")
    args = ap.parse_args()
    from mpi4py import MPI

    # NCCL refuses two ranks of one communicator on one GPU of one host: each rank is a host of its own to NCCL
    # (the ranks of an emulated node then meet over sockets, as they must on one GPU)
    os.environ.setdefault("NCCL_HOSTID", f"{socket.gethostname()}-{MPI.COMM_WORLD.rank}")

    from ddl.core.communicator import Communicator
    from ddl.units import parse_size

    world = MPI.COMM_WORLD
    device = Device(args.stand_ins, world)
    from ddl.gpu import path

    chosen = CASES if not args.cases else {  # auto always runs: its choice is reported
        "ddl (auto)" if s == "auto" else f"ddl, DDL_NCCL_LEVELS={s}": s for s in args.cases.split(",") + ["auto"]}
    comms, cases = {}, {}
    for name, setting in chosen.items():
        levels, _, blocks = setting.partition("/")
        os.environ["DDL_NCCL_LEVELS"] = levels
        comms[name] = Communicator.from_mpi(world)
        cases[name] = call(comms[name], path, int(blocks) if blocks else path.MAX_BLOCKS)
    if device.torch is not None:
        cases[NCCL] = lambda x: device.dist.all_reduce(x)
    rows = []
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        x = device.ones(nbytes // 4)
        for run in cases.values():  # warm-up: groups made, buffers grown
            run(x)
            device.synchronize()
        samples = {k: [] for k in cases}
        names = list(cases)
        for r in range(args.repeats):
            for k in names[r % len(names):] + names[:r % len(names)]:
                device.fill(x, 1.0)
                device.synchronize()
                world.Barrier()
                start = time.perf_counter()
                cases[k](x)
                device.synchronize()
                samples[k].append(world.allreduce(time.perf_counter() - start, op=MPI.MAX))
                got = device.last(x)
                assert got == world.size, f"rank {world.rank}, {k}: {got} != {world.size}"
        explained = comms["ddl (auto)"].explain(nbytes)
        rows.append({"bytes": nbytes, "seconds": {k: statistics.median(v) for k, v in samples.items()},
                     "bound_seconds": explained.bound, "auto": explained.device.to_dict()})
    if world.rank == 0:
        with open(args.out, "w") as f:
            json.dump({"ranks": world.size, "device": device.name, "mps": os.environ.get("DDL_BENCH_MPS") == "1",
                       "rows": rows}, f)
    for c in comms.values():
        c.close()
    return 0


def call(comm, path, max_blocks: int):
    def run(x):
        saved, path.MAX_BLOCKS = path.MAX_BLOCKS, max_blocks
        try:
            comm.allreduce(x, out=x)
        finally:
            path.MAX_BLOCKS = saved
    return run


class Device:
    """The arrays the job reduces: torch CUDA tensors on a GPU (with torch's "nccl" group beside), or numpy
    arrays presented through the stand-in driver (tests/fakes)."""

    def __init__(self, stand_ins: bool, world):
        self.torch = self.dist = None
        if stand_ins:
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
            import fakes

            self.fakes, self.name = fakes, "stand-ins (no GPU: times mean nothing)"
            return
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(0)
        os.environ.setdefault("MASTER_ADDR", world.bcast(socket.gethostbyname(socket.gethostname())))
        os.environ.setdefault("MASTER_PORT", str(world.bcast(29500 + os.getpid() % 1000)))
        dist.init_process_group("nccl", rank=world.rank, world_size=world.size)
        self.torch, self.dist, self.name = torch, dist, torch.cuda.get_device_name()

    def ones(self, count: int):
        if self.torch is not None:
            return self.torch.ones(count, device="cuda")
        return self.fakes.FakeDeviceArray(np.ones(count, np.float32))

    def fill(self, x, value: float) -> None:
        if self.torch is not None:
            x.fill_(value)
        else:
            self.fakes.synchronize()
            x.host.fill(value)

    def synchronize(self) -> None:
        if self.torch is not None:
            self.torch.cuda.synchronize()
        else:
            self.fakes.synchronize()

    def last(self, x) -> float:
        return float(x[-1]) if self.torch is not None else float(x.host[-1])


if __name__ == "__main__":
    sys.exit(main())
