"""Probe results kept per set of hosts, so the next job on the same hosts starts without measuring.

One file per host set, named by a hash of the sorted host names, holding the names themselves: a file whose
hosts differ (a hash collision, a copied file) or that does not parse is reported and ignored, never used.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from .result import ProbeError, ProbeResult


def default_directory() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ddl", "probe")


def path(directory: str, hosts: list[str]) -> Path:
    digest = hashlib.sha256("\n".join(sorted(hosts)).encode()).hexdigest()[:20]
    return Path(directory) / f"probe-{digest}.json"


def load(directory: str, hosts: list[str]) -> tuple[ProbeResult | None, str | None]:
    """(result, None) from the cache; (None, why not) when there is none or it cannot be used."""
    p = path(directory, hosts)
    if not p.exists():
        return None, None
    try:
        result = ProbeResult.from_dict(json.loads(p.read_text()), f"probe cache {p}")
    except (OSError, ValueError) as e:
        return None, f"{e if isinstance(e, ProbeError) else f'probe cache {p}: unreadable ({e})'}; measuring again"
    if sorted(result.hosts) != sorted(hosts):
        extra = sorted(set(result.hosts) ^ set(hosts))[:3]
        return None, f"probe cache {p} is for other hosts (differs in {', '.join(extra)}); measuring again"
    return result, None


def save(directory: str, result: ProbeResult) -> Path:
    """Writes atomically (a job reading the cache meanwhile sees the old file or the new, never half)."""
    p = path(directory, result.hosts)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".probe-")
    with os.fdopen(fd, "w") as f:
        json.dump(result.to_dict(), f, indent=1)
    os.replace(tmp, p)
    return p
