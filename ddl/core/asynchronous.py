"""Asynchronous collectives: one worker thread per communicator runs the submitted collectives one at a time,
in submission order, and each caller gets a Handle (``wait``, ``done``, ``result``).

Order across ranks: every rank must submit the same collectives in the same order (as DDP's fixed bucket
order, and as ddl's blocking calls already require). A rank that does not is not left waiting: every
collective begins with the agreement round, whose hash names the call, so the ranks that differ all get a
MismatchError, through their handles. A blocking collective called while submitted ones are pending waits for
them first, so mixing the two keeps the order. Progress happens while Python computes: the native executor
releases the GIL. Deadlines: each collective fails after DDL_TIMEOUT without progress, and that error reaches
the handle; ``wait(timeout)`` bounds the caller's own wait too.
"""
from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import weakref

from .. import _native
from ..errors import DDLError
from .devices import is_device_array


@contextlib.contextmanager
def waiting_on(executor):
    """A caller waiting for ``executor``'s submitted runs (None: nothing to tell): nothing of the caller's needs
    the core meanwhile, so they poll instead of resting (Executor.rest, caller_waits)."""
    if executor is None:
        yield
        return
    executor.caller_waits(True)
    try:
        yield
    finally:
        executor.caller_waits(False)


class Handle:
    """A submitted collective. ``wait()`` returns its result or raises its error; ``done()`` never blocks."""

    def __init__(self, name: str, executor=None):
        self.name = name
        self._executor = executor  # told while a caller waits, so that its runs stop resting (Executor.rest)
        self._finished = threading.Event()
        self._result = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._finished.is_set()

    def waiting(self):
        """The context of a caller that waits for this collective (by this handle or another way)."""
        return waiting_on(None if self._finished.is_set() else self._executor)

    def wait(self, timeout: float | None = None):
        with self.waiting():
            finished = self._finished.wait(timeout)
        if not finished:
            raise DDLError(f"{self.name} did not finish within {timeout:g} s (still running; wait again or "
                           f"let DDL_TIMEOUT end it)")
        if self._error is not None:
            raise self._error
        return self._result

    @property
    def result(self):
        return self.wait()

    def _settle(self, result=None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._finished.set()


class Worker:
    """The thread that runs one communicator's submitted collectives in order (started on first use)."""

    def __init__(self, name: str):
        self._queue: queue.Queue = queue.Queue()
        self._pending = 0
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        _running.add(self)

    def submit(self, name: str, fn, *args, executor=None) -> Handle:
        handle = Handle(name, executor)
        with self._idle:
            self._pending += 1
        self._queue.put((handle, fn, args))
        return handle

    def on_worker(self) -> bool:
        return threading.current_thread() is self._thread

    def drain(self) -> None:
        """Returns once everything submitted so far has finished (each collective has its own deadline)."""
        if self.on_worker():
            return
        with self._idle:
            self._idle.wait_for(lambda: self._pending == 0)

    def close(self, timeout: float) -> bool:
        """Stops the thread after what is queued; returns whether it ended within ``timeout`` seconds."""
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            handle, fn, args = item
            try:
                handle._settle(fn(*args))
            except BaseException as e:  # the caller's wait() raises it
                handle._settle(error=e)
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()


# A worker is a daemon thread, so that a job whose peers are gone cannot keep the process alive; but one still
# inside a C++ call when the interpreter finalizes (torch's Future.set_result, completing a Work) would be
# ended there and abort the process. At exit each finishes its queue first (every collective has a deadline).
_running: "weakref.WeakSet[Worker]" = weakref.WeakSet()
_EXIT_WAIT = 60.0


@atexit.register
def _stop_workers() -> None:
    for worker in list(_running):
        if worker._thread.is_alive():
            worker.close(_EXIT_WAIT)


class Submitting:
    """A communicator's asynchronous collectives (mixed into ddl.core.communicator.Communicator, whose
    ``_worker``, ``_mpi`` and ``rank`` these use)."""

    def submit(self, name: str, fn, *args) -> Handle:
        """Runs ``fn(*args)`` (a collective of this communicator) on its worker thread after everything
        submitted before; returns the Handle. Every rank must submit in the same order."""
        if self._worker is None:
            if self._mpi is not None:  # another thread will call MPI (ddl's own calls never at once)
                from mpi4py import MPI

                if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
                    raise DDLError(f"rank {self.rank}: {name} needs MPI initialised with at least "
                                   f"MPI_THREAD_SERIALIZED (mpi4py asks for MPI_THREAD_MULTIPLE unless "
                                   f"mpi4py.rc.thread_level was lowered)")
            self._worker = Worker(f"ddl-collectives-rank{self.rank}")
        executor = self._executor if isinstance(self._executor, _native.Executor) else None  # (None: alone)
        return self._worker.submit(name, fn, *args, executor=executor)

    def drain(self) -> None:
        """Waits for the submitted collectives to finish (a blocking collective does first, so the order stays
        the same everywhere)."""
        if self._worker is not None:
            self._worker.drain()

    def _host_only(self, array, call: str, collective, *args) -> Handle:
        if is_device_array(array):
            raise DDLError(f"rank {self.rank}: {call} takes host arrays; GPU arrays follow their stream with the "
                           f"blocking call ({call.replace('_async', '')})")
        return self.submit(call, collective, array, *args)

    def allreduce_async(self, array, op: str = "sum", out=None) -> Handle:
        """allreduce on the worker thread; leave ``array`` (and ``out``) alone until the handle is done."""
        return self._host_only(array, "allreduce_async", self.allreduce, op, out)

    def broadcast_async(self, array, root: int = 0) -> Handle:
        return self._host_only(array, "broadcast_async", self.broadcast, root)

    def allgather_async(self, array) -> Handle:
        return self._host_only(array, "allgather_async", self.allgather)
