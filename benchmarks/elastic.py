"""Elastic jobs on this host (issue 17's benchmark): what a failure costs, and what elastic mode costs when
nothing fails.

    python benchmarks/elastic.py                 # 8 ranks; 10 alternating runs for the cost
    python benchmarks/elastic.py --ranks 4 --runs 3
    python benchmarks/elastic.py --emulate T2    # the emulated 2-rack cluster (root): 8 ranks on 4 hosts

- recovery: an elastic job (ddlrun --elastic) whose last rank kills itself (SIGKILL) between steps of 1 MiB
  allreduces; it writes the time of its kill, every survivor the time it got RankFailure. Reported: kill to
  the last survivor knowing; shrink + re-plan (ddl.elastic's Recovered.seconds); the sync of a 100 MB state
  from the new rank 0, beside one 100 MB broadcast on the survivors' communicator.
- restart: a job launched again (ddlrun --max-restarts 1) after its last rank kills itself: from the kill to
  the job going on from its commit (ddlrun's new launch, imports, discovery, the state read from disk).
- cost: a 16 MiB allreduce (median of 20 calls per run) in an elastic job and in a normal one, alternating,
  the median over runs of each.

Writes benchmarks/results/elastic.md (elastic-T2.md with --emulate T2; and .json). Times share one clock
(time.time(): the emulated hosts are namespaces of this machine).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DDLRUN = str(Path(sys.executable).parent / "ddlrun")
STATE_BYTES = 100 * 10**6


def job_cost(out: str) -> None:
    import numpy as np

    import ddl

    x = np.ones(16 << 18, np.float32)  # 16 MiB
    for _ in range(3):
        ddl.allreduce(x)
    times = []
    for _ in range(20):
        ddl.barrier()
        t = time.perf_counter()
        ddl.allreduce(x)
        times.append(time.perf_counter() - t)
    took = ddl.communicator().allreduce(np.array([statistics.median(times)]), "max")[0]
    if ddl.rank() == 0:
        Path(out).write_text(json.dumps({"seconds": float(took)}))


def job_recover(out: str) -> None:
    import numpy as np

    import ddl
    import ddl.elastic

    folder = Path(out)
    victim = ddl.size() - 1
    launch_rank = ddl.rank()
    x = np.ones(1 << 18, np.float32)
    synced = []

    class Timed(ddl.elastic.State):
        def sync(self, root=0):
            t = time.perf_counter()
            super().sync(root)
            synced.append(time.perf_counter() - t)

    state = Timed(weights=np.zeros(STATE_BYTES // 4, np.float32), step=0)
    knew = []

    @ddl.elastic.run
    def train(state):
        while state.step < 6:
            if state.step == 3 and launch_rank == victim and not knew:
                (folder / "killed").write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                ddl.allreduce(x)
            except ddl.RankFailure:
                knew.append(time.time())
                raise
            state.step += 1
            state.commit()

    train(state)
    comm = ddl.communicator()
    bcast = []
    for _ in range(3):
        comm.barrier()
        t = time.perf_counter()
        comm.broadcast(state.weights, 0)
        bcast.append(time.perf_counter() - t)
    (folder / f"rank{launch_rank}.json").write_text(json.dumps({
        "knew": knew[0] if knew else None, "recover": state.recoveries[0].seconds if state.recoveries else None,
        "sync": synced[-1] if len(synced) > 1 else None, "broadcast": statistics.median(bcast)}))


def job_restart(out: str) -> None:
    import numpy as np

    import ddl
    import ddl.elastic

    folder = Path(out)
    state = ddl.elastic.State(weights=np.zeros(1 << 18, np.float32), step=0)

    @ddl.elastic.run
    def train(state):
        if state.restarts and ddl.rank() == 0:
            (folder / "resumed").write_text(repr(time.time()))
        while state.step < 6:
            if state.step == 3 and ddl.rank() == ddl.size() - 1 and not state.restarts:
                (folder / "killed").write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            state.weights += ddl.allreduce(np.ones_like(state.weights))
            state.step += 1
            state.commit()

    train(state)


def launch(args: list[str], timeout: float = 600) -> None:
    done = subprocess.run([DDLRUN, *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"ddlrun {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def recovery(where: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        launch(["--elastic", *where, sys.executable, __file__, "--job", "recover", "--out", folder])
        killed = float((Path(folder) / "killed").read_text())
        rows = [json.loads(p.read_text()) for p in Path(folder).glob("rank*.json")]
    return {"ranks": len(rows) + 1, "detect": max(r["knew"] for r in rows) - killed,
            "recover": max(r["recover"] for r in rows), "sync": max(r["sync"] for r in rows),
            "broadcast": max(r["broadcast"] for r in rows)}


def restart(where: list[str]) -> float:
    with tempfile.TemporaryDirectory() as folder:
        launch(["--max-restarts", "1", *where, sys.executable, __file__, "--job", "restart", "--out", folder])
        return float((Path(folder) / "resumed").read_text()) - float((Path(folder) / "killed").read_text())


def cost(where: list[str], runs: int) -> dict:
    seen: dict[str, list[float]] = {"normal": [], "elastic": []}
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "cost.json")
        for _ in range(runs):
            for kind in ("normal", "elastic"):
                flags = ["--elastic"] if kind == "elastic" else []
                launch([*flags, *where, sys.executable, __file__, "--job", "cost", "--out", out])
                seen[kind].append(json.loads(Path(out).read_text())["seconds"])
    return {k: statistics.median(v) for k, v in seen.items()} | {"runs": seen}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--runs", type=int, default=10, help="alternating runs of each kind for the cost")
    ap.add_argument("--emulate", metavar="SPEC", help="on an emulated cluster (ddlrun --emulate; root), e.g. T2")
    ap.add_argument("--job", choices=("cost", "recover", "restart"), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job == "cost":
        job_cost(args.out)
        return 0
    if args.job in ("recover", "restart"):
        (job_recover if args.job == "recover" else job_restart)(args.out)
        return 0
    where = ["--emulate", args.emulate] if args.emulate else ["-np", str(args.ranks)]
    rec = recovery(where)
    again = restart(where)
    spent = cost(where, args.runs)
    ratio = spent["elastic"] / spent["normal"]
    command = f"--emulate {args.emulate}" if args.emulate else f"--ranks {args.ranks}"
    lines = [
        f"# Elastic jobs {'on the emulated cluster ' + args.emulate if args.emulate else 'on one host'}", "",
        f"`python benchmarks/elastic.py {command} --runs {args.runs}`, {datetime.date.today()}, "
        f"{platform.node()}, {os.cpu_count()} cores, {rec['ranks']} ranks.", "",
        "| what | measured | target |", "|---|---|---|",
        f"| kill to every survivor knowing (RankFailure) | {rec['detect'] * 1e3:.0f} ms | ≤ 2 s |",
        f"| shrink + re-plan | {rec['recover'] * 1e3:.0f} ms | |",
        f"| sync of a {STATE_BYTES // 10**6} MB state from the new rank 0 | {rec['sync'] * 1e3:.0f} ms | |",
        f"| one {STATE_BYTES // 10**6} MB broadcast on the survivors | {rec['broadcast'] * 1e3:.0f} ms | |",
        f"| kill to the job going on from its commit, launched again (--max-restarts 1) | {again:.2f} s | |",
        f"| 16 MiB allreduce, normal job (median of {args.runs} runs) | {spent['normal'] * 1e3:.1f} ms | |",
        f"| 16 MiB allreduce, elastic job (--with-ft ulfm) | {spent['elastic'] * 1e3:.1f} ms | |",
        f"| elastic / normal | {ratio:.3f} | ≤ 1.05 |", ""]
    text = "\n".join(lines)
    print(text)
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    name = f"elastic-{args.emulate}" if args.emulate else "elastic"
    (results / f"{name}.md").write_text(text)
    (results / f"{name}.json").write_text(json.dumps({"recovery": rec, "restart": again, "cost": spent}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
