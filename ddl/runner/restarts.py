"""Elastic jobs launched again, as torchrun does: where in-place recovery cannot go on (fewer ranks left than
--min-np, an MPI without ULFM such as MPICH, a lost host and its launcher daemon, any failed launch), ddlrun
launches the job again, up to --max-restarts times, on the hosts the discovery script lists then (else the
same hosts), and the ranks start from the last commit rank 0 wrote (ddl.elastic.persist). A job whose
discovery script lists more slots than it has, below --max-np, ends at its next commit and is launched again
on them: such a restart is not a failure and does not count against --max-restarts.

Decisions only: the launch itself comes in as a function (ddl.tools.ddlrun gives its own), so this is tested
without MPI.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..elastic import persist
from . import discovery
from .hosts import Host, HostError
from .supervise import INTERRUPTED, TIMED_OUT

TOO_FEW = 75   # every survivor's status when fewer than --min-np were left (ddl.elastic.EXIT_TOO_FEW)
LOST_HOST = 76  # ddlrun's status when Open MPI's runtime lost a host's daemon
WHY = {TOO_FEW: "fewer ranks than --min-np were left to go on in place", LOST_HOST: "a host was lost"}
FINAL = {0, TIMED_OUT, INTERRUPTED}  # a success, or a stop the user asked for: never launched again


@dataclass(frozen=True)
class Policy:
    max_restarts: int = 0            # launches again after a failure
    script: str | None = None        # --host-discovery-script
    min_np: int = 1
    max_np: int | None = None
    interval: float = 5.0            # seconds between two runs of the script while the job runs

    @property
    def active(self) -> bool:
        return self.max_restarts > 0 or self.script is not None


class NotLaunched(Exception):
    """The launch did not happen (a pre-launch check failed): ``status`` is ddlrun's; nothing to restart."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


Launch = Callable[[list[Host] | None, int | None, dict[str, str]], int]


def ranks_for(hosts: list[Host], wanted: int | None, policy: Policy) -> int:
    """How many ranks a launch on ``hosts`` gets: what was asked for (else every slot), at most --max-np and
    the slots there are; an error below --min-np."""
    available = discovery.slots(hosts)
    n = min(x for x in (wanted or available, policy.max_np or available, available))
    if n < policy.min_np:
        listed = ", ".join(f"{h.name}:{h.slots or 1}" for h in hosts)
        raise HostError(f"the hosts give {available} slot(s) ({listed}), fewer than --min-np {policy.min_np}")
    return n


def run(policy: Policy, hosts: list[Host] | None, np: int | None, launch: Launch, say: Callable[[str], None],
        environ=os.environ) -> int:
    """Launches until the job succeeds, is stopped, or has used its restarts; returns the last status."""
    if not policy.active:
        return launch(hosts, np, {})
    folder, made = state_folder(environ)
    try:
        return _launches(policy, hosts, np, launch, say, folder, made)
    except BaseException:  # not launched (a check failed, the script failed first): nothing to keep
        if made and not (folder / persist.STATE_FILE).exists():
            shutil.rmtree(folder, ignore_errors=True)
        raise


def _launches(policy: Policy, hosts, np, launch: Launch, say, folder: Path, made: bool) -> int:
    failures = launches = generation = 0
    first: int | None = None  # the first launch's ranks
    grown: list[int] = []
    status = 0
    while True:
        if policy.script:
            try:
                hosts = discovery.discover(policy.script)
                # the first launch takes what was asked; later ones grow back up to --max-np (else that first size)
                np_now = ranks_for(hosts, np if launches == 0 else (policy.max_np or first), policy)
            except HostError as e:
                if launches == 0:
                    raise
                say(f"not launched again: {e}")
                break
        else:
            np_now = np
        if launches == 0:
            first = np_now
        settings = {"DDL_ELASTIC_STATE_DIR": str(folder), "DDL_ELASTIC_RESTART": str(launches)}
        if policy.script:
            settings["DDL_ELASTIC_GENERATION"] = str(generation)
        grown.clear()
        persist.ended_to_grow(folder)  # an earlier launch's mark is not this one's

        def found(more: list[Host], generation=generation + 1) -> None:
            persist.write_hosts(folder, generation, [(h.name, h.slots or 1) for h in more])
            grown.append(generation)

        current = np_now if np_now is not None else 0
        watching = policy.script is not None and current and current < (policy.max_np or current)
        if watching:
            with discovery.Watcher(policy.script, current, policy.interval, found, say):
                status = launch(hosts, np_now, settings)
        else:
            status = launch(hosts, np_now, settings)
        launches += 1
        if grown:
            generation = grown[-1]
        if status in FINAL:
            break
        if grown and persist.ended_to_grow(folder) == grown[-1]:
            say(f"launching again on the more hosts {policy.script} found (not counted against --max-restarts)")
            continue
        if failures >= policy.max_restarts:
            if policy.max_restarts:
                say(f"not launched again: the {policy.max_restarts} restart(s) of --max-restarts are used")
            break
        failures += 1
        say(f"restart {failures} of {policy.max_restarts}: {WHY.get(status, f'the job failed with status {status}')}"
            f"; from the last commit in {folder}")
    if status == 0 and made:
        shutil.rmtree(folder, ignore_errors=True)
    elif status != 0:
        say(f"the last commit is kept in {folder} (DDL_ELASTIC_STATE_DIR={folder} ddlrun ... starts from it)")
    return status


def state_folder(environ=os.environ) -> tuple[Path, bool]:
    """(the folder the ranks keep their commits in, whether ddlrun made it). DDL_ELASTIC_STATE_DIR names one
    the user keeps (a job started with it resumes from the commit there); else a new one under the current
    folder, which on a cluster is usually on the file system the hosts share."""
    given = environ.get("DDL_ELASTIC_STATE_DIR")
    if given:
        folder = Path(given)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / persist.HOSTS_FILE).unlink(missing_ok=True)  # an earlier job's news is not this one's
        return folder, False
    return Path(tempfile.mkdtemp(prefix=".ddl-elastic-", dir=os.getcwd())), True
