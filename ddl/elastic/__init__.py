"""Elastic training: a job that loses ranks shrinks, re-plans and goes on from its last commit.

    state = ddl.elastic.State(w=weights, step=0)       # ddl.torch.elastic.TorchState(model, optimizer, ...)

    @ddl.elastic.run
    def train(state):
        while state.step < steps:
            ...one step with ddl's collectives...
            state.step += 1
            if state.step % 10 == 0:
                state.commit()                          # cheap: a copy in memory

    train(state)

Under ``ddlrun --elastic`` (Open MPI with ULFM), when a rank dies every survivor's next collective raises
ddl.RankFailure naming it; ``run`` then shrinks ddl's communicator to the survivors (ddl.elastic.recovery),
rolls the state back to the last commit, broadcasts it from the new rank 0, calls the reset callbacks (to
rescale a learning rate, say) and calls ``train`` again. What is lost: the work since the last commit. A
rank that raises any other exception inside ``train`` in an elastic job is ended at once (by SIGKILL, after
printing it), so that the others see a failure and go on instead of waiting on it; outside elastic jobs the
exception propagates as usual. A live but silent rank is not a failure: it is a deadline error (DDL_TIMEOUT),
which ends the job (the flight recorder says who was behind).

Under ddlrun's restarts (``--max-restarts``, ``--host-discovery-script``; ddl.runner.restarts) rank 0 also
writes each commit to disk (ddl.elastic.persist) and ``run`` starts a launch from the last one; a commit also
checks whether ddlrun has found more hosts, and if so every rank ends (HostsUpdated, status 77) for the job
to be launched again on them.
"""
from __future__ import annotations

import atexit
import copy
import functools
import os
import pickle
import signal
import sys
import traceback

import numpy as np

from ..errors import DDLError, RankFailure
from . import persist
from .recovery import Recovered, TooFewRanks, say, shrink_world

EXIT_TOO_FEW = 75  # the status of every survivor when fewer than --min-np are left

__all__ = ["State", "run", "RankFailure", "Recovered", "TooFewRanks", "HostsUpdated"]


class HostsUpdated(DDLError):
    """ddlrun found more hosts (its --host-discovery-script): the job ends at this commit to restart on them."""

    def __init__(self, message: str, generation: int):
        super().__init__(message)
        self.generation = generation


