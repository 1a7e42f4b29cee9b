"""Which tree a communicator's large allreduces follow, and what its levels cost, from the first source that
applies (the precedence, highest first):

1. a plan file (-plan, DDL_PLAN): tree, algorithms and blocks;
2. a hierarchy given to init;
3. a topology file (init argument, -topology, DDL_TOPOLOGY), checked against the hosts MPI sees;
4. tiers: the launcher's racks and aisles (ddlrun --nodes/--racks/--aisles, DDL_NODES/RACKS/AISLES) over
   discovery, or IBM's -mode dims where they group ranks otherwise than their hosts do;
5. the probe's switch levels, cached or freshly measured (ddl.topology.probe), with measured link costs;
6. the scheduler's topology (Slurm's ``scontrol show topology``, ddl.topology.scheduler);
7. the hosts alone: discovery's nodes, sockets and GPUs under one switch.

Pure: the hosts come in as reports, the probe's or scheduler's switch tree as ``probed``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from .. import topology as topo
from ..config import get as setting
from ..errors import DDLError
from ..topology import discover
from ..topology import tree as hierarchical
from ..topology.validate import check_plan
from .choice import Plan, default_levels


@dataclass(frozen=True)
class TreeChoice:
    tree: list
    levels: tuple
    topology: "topo.Topology | None" = None
    forced: Plan | None = None     # a plan file's plan: every size follows it
    source: str = "flat"


def choose_tree(options, rank: int, size: int, hierarchy=None, topology=None,
                reports: list[dict] | None = None, probed=None) -> TreeChoice:
    """Raises DDLError (naming ``rank``) when the source contradicts the communicator."""
    network = setting("DDL_NETWORK")
    hosts = [r["host"] for r in reports] if reports else None

    def checked(tree, what: str) -> list:
        try:
            tree = hierarchical.normalize(tree)
        except ValueError as e:
            raise DDLError(f"rank {rank}: bad hierarchy from {what}: {e}") from None
        n = len(hierarchical.leaves(tree))
        if n != size:
            raise DDLError(f"rank {rank}: {what} holds {n} ranks, the communicator {size}")
        return tree

    if options.plan:
        forced = load_plan(options.plan)
        return TreeChoice(checked(forced.tree, f"plan file {options.plan!r}"), forced.levels, None, forced, "plan")
    if hierarchy is not None:
        tree = checked(hierarchy, "the hierarchy")
        return TreeChoice(tree, default_levels(tree, link=network), source="hierarchy")
    source = topology if topology is not None else options.topology
    dims = options.mode.dims if options.mode is not None else ()
    found = None
    if source is not None:
        found = topo.load(source)
    elif reports and (len(set(hosts)) > 1 or len({r["numa"] for r in reports} - {None}) > 1):
        # several hosts, or one host's ranks on several sockets. Dims that group ranks by host as MPI
        # placed them (ddlrun's) say nothing discovery does not: its sockets, GPUs and switches are kept.
        if not dims or dims_follow_hosts(dims, hosts):
            found = discover.build(reports, probed=probed)
    if found is None and dims:
        tree = checked(hierarchical.from_dims(dims), "-mode")
        return TreeChoice(tree, default_levels(tree, ("gpu", "node", "rack", "aisle"), network), source="mode")
    if found is not None:
        tree, levels = found.hierarchy(found.place(hosts, size))
        return TreeChoice(checked(tree, f"topology {found.name!r}"), tuple(levels) or default_levels([0]), found,
                          source="probe" if found.name == "probed" else "topology")
    tree = list(range(size))
    return TreeChoice(tree, default_levels(tree))


def dims_follow_hosts(dims: tuple[int, ...], hosts: list[str]) -> bool:
    """True when the innermost tier of ``dims`` is exactly the ranks of each host (packed host by host)."""
    per = dims[0]
    groups = [hosts[i:i + per] for i in range(0, len(hosts), per)]
    return all(len(set(g)) == 1 for g in groups) and len({g[0] for g in groups}) == len(groups)


def load_plan(path: str) -> Plan:
    try:
        with open(path) as f:
            d = json.load(f)
        check_plan(d, f"plan file {path!r}")
        return Plan.from_dict(d)
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise DDLError(f"plan file {path!r} cannot be used: {e!r}") from None
