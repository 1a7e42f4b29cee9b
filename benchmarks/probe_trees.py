"""Is the probe's tree right, job after job? Repeated jobs on emulated clusters nobody describes, each with an
empty probe cache, on an idle machine and again with a busy process beside them (issue 48).

    python benchmarks/probe_trees.py [--jobs 10] [--shapes T2,star,interleaved] [--busy both]   # as root
    python benchmarks/probe_trees.py --jobs 2 --record tests/unit/data/probe --out /tmp/x     # replayable rounds

Each job is benchmarks/allreduce_job.py (ddl alone, 16 MiB float32 sum, checked) with ``-dbg_level 1``: its probe
finds the switch levels, its plan runs, and rank 0's plan check compares the first allreduces with the plan's
prediction. Per job: whether the tree found equals the cluster's (hosts grouped as the emulator wires them),
the levels and their figures, the efficiency (the topology's lower bound / the measured time), and whether the
job warned that its plan ran far below its prediction. The target: the right tree in every job, and no job
below 0.85 of the bound without a warning. Writes benchmarks/results/probe-trees.md and .json.

Shapes: T2 (2 racks x 2 nodes x 2 ranks, 1 Gbit/s NICs, 500 Mbit/s uplinks); star (three racks of two nodes,
one rank each, 1 Gbit/s NICs, 300 Mbit/s uplinks, ranks round-robin); interleaved (two racks of three nodes
whose names alternate between the racks, 1 Gbit/s NICs, 300 Mbit/s uplinks: the probe's nearest-by-name merging
cannot lean on the names).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from topologies import JOB, bounds  # noqa: E402

SIZE = 16 << 20
SHAPES = {"T2": "T2", "star": "3x2x1:nic=1gbit:uplink=300mbit:order=round-robin", "interleaved": None}


def interleaved():
    """Two racks of three nodes, node0, node2, node4 in rack0 and node1, node3, node5 in rack1."""
    from ddl import topology

    link = lambda mbit: {"kind": "veth", "bandwidth": mbit / 8e3}
    names = [f"node{i}" for i in range(6)]
    return topology.load({
        "name": "interleaved racks", "node": {"nic": link(1000)},
        "nodes": [{"name": n, "slots": 1, "switch": f"rack{i % 2}"} for i, n in enumerate(names)],
        "switches": [{"name": "spine", "level": "spine"},
                     *({"name": f"rack{r}", "level": "rack", "parent": "spine", "uplink": link(300)} for r in (0, 1))],
        "placement": names})


def topology_of(shape: str):
    from ddl.cluster import spec as emulate

    return interleaved() if SHAPES[shape] is None else emulate.topology(SHAPES[shape])


def truth(t) -> frozenset:
    """The cluster's switch tree over host names as nested frozensets (order-free; groups of one dropped)."""
    def walk(v):
        if t.kind(v) == "node":
            return t.graph.nodes[v].get("host", v)
        kids = [walk(k) for k in t.children(v)]
        return kids[0] if len(kids) == 1 else frozenset(kids)
    return walk(t.roots()[0])


def found(tree, hosts: list[str]):
    """A tree of ranks as the same order-free tree over host names (a node's ranks are its host)."""
    if isinstance(tree, int):
        return hosts[tree]
    kids = {found(k, hosts) for k in tree}
    return next(iter(kids)) if len(kids) == 1 else frozenset(kids)


def plain(tree):
    """An order-free tree (truth, found) as nested lists in a fixed order (JSON)."""
    return tree if isinstance(tree, str) else sorted((plain(k) for k in tree), key=json.dumps)


