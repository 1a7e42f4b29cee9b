"""Allreduce bandwidth per emulated topology: ddl against the peers a user would pick instead.

    python benchmarks/topologies.py                       # T1-T4, 1 KiB to 64 MiB, 3 rounds (as root)
    python benchmarks/topologies.py --topologies T2 --sizes 1K,64K,1M,16M --rounds 1   # the README's main job

For each topology it builds the emulated cluster (ddl.cluster) and runs the same float32 sizes for: ddl (its
own plan over the emulated switches), ddl forced to one flat ring, MPI_Allreduce of the Open MPI wheel as it
comes (on several nodes its default is the hierarchical coll/han), the same with han disabled (coll/tuned),
MPI_Allreduce of the MPICH wheel (TCP through libfabric), and PyTorch gloo where torch is installed. Each round
runs every MPI setting in turn (the order rotates), each job runs every size with its algorithms interleaved
(ddl in every job: a peer is compared with the ddl measured beside it), every result is verified; a size's
time is the median over rounds. Writes benchmarks/results/<T>.md
(nccl-tests columns, the topology's lower bound and efficiency = bound / time), <T>.png (busbw against size)
and <T>.json, and checks issue 4's targets.

    python benchmarks/topologies.py --no-flags --topologies T2,T5 --repeats 2   # issue 15: nobody tells ddl

With ``--no-flags`` the jobs start as on a cluster nobody describes: no DDL_TOPOLOGY, no tiers, so ddl finds the
switch levels with its probe (the first job measures, later ones read the probe cache in the cluster's folder);
results go to <T>-noflags.md/.png/.json. Every report has a table of ddl's predicted time (its cost model, with
the level costs it planned with: probed under --no-flags) beside the measured median, and the error.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
JOB = HERE / "allreduce_job.py"
LABELS = {
    "ddl": "ddl (its plan)",
    "ddl-ring": "ddl, flat ring",
    "ompi-han": "Open MPI default (coll/han)",
    "ompi-tuned": "Open MPI coll/tuned (han off)",
    "mpich": "MPICH (ch4:ofi tcp)",
    "gloo": "PyTorch gloo",
}
PEERS = ("ompi-han", "ompi-tuned", "mpich", "gloo")
PARTNER = {"ompi-han": "ddl", "gloo": "ddl", "ompi-tuned": "ddl@ompi-tuned", "mpich": "ddl@mpich"}  # (see jobs)
ALL_SIZES = "1K,2K,4K,8K,16K,32K,64K,128K,256K,512K,1M,2M,4M,8M,16M,32M,64M"
PREDICTION_TARGET = 0.10  # issue 49: median |error| over sizes >= 1 MiB


def jobs(openmpi: Path, mpich: Path | None, gloo: bool, ddl_only: bool = False) -> list[dict]:
    """The MPI settings, each one job per round: (label, python, algorithms, renames, environment)."""
    if ddl_only:
        return [{"name": "openmpi", "python": openmpi, "algos": "ddl", "rename": {}, "env": {}}]
    # ddl runs in every job, interleaved with that job's peers: a peer is compared with the ddl measured beside
    # it (PARTNER), so a machine slower in one job than in another moves both sides of the ratio alike
    out = [{"name": "openmpi", "python": openmpi, "algos": "ddl,ddl-ring,mpi" + (",gloo" if gloo else ""),
            "rename": {"mpi": "ompi-han"}, "env": {}},
           {"name": "openmpi-tuned", "python": openmpi, "algos": "ddl,mpi",
            "rename": {"mpi": "ompi-tuned", "ddl": PARTNER["ompi-tuned"]}, "env": {"OMPI_MCA_coll": "^han"}}]
    if mpich is not None:
        out.append({"name": "mpich", "python": mpich, "algos": "ddl,mpi",
                    "rename": {"mpi": "mpich", "ddl": PARTNER["mpich"]}, "env": {}})
    return out


def has_torch(python: Path) -> bool:
    return subprocess.run([str(python), "-c", "import torch.distributed"], capture_output=True).returncode == 0


def bounds(t, sizes: list[int]) -> dict[int, tuple[float, str]]:
    """The topology's lower bound per size (ddl.planner.lower_bound over the topology's levels)."""
    from ddl import planner

    tree, levels = t.hierarchy(t.place(None, t.capacity()))
    shape = planner.Shape.of(tree)
    return {n: planner.lower_bound(shape, levels, n) for n in sizes}


class Progress:
    def __init__(self, total: int):
        self.total, self.done, self.start = total, 0, time.time()

    def step(self, what: str) -> None:
        width = 30
        filled = int(width * self.done / max(self.total, 1))
        spent = time.time() - self.start
        eta = spent / self.done * (self.total - self.done) if self.done else 0
        print(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} jobs  {spent:5.0f} s  "
              f"eta {eta:4.0f} s  {what:<32}", end="", file=sys.stderr, flush=True)
        self.done += 1


def run_topology(name: str, t, sizes: list[int], rounds: int, settings: list[dict], progress: Progress,
                 iters: int, min_seconds: float, repeats: int = 1, no_flags: bool = False,
                 big_repeats: int | None = None) -> dict:
    from ddl.cluster import Cluster

    by_round: list[dict[str, dict[int, list[float]]]] = []  # each round's samples: library -> size -> times
    versions, model = {}, None
    with Cluster(t) as cluster:
        # --no-flags: ddl is told nothing; its probe's cache lives in the cluster's folder (one measurement)
        env = {"DDL_PROBE_CACHE": str(cluster.workdir / "probe-cache")} if no_flags else {}
        for r in range(rounds):
            by_round.append({})
            order = settings[r % len(settings):] + settings[:r % len(settings)]  # rotate: no setting always first
            for job in order:
                progress.step(f"{name} round {r + 1}/{rounds} {job['name']}")
                out = cluster.workdir / f"{job['name']}-{r}.json"
                argv = [str(job["python"]), str(JOB), "--algos", job["algos"], "--out", str(out),
                        "--sizes", ",".join(str(s) for s in sizes), "--iters", str(iters),
                        "--min-seconds", str(min_seconds), "--repeats", str(repeats)] + \
                    (["--big-repeats", str(big_repeats)] if big_repeats is not None else [])
                exe = str(Path(job["python"]).parent / "mpiexec")
                for attempt in (1, 2):
                    done = cluster.mpirun(argv, mpiexec=exe, env={**env, **job["env"]}, timeout=1800, quiet=True,
                                          capture=True, tell_topology=not no_flags)
                    if done.returncode == 0 or attempt == 2:
                        break
                    # Seen once in ~40 launches: Open MPI's daemon on another node "failed to report back"
                    # before any rank ran. Said, and tried once more; a second failure ends the run.
                    why = (done.stderr.strip().splitlines() or ["no output"])
                    print(f"\n{name}: job {job['name']} failed ({done.returncode}): "
                          f"{next((ln for ln in why if 'daemon' in ln.lower()), why[-1]).strip()}; trying once more",
                          file=sys.stderr, flush=True)
                if done.returncode:
                    raise RuntimeError(f"{name}: job {job['name']} failed ({done.returncode}):\n"
                                       f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
                res = json.loads(out.read_text())
                versions[job["name"]] = res["mpi"].split(",")[0]
                if "ddl" in job["algos"].split(",") and model is None:
                    model = res["model"]
                for algo, by_size in res["runs"].items():
                    algo = job["rename"].get(algo, algo)
                    for size, us in by_size.items():
                        by_round[-1].setdefault(algo, {}).setdefault(int(size), []).extend(us)
    return {"topology": name, **pooled(by_round), "versions": versions, "model": model, "no_flags": no_flags}


def pooled(by_round: list[dict]) -> dict:
    """The rounds' samples, pooled over the rounds a disturbed machine did not spoil (ddl.tools.measure
    .disturbed_rounds: every library far below its usual speed alike), a size's time their median (ddl's over
    every job it ran in); ddl's time over each peer's (``ratios``: per round, the peer's median against the
    ddl's of its job, then the median over the rounds kept); ddl's spread over the kept rounds' medians."""
    from ddl.tools.measure import disturbed_rounds, spread

    medians = [{a: {s: statistics.median(v) for s, v in by_size.items()} for a, by_size in r.items()}
               for r in by_round]
    disturbed = disturbed_rounds(medians)
    samples: dict[str, dict[int, list[float]]] = {}
    for i, r in enumerate(by_round):
        if i not in disturbed:
            for a, by_size in r.items():
                for s, v in by_size.items():
                    samples.setdefault(a, {}).setdefault(s, []).extend(v)
    times = {a: {s: statistics.median(v) for s, v in by_size.items()} for a, by_size in samples.items()
             if not a.startswith("ddl@")}
    every_job = ddl_samples(samples)
    if every_job:
        times["ddl"] = {s: statistics.median(v) for s, v in every_job.items()}
    kept_rounds = [i for i in range(len(by_round)) if i not in disturbed]
    round_ratios = [paired(medians[i]) for i in kept_rounds]  # (each peer against the ddl beside it)
    # a round's ddl time, as the pooled one: over every job it ran in that round (the main job alone gave one
    # sample a round at 16 MiB, and one outlier, 369 ms where ddl's other jobs took 277-292, decided the round)
    kept = [{**medians[i], "ddl": {s: statistics.median(v) for s, v in ddl_samples(by_round[i]).items()}}
            for i in kept_rounds]
    ratios = {p: {s: statistics.median(r[p][s] for r in round_ratios if s in r.get(p, {})) for s in by_size}
              for p, by_size in round_ratios[0].items()} if round_ratios else {}
    return {"times": times, "samples": samples, "rounds": len(by_round),
            "disturbed": {i + 1: x for i, x in disturbed.items()}, "round_times": kept, "ratios": ratios,
            "round_ratios": round_ratios,
            "spread": {s: spread([m["ddl"][s] for m in kept if s in m.get("ddl", {})])
                       for s in samples.get("ddl", {})} if len(kept) > 1 else {}}


def ddl_samples(samples: dict) -> dict[int, list[float]]:
    """ddl's samples per size from every job it ran in (its own, and beside each peer: ddl@<peer>)."""
    out: dict[int, list[float]] = {}
    for a, by_size in samples.items():
        if a == "ddl" or a.startswith("ddl@"):
            for s, v in by_size.items():
                out.setdefault(s, []).extend(v)
    return out


def paired(times: dict) -> dict[str, dict[int, float]]:
    """ddl's time over each peer's at each size, ddl as measured in the peer's job (PARTNER; the main job's
    where the peer's job had none)."""
    out = {}
    for peer in PEERS:
        partner = times.get(PARTNER[peer]) or times.get("ddl", {})
        out[peer] = {s: partner[s] / t for s, t in times.get(peer, {}).items() if s in partner}
    return {p: r for p, r in out.items() if r}


def rounds_text(result: dict) -> str:
    """How many rounds, which were left out and why, and how far apart ddl's were."""
    text = f"{result.get('rounds', 1)} round(s)"
    for r, slow in result.get("disturbed", {}).items():
        text += f"; round {r} left out: a disturbed machine (every library at {slow:.1f}x its usual time or more)"
    if result.get("spread"):
        text += "; ddl's spread over the rounds kept (largest - smallest) / median: " + ", ".join(
            f"{_size(s)} {x:.0%}" for s, x in sorted(result["spread"].items()))
    return text


def busbw(nbytes: int, us: float, n: int) -> float:
    from ddl.tools.measure import bandwidth

    return bandwidth(nbytes, us, n)[1]


def targets(name: str, times: dict, bound: dict, switched: bool = False,
            ratios: dict | None = None) -> list[tuple[str, bool, str]]:
    """Issue 4's targets on this topology (issue 15's with no flags: the same figures): (target, met, measured).
    ``ratios``: ddl's time over each peer's (paired(); worked out from ``times`` where not given). ``switched``:
    the topology has switch levels, where ddl must beat the flat peers clearly (as on T2)."""
    ddl = times["ddl"]
    ratios = paired(times) if ratios is None else ratios
    if not ratios:  # --ddl-only: nothing to compare with
        return []
    # per size, the best peer: the one ddl's time is the largest multiple of
    best = {s: max((r[s], p) for p, r in ratios.items() if s in r) for s in ddl
            if any(s in r for r in ratios.values())}
    out = []
    big = [s for s in ddl if s >= 16 << 20]
    if big:
        eff = {s: bound[s][0] / (ddl[s] * 1e-6) for s in big}
        worst = min(eff, key=eff.get)
        out.append((">= 85% of the lower bound, >= 16 MiB", eff[worst] >= 0.85,
                    ", ".join(f"{_size(s)} {eff[s]:.0%}" for s in big)))
        if (name in ("T2", "T4") or switched) and all(s in best for s in big):
            sp = {s: 1 / best[s][0] for s in big}
            out.append((">= 1.3x faster than the best peer, >= 16 MiB", min(sp.values()) >= 1.3,
                        ", ".join(f"{_size(s)} {sp[s]:.2f}x vs {best[s][1]}" for s in big)))
    mid = [s for s in best if s >= 64 << 10]
    if mid:
        ratio = {s: 1 / best[s][0] for s in mid}
        worst = min(ratio, key=ratio.get)
        out.append(("never slower than 0.95x the best peer, >= 64 KiB", ratio[worst] >= 0.95,
                    f"worst {ratio[worst]:.2f}x at {_size(worst)} vs {best[worst][1]}"))
    small = [s for s in best if s <= 4 << 10]
    if small:
        ratio = {s: best[s][0] for s in small}
        worst = max(ratio, key=ratio.get)
        out.append(("within 1.2x of the best peer's time, <= 4 KiB", ratio[worst] <= 1.2,
                    ", ".join(f"{_size(s)} {ratio[s]:.2f}x vs {best[s][1]}" for s in small)))
    return out


def decided(name: str, result: dict, bound: dict, switched: bool = False) -> list[tuple[str, bool | None, str]]:
    """targets() on the pooled times and paired ratios, each verdict kept where most rounds kept give it too
    (said with how many met it where they differ); one that most rounds contradict is undecided (None). Three
    make bench runs in a row (11-29) with every round required to agree: a lone round's outlier (a 1 MiB
    allreduce at 35 ms where the others took 21) made a target undecided in one run and not the next."""
    pooled = targets(name, result["times"], bound, switched, result.get("ratios"))
    kept = result.get("round_times", [])
    rounds = [targets(name, times, bound, switched, r)
              for times, r in zip(kept, result.get("round_ratios") or [None] * len(kept))]
    out = []
    for i, (target, ok, measured) in enumerate(pooled):
        each = [r[i][1] for r in rounds if len(r) > i and r[i][0] == target]
        if len(each) >= 2 and len(set(each)) > 1:
            measured = f"{measured} (met in {sum(each)} of {len(each)} rounds)"
            if 2 * sum(v == ok for v in each) <= len(each):
                ok = None
        out.append((target, ok, measured))
    return out


def said(ok: bool | None) -> str:
    return "yes" if ok else "undecided" if ok is None else "**no**"


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def table(result: dict, bound: dict, nranks: int) -> str:
    from ddl.tools.measure import bandwidth

    times = result["times"]
    algos = [a for a in LABELS if a in times]
    lines = [f"| {'size (B)':>10} | {'count':>10} | type | redop | {'algorithm':<30} | {'time (us)':>12} | "
             f"{'algbw (GB/s)':>12} | {'busbw (GB/s)':>12} | {'bound (us)':>12} | efficiency |",
             "|" + "---:|" * 2 + ":---|:---|:---|" + "---:|" * 5]
    for s in sorted(bound):
        for a in algos:
            us = times[a].get(s)
            if us is None:
                continue
            alg, bus = bandwidth(s, us, nranks)
            lines.append(f"| {s:>10} | {s // 4:>10} | float | sum | {LABELS[a]:<30} | {us:>12.1f} | {alg:>12.4f} | "
                         f"{bus:>12.4f} | {bound[s][0] * 1e6:>12.1f} | "
                         f"{bound[s][0] / (us * 1e-6):>9.1%} |")
    return "\n".join(lines)


def plot(result: dict, bound: dict, nranks: int, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    sizes = sorted(bound)
    for a in [a for a in LABELS if a in result["times"]]:
        pts = [(s, busbw(s, result["times"][a][s], nranks)) for s in sizes if s in result["times"][a]]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=LABELS[a],
                lw=2.5 if a == "ddl" else 1.2)
    ax.plot(sizes, [busbw(s, bound[s][0] * 1e6, nranks) for s in sizes], "k--", lw=1, label="lower bound")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes, float32)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def prediction(result: dict) -> tuple[list[str], float | None]:
    """The markdown table of ddl's predicted time beside its measured median per size, and the median absolute
    error over sizes >= 1 MiB (None without such sizes). Error = (predicted - measured) / measured."""
    model, samples = result.get("model"), ddl_samples(result["samples"])
    if not model:
        return [], None
    predicted = {int(k): v for k, v in model["predicted"].items()}
    lines = ["| size | predicted (us) | measured (us) | runs | error |", "|---:|---:|---:|---:|---:|"]
    errors = []
    for size in sorted(samples):
        measured = statistics.median(samples[size])
        err = (predicted[size] - measured) / measured
        if size >= 1 << 20:
            errors.append(abs(err))
        lines.append(f"| {_size(size)} | {predicted[size]:.1f} | {measured:.1f} | {len(samples[size])} | {err:+.1%} |")
    levels = ", ".join(f"{lv['name']} {lv['bandwidth'] * 8e-6:.0f} Mbit/s, alpha {lv['alpha'] * 1e6:.0f} us "
                       f"({_costs(lv.get('measured'))})" for lv in model["levels"])
    lines += ["", f"Tree from: {model['tree_source']}; level costs planned with: {levels}."]
    return lines, (statistics.median(errors) if errors else None)


