"""Horovod's synthetic benchmark (ResNet-18, batch 8 per rank, 224x224) on the emulated T2 cluster with 4
ranks (2 racks x 2 nodes x 1 rank, NICs 1 Gbit/s, rack uplinks 500 Mbit/s), as root:

    python benchmarks/horovod_synthetic.py [--horovod-python /tmp/hvd/bin/python]

Side by side, in one run, each peer on the same cluster: examples/horovod/pytorch_synthetic_benchmark.py on
ddl (ddl.horovod.torch, gradients averaged during backward), the same script with Horovod's import line on a
real Horovod 0.28.1 (its horovodrun, gloo, across the nodes through an ssh shim; `sh benchmarks/build_horovod.sh
torch VENV` builds one; left out where none is given), PyTorch DDP on gloo
(benchmarks/ddp_synthetic_job.py), and the ranks' compute alone (no averaging: the ceiling). Beside them, the
communication's lower bound per step for ResNet-18's gradients on this topology, and the images per second
it allows. One thread per rank (the machine has fewer cores than ranks). Writes
benchmarks/results/horovod-synthetic.md (and .json).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples" / "horovod"
SCRIPT = EXAMPLES / "pytorch_synthetic_benchmark.py"
SPEC = "2x2x1:nic=1gbit:uplink=500mbit"
GRADIENT_BYTES = 11_689_512 * 4  # ResNet-18's parameters, float32
TOTAL = re.compile(r"Total img/sec on (\d+) CPU\(s\): ([0-9.]+) \+-([0-9.]+)")
# ssh's place for horovodrun: drop ssh's options, enter the node with the cluster's agent
SSH_SHIM = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -o|-p|-i|-l|-F) shift 2 ;; -*) shift ;; *) break ;; esac; done
host=$1; shift
while [ $# -gt 0 ]; do case "$1" in -o|-p|-i|-l|-F) shift 2 ;; -*) shift ;; *) break ;; esac; done  # after it too
exec %(agent)s "$host" "$@"
"""


def total(text: str, label: str) -> tuple[float, float]:
    m = TOTAL.search(text)
    if not m:
        raise RuntimeError(f"{label}: no 'Total img/sec' line:\n{text[-3000:]}")
    return float(m.group(2)), float(m.group(3))


