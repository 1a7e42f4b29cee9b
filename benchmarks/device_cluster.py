"""Allreduce of GPU arrays on the emulated clusters, side by side in one run: ddl with NCCL at every level, ddl
with NCCL in the node and the levels above staged over MPI, ddl as its cost model chooses, and NCCL alone.

    python benchmarks/device_cluster.py --topologies T1,T2 --sizes 1M,32M --out benchmarks/results/device-cluster.md
    python benchmarks/device_cluster.py --stand-ins --topologies T2 --sizes 1M     # a dry run without a GPU

Needs root (network namespaces, shaped links: ddl.cluster). On the machine the device tool lends, the ranks of
every emulated node share its one GPU through CUDA MPS, and NCCL crosses the emulated links over sockets
(NCCL_SOCKET_IFNAME=eth0, NCCL_IB_DISABLE=1; ../shared/reference/gpu-machine.md says how to carry iproute2
there). --stand-ins runs the same jobs on tests/fakes' CUDA and NCCL: the machinery end to end, but the stand-in
NCCL moves bytes through shared memory, not over the links, so its times mean nothing. A time is the median
over repeats of the slowest rank's call; algbw/busbw in nccl-tests' units, the topology's lower bound beside,
and each case's time against NCCL alone's (the issue's target: ddl at least 1.8x NCCL alone's speed on T2 at 32
MiB, 1.1x on T1).
"""
import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE / "device_cluster_job.py"
NCCL = "NCCL alone (torch nccl)"


def run(name: str, sizes: str, repeats: int, stand_ins: bool, cases: str = None) -> dict:
    from ddl.cluster import Cluster
    from ddl.cluster import spec as emulate

    with Cluster(emulate.topology(name)) as cluster:
        env = {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"}
        for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "DDL_BENCH_MPS"):
            if key in os.environ:
                env[key] = os.environ[key]
        if stand_ins:
            sys.path.insert(0, str(HERE.parent / "tests"))
            from fakes import build

            env.update(build(tempfile.mkdtemp(prefix="ddl-fakes-", dir=cluster.workdir)))
            # (the stand-ins spin: 8 ranks' stream threads on a small machine can leave a member off a step of the
            # stand-in NCCL for over its default minute, which then fails that collective)
            env["FAKE_NCCL_TIMEOUT"] = "600"
        out = cluster.workdir / "device.json"
        argv = [sys.executable, str(JOB), "--sizes", sizes, "--repeats", str(repeats), "--out", str(out)]
        argv += ["--cases", cases] if cases else []
        done = cluster.mpirun(argv + (["--stand-ins"] if stand_ins else []), env=env, timeout=1200, capture=True,
                              quiet=True)
        if done.returncode:
            raise RuntimeError(f"{name}: the job failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                               f"{done.stderr[-3000:]}")
        return {"topology": name, **json.loads(out.read_text())}


def table(result: dict) -> str:
    from ddl.planner.explain import bandwidth
    from ddl.units import format_size

    n = result["ranks"]
    lines = [f"### {result['topology']}: {n} ranks, {result['device']}"
             f"{', CUDA MPS' if result.get('mps') else ''}", "",
             "| size | case | time (ms) | algbw GB/s | busbw GB/s | of the bound | vs NCCL alone |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        nccl = row["seconds"].get(NCCL)
        for case, seconds in row["seconds"].items():
            alg, bus = bandwidth(row["bytes"], seconds, n)
            versus = f"{nccl / seconds:.2f}x" if nccl else "-"
            lines.append(f"| {format_size(row['bytes'])} | {case} | {seconds * 1e3:.2f} | {alg:.3f} | {bus:.3f} | "
                         f"{row['bound_seconds'] / seconds:.2f} | {versus} |")
        levels = ", ".join(f"{lv['name']}: {lv['transport']}" for lv in row["auto"]["levels"])
        lines.append(f"| | ddl (auto) chose | {levels} | | | | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topologies", default="T1,T2")
    ap.add_argument("--sizes", default="1M,32M")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--stand-ins", action="store_true", help="tests/fakes' CUDA and NCCL: no GPU needed")
    ap.add_argument("--cases", help="DDL_NCCL_LEVELS settings to compare, e.g. all,all/4,2,1,auto (all/4: every "
                    "level on NCCL in up to 4 blocks, a wavefront); default all, 1 and auto")
    ap.add_argument("--out", help="write the tables here (markdown)")
    args = ap.parse_args(argv)
    tables = [table(run(name, args.sizes, args.repeats, args.stand_ins, args.cases)) for name in args.topologies.split(",")]
    text = "\n\n".join(tables)
    print(text)
    if args.out:
        Path(args.out).write_text(f"# Allreduce of GPU arrays on the emulated clusters\n\n"
                                  f"`python benchmarks/device_cluster.py {' '.join(argv or sys.argv[1:])}`\n\n"
                                  f"{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
