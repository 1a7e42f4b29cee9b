"""Hosts from a discovery script (horovodrun's --host-discovery-script): an executable that prints the hosts
available now, ``host:slots`` (or ``host``, or ``host slots=N``) a line. ddlrun runs it before every launch,
and every few seconds while an elastic job runs, to notice new hosts (ddl.elastic.persist says how the job
learns of them).

A script that fails, runs past its deadline or prints something that is not a host list is an error naming
the script and what it did; while a job runs such a failure is reported and the hosts known before are kept.
"""
from __future__ import annotations

import subprocess
import threading
from typing import Callable

from .hosts import Host, HostError, parse_hostfile

DEADLINE_SECONDS = 10.0


def discover(script: str, deadline: float = DEADLINE_SECONDS) -> list[Host]:
    """The hosts the script prints now."""
    try:
        done = subprocess.run([script], capture_output=True, text=True, timeout=deadline)
    except subprocess.TimeoutExpired:
        raise HostError(f"--host-discovery-script {script!r} ran past its {deadline:g} s deadline") from None
    except OSError as e:
        raise HostError(f"--host-discovery-script {script!r} cannot be run: {e.strerror}") from None
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()[-1:] or ["nothing on stderr"]
        raise HostError(f"--host-discovery-script {script!r} failed with status {done.returncode}: {said[0]}")
    return parse_hostfile(done.stdout, f"--host-discovery-script {script!r} printed: no hosts; its output")


def slots(hosts: list[Host]) -> int:
    return sum(h.slots or 1 for h in hosts)


class Watcher:
    """Runs the script every ``interval`` seconds in a thread while a job runs; calls ``found(hosts)`` each
    time it lists more slots than ``current`` (then waits for the next launch), and ``said(text)`` once per
    kind of failure."""

    def __init__(self, script: str, current: int, interval: float, found: Callable[[list[Host]], None],
                 said: Callable[[str], None]):
        self.script, self.current, self.interval = script, current, interval
        self.found, self.said = found, said
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ddlrun-discovery", daemon=True)
        self._reported: set[str] = set()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=DEADLINE_SECONDS + self.interval)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                hosts = discover(self.script)
            except HostError as e:
                if str(e) not in self._reported:
                    self._reported.add(str(e))
                    self.said(f"{e}; keeping the hosts known")
                continue
            if slots(hosts) > self.current:
                self.found(hosts)
                return
