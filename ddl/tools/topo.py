"""ddl-topo: show a topology (a file, a library machine, or this host as discovery sees it), dump or load it
as JSON, draw it, and explain the plan an allreduce of a given size would follow on it.

    ddl-topo summit                      the tree, folded
    ddl-topo summit --plan 100M          levels, groups, algorithms, bytes per link, predicted vs lower bound
    ddl-topo dgx-h100 --plan 1G --dump-plan plan.json   then DDL_PLAN=plan.json forces it
    ddl-topo --list                      the machine library
    ddl-topo T2 --plan 16M               an emulated cluster's spec (ddl.cluster.spec) works too
    ddlrun -H a,b,c ddl-topo --probe --dump cluster.json   measure this job's hosts (ddl.topology.probe)
    ddl-topo --probe-cache               the probe's cached results: hosts, tree, levels, when and how measured
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from dataclasses import replace

from .. import config, planner, topology
from ..cluster import spec as emulate
from ..errors import DDLError
from ..planner.explain import explain
from ..topology import discover
from ..topology import tree as hierarchical
from .cli import Parser, one_line_errors, size


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="ddl-topo", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", nargs="?", help="topology file, library machine or emulated-cluster spec "
                   "(default: this host)")
    p.add_argument("--list", action="store_true", help="list the machine library")
    p.add_argument("--ranks", type=_positive, help="plan for this many ranks (default: every GPU or slot)")
    p.add_argument("--plan", metavar="SIZE", action="append", default=[], type=size,
                   help="explain an allreduce of SIZE bytes (e.g. 8, 64K, 64KiB, 100MB, 1G); may repeat")
    p.add_argument("--algo", default="auto", help="force algorithms, as DDL_ALGO")
    p.add_argument("--json", action="store_true", help="print the explanation as JSON")
    p.add_argument("--dump", metavar="FILE", help="write the topology graph as JSON")
    p.add_argument("--gpu-arrays", action="store_true",
                   help="with --plan: also each level's transport for GPU arrays (NCCL or staged over MPI; shown "
                        "anyway where the ranks are GPUs)")
    p.add_argument("--dump-plan", metavar="FILE", help="write the (last) plan as JSON, for DDL_PLAN")
    p.add_argument("--png", metavar="FILE", help="draw the topology (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="do not print the tree")
    p.add_argument("--probe", action="store_true", help="under MPI (ddlrun/mpirun): measure the job's hosts "
                   "and show (or --dump) the topology found, measured links marked")
    p.add_argument("--probe-cache", nargs="?", const="", metavar="DIR", help="list the probe's cached results "
                   "(default folder: DDL_PROBE_CACHE, else ~/.cache/ddl/probe): when and how each was measured, "
                   "when a job last verified it")
    return p


def cached_probes(folder: str) -> str:
    """Every cached probe result in ``folder``, as text (unreadable files named, not fatal)."""
    from pathlib import Path

    from ..topology.probe.result import ProbeError, ProbeResult

    files = sorted(Path(folder).glob("probe-*.json")) if os.path.isdir(folder) else []
    if not files:
        return f"no cached probe results in {folder}"
    out = []
    for f in files:
        try:
            r = ProbeResult.from_dict(json.loads(f.read_text()), str(f))
        except (OSError, ValueError, ProbeError) as e:
            out.append(f"{f}: unusable ({e})")
            continue
        how = ", ".join(f"{k} {v}" for k, v in r.settings.items()) or "settings not recorded"
        levels = ", ".join(f"{lv.name} {lv.bandwidth * 8 / 1e6:.0f} Mbit/s {lv.latency * 1e6:.0f} us" for lv in r.levels)
        out.append(f"{f}\n  hosts: {' '.join(r.hosts)}\n  tree: {json.dumps(r.tree)}\n  levels: {levels}\n"
                   f"  measured: {r.measured_at or 'unknown'} ({r.seconds:.2f} s, {r.rounds} rounds, {r.flows} "
                   f"flows; {how})\n  last verified: {r.verified_at or 'never'}")
    return "\n".join(out)


def probed() -> topology.Topology | None:
    """Every rank measures with the others (always afresh); rank 0 gets the topology, the others None."""
    from mpi4py import MPI

    from ..options import parse
    from ..topology.probe import session

    comm = MPI.COMM_WORLD
    reports, _ = discover.exchange(comm)
    outcome = session.survey_hosts(comm, [r["host"] for r in reports], parse("-probe force"))
    if outcome.result is None:
        raise DDLError(f"rank {comm.rank}: {outcome.how}")
    t = discover.build(reports, probed=outcome.result)
    if comm.rank == 0:
        print(f"probe: {len(outcome.result.hosts)} hosts, {outcome.seconds:.2f} s, {outcome.result.rounds} rounds",
              file=sys.stderr)
    return t if comm.rank == 0 else None


def load(source: str | None, ranks: int | None = None, gpus=None) -> topology.Topology:
    """The machine to show: a file, an emulated shape, or this host alone, as a job on it would see it: one rank
    per GPU where it has GPUs (``gpus``: NVML's reports, read here when not given), else one per core, or
    ``ranks``."""
    if source and emulate.is_spec(source):
        return emulate.topology(source)
    if source:
        return topology.load(source)
    host = socket.gethostname()
    gpus = discover.nvml_gpus() if gpus is None else gpus
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return discover.build([{"host": host, "numa": None, "gpus": gpus}] * (ranks or len(gpus) or cores))


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


GPU_LINKS = ("nvlink", "pcie")  # an innermost level over these joins GPUs


@one_line_errors("ddl-topo")
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list:
        for name in topology.library():
            t = topology.load(name)
            print(f"{name:<20}{len(_placement(t, None)):>7} ranks  {t.graph.number_of_nodes():>6} vertices")
        return 0
    if args.probe_cache is not None:
        from ..topology.probe import cache

        print(cached_probes(args.probe_cache or config.get("DDL_PROBE_CACHE") or cache.default_directory()))
        return 0
    if args.probe:
        if args.source:
            raise DDLError("--probe measures the job's own hosts: give no source")
        t = probed()
        if t is None:
            return 0
        placement = t.placement
    else:
        t = load(args.source, args.ranks)
        placement = _placement(t, args.ranks)
    if not args.quiet:
        print(t.tree_text())
    if args.dump:
        with open(args.dump, "w") as f:
            f.write(t.to_json())
    if args.png:
        t.draw(args.png)
    if args.plan:
        tree, levels = t.hierarchy(placement)
        if not levels:
            raise DDLError("one rank: nothing to plan")
        for n in args.plan:
            plan = planner.choose(tree, levels, n, tuple(args.algo.split(",")))
            e = explain(plan, n)
            if args.gpu_arrays or levels[0].link.startswith(GPU_LINKS):  # the ranks are GPUs
                from ..gpu.levels import choose_levels

                e = replace(e, device=choose_levels(hierarchical.nested(tree), levels,
                                                    config.get("DDL_NCCL_LEVELS"), n))
            print(json.dumps(e.to_dict(), indent=1) if args.json else f"\n{e.text()}")
        if args.dump_plan:
            with open(args.dump_plan, "w") as f:
                json.dump(plan.to_dict(), f)
    return 0


def _placement(t: topology.Topology, ranks: int | None) -> list[str]:
    return t.place(None, ranks or t.capacity())


if __name__ == "__main__":
    sys.exit(main())
