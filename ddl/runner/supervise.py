"""Running a launcher (mpiexec) to its end, with a deadline, and stopping everything it started on Ctrl-C.

The launcher gets a session of its own, so its ranks and daemons can be signalled as one group: on the
deadline or a signal they get SIGTERM (Open MPI and hydra pass it to every rank), then SIGKILL after a grace
period, then ``cleanup`` runs for what lives outside the group (an emulated cluster's namespaces).
We keep our own deadline rather than the launcher's: MPICH's hydra was seen exiting 0 on its MPIEXEC_TIMEOUT.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Callable

TIMED_OUT = 124      # as coreutils' timeout
INTERRUPTED = 130    # 128 + SIGINT, as shells report Ctrl-C
GRACE_SECONDS = 5.0


@dataclass
class Outcome:
    returncode: int
    stdout: str | None = None
    stderr: str | None = None
    timed_out: bool = False
    interrupted: bool = False


class _Stop(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float | None = None, capture: bool = False,
        cleanup: Callable[[], None] | None = None, watch: Callable[[str], None] | None = None) -> Outcome:
    """Runs argv; returns its status, TIMED_OUT after ``timeout`` seconds, INTERRUPTED on SIGINT/SIGTERM/SIGHUP
    (in the main thread). Whatever ended it, nothing it started is left running once this returns. ``watch``
    (not with ``capture``): every line of the launcher's stderr is passed on to ours as it comes and shown to
    it."""
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True} if capture else \
        {"stderr": subprocess.PIPE, "text": True, "errors": "replace"} if watch else {}
    proc = subprocess.Popen(argv, env=env, start_new_session=True, **pipes)
    reader = threading.Thread(target=_pass_on, args=(proc.stderr, watch), daemon=True) if watch else None
    if reader is not None:
        reader.start()
    previous = _install_handlers()
    try:
        if reader is not None:
            proc.wait(timeout=timeout)
            out = err = None
        else:
            out, err = proc.communicate(timeout=timeout)
        outcome = Outcome(proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        outcome = Outcome(TIMED_OUT, timed_out=True)
    except (_Stop, KeyboardInterrupt):
        outcome = Outcome(INTERRUPTED, interrupted=True)
    finally:
        _restore_handlers(previous)
        if proc.poll() is None:
            _stop(proc)
    if outcome.returncode != 0 and cleanup is not None:
        cleanup()  # a failed job may leave ranks behind on other "hosts"
    if reader is not None:
        reader.join(timeout=GRACE_SECONDS)
    if capture and outcome.stdout is None:
        try:
            outcome.stdout, outcome.stderr = proc.communicate(timeout=GRACE_SECONDS)
        except subprocess.TimeoutExpired:  # something outside the group still holds the pipes
            outcome.stdout, outcome.stderr = "", ""
    return outcome


def _pass_on(stream, watch: Callable[[str], None]) -> None:
    for line in stream:
        sys.stderr.write(line)
        sys.stderr.flush()
        watch(line)


def _stop(proc: subprocess.Popen) -> None:
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc, signal.SIGKILL)  # also whatever the launcher left behind in its group
    proc.wait()


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _raise_stop(signum, frame):
    raise _Stop(signum)


def _install_handlers():
    try:
        return {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    except ValueError:  # not the main thread: signals stay with whoever handles them there
        return {}


def _restore_handlers(previous) -> None:
    for s, h in previous.items():
        signal.signal(s, h)
