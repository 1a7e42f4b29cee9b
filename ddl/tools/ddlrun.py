"""ddlrun: launch a ddl program as an MPI job on this machine, on hosts, in a batch job, or on an emulated cluster.

    ddlrun -np 4 python train.py                     # 4 ranks here (default: one per GPU, else per core)
    ddlrun -H node1:4,node2:4 python train.py        # packed: ranks 0-3 on node1, 4-7 on node2
    ddlrun --hostfile hosts --racks 2 python train.py
    ddlrun python train.py                           # inside Slurm, LSF or PBS: the job's hosts and slots
    ddlrun --emulate T2 python train.py              # an emulated 2-rack cluster (root), torn down after

The program is the first argument that is not an option. Hosts come from -H, --hostfile, --rankfile, else
the batch scheduler (Slurm, LSF, PBS), else this machine. The MPI command is printed (``+ mpirun ...``) and
run without a shell. Before a launch on other hosts, every host is checked over ssh (reachable, ddl importable
in the same version, same GPU count and CPU model); -s or --rankfile skip the checks.

exit status:
  0     every rank succeeded
  N     the job failed: the launcher's status (the failing rank's, as Open MPI or MPICH report it); the
        failing rank and host are printed ("ddlrun: rank 3 (node2): ... exited with status 1")
  2     usage error: bad option, host name, host file, rankfile, scheduler variable, placement or spec;
        or the emulated cluster cannot be built here
  3     a pre-launch check failed (each problem printed with its host)
  75    elastic: fewer ranks than --min-np were left to go on in place (and no restart was left)
  76    elastic: a host was lost, and with it Open MPI's runtime (and no restart was left)
  124   the job ran past --timeout and was stopped
  130   interrupted (Ctrl-C, SIGTERM, SIGHUP): every rank was stopped
"""
from __future__ import annotations

import argparse
import os
import shlex
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path

from ..runner import hosts as hostlib
from ..runner import launch
from ..runner import mpirun
from ..runner import prelaunch
from ..runner import restarts
from ..runner import supervise
from ..errors import DDLError
from .cli import Parser, one_line_errors

