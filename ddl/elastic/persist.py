"""What outlives a restart of an elastic job: the last commit, on disk, and the hosts ddlrun has found since.

ddlrun (``--max-restarts``, ``--host-discovery-script``) gives every rank a folder, DDL_ELASTIC_STATE_DIR, on a
file system the hosts share. Rank 0 writes each commit there (``state.pkl``, replaced whole by a rename, so a
crash mid-write leaves the commit before it), from a thread of its own: a commit stays a copy in memory on the
training's path. A restarted job starts from that file. ddlrun writes ``hosts`` there when its discovery script
lists more slots than the job has: the ranks notice at their next commit and end together with EXIT_GROW, and
ddlrun restarts the job on the larger set of hosts.
"""
from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path

STATE_FILE = "state.pkl"
HOSTS_FILE = "hosts"  # first line: its generation (a counter), then ``host:slots`` a line
GROWING_FILE = "growing"  # the generation the job ended for: its exit status alone may not survive MPI's launcher
EXIT_GROW = 77        # every rank's status when the job ends to restart on more hosts


def folder(environ=os.environ) -> Path | None:
    value = environ.get("DDL_ELASTIC_STATE_DIR")
    return Path(value) if value else None


def restart_count(environ=os.environ) -> int:
    """How many times ddlrun has restarted this job (0: the first launch)."""
    return int(environ.get("DDL_ELASTIC_RESTART", "0") or 0)


def load(where: Path):
    """The last commit written there, or None when there is none."""
    try:
        with open(where / STATE_FILE, "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        return None


class Writer:
    """Writes commits in order, one at a time, off the caller's thread; ``flush`` waits for the last one."""

    def __init__(self, where: Path):
        self.where = where
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def write(self, saved) -> None:
        self.flush()  # one write in flight at most: commits land in order, and memory holds two copies at most
        self._thread = threading.Thread(target=self._write, args=(saved,), name="ddl-elastic-writer", daemon=True)
        self._thread.start()

    def flush(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise OSError(f"ddl.elastic: writing the commit to {self.where / STATE_FILE} failed: {error}")

    def _write(self, saved) -> None:
        temporary = self.where / f".{STATE_FILE}.{os.getpid()}"
        try:
            with open(temporary, "wb") as f:
                pickle.dump(saved, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(temporary, self.where / STATE_FILE)
        except BaseException as e:  # reported by the next write or flush, on the training's thread
            self.error = e


def hosts_generation(where: Path) -> int:
    """The generation of the hosts file ddlrun last wrote (0: none yet)."""
    try:
        first = (where / HOSTS_FILE).read_text().split("\n", 1)[0]
    except FileNotFoundError:
        return 0
    return int(first) if first.strip().isdigit() else 0


def mark_growing(where: Path, generation: int) -> None:
    """Rank 0's word that the job ends to be launched on more hosts (MPICH's hydra reports such an end as a
    signal's status, whatever the ranks' own)."""
    (where / GROWING_FILE).write_text(str(generation))


def ended_to_grow(where: Path) -> int:
    """The generation the last launch ended for (0: it did not end to grow); the mark is taken away."""
    try:
        text = (where / GROWING_FILE).read_text()
    except FileNotFoundError:
        return 0
    (where / GROWING_FILE).unlink(missing_ok=True)
    return int(text) if text.strip().isdigit() else 0


def write_hosts(where: Path, generation: int, hosts: list[tuple[str, int]]) -> None:
    """ddlrun's side: the hosts the next launch would use, atomically."""
    temporary = where / f".{HOSTS_FILE}.{os.getpid()}"
    temporary.write_text(f"{generation}\n" + "".join(f"{h}:{k}\n" for h, k in hosts))
    os.replace(temporary, where / HOSTS_FILE)