class State:
    """Values that survive a failure: attributes (``state.epoch``), saved by ``commit()``, put back by
    ``restore()`` and sent from rank 0 by ``sync()``. Subclasses add what cannot be pickled cheaply (a
    model's weights) by overriding ``save``/``load``/``sync``."""

    def __init__(self, **values):
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_saved", None)
        object.__setattr__(self, "_reset_callbacks", [])
        object.__setattr__(self, "commits", 0)
        object.__setattr__(self, "recoveries", [])  # Recovered, one per failure survived
        object.__setattr__(self, "restarts", persist.restart_count())  # ddlrun's restarts before this launch
        object.__setattr__(self, "_writer", None)

    def __getattr__(self, name):
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__} has no value {name!r} (give it to the constructor)")

    def __setattr__(self, name, value):
        if name in self._values:
            self._values[name] = value
        else:
            object.__setattr__(self, name, value)

    # -- what subclasses extend ------------------------------------------------------------------------------

    def save(self):
        return copy.deepcopy(self._values)

    def load(self, saved) -> None:
        self._values.update(copy.deepcopy(saved))

    def sync(self, root: int = 0) -> None:
        """Every rank takes root's values: numpy arrays by ddl's broadcast (no pickling: a 100 MB state costs
        about one broadcast), the rest pickled. Every rank holds the same names (they were committed alike)."""
        import ddl

        arrays = sorted(k for k, v in self._values.items() if isinstance(v, np.ndarray))
        rest = broadcast_object({k: v for k, v in self._values.items() if k not in arrays}, root)
        comm = ddl.communicator()
        for k in arrays:
            self._values[k] = comm.broadcast(self._values[k], root)
        self._values.update(rest)

    # -- the user's side -------------------------------------------------------------------------------------

    def commit(self) -> None:
        """Keeps the present values as the point a failure rolls back to (in memory, on every rank; under
        ddlrun's restarts rank 0 also writes it to disk, off this thread), then checks for new hosts."""
        object.__setattr__(self, "_saved", self.save())
        object.__setattr__(self, "commits", self.commits + 1)
        self._persist()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raises HostsUpdated on every rank alike when ddlrun has found more hosts since this launch (only
        under its --host-discovery-script: one small broadcast from rank 0, which reads ddlrun's file)."""
        import ddl

        where, known = persist.folder(), os.environ.get("DDL_ELASTIC_GENERATION")
        if where is None or known is None:
            return
        found = persist.hosts_generation(where) if ddl.rank() == 0 else 0
        found = int(ddl.communicator().broadcast(np.array([found], np.int64), 0)[0])
        if found > int(known):
            raise HostsUpdated(f"ddlrun found more hosts (generation {found}); ending at commit {self.commits} "
                               f"to restart on them", found)

    def _persist(self) -> None:
        import ddl

        where = persist.folder()
        if where is None or ddl.rank() != 0:
            return
        if self._writer is None:
            object.__setattr__(self, "_writer", persist.Writer(where))
        self._writer.write(self._saved)

    def flush(self) -> None:
        """Waits until the last commit is on disk (rank 0, under ddlrun's restarts; else nothing to wait for)."""
        if self._writer is not None:
            self._writer.flush()

    def resume(self) -> bool:
        """Rank 0 takes the commit a previous launch left in DDL_ELASTIC_STATE_DIR, if any (``run`` calls this
        before its first sync, which gives it to the others). True when there was one."""
        import ddl

        where = persist.folder()
        saved = persist.load(where) if where is not None and ddl.rank() == 0 else None
        if saved is not None:
            self.load(saved)
            say(f"resuming from the commit in {where / persist.STATE_FILE} (restart {self.restarts})")
        return saved is not None

    def restore(self) -> None:
        if self._saved is not None:
            self.load(self._saved)

    def register_reset_callbacks(self, callbacks) -> None:
        """Functions called (with no argument) after every recovery, once the state is synced."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()


def broadcast_object(obj, root: int = 0):
    """Root's ``obj`` (anything pickle can write) on every rank of ddl's world."""
    import ddl

    comm = ddl.communicator()
    return pickle.loads(comm.broadcast_bytes(pickle.dumps(obj) if comm.rank == root else None, root))


def run(func):
    """Makes ``func(state, ...)`` elastic: synced from rank 0 and committed before the first call; after a
    RankFailure, recovery on the survivors, roll-back, sync, reset callbacks, and ``func`` again."""

    @functools.wraps(func)
    def elastic(state: State, *args, **kwargs):
        import ddl

        failure: RankFailure | None = None
        first = True
        while True:
            try:
                if failure is not None:  # inside the try: a failure during recovery is recovered from too
                    _recover(state)      # (first: a failure in the first sync leaves a broken world behind)
                    failure = None
                if first:
                    state.resume()
                    state.sync()
                    state.commit()
                    first = False
                result = func(state, *args, **kwargs)
                state.flush()
                return result
            except RankFailure as e:
                failure = e
                say(str(e))
            except HostsUpdated as e:
                _end_to_grow(state, e)
            except TooFewRanks as e:
                # every survivor knows it (the shrink's result is the same everywhere): all end, none waits.
                # No MPI_Finalize: with failed ranks in the job it may wait on them.
                say(f"{e}")
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(EXIT_TOO_FEW)
            except Exception as e:
                behind = _rank_failure_behind(e)
                # a framework's error around ddl's (TensorFlow wraps py-functions'); not the failure whose recovery
                # just failed: that would be tried again forever
                if behind is not None and behind is not failure:
                    failure = behind
                    say(f"{behind} (inside {type(e).__name__})")
                    continue
                if os.environ.get("DDL_ELASTIC") != "1":
                    raise  # not an elastic job: nobody would recover, the job ends as it always has
                # Not a failure ddl can recover from on this rank: end it now, without MPI_Finalize, so the
                # others see a failed rank (and recover) rather than wait on one that is finalising.
                traceback.print_exc()
                print(f"ddl.elastic: rank {ddl.rank()}: ending this rank after the exception above",
                      file=sys.stderr, flush=True)
                sys.stdout.flush()
                # by a signal: MPI's runtime tells the others about a killed process, while one that merely
                # exits (even with a failure status, without MPI_Finalize) left them waiting (measured)
                os.kill(os.getpid(), signal.SIGKILL)

    return elastic


_LEAVING = []


def _exit_without_finalize() -> None:
    """Once a rank has failed, this process leaves without MPI_Finalize: with a failed rank in the job it was
    seen to hang there over TCP (the emulated cluster), after the work was done. A rank that ends cleanly
    first waits at a barrier for the others: without Finalize's own wait, a rank that left while its last
    messages were on their way was a failed rank to those still receiving them (seen on the emulated cluster:
    a 100 MB broadcast after the training). The exit status: 1 after an uncaught exception (no barrier: the
    others should see this rank fail), else 0. Registered last, it runs before the handlers registered
    earlier (ddl's own, DDL_TIMELINE's), which are skipped too."""
    if _LEAVING:
        return
    _LEAVING.append(0)
    previous = sys.excepthook

    def failed(kind, value, tb):
        _LEAVING[0] = 1
        previous(kind, value, tb)

    def leave():
        import ddl

        if _LEAVING[0] == 0 and ddl.initialized():
            try:
                ddl.communicator().barrier()
            except Exception as e:  # a rank failed meanwhile, or the world is closed: nothing left to wait for
                say(f"rank {ddl.rank()}: leaving without the others ({type(e).__name__})")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_LEAVING[0])

    sys.excepthook = failed
    atexit.register(leave)


def _rank_failure_behind(error: BaseException) -> RankFailure | None:
    """The RankFailure that caused ``error``: in its chain of causes, or the one that broke ddl's world."""
    import ddl

    seen = error
    while seen is not None:
        if isinstance(seen, RankFailure):
            return seen
        seen = seen.__cause__ or seen.__context__
    return ddl.communicator().failure if ddl.initialized() else None


def _end_to_grow(state: State, why: HostsUpdated) -> None:
    """Every rank ends with EXIT_GROW once rank 0 has the commit on disk; ddlrun restarts on more hosts."""
    import ddl

    state.flush()
    if ddl.rank() == 0:
        persist.mark_growing(persist.folder(), why.generation)
        say(str(why))
    ddl.communicator().barrier()  # nobody ends (and has MPI's launcher stop the rest) before rank 0 has written
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(persist.EXIT_GROW)  # no MPI_Finalize: after a recovery it may wait on the failed ranks


def _recover(state: State) -> None:
    import ddl

    _exit_without_finalize()
    recovered = shrink_world()
    state.recoveries.append(recovered)
    state.restore()
    state.sync()
    state.on_reset()
    if ddl.rank() == 0:
        say(f"rank{'s' if len(recovered.failed) > 1 else ''} {', '.join(map(str, recovered.failed))} of "
            f"{recovered.old_size} lost; going on with {recovered.new_size} from commit {state.commits} "
            f"({recovered.seconds * 1e3:.0f} ms to shrink and re-plan)")
