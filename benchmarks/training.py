"""Training steps on the emulated clusters (issue 16's benchmark), as root:

    python benchmarks/training.py                       # T1 and T2, 8 ranks, 10 alternating steps each

Runs benchmarks/training_job.py on each topology: one step at a time of a model with ResNet-50's gradient sizes
(161 tensors, ~102 MB), its backward an emulated accelerator sized so compute = communication (by default the
topology's lower bound for allreducing the gradients, a figure no library's run moves), under DDP on "ddl",
DDP on gloo, ddl.torch.DistributedOptimizer with overlap and without. Writes
benchmarks/results/training.md (and .json): step times (medians of the alternating runs), the communication
alone beside its lower bound, how much of it overlap hid, and a lone 64 MiB allreduce blocking against
asynchronous; checks the targets.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE / "training_job.py"
TARGET_SPEEDUP = {"T1": 1.05, "T2": 1.5}  # issue 48's
COMPUTE_FROM = {"bound": "the lower bound of allreducing the gradients on the topology",
                "measured": "ddl's fused allreduce of the gradients, measured at the job's start"}
LABELS = {"ddp-ddl": "DDP on ddl", "ddp-gloo": "DDP on gloo", "opt-overlap": "ddl DistributedOptimizer, overlap",
          "opt-blocking": "ddl DistributedOptimizer, no overlap"}


def run_job(name: str, job: Path, args: list[str]) -> dict:
    """Runs ``job`` (``args``, then ``--out FILE``) on the emulated topology ``name``, one rank per slot; returns
    the JSON rank 0 wrote there."""
    from ddl.cluster import Cluster
    from ddl.cluster import spec as emulate

    with Cluster(emulate.topology(name)) as cluster:
        out = cluster.workdir / "result.json"
        done = cluster.mpirun([sys.executable, str(job), *args, "--out", str(out)], timeout=1800, quiet=True,
                              capture=True)
        if done.returncode:
            raise RuntimeError(f"{name}: the job failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                               f"{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def gradient_bytes() -> int:
    """The model's gradients in bytes (float32), as the job builds them."""
    sys.path.insert(0, str(HERE))
    try:
        from training_job import resnet50_sizes
    finally:
        sys.path.remove(str(HERE))
    return 4 * sum(resnet50_sizes())


def allreduce_bound(name: str, nbytes: int) -> float:
    """The lower bound (s) of an allreduce of ``nbytes`` on the emulated topology ``name``, one rank per slot."""
    from ddl import planner
    from ddl.cluster import spec as emulate

    t = emulate.topology(name)
    tree, levels = t.hierarchy(t.place(None, t.capacity()))
    return planner.lower_bound(planner.Shape.of(tree), levels, nbytes)[0]


def run(name: str, steps: int, compute: str = "bound", buckets: bool = False) -> dict:
    """One job on ``name``. ``compute``: the backward's emulated compute per step, "bound" (the allreduce's lower
    bound on this topology: the same for every library and every run), "measured" (ddl's fused allreduce,
    measured by the job at its start: moves with ddl's start-up, which made the verdict move) or milliseconds."""
    bound = allreduce_bound(name, gradient_bytes())
    compute_ms = {"bound": bound * 1e3, "measured": 0.0}.get(compute)
    if compute_ms is None:
        compute_ms = float(compute)
    result = run_job(name, JOB, ["--steps", str(steps), "--compute-ms", f"{compute_ms:.3f}"]
                     + (["--buckets"] if buckets else []))
    result["bound"], result["topology"], result["compute_from"] = bound, name, compute
    return result


def summarize(r: dict) -> dict:
    med = {c: statistics.median(v) for c, v in r["steps"].items()}
    comm, compute = statistics.median(r["comm"]), r["compute"]
    hidden = (compute + comm - med["opt-overlap"]) / comm if "opt-overlap" in med else None
    lone = {k: statistics.median(v) for k, v in r["lone_64mib"].items()}
    return {"step": med, "comm": comm, "compute": compute, "hidden": hidden, "lone": lone,
            "ddp_speedup": med["ddp-gloo"] / med["ddp-ddl"] if {"ddp-ddl", "ddp-gloo"} <= med.keys() else None}


def compute_from(result: dict) -> str:
    how = result.get("compute_from", "measured")
    return COMPUTE_FROM.get(how, f"{how} ms")


def report(results: list[dict], command: str, path: Path) -> list[tuple[str, bool, str]]:
    lines = ["# Training steps on the emulated clusters", "",
             f"Produced by `{command}` on {datetime.date.today()} ({platform.node()}, {os.cpu_count()} cores). "
             "8 ranks; a model with ResNet-50's gradient sizes (161 tensors, ~102 MB float32) whose backward "
             "waits, layer by layer, a time proportional to the layer's size with the CPU left free (an emulated "
             f"accelerator), the total set equal to {compute_from(results[0])}. Each configuration runs one step in "
             "turn (rotating order); times are medians over the steps of the slowest rank's step.", "",
             "| topology | configuration | step (ms) | runs |", "|:---|:---|---:|---:|"]
    met = []
    for r in results:
        s = summarize(r)
        for c, t in s["step"].items():
            lines.append(f"| {r['topology']} | {LABELS[c]} | {t * 1e3:.0f} | {len(r['steps'][c])} |")
    lines += ["", "| topology | communication alone (ms) | its lower bound (ms) | compute (ms) | hidden by overlap "
              "| DDP ddl vs gloo | lone 64 MiB: blocking / async (ms) |", "|:---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        s = summarize(r)
        lines.append(f"| {r['topology']} | {s['comm'] * 1e3:.0f} | {r['bound'] * 1e3:.0f} | {s['compute'] * 1e3:.0f} | "
                     f"{s['hidden']:.0%} | {s['ddp_speedup']:.2f}x | {s['lone']['blocking'] * 1e3:.1f} / "
                     f"{s['lone']['async'] * 1e3:.1f} |")
        want = TARGET_SPEEDUP.get(r["topology"])
        if want is not None and s["ddp_speedup"] is not None:
            met.append((f"DDP on ddl >= {want}x faster per step than DDP on gloo ({r['topology']})",
                        s["ddp_speedup"] >= want, f"{s['ddp_speedup']:.2f}x"))
        met.append((f"overlap hides >= 50% of the communication ({r['topology']})", s["hidden"] >= 0.5,
                    f"{s['hidden']:.0%}"))
        ratio = s["lone"]["async"] / s["lone"]["blocking"]
        met.append((f"asynchronous lone 64 MiB allreduce within 5% of blocking ({r['topology']})", ratio <= 1.05,
                    f"{ratio:.3f}x"))
    lines += bucket_lines(results)
    write_report(lines, met, results, path)
    return met


def bucket_times(steps: list[list]) -> list[dict]:
    """Per bucket, medians over the steps (each a list of (index, bytes, ready, done) in bucket order, times from
    the step's start): ``ready``, ``done``, ``own`` (its allreduce alone: from the later of its ready and the one
    before's done, to its done) and ``idle`` (the network's wait for backward before it: how long after the
    bucket before finished this one was handed over; 0 for the first, whose wait is the step's start)."""
    out = []
    for k in range(len(steps[0])):
        own, idle = [], []
        for s in steps:
            ready, done = s[k][2], s[k][3]
            before = s[k - 1][3] if k else ready  # (the first bucket waits for nothing before it)
            own.append(done - max(ready, before))
            idle.append(max(0.0, ready - before))
        out.append({"bytes": steps[0][k][1], "ready": statistics.median(s[k][2] for s in steps),
                    "done": statistics.median(s[k][3] for s in steps), "own": statistics.median(own),
                    "idle": statistics.median(idle)})
    return out


def bucket_lines(results: list[dict]) -> list[str]:
    """Where each DDP bucket's time went (--buckets): median over the steps of when backward handed it over and
    when its allreduce finished (rank 0's clock, from the step's start), how long its allreduce took once the
    one before had finished (against that allreduce's lower bound on the topology), and how long the network
    had waited for backward before it."""
    rows, sums = [], []
    for r in results:
        for config, steps in r.get("buckets", {}).items():
            if not steps:
                continue
            buckets = bucket_times(steps)
            for k, b in enumerate(buckets):
                rows.append(f"| {r['topology']} | {LABELS[config]} | {k} | {b['bytes'] / 1e6:.1f} | "
                            f"{b['ready'] * 1e3:.0f} | {b['done'] * 1e3:.0f} | {(b['done'] - b['ready']) * 1e3:.0f} | "
                            f"{b['own'] * 1e3:.0f} ({_of_bound(r, [b])}) | {b['idle'] * 1e3:.0f} |")
            sums.append(f"{r['topology']}, {LABELS[config]}: the network waited "
                        f"{sum(b['idle'] for b in buckets) * 1e3:.0f} ms for backward between buckets; the buckets' "
                        f"allreduces took {sum(b['own'] for b in buckets) * 1e3:.0f} ms ({_of_bound(r, buckets)} of "
                        f"their bounds); from the last bucket's end to the step's, "
                        f"{_tail(r, config, buckets) * 1e3:.0f} ms.")
    if not rows:
        return []
    return ["", "Each DDP bucket (`--buckets`: DDP's average through a comm hook that notes the times; medians over "
            "the steps, rank 0): when backward handed it over, when its allreduce finished, the time between "
            "(queued behind the bucket before it, then on the wire), its allreduce alone (from the later of its "
            "ready and the bucket before's done; in brackets its lower bound over that time, above 100 % where it began "
            "before the bucket before had finished: gloo keeps two in flight) and how long the network had waited "
            "for backward before it.", "",
            "| topology | configuration | bucket | MB | ready (ms) | done (ms) | ready to done (ms) | "
            "its allreduce (ms) | network waited (ms) |",
            "|:---|:---|---:|---:|---:|---:|---:|---:|---:|", *rows, "", *(f"- {line}" for line in sums)]


def _of_bound(r: dict, buckets: list[dict]) -> str:
    """The buckets' allreduces' lower bound on the topology over the time they took ("-" where it was none: one
    that finished no later than the bucket before)."""
    took = sum(b["own"] for b in buckets)
    return f"{sum(allreduce_bound(r['topology'], b['bytes']) for b in buckets) / took:.0%}" if took > 0 else "-"


def _tail(r: dict, config: str, buckets: list[dict]) -> float:
    """The step (median, slowest rank) after its last bucket finished (rank 0's clock): DDP copying the results
    back, the optimizer's step."""
    return statistics.median(r["steps"][config]) - buckets[-1]["done"] if config in r.get("steps", {}) else 0.0


def write_report(lines: list[str], met: list[tuple[str, bool, str]], results: list[dict], path: Path) -> None:
    """``lines`` and a table of the targets ``met`` as path.md; ``results`` as path.json."""
    lines = lines + ["", "## Targets", "", "| target | met | measured |", "|:---|:---|:---|"]
    lines += [f"| {t} | {'yes' if ok else '**no**'} | {m} |" for t, ok, m in met]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps(results, indent=1))


def command_line(script: str, argv) -> str | None:
    """How this run was asked for (for the report), or None (and why, on stderr) when no emulated cluster can
    run here."""
    from ddl import cluster

    why = cluster.available()
    if why:
        print(f"{script}: {why}", file=sys.stderr)
        return None
    return (f"python {script} " + " ".join(argv if argv is not None else sys.argv[1:])).strip()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topologies", default="T1,T2")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default=str(HERE / "results" / "training"))
    ap.add_argument("--buckets", action="store_true", help="time each DDP bucket (through a comm hook)")
    ap.add_argument("--compute", default="bound",
                    help="backward's compute per step: bound (the allreduce's lower bound on the topology), measured "
                         "(ddl's fused allreduce at the job's start, the rule until 2026-11-29) or milliseconds")
    args = ap.parse_args(argv)
    command = command_line("benchmarks/training.py", argv)
    if command is None:
        return 2
    results = [run(name, args.steps, args.compute, args.buckets) for name in args.topologies.split(",")]
    met = report(results, command, Path(args.out))
    print(Path(args.out).with_suffix(".md").read_text())
    return 0 if all(ok for _, ok, _ in met) else 1


if __name__ == "__main__":
    sys.exit(main())