def job(cluster, out: Path, record: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        argv = [sys.executable, str(JOB), "--algos", "ddl", "--sizes", str(SIZE), "--repeats", "3", "--out", str(out)]
        env = {"DDL_PROBE_CACHE": cache, "DDL_OPTIONS": "-dbg_level 1",
               **({"DDL_PROBE_RECORD": str(record)} if record else {})}
        done = cluster.mpirun(argv, env=env, timeout=900, quiet=True, capture=True, tell_topology=False)
    if done.returncode:
        raise RuntimeError(f"job failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text())
    said = [ln.removeprefix("ddl: ") for ln in done.stderr.splitlines() if ln.startswith("ddl: ")]
    return {"us": result["times"]["ddl"][str(SIZE)], "model": result["model"],
            "probe": [s for s in said if s.startswith("probe")],
            "check": [s for s in said if s.startswith("plan check")],
            "warned": any(": far below" in s or ": below" in s for s in said if s.startswith("plan check"))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--busy", choices=("idle", "busy", "both"), default="both",
                    help="idle machine, one busy process beside the jobs, or both in turn")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--record", help="a folder: every job's probe rounds (DDL_PROBE_RECORD) with the cluster's true "
                                     "tree, for tests/unit/test_probe_replay.py")
    args = ap.parse_args(argv)
    from ddl.cluster import Cluster, available

    why = available()
    if why is not None:
        print(f"benchmarks/probe_trees.py: {why}", file=sys.stderr)
        return 2
    rows = []
    loads = ["idle", "busy"] if args.busy == "both" else [args.busy]
    for shape in args.shapes.split(","):
        t = topology_of(shape)
        want = truth(t)
        bound = bounds(t, [SIZE])[SIZE][0]
        with Cluster(t) as cluster:
            for load in loads:
                beside = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load == "busy" else None
                try:
                    for i in range(args.jobs):
                        record = Path(args.record) / f"{shape}-{load}-{i}.json" if args.record else None
                        r = job(cluster, cluster.workdir / "out.json", record)
                        if record is not None:
                            kept = json.loads(record.read_text())
                            record.write_text(json.dumps({"shape": shape, "load": load, "truth": plain(want),
                                                          **kept}))
                        got = found(r["model"]["tree"], r["model"]["hosts"])
                        row = {"shape": shape, "load": load, "job": i, "right": got == want,
                               "efficiency": bound / (r["us"] * 1e-6),
                               "levels": [(lv["name"], round(lv["bandwidth"] * 8e-6), lv["measured"])
                                          for lv in r["model"]["levels"]],
                               "warned": r["warned"], "probe": r["probe"], "check": r["check"]}
                        rows.append(row)
                        print(f"{shape:<12}{load:<6}{i:>3}  tree {'right' if row['right'] else 'WRONG'}  "
                              f"{row['efficiency']:6.1%} of the bound  "
                              f"{'warned' if row['warned'] else '':<7}"
                              f"{', '.join(f'{n} {b}' for n, b, _ in row['levels'])}", flush=True)
                finally:
                    if beside is not None:
                        beside.kill()
    write(rows, Path(args.out), " ".join(["python benchmarks/probe_trees.py", *(argv or sys.argv[1:])]))
    bad = [r for r in rows if not r["right"] or (r["efficiency"] < 0.85 and not r["warned"])]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} jobs: the right tree, and at 0.85 of the bound or warned")
    return 0


def write(rows: list[dict], outdir: Path, command: str) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "probe-trees.json").write_text(json.dumps(rows, indent=1))
    lines = ["# The probe's tree, job after job", "",
             f"Produced by `{command}` on {datetime.date.today()} ({platform.node()}, 2-core VM). Every job with an "
             f"empty probe cache; 16 MiB allreduces; efficiency = the lower bound / the measured time; warned = the "
             f"job's plan check said its plan ran far below its prediction.", "",
             "| shape | machine | jobs | right tree | efficiency (min, median) | below 0.85 of the bound | of those, warned |",
             "|---|---|---:|---:|---|---:|---:|"]
    for (shape, load) in dict.fromkeys((r["shape"], r["load"]) for r in rows):
        mine = [r for r in rows if r["shape"] == shape and r["load"] == load]
        low = [r for r in mine if r["efficiency"] < 0.85]
        eff = [r["efficiency"] for r in mine]
        lines.append(f"| {shape} | {'a busy process beside' if load == 'busy' else 'idle'} | {len(mine)} | "
                     f"{sum(r['right'] for r in mine)} | {min(eff):.1%}, {statistics.median(eff):.1%} | {len(low)} | "
                     f"{sum(r['warned'] for r in low)} |")
    lines += ["", "Per job: levels found (Mbit/s, how obtained), what the probe and the plan check said (`-dbg_level 1`).",
              ""]
    for r in rows:
        lines.append(f"- {r['shape']} {r['load']} {r['job']}: tree {'right' if r['right'] else '**wrong**'}, "
                     f"{r['efficiency']:.1%} of the bound{', warned' if r['warned'] else ''}; levels "
                     + ", ".join(f"{n} {b}" for n, b, _ in r["levels"]))
    (outdir / "probe-trees.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
