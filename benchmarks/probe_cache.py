"""The probe's memory on emulated clusters: what verifying a cached result costs, and what a stale one did to a
job before the cache checked itself (issue 31).

    python benchmarks/probe_cache.py                   # as root; about 10 minutes; the machine must be quiet

Every job is benchmarks/allreduce_job.py (ddl alone, 32 MiB float32 sum, checked) on a cluster nobody describes
(no DDL_TOPOLOGY, no tiers: ddl's probe finds the switches), with ``-dbg_level 1`` so rank 0 says where its switch
levels came from and how long that took. Cases:

- each shape twice on one cache folder: the first job measures, the second verifies the cached result (the cost
  a job pays once per start for a memory that cannot go stale);
- the stale case of the issue: a job on T1 (four hosts, one switch), then a job on T2 (hosts of the same names in
  two racks behind a 500 Mbit/s uplink) on the same cache: by default the second job finds the cache disagrees
  and measures again; with ``DDL_PROBE=trust`` (the old behaviour) it plans over the flat tree it remembered.

Efficiency = the topology's lower bound / the measured time (benchmarks/topologies.py's bound). Writes
benchmarks/results/probe-cache.md and .json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from topologies import JOB, bounds  # noqa: E402

SIZE = 32 << 20
MEASURED = re.compile(r"probe measured: .*?; ([0-9.]+) s, (\d+) rounds, (\d+) flows")
VERIFIED = re.compile(r"probe cached, verified against the network in ([0-9.]+) s \((\d+) rounds, (\d+) flows\)")


def job(cluster, cache: Path, out: Path, repeats: int, env=None) -> dict:
    """One ddl job on the cluster; its time at SIZE and what rank 0 said about the probe."""
    argv = [sys.executable, str(JOB), "--algos", "ddl", "--sizes", str(SIZE), "--repeats", str(repeats),
            "--out", str(out)]
    done = cluster.mpirun(argv, env={"DDL_PROBE_CACHE": str(cache), "DDL_OPTIONS": "-dbg_level 1", **(env or {})},
                          timeout=900, quiet=True, capture=True, tell_topology=False)
    if done.returncode:
        raise RuntimeError(f"job failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    said = [ln.removeprefix("ddl: ") for ln in done.stderr.splitlines() if ln.startswith("ddl: probe")]
    result = json.loads(out.read_text())
    measured = next((m for m in map(MEASURED.search, said) if m), None)
    verified = next((m for m in map(VERIFIED.search, said) if m), None)
    return {"us": result["times"]["ddl"][str(SIZE)], "probe": said, "tree_source": result["model"]["tree_source"],
            "measured_s": float(measured.group(1)) if measured else None,
            "verified_s": float(verified.group(1)) if verified else None,
            "verify_rounds": int(verified.group(2)) if verified else None,
            "stale": any("does not match" in s for s in said)}


def efficiency(shape: str, us: float) -> float:
    from ddl.cluster import spec as emulate

    return bounds(emulate.topology(shape), [SIZE])[SIZE][0] / (us * 1e-6)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="T1,T2,T3,T4,T5", help="shapes measured then verified")
    ap.add_argument("--repeats", type=int, default=3, help="timings per job (its median is the job's time)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the stale case (the median is reported)")
    ap.add_argument("--out", default=str(HERE / "results" / "probe-cache"))
    args = ap.parse_args(argv)
    from ddl.cluster import Cluster

    rows, stale = [], []
    with tempfile.TemporaryDirectory(prefix="ddl-probe-cache-") as tmp:
        tmp = Path(tmp)
        for shape in args.shapes.split(","):
            with Cluster(shape) as c:
                first = job(c, tmp / shape, tmp / f"{shape}-1.json", args.repeats)
                second = job(c, tmp / shape, tmp / f"{shape}-2.json", args.repeats)
            rows.append({"shape": shape, "first": first, "second": second,
                         "first_eff": efficiency(shape, first["us"]), "second_eff": efficiency(shape, second["us"])})
            print(f"{shape}: measured {first['measured_s']} s, verified {second['verified_s']} s", file=sys.stderr)
        cases = (("T2 on an empty cache", None), ("default (verified)", {}),
                 ("DDL_PROBE=trust (the old behaviour)", {"DDL_PROBE": "trust"}))
        runs = {label: [] for label, _ in cases}
        for r in range(args.rounds):  # the three second jobs side by side in each round: one cluster, one load
            with Cluster("T1") as c:
                for i in range(1, len(cases)):
                    job(c, tmp / f"stale-{r}-{i}", tmp / "flat.json", 1)
            with Cluster("T2") as c:
                for i in [(r + k) % len(cases) for k in range(len(cases))]:  # the order rotates
                    label, env = cases[i]
                    runs[label].append(job(c, tmp / f"stale-{r}-{i}", tmp / "racks.json", args.repeats, env))
        for label, _ in cases:
            times = [j["us"] for j in runs[label]]
            stale.append({"case": label, **runs[label][-1], "us": statistics.median(times), "runs_us": times,
                          "eff": efficiency("T2", statistics.median(times))})
            print(f"{label}: {stale[-1]['eff']:.1%} ({len(times)} rounds)", file=sys.stderr)
    Path(args.out + ".json").write_text(json.dumps({"rows": rows, "stale": stale}, indent=1))
    Path(args.out + ".md").write_text(report(rows, stale, args.rounds))
    print(report(rows, stale, args.rounds))
    return 0


def report(rows: list, stale: list, rounds: int) -> str:
    lines = ["# The probe's memory: verification cost and a stale cache", "",
             f"`python benchmarks/probe_cache.py`, {datetime.date.today()}, {platform.node()} (2 cores; the emulated "
             "clusters of ddl.cluster, 8 ranks on 2 cores), Open MPI wheel. Every job: ddl alone, 32 MiB float32 "
             "allreduce, no topology given (the probe finds the switches), `-dbg_level 1`. Efficiency = the "
             "topology's lower bound / the median time.", "",
             "## Measuring, then verifying, per shape", "",
             "The first job on an empty cache measures; the second, on the same cache, verifies the cached result "
             "against the network before planning with it (the probe's budget, DDL_PROBE_BUDGET, is 5 s). One job "
             "each: its efficiency moves by about 10 points from run to run with 8 ranks on 2 cores (the stale "
             "case below takes the median of rounds).", "",
             "| shape | first job: probe measured (s) | efficiency | second job: verified (s) | rounds | efficiency |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        a, b = r["first"], r["second"]
        lines.append(f"| {r['shape']} | {a['measured_s'] if a['measured_s'] is not None else '-'} | "
                     f"{r['first_eff']:.1%} | {b['verified_s'] if b['verified_s'] is not None else '-'} | "
                     f"{b['verify_rounds'] if b['verify_rounds'] is not None else '-'} | {r['second_eff']:.1%} |")
    lines += ["", "## The stale case: T1, then T2 with the same host names, one cache", "",
              f"Each round: on T1, a job fills two caches with the flat result; on T2 (same names, two racks), a job "
              f"on each of them and one on an empty cache, side by side. Time: the median over {rounds} rounds.", "",
              "| second job (T2) | cache found stale | probe measured (s, last round) | time (ms) | efficiency at 32 MiB |",
              "|---|---|---:|---:|---:|"]
    for s in stale:
        lines.append(f"| {s['case']} | {'yes' if s['stale'] else '-' if 'empty' in s['case'] else 'no'} | "
                     f"{s['measured_s'] if s['measured_s'] is not None else '-'} | {s['us'] / 1e3:.0f} | "
                     f"{s['eff']:.1%} |")
    lines += ["", "What rank 0 said about the probe in each stale-case job:", ""]
    for s in stale:
        lines += [f"- {s['case']}:"] + [f"  - `{line}`" for line in s["probe"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