USAGE_ERROR = 2
MPI_NAMES = ("openmpi", "mpich")
CHECK_FAILED = 3
SCHEDULER_JOBS = ("SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID")  # inside an allocation: no ssh pre-checks


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def _whole(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    ap = Parser(prog="ddlrun", usage="ddlrun [options] program [args]", allow_abbrev=False,
                                 description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add = ap.add_argument  # IBM's ddlrun took every long option with one dash or two: both are accepted
    add("-np", "--np", "-n", dest="np", type=_positive, help="number of ranks (default: every slot of the hosts)")
    add("-H", "--host", "-host", dest="host", help="hosts, h1,h2 or h1:slots,h2:slots")
    add("--hostfile", "-hostfile", help="file of hosts, one a line: 'host', 'host:N' or 'host slots=N'")
    add("-rf", "--rankfile", "-rankfile", help="Open MPI rankfile ('rank N=host slot=...'); skips the checks")
    add("-m", "--mode", "-mode", default="p", help="IBM DDL mode letter (r n b c m p; default p); ddlrun adds "
        "the dims, e.g. p:4x2x1x1")
    add("--ddloption", "-ddloption", "--ddlarg", "-ddlarg", action="append", default=[],
        help="more DDL_OPTIONS, e.g. '-dbg_level 1' (repeatable)")
    add("--no_ddloptions", "-no_ddloptions", action="store_true",
        help="set no DDL_OPTIONS (the program calls ddl.init(options=...) itself)")
    add("--accelerators", "-accelerators", type=_positive, help="GPUs (ranks) per host where the host list gives no slots")
    add("--nodes", "-nodes", type=_positive, help="nodes per rack (IBM's second tier; default: all nodes)")
    add("--racks", "-racks", type=_positive, help="racks per aisle (default 1)")
    add("--aisles", "-aisles", type=_positive, help="aisles (default 1)")
    add("--mpiarg", "-mpiarg", action="append", default=[], help="arguments for mpirun, e.g. '-x FOO' (repeatable)")
    add("--tcp", "-tcp", action="store_true", help="TCP sockets only (no InfiniBand, UCX or PAMI)")
    add("-v", "--verbose", action="store_true", help="say where ranks go, what each rank gets, what checks found")
    add("-s", "--skipchecks", action="store_true", help="skip the pre-launch checks")
    add("--dry-run", action="store_true", help="print the command and exit")
    add("--emulate", metavar="SPEC", help="run on an emulated cluster: T1..T4, 2x2x2:nic=1gbit, 3,2,1, or a "
        "topology file (root; see ddl-cluster --help)")
    add("--output-filename", metavar="DIR", help="each rank's output in DIR/rank.N/stdout and stderr")
    add("--timeout", type=float, default=0, help="stop the job after this many seconds (0: never)")
    add("--mpi", choices=MPI_NAMES, help="the MPI to launch with (default: the mpiexec found; $DDL_MPIEXEC "
        "names one); bare, before the program (horovodrun's --mpi), it is accepted and changes nothing")
    add("--elastic", action="store_true", help="survive lost ranks: the others shrink, re-plan and go on from "
        "the last ddl.elastic commit (Open MPI's ULFM; see docs/guides/elastic.md)")
    add("--min-np", "-min-np", dest="min_np", type=_positive, help="elastic: the fewest ranks to go on with "
        "(horovodrun's flag; giving it asks for --elastic)")
    add("--max-np", "-max-np", dest="max_np", type=_positive, help="elastic: the most ranks (default -np); "
        "with --host-discovery-script the job grows up to it on new hosts")
    add("--max-restarts", "--reset-limit", dest="max_restarts", type=_whole, default=0,
        help="launch the job again after a failure, up to this many times, from the last ddl.elastic commit "
             "(torchrun's flag; horovodrun's --reset-limit; default 0)")
    add("--host-discovery-script", dest="discovery", metavar="SCRIPT", help="an executable printing the hosts "
        "available now, 'host:slots' a line; run before every launch and every --discovery-interval seconds")
    add("--discovery-interval", type=float, default=1.0, metavar="SECONDS",
        help="seconds between two runs of the discovery script while the job runs (default 1, as horovodrun)")
    # horovodrun's command line (docs/guides/horovod.md)
    add("-p", "--ssh-port", dest="ssh_port", type=_positive, help="the hosts' ssh port (horovodrun's -p)")
    add("--network-interface", "--network-interfaces", dest="iface", metavar="NIC",
        help="keep MPI's traffic between hosts on this interface (horovodrun's flag)")
    add("--timeline-filename", metavar="FILE", help="ddl's Chrome trace of every collective (DDL_TIMELINE)")
    add("--fusion-threshold-mb", type=float, metavar="MB", help="fused gradient buffers of at most MB "
        "mebibytes (DDL_FUSION_BYTES)")
    add("--cycle-time-ms", type=float, metavar="MS", help="accepted for horovodrun scripts: ddl starts each "
        "collective when it is called, with no background cycle to tune")
    add("--start-timeout", type=float, metavar="SECONDS", help="seconds the ranks may take to start (the "
        "pre-launch checks' ssh deadline; horovodrun's flag)")
    add("--gloo", action="store_true", help="accepted for horovodrun scripts: ddl runs its own transport over "
        "MPI, whichever is asked")
    add("--version", action="store_true", help="print ddl's version and exit")
    return ap


def split_program(ap: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """(ddlrun's options, the program and its arguments): the program is the first argument that is not an
    option (or whatever follows ``--``), so its own options are never read as ddlrun's."""
    options: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return options, argv[i + 1:]
        if not word.startswith("-") or word == "-":
            return options, argv[i:]
        name = word.split("=", 1)[0]
        if word == "--mpi" and (i + 1 == len(argv) or argv[i + 1] not in MPI_NAMES):
            i += 1  # horovodrun's bare --mpi: ddl runs over MPI anyway
            continue
        action = ap._option_string_actions.get(name)
        if action is None:
            ap.error(f"unknown option {word!r} (the program starts at the first argument that is not an option)")
        if action.nargs == 0 or "=" in word or i + 1 == len(argv):
            options.append(word)
            i += 1
        else:  # name=value: a value may start with '-' (--mpiarg -pami_noib, --ddloption -dbg_level)
            options.append(f"{name}={argv[i + 1]}")
            i += 2
    return options, []


def _mpiexec(wanted: str | None) -> tuple[str, str]:
    exe = os.environ.get("DDL_MPIEXEC") or mpirun.mpiexec_path()
    kind = mpirun.flavor(exe)
    if wanted and wanted != kind:
        raise DDLError(f"--mpi {wanted}: the mpiexec found ({exe}) is {kind}'s; install the {wanted} wheel in "
                       f"another environment, or set DDL_MPIEXEC to its mpiexec")
    return exe, kind


def _machine() -> launch.Machine:
    from ..topology import discover

    return launch.Machine(hostname=socket.gethostname(), cores=os.cpu_count() or 1,
                          gpus=len(discover.nvml_gpus()), root=os.geteuid() == 0, python=sys.executable,
                          environ=dict(os.environ), free_port=_free_port())


def checks_skipped(args, environ) -> str | None:
    """Why the ssh pre-launch checks do not run, or None when they do."""
    if args.skipchecks:
        return "--skipchecks"
    if args.rankfile:
        return "a rankfile gives the placement"
    allocation = next((v for v in SCHEDULER_JOBS if environ.get(v)), None)
    if allocation:
        return (f"inside a scheduler's allocation ({allocation}): the scheduler checked the hosts, and many "
                f"sites block ssh between nodes")
    return None


def _free_port() -> int:
    """A TCP port nothing listens on here now (the kernel's pick), for torch's store on rank 0's host."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _hosts(args) -> tuple[str, list[hostlib.Host] | None, list[str] | None]:
    """(where the hosts came from, hosts, rankfile placement)."""
    given = [f for f in ("host", "hostfile", "rankfile") if getattr(args, f)]
    if len(given) > 1:
        raise DDLError(f"give one of -H, --hostfile, --rankfile (got {', '.join(given)})")
    if args.host:
        return "-H", hostlib.parse_host_list(args.host), None
    if args.hostfile:
        return "--hostfile", hostlib.read_hostfile(args.hostfile), None
    if args.rankfile:
        return "--rankfile", None, hostlib.read_rankfile(args.rankfile)
    found = hostlib.from_scheduler(os.environ)
    if found:
        return found[0], found[1], None
    return "this machine", None, None


def _policy(args) -> restarts.Policy:
    if args.discovery and (args.host or args.hostfile or args.rankfile):
        raise DDLError("--host-discovery-script lists the hosts: drop -H, --hostfile and --rankfile")
    if args.discovery_interval <= 0:
        raise DDLError(f"--discovery-interval must be positive, got {args.discovery_interval:g}")
    if args.min_np and args.np and args.min_np > args.np:
        raise DDLError(f"--min-np {args.min_np} is more than the {args.np} ranks launched (-np)")
    if args.max_np and args.np and args.max_np < args.np:
        raise DDLError(f"--max-np {args.max_np} is less than the {args.np} ranks launched (-np)")
    return restarts.Policy(max_restarts=args.max_restarts, script=args.discovery, min_np=args.min_np or 1,
                           max_np=args.max_np, interval=args.discovery_interval)


def _in_place(args, kind: str, policy: restarts.Policy) -> bool:
    """Whether the job recovers in place (ULFM). MPICH has no ULFM: with restarts an elastic job is launched
    again instead; without, its launcher refuses (ddl.runner.mpirun says why)."""
    asked = args.elastic or args.min_np is not None
    if asked and kind == "mpich" and policy.active:
        _say("MPICH has no fault tolerance (ULFM): a lost rank ends the launch, and the job is launched again "
             "(--max-restarts)")
        return False
    return asked


def horovod_settings(args) -> dict[str, str]:
    """What horovodrun's flags ask of every rank, in ddl's settings."""
    out = {}
    if args.timeline_filename:
        out["DDL_TIMELINE"] = os.path.abspath(args.timeline_filename)
    if args.fusion_threshold_mb is not None:
        if args.fusion_threshold_mb < 0:
            raise DDLError(f"--fusion-threshold-mb {args.fusion_threshold_mb:g}: a size of at least 0")
        out["DDL_FUSION_BYTES"] = str(int(args.fusion_threshold_mb * 2**20))
    return out


def _request(args, program, hosts, rank_hosts, **extra) -> launch.Request:
    try:
        mpiargs = tuple(w for a in args.mpiarg for w in shlex.split(a))
    except ValueError as e:
        raise DDLError(f"--mpiarg {args.mpiarg!r}: {e}") from None
    extra["job_env"] = {**horovod_settings(args), **extra.get("job_env", {})}
    if args.iface and "iface" not in extra:
        extra["iface"] = args.iface
    return launch.Request(
        program=program, np=args.np, hosts=hosts, rank_hosts=rank_hosts, mode=args.mode,
        ddloption=" ".join(args.ddloption), no_ddloptions=args.no_ddloptions, accelerators=args.accelerators,
        nodes=args.nodes, racks=args.racks, aisles=args.aisles,
        mpiargs=mpiargs, tcp=args.tcp, elastic=args.in_place, min_np=args.min_np, max_np=args.max_np,
        output_dir=os.path.abspath(args.output_filename) if args.output_filename else None,
        ssh_port=args.ssh_port, **extra)


def _prepare(args, program, source, hosts, rank_hosts, here: launch.Machine, **extra):
    """(plan, command, launcher environment) for this request, the command printed (and the placement with -v)."""
    exe, kind = _mpiexec(args.mpi)
    p = launch.plan(_request(args, program, hosts, rank_hosts, **extra), here)
    cmd, env = mpirun.build(kind, exe, p.job, here.root, here.cores)
    if args.verbose:
        _describe(p, source)
    print(show(cmd, env), file=sys.stderr, flush=True)
    return p, cmd, env


def show(cmd: list[str], env: dict[str, str]) -> str:
    """The command as a shell would take it back (copy-pastable), launcher settings in front."""
    return "+ " + " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.join(cmd)])


def _say(text: str) -> None:
    print(f"ddlrun: {text}", file=sys.stderr, flush=True)


def _describe(p: launch.Launch, source: str) -> None:
    _say(f"{len(p.rank_hosts)} ranks, hosts from {source}: {launch.host_list(p.rank_hosts)}")
    if p.dims:
        _say("tiers: " + " x ".join(f"{d} {t}" for d, t in zip(p.dims, launch.TIERS)))
    for k, v in p.job.set_env.items():
        _say(f"every rank gets {k}={v}")


def _run_checks(hosts: list[str], ssh: list[str], python: str, local: set[str], verbose: bool) -> bool:
    unique = list(dict.fromkeys(hosts))
    try:
        seconds = prelaunch.host_seconds()
    except ValueError as e:
        _say(f"check failed: {e}")
        return False
    reports, problems = prelaunch.check(unique, prelaunch.probe(), ssh, python, local, seconds)
    if verbose:
        for r in reports:
            _say(f"check {r.host}: {r.facts if r.facts else r.problem}")
    for p in problems:
        _say(f"check failed: {p}")
    if problems:
        _say("not launched (-s skips the checks)")
    return not problems


# Open MPI's runtime ends the whole job when it loses a host's daemon, ULFM or not (open-mpi/ompi#12227), and
# then exits 0 in a fault-tolerant job: ddlrun reads its stderr for that notice so as not to report success.
LOST_DAEMON = "lost communication with a remote daemon"


def _supervise(p: launch.Launch, cmd: list[str], env: dict[str, str], timeout: float, limit: float,
               cleanup=None) -> int:
    """Runs the launcher for at most ``timeout`` seconds (what is left of --timeout ``limit``)."""
    lost: list[str] = []
    watch = (lambda line: lost.append(line) if LOST_DAEMON in line else None) if p.job.fault_tolerant else None
    outcome = supervise.run(cmd, env=env, timeout=timeout or None, cleanup=cleanup, watch=watch)
    if lost and outcome.returncode == 0:
        _say("a host was lost and Open MPI's runtime ended the job (it cannot go on without a host's daemon); "
             "--elastic recovers in place from lost processes, not lost hosts (--max-restarts launches again)")
        return restarts.LOST_HOST
    return _finish(outcome, limit)


def _finish(outcome: supervise.Outcome, limit: float) -> int:
    if outcome.timed_out:
        _say(f"the job ran past --timeout {limit:g} s; every rank was stopped")
    elif outcome.interrupted:
        _say("interrupted; every rank was stopped")
    elif outcome.returncode:
        _say(f"the job failed with status {outcome.returncode}")
    return outcome.returncode


@one_line_errors("ddlrun")
def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    options, program = split_program(ap, list(sys.argv[1:] if argv is None else argv))
    args = ap.parse_args(options)
    if args.version:
        from ..config import version

        print(f"ddlrun (ddl) {version()}")
        return 0
    if not program:
        ap.error("no program given")
    try:
        policy = _policy(args)
        args.in_place = _in_place(args, _mpiexec(args.mpi)[1], policy)
        if args.emulate:
            return _emulated(args, program, policy)
        source, hosts, rank_hosts = _hosts(args)
        here = _machine()

        def launch_once(hosts_now, np, job_env) -> int:
            source_now = f"--host-discovery-script {args.discovery}" if args.discovery else source
            p, cmd, env = _prepare(_with(args, np), program, source_now, hosts_now, rank_hosts, here,
                                   job_env=job_env)
            if args.dry_run:
                return 0
            skip = checks_skipped(args, os.environ)
            if p.remote and skip and args.verbose:
                _say(f"pre-launch checks skipped: {skip}")
            if p.remote and not skip:
                local = {here.hostname, *hostlib.LOCAL_NAMES}
                if not _run_checks(p.rank_hosts, _ssh(args), here.python, local, args.verbose):
                    raise restarts.NotLaunched(CHECK_FAILED)
            return _supervise(p, cmd, {**os.environ, **env}, _time_left(args.timeout, started), args.timeout)

        started = time.monotonic()
        return restarts.run(policy, hosts, args.np, launch_once, _say)
    except restarts.NotLaunched as e:
        return e.status
    except DDLError as e:
        _say(str(e))
        return USAGE_ERROR
    except FileNotFoundError as e:  # no mpiexec
        _say(str(e))
        return USAGE_ERROR


def _ssh(args) -> list[str]:
    """The pre-launch checks' ssh, with horovodrun's -p and --start-timeout."""
    ssh = prelaunch.ssh_command()
    if args.ssh_port:
        ssh += ["-p", str(args.ssh_port)]
    if args.start_timeout:  # ssh takes an option's first value: replace the default one
        deadline = f"ConnectTimeout={max(1, int(args.start_timeout))}"
        if any(w.startswith("ConnectTimeout=") for w in ssh):
            ssh = [deadline if w.startswith("ConnectTimeout=") else w for w in ssh]
        else:
            ssh += ["-o", deadline]
    return ssh


def _time_left(timeout: float, started: float) -> float:
    """--timeout covers every launch of the job together: what is left of it (0: no timeout)."""
    return max(timeout - (time.monotonic() - started), 0.001) if timeout else 0


def _with(args, np: int | None):
    """args with this launch's number of ranks (a restart may have fewer or more)."""
    return argparse.Namespace(**{**vars(args), "np": np})


def _emulated(args, program: list[str], policy: restarts.Policy) -> int:
    """The same launch inside an emulated cluster: hosts are its nodes, ssh is its agent, checks included."""
    from .. import cluster
    from ..cluster import spec as emulate

    if args.host or args.hostfile or args.rankfile:
        raise DDLError("--emulate places the ranks itself: drop -H, --hostfile and --rankfile")
    c = cluster.Cluster(emulate.topology(args.emulate))
    if args.np and args.np != c.nranks and not args.discovery:
        raise DDLError(f"--emulate {args.emulate} runs {c.nranks} ranks; -np {args.np} disagrees")
    here = _machine()

    def planned(workdir: str, hosts, np, job_env) -> tuple[launch.Launch, list[str], dict[str, str]]:
        # The job plans over the cluster's switches: its topology file, with its ranks placed, travels in
        # DDL_TOPOLOGY. A discovery script names some of the cluster's nodes; else every rank of the cluster runs.
        topology = {"DDL_TOPOLOGY": f"{workdir}/job-topology.json"}
        p, cmd, env = _prepare(_with(args, np), program, f"--emulate {args.emulate}", hosts,
                               None if hosts else c.rank_hosts,
                               replace(here, environ={**here.environ, **topology}), agent=f"{workdir}/agent.sh",
                               iface="eth0" if c.links else "lo", job_env=job_env)
        if c.workdir is not None:
            Path(topology["DDL_TOPOLOGY"]).write_text(c.topology_for(p.rank_hosts).to_json())
        return p, cmd, {**env, **topology}

    if args.dry_run:
        planned("<cluster>", None, args.np, {})
        return 0
    if (why := cluster.available()) is not None:
        raise DDLError(why)
    with c:
        def launch_once(hosts, np, job_env) -> int:
            p, cmd, env = planned(str(c.workdir), hosts, np, job_env)
            agent = str(c.workdir / "agent.sh")
            if not (args.skipchecks or _run_checks(p.rank_hosts, [agent], here.python, set(), args.verbose)):
                raise restarts.NotLaunched(CHECK_FAILED)
            return _supervise(p, c.exec_argv(p.rank_hosts[0], cmd), {**os.environ, **env},
                              _time_left(args.timeout, started), args.timeout, cleanup=c.kill_jobs)

        started = time.monotonic()
        return restarts.run(policy, None, args.np, launch_once, _say)


if __name__ == "__main__":
    sys.exit(main())