def _costs(measured) -> str:
    return "calibrated" if measured == "calibrated" else "probed" if measured else "nominal"


def report(result: dict, bound: dict, nranks: int, outdir: Path, command: str, switched: bool = False) -> list:
    from ddl.cluster import spec as emulate

    name = result["topology"]
    met = decided(name, result, bound, switched)
    predicted, error = prediction(result)
    if error is not None:
        met.append((f"prediction: median |error| over sizes >= 1 MiB within {PREDICTION_TARGET:.0%}",
                    error <= PREDICTION_TARGET, f"{error:.1%}"))
    spec = emulate.PRESETS.get(name, name)
    desc = emulate.PRESET_TEXT.get(name, spec)
    stem = name + ("-noflags" if result.get("no_flags") else "")
    told = ("Launched with no flags: no DDL_TOPOLOGY, no tiers; ddl found the switch levels itself (probe). "
            if result.get("no_flags") else "ddl was told the topology (DDL_TOPOLOGY). ")
    lines = [f"# {stem}: {desc}", "",
             f"Spec `{spec}`, {nranks} ranks. Produced by `{command}` on {datetime.date.today()} "
             f"({platform.node()}, {os.cpu_count()} cores; {'; '.join(f'{k}: {v}' for k, v in result['versions'].items())}).",
             told + "Out of place, float32 sum; time = median over runs of the max over ranks of the mean per call; "
             "busbw = algbw x 2(n-1)/n (nccl-tests); bound = the topology's lower bound "
             "(ddl.planner.lower_bound: per level 2(E-1)/E x n / B_out, or the latency of one round across the top); "
             "efficiency = bound / time. Every result was verified.", "", rounds_text(result) + ".", "",
             "## Targets", "", "| target | met | measured |", "|:---|:---|:---|"]
    lines += [f"| {t} | {said(ok)} | {m} |" for t, ok, m in met]
    lines += ["", "## Results", "", table(result, bound, nranks), "", f"![busbw against size]({stem}.png)", ""]
    if predicted:
        lines += ["## Prediction against measurement (ddl's cost model)", ""] + predicted + [""]
    (outdir / f"{stem}.md").write_text("\n".join(lines))
    plot(result, bound, nranks, f"{stem}: {desc}", outdir / f"{stem}.png")
    (outdir / f"{stem}.json").write_text(json.dumps({**result, "bound": {s: b for s, b in bound.items()}},
                                                    indent=1))
    return met


