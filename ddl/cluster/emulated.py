"""The emulated multi-node cluster: one network namespace per node, a bridge per switch, veth links shaped by tc.

    with Cluster(emulate.topology("T2")) as c:      # up on enter, torn down on exit, error and signal
        c.mpirun(["python", "job.py"])               # MPI inside: ranks see separate hosts
        c.counters()                                 # bytes each link carried, per direction

Every node is a namespace ``ddl-<cluster>-<host>`` with ``lo`` and ``eth0`` (10.200.x.y/16); every switch is a
bridge in the cluster's switch namespace ``ddl-<cluster>-sw``; a switch's uplink is a veth pair from its bridge
to its parent's. Both ends of every link get a tbf shaper (full duplex), whose byte counters tell what crossed
the link. Hostnames are per process (``unshare --uts``), so MPI's launcher reaches a node through an agent
script that enters its namespace (ssh's place). Node names resolve on every node, as a cluster's DNS would
have them (``ip netns exec`` mounts /etc/netns/<namespace>/hosts over /etc/hosts). MTU 9000, as cluster
fabrics run, so framing costs <1 %.
Needs root and ``ip netns``; available() says why not.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import spec as emulate
from ..runner import mpirun
from ..runner import supervise
from .. import topology as topo
from ..errors import DDLError

STATE_DIR = Path(os.environ.get("DDL_CLUSTER_STATE", "/run/ddl-cluster"))
NETNS_ETC = Path("/etc/netns")  # ip netns exec's per-namespace overrides of /etc files
MTU = 9000
NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,23}")
_AUTO = re.compile(r"ddl-p(\d+)-\d+-")
_DAEMON_LOST = "A daemon failed to report back"  # Open MPI's launcher (PRRTE), when a node's daemon never came
_counter = iter(range(1 << 30))

AGENT = """#!/bin/sh
# ssh's place for MPI's launcher: run COMMAND on emulated node HOST (its namespace, its hostname).
while [ "${1#-}" != "$1" ]; do shift; done   # ssh-style options (hydra passes -x before the host)
host=$1; shift
case "$host" in ''|*[!a-z0-9-]*) echo "ddl-cluster agent: bad host name '$host'" >&2; exit 255 ;; esac
exec ip netns exec "%(prefix)s$host" unshare --uts sh -c "hostname $host; $*"
"""


class ClusterError(DDLError):
    """The emulated cluster cannot be built, reached or run (not root, no namespaces, a failed command)."""


def available() -> str | None:
    """None where clusters can be built here, else why not."""
    if os.geteuid() != 0:
        return "the emulated cluster needs root (network namespaces and tc): run as root, or use local ranks"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"the emulated cluster needs '{tool}' (iproute2 / util-linux)"
    probe = f"ddl-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"network namespaces are unavailable here: ip netns add: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass(frozen=True)
class Link:
    """One shaped link: from ``child`` (a node or a switch) up into ``parent``; each end in its namespace."""
    child: str
    parent: str
    bps: int
    up: tuple[str, str]      # (namespace, device) whose egress carries child -> parent traffic
    down: tuple[str, str]    # (namespace, device) whose egress carries parent -> child traffic


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and r.returncode:
        raise ClusterError(f"{' '.join(argv)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def _burst(bps: int) -> int:
    """tbf's bucket: 1 ms of traffic, never below two frames. A deeper bucket lets small messages pass at the
    speed of memory (a 250 KB bucket made a 64 KiB allreduce beat the 500 Mbit/s link's bound)."""
    return max(bps // 8 // 1000, 2 * MTU + 512)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Deletes namespaces left by auto-named clusters whose process died (a kill -9 skips every finally)."""
    gone = []
    for ns in _namespaces():
        m = _AUTO.match(ns)
        if m and not _pid_alive(int(m.group(1))):
            _kill_and_delete(ns)
            gone.append(ns)
    return gone


def _namespaces() -> list[str]:
    out = _sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_inside(ns: str, wait: float = 5.0) -> None:
    """Kills every process in namespace ns, and waits (a while) until none is left: a killed process lingers
    until the kernel has torn it down, and a launcher may spawn another in between."""
    deadline = time.monotonic() + wait
    while pids := _sh("ip", "netns", "pids", ns, check=False).stdout.split():
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _kill_and_delete(ns: str) -> None:
    _kill_inside(ns)
    _sh("ip", "netns", "del", ns, check=False)
    shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


class Cluster:
    """An emulated cluster of ``topology`` (an emulate spec's Topology, placement included)."""

    def __init__(self, topology: topo.Topology | str, name: str | None = None):
        self.topology = emulate.topology(topology) if isinstance(topology, str) else topology
        self.name = name or f"p{os.getpid()}-{next(_counter)}"
        if not NAME.fullmatch(self.name):
            raise ClusterError(f"cluster name {self.name!r}: lower-case letters, digits and '-', at most 24")
        t = self.topology
        self.prefix = f"ddl-{self.name}-"
        self.switch_ns = self.prefix + "sw"
        self._host = {n: t.graph.nodes[n].get("host", n) for n in t.nodes()}  # node vertex -> hostname
        self.hosts = list(self._host.values())
        self.rank_hosts = [self._host[n] for n in emulate.rank_nodes(t)]
        switches = [v for v in t.graph.nodes if t.kind(v) == "switch" and t.host_of(v) is None]
        self._bridge = {s: f"b{i}" for i, s in enumerate(switches)}
        self.links = self._links(switches)
        self.workdir: Path | None = None
        self._up = False
        self._old_handlers: dict = {}

    def ns(self, host: str) -> str:
        return self.prefix + host

    def address(self, host: str) -> str:
        """The IPv4 address of ``host``'s eth0 (the i-th node's: 10.200.0.0/16 counted from 1)."""
        i = self.hosts.index(host)
        return f"10.200.{i // 250}.{i % 250 + 1}"

    @property
    def nranks(self) -> int:
        return len(self.rank_hosts)

    def topology_for(self, rank_hosts: list[str]) -> topo.Topology:
        """The cluster's topology with a job's ranks placed on it: rank r on the next of its host's places
        (a job on some of the hosts, as an elastic job launched again after losing one)."""
        t = self.topology
        places: dict[str, list[str]] = {}
        for device, host in zip(t.placement or t.place(None, t.capacity()), self.rank_hosts):
            places.setdefault(host, []).append(device)
        placement = []
        for r, host in enumerate(rank_hosts):
            if not places.get(host):
                raise ClusterError(f"rank {r}: host {host!r} is not in the cluster or has no place left "
                                   f"(hosts: {', '.join(dict.fromkeys(self.rank_hosts))})")
            placement.append(places[host].pop(0))
        return topo.Topology(t.name, t.graph, placement)

    def _links(self, switches: list[str]) -> list[Link]:
        """A node's link runs from its eth0 to port n<i> of its switch's bridge; a switch's uplink from port u<i>
        of its bridge to port d<i> of its parent's."""
        t = self.topology
        ends = [(n, (self.ns(self._host[n]), "eth0"), (self.switch_ns, f"n{i}")) for i, n in enumerate(t.nodes())]
        ends += [(s, (self.switch_ns, f"u{i}"), (self.switch_ns, f"d{i}")) for i, s in enumerate(switches)]
        return [Link(c, t.parent(c), int(round(t.graph.edges[c, t.parent(c)]["bandwidth"] * 8e9)), up, down)
                for c, up, down in ends if t.parent(c) is not None]

    # -- up and down ------------------------------------------------------------------------------------------

    def __enter__(self) -> "Cluster":
        self._trap_signals()
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> "Cluster":
        why = available()
        if why:
            raise ClusterError(why)
        remove_stale()
        taken = [ns for ns in _namespaces() if ns.startswith(self.prefix)]
        if taken:
            raise ClusterError(f"cluster {self.name!r} exists already ({', '.join(taken)}): "
                               f"ddl-cluster down {self.name}")
        self._up = True  # from here on, down() has something to remove
        self.workdir = Path(tempfile.mkdtemp(prefix=f"ddl-cluster-{self.name}-"))
        t = self.topology
        _sh("ip", "netns", "add", self.switch_ns)
        _sh("ip", "-n", self.switch_ns, "link", "set", "lo", "up")
        for br in self._bridge.values():
            _sh("ip", "-n", self.switch_ns, "link", "add", br, "mtu", str(MTU), "type", "bridge")
            _sh("ip", "-n", self.switch_ns, "link", "set", br, "up")
        for h in self.hosts:
            _sh("ip", "netns", "add", self.ns(h))
            _sh("ip", "-n", self.ns(h), "link", "set", "lo", "up")
        for link in self.links:
            self._wire(link)
        for n in t.nodes():
            if t.parent(n) is not None:
                host = self._host[n]
                _sh("ip", "-n", self.ns(host), "addr", "add", f"{self.address(host)}/16", "dev", "eth0")
        self._write_files()
        return self

    def _wire(self, link: Link) -> None:
        (uns, udev), (dns, ddev) = link.up, link.down
        # Created straight into both namespaces: names never meet another run's in the root namespace.
        _sh("ip", "link", "add", udev, "mtu", str(MTU), "netns", uns, "type", "veth", "peer", "name", ddev,
            "mtu", str(MTU), "netns", dns)
        for ns, dev, switch in ((uns, udev, self.topology.kind(link.child) == "switch" and link.child),
                                (dns, ddev, link.parent)):
            if switch:
                _sh("ip", "-n", ns, "link", "set", dev, "master", self._bridge[switch])
            _sh("ip", "-n", ns, "link", "set", dev, "up")
            _sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{link.bps}bit",
                "burst", str(_burst(link.bps)), "latency", "50ms")

    def _write_files(self) -> None:
        # Software that resolves its own hostname (gloo does, and crashes when it cannot) finds it, and the
        # other nodes' names too (no DNS reaches the namespaces).
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self.address(h)} {h}\n" for h in self.hosts)
        for h in self.hosts:
            (NETNS_ETC / self.ns(h)).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / self.ns(h) / "hosts").write_text(hosts)
        agent = self.workdir / "agent.sh"
        agent.write_text(AGENT % {"prefix": self.prefix})
        agent.chmod(0o755)
        (self.workdir / "topology.json").write_text(self.topology.to_json())

    def down(self) -> None:
        """Kills what runs inside and deletes every namespace (which removes their veths and bridges)."""
        if self._up:
            for ns in [self.ns(h) for h in self.hosts] + [self.switch_ns]:
                _kill_and_delete(ns)
            self._up = False
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        self._restore_signals()

    def _trap_signals(self) -> None:
        """SIGTERM and SIGHUP unwind like Ctrl-C, so the finally that tears the cluster down runs."""
        if threading.current_thread() is not threading.main_thread():
            return
        def stop(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")
        for s in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[s] = signal.signal(s, stop)

    def _restore_signals(self) -> None:
        for s, h in self._old_handlers.items():
            signal.signal(s, h)
        self._old_handlers.clear()

    # -- using it -----------------------------------------------------------------------------------------------

    def exec_argv(self, host: str, argv: list[str]) -> list[str]:
        """argv run on emulated ``host``: inside its namespace, under its hostname. No shell sees argv."""
        if host not in self.hosts:
            raise ClusterError(f"cluster {self.name!r} has no host {host!r} (hosts: {', '.join(self.hosts)})")
        return ["ip", "netns", "exec", self.ns(host), "unshare", "--uts", "sh", "-c", 'hostname "$0"; exec "$@"',
                host, *argv]

    def counters(self) -> dict[str, tuple[int, int]]:
        """Bytes every link has carried so far: {child: (up, down)}, from the tbf shapers' counters."""
        seen: dict[tuple[str, str], int] = {}
        for ns in {end[0] for link in self.links for end in (link.up, link.down)}:
            out = _sh("tc", "-n", ns, "-s", "-j", "qdisc", "show").stdout
            for q in json.loads(out or "[]"):
                if q.get("kind") == "tbf":
                    seen[(ns, q["dev"])] = int(q["bytes"])
        return {link.child: (seen.get(link.up, 0), seen.get(link.down, 0)) for link in self.links}

    def mpirun(self, argv: list[str], mpiexec: str | None = None, env: dict[str, str] | None = None,
               timeout: float = 600, quiet: bool = False, capture: bool = False,
               tell_topology: bool = True, mpich_tcp: str = "ofi") -> subprocess.CompletedProcess:
        """Runs argv as an MPI job on the cluster (mpiexec started on the first host), ranks placed as the
        topology says, with DDL_TOPOLOGY pointing at it so ddl plans over the emulated switches (unless
        ``tell_topology`` is False: then ddl sees only hosts, as on a cluster nobody describes; ``mpich_tcp``:
        MPICH's module for TCP, ofi or ucx). A job past
        ``timeout`` seconds is stopped (status supervise.TIMED_OUT), as is one interrupted (INTERRUPTED); a
        failed or stopped job leaves nothing running on any node."""
        if not self._up:
            raise ClusterError(f"cluster {self.name!r} is not up")
        exe = mpiexec or mpirun.mpiexec_path()
        extra = {**({"DDL_TOPOLOGY": str(self.workdir / "topology.json")} if tell_topology else {}), **(env or {})}
        try:
            cmd, menv = mpirun.cluster_command(exe, self.rank_hosts, str(self.workdir / "agent.sh"), argv,
                                               forward=sorted(extra), mpich_tcp=mpich_tcp,
                                               iface="eth0" if self.links else "lo")  # one node: no NIC
        except ValueError as e:
            raise ClusterError(f"cluster {self.name!r}: {e}") from None
        full = self.exec_argv(self.rank_hosts[0], cmd)
        if not quiet:
            print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
        deadline = time.monotonic() + timeout
        for attempt in range(2):
            done = supervise.run(full, env={**os.environ, **menv, **extra}, timeout=deadline - time.monotonic(),
                                 capture=capture, cleanup=self.kill_jobs)
            # Open MPI's launcher lost a node's daemon before any rank started (seen once in CI, exit 213 on a
            # loaded machine): nothing of the job ran, so it starts again once while half the time is left
            lost = done.returncode and capture and _DAEMON_LOST in (done.stdout or "") + (done.stderr or "")
            if attempt or not lost or deadline - time.monotonic() < timeout / 2:
                break
            self.kill_jobs()
            print(f"cluster {self.name!r}: a daemon did not report back; starting the job again", file=sys.stderr,
                  flush=True)
        return subprocess.CompletedProcess(full, done.returncode, done.stdout, done.stderr)

    def torchrun(self, argv: list[str], env: dict[str, str] | None = None, timeout: float = 600,
                 port: int = 29400, python: str | None = None,
                 mpich_tcp: str = "ofi") -> list[subprocess.CompletedProcess]:
        """Runs argv (a Python script and its arguments) as a torchrun job, no MPI launcher: one torchrun per host (as many processes as the
        topology places there), meeting through a c10d rendezvous on the first host. MPI's traffic is kept on
        TCP over the emulated links (``mpich_tcp``: through ofi or ucx; UCX's shared memory would cross between
        namespaces). The
        job gets no topology: ddl sees hosts and probes for switches as on a cluster nobody describes. Past
        ``timeout`` seconds, or once one host's torchrun fails, everything on the cluster is stopped.
        ``python``: the environment whose torchrun runs it (default: this one's). Returns each host's
        completed torchrun, captured, in host order."""
        if not self._up:
            raise ClusterError(f"cluster {self.name!r} is not up")
        per_host = {h: self.rank_hosts.count(h) for h in dict.fromkeys(self.rank_hosts)}
        torchrun = [python or sys.executable, "-m", "torch.distributed.run"]  # (torch may sit in another environment)
        extra = {**mpirun.mpich_tcp_env(mpich_tcp, "eth0"), **(env or {})}
        endpoint = f"{self.address(next(iter(per_host)))}:{port}"
        logs = {h: (tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for h in per_host}
        procs = {h: subprocess.Popen(self.exec_argv(h, [*torchrun, "--nnodes", str(len(per_host)), "--nproc-per-node",
                                                        str(n), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                                        endpoint, "--rdzv-id", self.name, *argv]),
                                     env={**os.environ, **extra}, stdout=logs[h][0], stderr=logs[h][1],
                                     text=True, start_new_session=True)
                 for h, n in per_host.items()}
        deadline = time.monotonic() + timeout
        try:
            while any(p.poll() is None for p in procs.values()):
                if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs.values()):
                    self.kill_jobs()
                    break
                time.sleep(0.1)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
        done = []
        for h, p in procs.items():
            out, err = logs[h]
            code = p.wait()
            out.seek(0), err.seek(0)
            done.append(subprocess.CompletedProcess(p.args, code, out.read(), err.read()))
            out.close(), err.close()
        return done

    def kill_jobs(self) -> None:
        """Kills every process running on the cluster's nodes."""
        for h in self.hosts:
            _kill_inside(self.ns(h))

    # -- persistence for ddl-cluster ------------------------------------------------------------------------------

    def save(self) -> Path:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        path = STATE_DIR / f"{self.name}.json"
        path.write_text(json.dumps({"name": self.name, "created": time.time(), "workdir": str(self.workdir),
                                    "topology": self.topology.to_dict()}))
        return path

    @classmethod
    def attach(cls, name: str) -> "Cluster":
        path = STATE_DIR / f"{name}.json"
        if not path.exists():
            raise ClusterError(f"no cluster named {name!r} (ddl-cluster status lists them)")
        state = json.loads(path.read_text())
        c = cls(topo.load(state["topology"]), name=state["name"])
        c._up, c.workdir = True, Path(state["workdir"])
        return c

    def forget(self) -> None:
        (STATE_DIR / f"{self.name}.json").unlink(missing_ok=True)


def saved() -> list[str]:
    return sorted(p.stem for p in STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []
