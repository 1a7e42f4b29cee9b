"""The road every collective takes: a described call (ddl.core.calls), then the first path of the table that
serves it.

A path is a module of ddl.core.paths (or ddl.gpu's device path) with one class: ``name`` (as ddl.explain and
DDL_PATH say it), ``serves`` (the collectives it provides), ``takes(call)`` (why it takes this call, or None)
and ``run(call)``; a path whose calls repeat cheaply also has ``again(known, array, out, dst)``, the short form
of a known call. The communicator builds its table when it is made (and again after an elastic shrink, which
makes a new communicator): per collective, the paths that provide it, in the table's order. Which path serves a
call is data — the order, and each path's reason — as Open MPI's coll framework fills a communicator's table
from its components and MPICH's selection reads a decision tree, so adding an algorithm or a transport is a
new path, not a new rung in every collective's ladder.
"""
from __future__ import annotations

from ..errors import DDLError

COLLECTIVES = ("allreduce", "broadcast", "allgather", "reduce_scatter", "barrier", "alltoall")


class Road:
    """One communicator's table of paths, per collective."""

    def __init__(self, paths: list, forced: str | None = None):
        names = [p.name for p in paths]
        if forced is not None and forced not in names:
            raise DDLError(f"DDL_PATH {forced!r} is not a path here; the paths are {', '.join(names)}")
        self.paths = paths
        self.forced = forced
        self.table = {c: tuple(p for p in paths if c in p.serves) for c in COLLECTIVES}
        # a forced path goes first for what it serves, after those no other can stand in for (GPU arrays, one
        # rank); whatever it does not take follows the usual order
        if forced is not None:
            self.table = {c: tuple(sorted(ps, key=lambda p: 0 if getattr(p, "first", False) else
                                          1 if p.name == forced else 2)) for c, ps in self.table.items()}

    def choose(self, call):
        """The first path that takes ``call`` (the last of every table takes every call)."""
        for path in self.table[call.collective]:
            if path.takes(call):
                return path
        raise DDLError(f"no path serves {call.text}")  # (a table without its last resort: a bug)

    def named(self, name: str):
        return next(p for p in self.paths if p.name == name)

    def route(self, call) -> list[tuple[str, str | None]]:
        """Every path of the call's collective, in order, with its reason for taking the call (None: it does
        not); the first with a reason is the one taken."""
        return [(p.name, p.takes(call)) for p in self.table[call.collective]]


def said(route: list[tuple[str, str | None]]) -> str:
    """A route as ddl.explain prints it: the path taken and why, then those passed over."""
    taken = next((i for i, (_, why) in enumerate(route) if why), None)
    if taken is None:
        return "no path"
    name, why = route[taken]
    passed = ", ".join(n for n, _ in route[:taken])
    return f"the {name} path: {why}" + (f" (not {passed})" if passed else "")
