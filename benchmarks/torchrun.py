"""ddl launched by torchrun (no MPI launcher: the ranks join through torchrun's store) against the same job
launched over MPI by mpiexec, both on the MPICH 4 environment (make MPI=mpich setup), side by side in one run.

    python benchmarks/torchrun.py                          # T1 and T2 at 32 MiB, then one host's small sizes
    python benchmarks/torchrun.py --topologies T2 --rounds 1

On each emulated cluster (as root) every round runs benchmarks/allreduce_job.py twice, in alternating order:
with one torchrun per node meeting through a c10d rendezvous, and with MPICH's mpiexec. Neither is told the
topology: ddl sees hosts and probes for the switches (one probe, cached in the cluster's folder); between
nodes MPICH runs on TCP through its UCX module (--netmod; libfabric's tcp provider reached about half the bound
for both launchers alike). Then, on this
host, 2 processes under torchrun --standalone and under mpiexec time small allreduces (8 B to 64 KiB). A size's
time is the median over rounds and repeats. Writes benchmarks/results/torchrun.md and .json with the topology's
lower bound and efficiency (= bound / time), and checks issue 32's targets: on T1 and T2 at 32 MiB, torchrun
reaches >= 0.85 of the bound and <= 1.1x the mpiexec time; on one host, small sizes within 1.2x.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from topologies import JOB, ROOT, _size, bounds, busbw  # noqa: E402

MPICH = ROOT / ".venv-mpich" / "bin" / "python"
LAUNCHERS = ("torchrun", "mpiexec")


def job_argv(python: str, sizes: str, out: Path, repeats: int) -> list[str]:
    return [python, str(JOB), "--algos", "ddl", "--sizes", sizes, "--out", str(out), "--repeats", str(repeats)]


def collect(samples: dict, launcher: str, out: Path) -> None:
    for size, us in json.loads(out.read_text())["runs"]["ddl"].items():
        samples.setdefault(launcher, {}).setdefault(int(size), []).extend(us)


def on_cluster(name: str, sizes: str, rounds: int, repeats: int, netmod: str) -> dict:
    from ddl.cluster import Cluster, spec

    t = spec.topology(name)
    samples: dict = {}
    with Cluster(t) as c:
        env = {"DDL_PROBE_CACHE": str(c.workdir / "probe-cache")}
        for r in range(rounds):
            for launcher in (LAUNCHERS if r % 2 == 0 else LAUNCHERS[::-1]):
                out = c.workdir / f"{launcher}-{r}.json"
                argv = job_argv(str(MPICH), sizes, out, repeats)
                if launcher == "torchrun":
                    done = c.torchrun(argv[1:], env=env, timeout=900, python=str(MPICH), mpich_tcp=netmod)
                    failed = next((d for d in done if d.returncode), None)
                else:
                    failed = c.mpirun(argv, mpiexec=str(MPICH.with_name("mpiexec")), env=env, timeout=900, quiet=True,
                                      capture=True, tell_topology=False, mpich_tcp=netmod)
                    failed = failed if failed.returncode else None
                if failed is not None:
                    raise RuntimeError(f"{name}: {launcher} failed ({failed.returncode}):\n{failed.stderr[-3000:]}")
                collect(samples, launcher, out)
        bound = bounds(t, sorted({int(s) for by in samples.values() for s in by}))
    return {"samples": samples, "bound": {s: b[0] for s, b in bound.items()}, "nranks": t.capacity()}


def on_this_host(nproc: int, sizes: str, rounds: int, repeats: int) -> dict:
    samples: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for launcher in (LAUNCHERS if r % 2 == 0 else LAUNCHERS[::-1]):
                out = Path(tmp) / f"{launcher}-{r}.json"
                argv = job_argv(str(MPICH), sizes, out, repeats)
                cmd = ([str(MPICH.with_name("torchrun")), "--standalone", "--nproc-per-node", str(nproc), *argv[1:]]
                       if launcher == "torchrun" else [str(MPICH.with_name("mpiexec")), "-n", str(nproc), *argv])
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
                if done.returncode:
                    raise RuntimeError(f"this host: {launcher} failed ({done.returncode}):\n{done.stderr[-3000:]}")
                collect(samples, launcher, out)
    return {"samples": samples, "nranks": nproc}


def medians(result: dict) -> dict:
    return {la: {s: statistics.median(v) for s, v in by.items()} for la, by in result["samples"].items()}


def cluster_table(name: str, result: dict, checks: list) -> list[str]:
    t, n = medians(result), result["nranks"]
    lines = [f"### {name} ({n} ranks)", "",
             "| size | launcher | time (us) | algbw (GB/s) | busbw (GB/s) | bound (us) | efficiency | torchrun / mpiexec |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for s in sorted(result["bound"]):
        bound = result["bound"][s]
        ratio = t["torchrun"][s] / t["mpiexec"][s]
        for la in LAUNCHERS:
            us = t[la][s]
            lines.append(f"| {_size(s)} | {la} | {us:.0f} | {s / us / 1e3:.4f} | {busbw(s, us, n):.4f} | "
                         f"{bound * 1e6:.0f} | {bound / (us * 1e-6):.1%} | {f'{ratio:.3f}' if la == 'torchrun' else ''} |")
        eff = result["bound"][s] / (t["torchrun"][s] * 1e-6)
        checks.append((f"{name} {_size(s)}: torchrun >= 0.85 of the bound", eff >= 0.85, f"{eff:.1%}"))
        checks.append((f"{name} {_size(s)}: torchrun <= 1.1x mpiexec", ratio <= 1.1, f"{ratio:.3f}x"))
    return lines + [""]


def host_table(result: dict, checks: list) -> list[str]:
    t = medians(result)
    lines = [f"### One host ({result['nranks']} processes)", "",
             "| size | torchrun (us) | mpiexec (us) | torchrun / mpiexec |", "|---:|---:|---:|---:|"]
    for s in sorted(t["torchrun"]):
        ratio = t["torchrun"][s] / t["mpiexec"][s]
        lines.append(f"| {_size(s)} | {t['torchrun'][s]:.1f} | {t['mpiexec'][s]:.1f} | {ratio:.3f} |")
        checks.append((f"one host {_size(s)}: torchrun within 1.2x of mpiexec", ratio <= 1.2, f"{ratio:.3f}x"))
    return lines + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topologies", default="T1,T2")
    ap.add_argument("--sizes", default="32M")
    ap.add_argument("--host-sizes", default="8,1K,64K")
    ap.add_argument("--host-ranks", type=int, default=2, help="processes on this host (2: one per core)")
    ap.add_argument("--netmod", default="ucx", choices=("ucx", "ofi"),
                    help="MPICH's module for TCP between the emulated nodes, the same for both launchers")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--host-rounds", type=int, default=9,
                    help="rounds on this host (a round takes seconds; microsecond calls need many to settle)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    if not MPICH.exists():
        sys.exit("benchmarks/torchrun.py needs the MPICH environment: make MPI=mpich setup")
    results, checks, lines = {}, [], []
    for name in [t for t in args.topologies.split(",") if t]:
        print(f"{name}: {args.rounds} rounds of torchrun and mpiexec", file=sys.stderr, flush=True)
        results[name] = on_cluster(name, args.sizes, args.rounds, args.repeats, args.netmod)
        lines += cluster_table(name, results[name], checks)
    print(f"this host: {args.host_rounds} rounds of torchrun and mpiexec", file=sys.stderr, flush=True)
    results["host"] = on_this_host(args.host_ranks, args.host_sizes, args.host_rounds, args.repeats)
    lines += host_table(results["host"], checks)
    command = "python benchmarks/torchrun.py " + " ".join(argv if argv is not None else sys.argv[1:])
    head = ["# ddl launched by torchrun against the same job under mpiexec (issue 32)", "",
            f"`{command.strip()}`, MPICH {mpich_version()} (both launchers; between nodes TCP through its "
            f"{args.netmod} module), float32 sum, out of place; "
            f"{args.rounds} rounds x {args.repeats} repeats on the clusters, {args.host_rounds} rounds on this host, "
            "alternating which launcher goes first; medians. On the "
            "clusters neither is told the topology (ddl probes for the switches). busbw = algbw x 2(n-1)/n "
            "(nccl-tests); bound = the topology's lower bound (ddl.planner.lower_bound); efficiency = bound / time. "
            "Every result was verified.", "", "## Targets", "", "| target | met | measured |", "|---|---|---:|"]
    head += [f"| {what} | {'yes' if ok else '**no**'} | {got} |" for what, ok, got in checks] + ["", "## Results", ""]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "torchrun.md").write_text("\n".join(head + lines))
    (out / "torchrun.json").write_text(json.dumps(results, indent=1))
    print("\n".join(head + lines))
    return 0 if all(ok for _, ok, _ in checks) else 1


def mpich_version() -> str:
    done = subprocess.run([str(MPICH), "-c", "import importlib.metadata as m; print(m.version('mpich'))"],
                          capture_output=True, text=True)
    return done.stdout.strip() or "?"


if __name__ == "__main__":
    sys.exit(main())
