"""ddlrun's checks before a launch, as IBM's ddlrun made them: every host reachable by ssh (batch mode, short
timeouts, all hosts at once), ddl importable there with the same version as here, and the same hardware (GPU
count, CPU model) everywhere. Each problem is reported with its host.

``python -m ddl.runner.prelaunch`` prints what a host has (the probe ssh runs there), as one JSON line.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass

SSH = ("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "StrictHostKeyChecking=accept-new")
HOST_SECONDS = 10.0  # per host, connection and probe together: an unreachable host is reported within this


def host_seconds(environ=os.environ) -> float:
    """The checks' deadline per host: $DDL_CHECK_SECONDS, or HOST_SECONDS (a cold Python import from a shared
    filesystem, or hosts that share a few cores, can take longer than an unreachable host should)."""
    text = environ.get("DDL_CHECK_SECONDS")
    if not text:
        return HOST_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(f"DDL_CHECK_SECONDS={text!r}: the checks' deadline per host must be a positive number "
                         f"of seconds")
    return seconds


def probe() -> dict:
    """What this host has, as the checks compare it."""
    from ..config import version
    from ..topology import discover

    gpus = discover.nvml_gpus()
    return {"ddl": version(), "python": platform.python_version(), "cpu": _cpu_model(),
            "cores": os.cpu_count() or 1, "gpus": len(gpus) if gpus else 0}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass
class Report:
    host: str
    facts: dict | None = None
    problem: str | None = None


def ssh_command() -> list[str]:
    """The ssh ddlrun uses: $DDL_SSH (e.g. 'ssh -p 2222 -i key') or SSH's batch-mode defaults."""
    return shlex.split(os.environ["DDL_SSH"]) if os.environ.get("DDL_SSH") else list(SSH)


def probe_host(host: str, ssh: list[str], python: str, seconds: float = HOST_SECONDS) -> Report:
    # ssh hands the remote side one string for its shell: every word is quoted; host names are validated.
    remote = shlex.join([python, "-m", "ddl.runner.prelaunch"])
    try:
        done = subprocess.run([*ssh, host, remote], capture_output=True, text=True, timeout=seconds,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Report(host, problem=f"no answer within {seconds:g} s (unreachable, or ssh waits for a password)")
    except OSError as e:
        return Report(host, problem=f"cannot run {ssh[0]!r}: {e.strerror}")
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        try:
            return Report(host, facts=json.loads(lines[-1]))
        except json.JSONDecodeError:
            pass
    err = (done.stderr.strip().splitlines() or ["no output"])[-1]
    if done.returncode == 255:  # ssh's own failure: connection, authentication, host key
        return Report(host, problem=f"unreachable by ssh: {err}")
    if "No module named" in err:
        return Report(host, problem=f"ddl is not importable with {python}: {err}")
    return Report(host, problem=f"the probe failed (status {done.returncode}): {err}")


def check(hosts: list[str], here: dict, ssh: list[str], python: str, local: set[str] = frozenset(),
          seconds: float = HOST_SECONDS) -> tuple[list[Report], list[str]]:
    """Probes every host at once (``local`` names are this machine: ``here`` stands for them); returns the
    reports and the problems found, each naming its host (or the hosts that differ)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(64, max(1, len(hosts)))) as pool:
        futures = [None if h in local else pool.submit(probe_host, h, ssh, python, seconds) for h in hosts]
        reports = [Report(h, facts=here) if f is None else f.result() for h, f in zip(hosts, futures)]
    problems = [f"{r.host}: {r.problem}" for r in reports if r.problem]
    reached = [r for r in reports if r.facts]
    for r in reached:
        if r.facts.get("ddl") != here["ddl"]:
            problems.append(f"{r.host}: ddl {r.facts.get('ddl')}, but {here['ddl']} here")
    for key, what in (("gpus", "GPU count"), ("cpu", "CPU model")):
        values = {r.host: r.facts.get(key) for r in reached}
        if len(set(map(str, values.values()))) > 1:
            problems.append(f"hosts differ in {what}: " + ", ".join(f"{h} {v}" for h, v in values.items()))
    return reports, problems


if __name__ == "__main__":
    print(json.dumps(probe()))
    sys.exit(0)
