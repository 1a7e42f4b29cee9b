"""Sharded training on the emulated clusters (issue 29's benchmark), as root:

    python benchmarks/fsdp.py                          # T1 and T2, 8 ranks, 8 alternating steps each

Runs benchmarks/fsdp_job.py on each topology: FSDP2 steps of a model of 8 layers x 8 MiB on the "ddl" backend,
on gloo, and HSDP on the mesh ddl.torch.device_mesh() lays out from the topology (on "ddl"); then ddl's
reduce-scatter of 16 MiB against its allreduce of the same buffer. Writes benchmarks/results/fsdp.md (and
.json): medians of the alternating runs (each the slowest rank's time), the ratios, and the targets.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
from pathlib import Path

from training import command_line, run_job, write_report

HERE = Path(__file__).resolve().parent
JOB = HERE / "fsdp_job.py"
LABELS = {"fsdp-ddl": "FSDP2 on ddl", "fsdp-gloo": "FSDP2 on gloo", "hsdp-ddl": "HSDP on ddl, device_mesh()"}


def report(results: list[dict], command: str, path: Path) -> list[tuple[str, bool, str]]:
    first = results[0]
    lines = ["# Sharded training (FSDP2, HSDP) on the emulated clusters", "",
             f"Produced by `{command}` on {datetime.date.today()} ({platform.node()}, {os.cpu_count()} cores). "
             f"{first['ranks']} ranks; a model of {first['layers']} layers, {first['bytes'] / 2**20:.0f} MiB of "
             f"float32 parameters, each layer `fully_shard`ed; compute per step {first['compute'] * 1e3:.0f} ms "
             "(0: the step is FSDP's allgathers and reduce-scatters alone). Configurations run one step in turn "
             "(rotating order); times are medians of the slowest rank's.", "",
             "| topology | configuration | mesh | step (ms) | runs |", "|:---|:---|:---|---:|---:|"]
    met = []
    for r in results:
        med = {c: statistics.median(v) for c, v in r["steps"].items()}
        for c, t in med.items():
            lines.append(f"| {r['topology']} | {LABELS[c]} | `{r['meshes'][c]}` | {t * 1e3:.0f} | {len(r['steps'][c])} |")
        r["median"] = med
    lines += ["", "| topology | FSDP2 ddl vs gloo (speed-up) | HSDP vs FSDP2 on ddl (speed-up) | reduce-scatter / "
              "allreduce of 16 MiB (time) |", "|:---|---:|---:|---:|"]
    for r in results:
        med, coll = r["median"], {k: statistics.median(v) for k, v in r["collectives_16mib"].items()}
        vs_gloo = med["fsdp-gloo"] / med["fsdp-ddl"]
        hsdp = med["fsdp-ddl"] / med["hsdp-ddl"]
        rs = coll["reduce_scatter"] / coll["allreduce"]
        lines.append(f"| {r['topology']} | {vs_gloo:.2f}x | {hsdp:.2f}x | {rs:.2f} ({coll['reduce_scatter'] * 1e3:.1f} "
                     f"/ {coll['allreduce'] * 1e3:.1f} ms) |")
        if r["topology"] == "T2":
            met += [("FSDP2 step on ddl >= 1.3x on gloo (T2)", vs_gloo >= 1.3, f"{vs_gloo:.2f}x"),
                    ("HSDP from device_mesh() >= 1.2x plain FSDP on ddl (T2)", hsdp >= 1.2, f"{hsdp:.2f}x"),
                    ("reduce-scatter of 16 MiB <= 0.6x ddl's allreduce (T2)", rs <= 0.6, f"{rs:.2f}x")]
    write_report(lines, met, results, path)
    return met


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topologies", default="T1,T2")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--compute-ms", type=float, default=0.0)
    ap.add_argument("--out", default=str(HERE / "results" / "fsdp"))
    args = ap.parse_args(argv)
    command = command_line("benchmarks/fsdp.py", argv)
    if command is None:
        return 2
    results = []
    for name in args.topologies.split(","):
        result = run_job(name, JOB, ["--steps", str(args.steps), "--compute-ms", str(args.compute_ms)])
        results.append({**result, "topology": name})
    met = report(results, command, Path(args.out))
    print(Path(args.out).with_suffix(".md").read_text())
    return 0 if all(ok for _, ok, _ in met) else 1


if __name__ == "__main__":
    sys.exit(main())