def print_summary(result: dict, bound: dict, nranks: int, met: list) -> None:
    times = result["times"]
    algos = [a for a in LABELS if a in times]
    predicted = {int(k): v for k, v in (result.get("model") or {}).get("predicted", {}).items()}
    print(f"\n{result['topology']}: busbw (GB/s) per algorithm; bound, ddl's efficiency and the error of its "
          f"predicted time at the right")
    print(f"{'size':>10} " + " ".join(f"{a:>10}" for a in algos) + f" {'bound':>10} {'ddl eff':>8} {'pred err':>9}")
    for s in sorted(bound):
        row = " ".join(f"{busbw(s, times[a][s], nranks):>10.4f}" if s in times[a] else f"{'-':>10}" for a in algos)
        err = f"{(predicted[s] - times['ddl'][s]) / times['ddl'][s]:>+9.1%}" if s in predicted else f"{'-':>9}"
        print(f"{_size(s):>10} {row} {busbw(s, bound[s][0] * 1e6, nranks):>10.4f} "
              f"{bound[s][0] / (times['ddl'][s] * 1e-6):>8.1%} {err}")
    print(f"  {rounds_text(result)}")
    for t, ok, m in met:
        print(f"  [{'met' if ok else 'UNDECIDED' if ok is None else 'MISSED'}] {t}: {m}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topologies", default="T1,T2,T3,T4", help="presets or specs (ddl.cluster.spec), comma list")
    ap.add_argument("--sizes", default=ALL_SIZES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=2, help="timed calls at least (after one checked call)")
    ap.add_argument("--min-seconds", type=float, default=0.2, help="and at least this long per measurement")
    ap.add_argument("--repeats", type=int, default=1, help="measurements per size in each job (interleaved)")
    ap.add_argument("--big-repeats", type=int, help="the same from 1 MiB (default: --repeats)")
    ap.add_argument("--no-flags", action="store_true",
                    help="tell ddl nothing (no DDL_TOPOLOGY): it probes; results in <T>-noflags.*")
    ap.add_argument("--ddl-only", action="store_true", help="ddl alone (for the prediction table): no peers")
    ap.add_argument("--mpich", default=str(ROOT / ".venv-mpich"), help="virtual env with the MPICH wheel + ddl")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)

    from ddl import cluster

    from ddl.cluster import spec as emulate
    from ddl.units import parse_size

    why = cluster.available()
    if why:
        print(f"benchmarks/topologies.py: {why}", file=sys.stderr)
        return 2
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    mpich = Path(args.mpich) / "bin" / "python"
    settings = jobs(Path(sys.executable), mpich if mpich.exists() else None, has_torch(Path(sys.executable)),
                    args.ddl_only)
    if not mpich.exists() and not args.ddl_only:
        print(f"note: no MPICH environment at {args.mpich} (make MPI=mpich setup): MPICH left out", file=sys.stderr)
    names = args.topologies.split(",")
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/topologies.py " + " ".join(argv if argv is not None else sys.argv[1:])
    progress = Progress(len(names) * args.rounds * len(settings))
    missed = undecided = 0
    for name in names:
        t = emulate.topology(name)
        bound = bounds(t, sizes)
        result = run_topology(name, t, sizes, args.rounds, settings, progress, args.iters, args.min_seconds,
                              args.repeats, args.no_flags, args.big_repeats)
        switched = len(t.hierarchy(t.place(None, t.capacity()))[1]) >= 3
        met = report(result, bound, t.capacity(), outdir, command.strip(), switched)
        print("", file=sys.stderr)
        print_summary(result, bound, t.capacity(), met)
        stem = name + ("-noflags" if args.no_flags else "")
        print(f"  written: {outdir / (stem + '.md')}, {outdir / (stem + '.png')}")
        missed += sum(ok is False for _, ok, _ in met)
        undecided += sum(ok is None for _, ok, _ in met)
    print((f"\n{missed} target(s) missed" if missed else "\nall targets met" if not undecided else "\nnone missed") +
          (f"; {undecided} undecided (most rounds disagreed with the median)" if undecided else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