def horovod_on_cluster(cluster, python: str, args: list[str], workdir: Path) -> str:
    """Real horovodrun started on the cluster's first node, reaching the others through an ssh shim."""
    script = workdir / "pytorch_synthetic_benchmark.py"
    script.write_text(SCRIPT.read_text().replace("import ddl.horovod.torch as hvd", "import horovod.torch as hvd"))
    (workdir / "resnet.py").write_text((EXAMPLES / "resnet.py").read_text())
    shim_dir = workdir / "bin"
    shim_dir.mkdir()
    (shim_dir / "ssh").write_text(SSH_SHIM % {"agent": cluster.workdir / "agent.sh"})
    (shim_dir / "ssh").chmod(0o755)
    slots = ",".join(f"{h}:{cluster.rank_hosts.count(h)}" for h in dict.fromkeys(cluster.rank_hosts))
    horovodrun = str(Path(python).parent / "horovodrun")
    cmd = ["env", f"PATH={shim_dir}:{os.environ['PATH']}", "OMP_NUM_THREADS=1", horovodrun,
           "-np", str(cluster.nranks), "-H", slots, "--gloo", "--network-interface", "eth0", "--start-timeout", "60",
           python, str(script), *args]
    done = subprocess.run(cluster.exec_argv(cluster.rank_hosts[0], cmd), capture_output=True, text=True,
                          timeout=1800, cwd=workdir)
    if done.returncode:
        raise RuntimeError(f"horovodrun failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--horovod-python", help="a real Horovod's interpreter (toolchain.md §9)")
    ap.add_argument("--iters", type=int, default=3, help="benchmark iterations of 5 batches each (default 3)")
    ap.add_argument("--out", default=str(HERE / "results" / "horovod-synthetic"))
    args = ap.parse_args()

    from ddl import planner
    from ddl.cluster import Cluster
    from ddl.cluster import spec as emulate

    bench = ["--model", "resnet18", "--batch-size", "8", "--num-warmup-batches", "2", "--num-batches-per-iter",
             "5", "--num-iters", str(args.iters)]
    env = {"OMP_NUM_THREADS": "1"}
    t = emulate.topology(SPEC)
    results: dict[str, tuple[float, float]] = {}
    with Cluster(t) as cluster, tempfile.TemporaryDirectory() as tmp:
        def mpirun(argv: list[str], label: str) -> None:
            done = cluster.mpirun(argv, env=env, timeout=1800, quiet=True, capture=True)
            if done.returncode:
                raise RuntimeError(f"{label} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                                   f"{done.stderr[-3000:]}")
            results[label] = total(done.stdout, label)
            print(f"{label}: {results[label][0]:.1f} img/sec", file=sys.stderr, flush=True)

        mpirun([sys.executable, str(SCRIPT), *bench], "ddl (ddl.horovod.torch)")
        if args.horovod_python:
            results["Horovod 0.28.1 (gloo)"] = total(
                horovod_on_cluster(cluster, args.horovod_python, bench, Path(tmp)), "horovod")
            print(f"horovod: {results['Horovod 0.28.1 (gloo)'][0]:.1f} img/sec", file=sys.stderr, flush=True)
        job = [sys.executable, str(HERE / "ddp_synthetic_job.py"), *bench[2:]]
        mpirun(job + ["--peer", "ddp-gloo"], "PyTorch DDP (gloo)")
        mpirun(job + ["--peer", "compute"], "compute alone (no averaging)")
        tree, levels = t.hierarchy(t.place(None, t.capacity()))
        bound = planner.lower_bound(planner.Shape.of(tree), levels, GRADIENT_BYTES)[0]

    ranks, batch = t.capacity(), 8
    compute_step = ranks * batch / results["compute alone (no averaging)"][0]
    command = "python benchmarks/horovod_synthetic.py" + (f" --horovod-python {args.horovod_python}"
                                                          if args.horovod_python else "")
    lines = ["# Horovod's synthetic benchmark on the emulated T2 cluster, 4 ranks", "",
             f"Produced by `{command}` on {datetime.date.today()} ({platform.node()}, {os.cpu_count()} cores). "
             f"ResNet-18 (11.7 M parameters: {GRADIENT_BYTES / 1e6:.1f} MB of float32 gradients a step), batch 8 "
             f"per rank, 224x224 synthetic images, SGD; `{SPEC}` (2 racks x 2 nodes x 1 rank); one thread per "
             f"rank. Mean of {args.iters} iterations of 5 batches after 2 warm-up batches, ± 1.96 standard "
             "deviations; all peers in one run on one cluster.", "",
             "| peer | images/s (all ranks) | step (s) | vs ddl |", "|:---|---:|---:|---:|"]
    ours = results["ddl (ddl.horovod.torch)"][0]
    for label, (rate, conf) in results.items():
        lines.append(f"| {label} | {rate:.1f} ± {conf:.1f} | {ranks * batch / rate:.2f} | {rate / ours:.2f} |")
    lines += ["", f"Communication's lower bound per step for {GRADIENT_BYTES / 1e6:.1f} MB on this topology: "
              f"{bound:.2f} s. With the compute alone taking {compute_step:.2f} s a step, the images per second "
              f"can reach at most {ranks * batch / max(compute_step, bound):.1f} with perfect overlap and "
              f"{ranks * batch / (compute_step + bound):.1f} with none. The machine has {os.cpu_count()} cores "
              f"for {ranks} ranks: communication's own CPU work (reductions, copies, TCP) competes with the "
              "compute, which no overlap can hide."]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"results": results, "bound_s": bound,
                                                    "compute_step_s": compute_step, "spec": SPEC}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
