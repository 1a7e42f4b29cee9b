"""Planning time per rank, and the planner's predicted efficiency, for every machine in topology/ and for
summit-x10, Summit ten times over (46,080 nodes, 276,480 ranks).

    python benchmarks/planning.py [-J planning.json] [--machines summit summit-x10 dgx-h100]

Per rank, planning is: read the machine file (and check it), place the ranks, derive the levels, choose the
plan for a size, and compile that rank's own program. Each machine is measured in a fresh interpreter with ddl
imported, so the first file read pays what a rank at start-up pays. Targets (issue 49): at most 0.1 s per rank
for Summit's 27,648 ranks and 0.5 s for summit-x10. The steps of one rank's program are shown beside the world
size: memory grows with a rank's own steps. Efficiency = the topology's lower bound / the predicted time (the
alpha-beta-gamma model; nominal link data).
"""
import argparse
import json
import subprocess
import sys
import time

from ddl import planner, topology
from ddl.planner.explain import explain
from ddl.topology.files import machine_file

TARGETS = {"summit-x10": 0.5}  # seconds per rank; every other machine: 0.1
LARGER = {"summit-x10": ("summit", 10)}  # a library machine with its nodes and top fanout multiplied


def source(name: str):
    if name not in LARGER:
        return name
    base, times = LARGER[name]
    d = json.loads(machine_file(base).read_text())
    d["name"], d["nodes"] = name, d["nodes"] * times
    d["switches"][-1]["fanout"] *= times
    return d

SIZES = (8, 1 << 20, 64 << 20, 1 << 30)


def clock(f):
    t = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t


def measure(name: str) -> dict:
    t, load = clock(lambda: topology.load(source(name)))
    p = t.capacity()
    placement, place = clock(lambda: t.place(None, p))
    (tree, levels), derive = clock(lambda: t.hierarchy(placement))
    plan, choose = clock(lambda: planner.choose(tree, levels, 64 << 20))
    compile_s, steps = 0.0, 0
    for rank in sorted({0, p // 2, p - 1}):
        prog, s = clock(lambda: planner.program(rank, plan, max(1, plan.block_bytes // 4)))
        compile_s, steps = max(compile_s, s), max(steps, len(prog.steps))
    row = {"machine": name, "ranks": p, "levels": len(levels), "load_s": load, "place_s": place,
           "levels_s": derive, "choose_s": choose, "compile_s": compile_s,
           "per_rank_s": load + place + derive + choose + compile_s, "steps_per_rank": steps, "sizes": []}
    for n in SIZES:
        e = explain(planner.choose(tree, levels, n), n)
        row["sizes"].append({"bytes": n, "plan": planner.label(e.plan), "predicted_us": e.predicted * 1e6,
                             "busbw": e.bandwidths(e.predicted)[1], "bound_busbw": e.bandwidths(e.bound)[1],
                             "efficiency": e.efficiency})
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--machines", nargs="+", default=topology.library() + list(LARGER))
    ap.add_argument("-J", "--json", help="write the results here")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # measure this machine here and print its row as JSON
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one)))
        return 0
    rows = [json.loads(subprocess.run([sys.executable, __file__, "--one", m], check=True, capture_output=True,
                                      text=True).stdout) for m in args.machines]
    print(f"{'machine':<20}{'ranks':>7}{'levels':>7}{'load':>8}{'place':>8}{'levels':>8}{'choose':>8}"
          f"{'compile':>9}{'per rank':>10}{'steps':>7}{'target':>9}")
    for r in rows:
        target = TARGETS.get(r["machine"], 0.1)
        print(f"{r['machine']:<20}{r['ranks']:>7}{r['levels']:>7}{r['load_s']:>7.3f}s{r['place_s']:>7.3f}s"
              f"{r['levels_s']:>7.3f}s{r['choose_s']:>7.3f}s{r['compile_s']:>8.3f}s{r['per_rank_s']:>9.3f}s"
              f"{r['steps_per_rank']:>7}  <{target:g} s {'ok' if r['per_rank_s'] <= target else 'MISSED'}")
    print(f"\n{'machine':<20}{'bytes':>11}  {'plan':<44}{'predicted':>13}{'busbw':>9}{'bound':>9}{'eff':>7}")
    for r in rows:
        for s in r["sizes"]:
            print(f"{r['machine']:<20}{s['bytes']:>11}  {s['plan'][:43]:<44}{s['predicted_us']:>11.1f}us"
                  f"{s['busbw']:>9.2f}{s['bound_busbw']:>9.2f}{100 * s['efficiency']:>6.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
