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
import queue
import threading
import weakref

from ..errors import DDLError


class Handle:
    """A submitted collective. ``wait()`` returns its result or raises its error; ``done()`` never blocks."""

    def __init__(self, name: str):
        self.name = name
        self._finished = threading.Event()
        self._result = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._finished.is_set()

    def wait(self, timeout: float | None = None):
        if not self._finished.wait(timeout):
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

    def submit(self, name: str, fn, *args) -> Handle:
        handle = Handle(name)
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
