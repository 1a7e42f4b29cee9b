"""The road every collective takes: a described call (ddl.core.calls), then the first path of the table that
serves it.

A path is a module of ddl.core.paths (or ddl.gpu's device path) with one class: ``name`` (as ddl.explain and
DDL_PATH say it), ``serves`` (the collectives it provides), ``takes(call)`` (why it takes this call, or None)
and ``run(call)``; a path whose calls repeat cheaply also has ``again(known, array, out)``, the short form of
a known call (``repeats``: its collectives that do, ``repeatable(call)`` where only some of their calls do;
``native``: ddl._native.ShortCalls can run them too; ``teach(call)``: the path teaches ShortCalls what it can).
The communicator builds its table when it is made (and again after an elastic shrink, which makes a new
communicator): per collective, the paths that provide it, in the table's order. Which path serves a call is
data — the order, and each path's reason — as Open MPI's coll framework fills a communicator's table from its
components and MPICH's selection reads a decision tree, so adding an algorithm or a transport is a new path,
not a new rung in every collective's ladder.
"""
from __future__ import annotations

import numpy as np

from ..errors import DDLError
from .calls import KEPT, fits

COLLECTIVES = ("allreduce", "broadcast", "allgather", "reduce_scatter", "barrier", "alltoall")


class Road:
    """One communicator's table of paths, per collective."""

    def __init__(self, paths: list, forced: str | None = None, quick: bool = True, native=None, drain=None,
                 timed=None):
        """``quick``: known calls take their short forms (not where each call feeds a timer, a timeline or a
        check); ``native``: the communicator's ddl._native.ShortCalls, taught the calls its paths can repeat
        natively; ``drain()`` waits for the submitted collectives; ``timed(path, call)`` runs an allreduce
        timed (-dump_iter, DDL_TIMELINE)."""
        self.quick: dict | None = {} if quick else None  # signature -> (path, Known): the short forms
        self.native, self._drain, self._timed = native, drain, timed
        names = [p.name for p in paths]
        if forced is not None and forced not in names:
            raise DDLError(f"DDL_PATH {forced!r} is not a path here; the paths are {', '.join(names)}")
        self.paths = paths
        self.table = {c: tuple(p for p in paths if c in p.serves) for c in COLLECTIVES}
        # a forced path goes first for what it serves, after those no other can stand in for (GPU arrays, one
        # rank); whatever it does not take follows the usual order
        if forced is not None:
            self.table = {c: tuple(sorted(ps, key=lambda p: 0 if getattr(p, "first", False) else
                                          1 if p.name == forced else 2)) for c, ps in self.table.items()}

    def take(self, collective: str, arg, array, out, describe, *args):
        """A call: a known one of a plain C-contiguous array by its path's short form, else ``describe(*args)``
        (ddl.core.calls) and the first path that takes it. ``arg``: the op, root or row counts that complete
        the signature."""
        self._drain()
        if self.quick is not None and type(array) is np.ndarray and array.flags.c_contiguous:
            try:
                hit = self.quick.get((collective, array.shape, array.dtype, arg))
            except TypeError:  # (an op that cannot be a key: described, and refused there)
                hit = None
            if hit is not None and (out is None or fits(out, hit[1].shape, array.dtype)):
                return hit[0].again(hit[1], array, out)
        return self.run(describe(*args))

    def run(self, call):
        """A described call, on the first path that takes it; a valid call of a plain dtype is remembered, so
        that its next ones take the short form (natively where the path can)."""
        path = self.choose(call)
        if self._timed is None or call.collective != "allreduce" or call.device:
            result = path.run(call)
        else:
            result = self._timed(path, call)
        if call.problem is None and call.known.short and call.key:
            if self.native is not None and getattr(path, "native", False):
                teach(self.native, call)
            elif self.native is not None and hasattr(path, "teach"):  # (a planned run the executor repeats)
                path.teach(call)
            if self.quick is not None and call.collective in getattr(path, "repeats", ()) and \
                    getattr(path, "repeatable", lambda _: True)(call):
                if len(self.quick) > KEPT:
                    self.quick.clear()
                self.quick[call.key] = (path, call.known)
        return result

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


def teach(native, call) -> None:
    """ddl._native.ShortCalls learns a known call: later ones of its signature are found and run natively."""
    k, a, collective = call.known, call.array, call.collective
    if collective == "allreduce":
        native.learn_allreduce(a.dtype, a.shape, call.op, k.prepared)
    elif collective == "broadcast":
        native.learn_broadcast(a.dtype, a.shape, call.root, k.prepared)
    elif collective == "allgather":
        native.learn_allgather(a.dtype, a.shape, k.shape, k.prepared)
    elif collective == "reduce_scatter" and call.key[3][1] is None:  # (row counts given: Python's road)
        native.learn_reduce_scatter(a.dtype, a.shape, call.op, k.shape, k.prepared)
    elif collective == "barrier":
        native.learn_barrier(k.prepared)
