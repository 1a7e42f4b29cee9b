"""ddl-cluster: build, inspect, use and remove emulated clusters that outlive one command.

    ddl-cluster up T2 --name lab           # 2 racks x 2 nodes x 2 ranks (see ddl.cluster.spec for specs)
    ddl-cluster status                     # clusters, hosts, bytes per link
    ddl-cluster exec lab node1 -- hostname
    ddl-cluster run lab -- python train.py # an MPI job, ranks placed as the spec says, DDL_TOPOLOGY set
    ddl-cluster down lab                   # or: down --all

Exit status: 0, the command's own status (exec, run), 2 for a usage error or where clusters cannot be built.
"""
from __future__ import annotations

import argparse
import sys

from .. import cluster
from ..cluster import spec as emulate
from ..errors import DDLError
from .cli import Parser, one_line_errors


def _human(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def describe(c: cluster.Cluster, counters: bool = True) -> str:
    lines = [f"cluster {c.name}: {c.topology.name}, {c.nranks} ranks on {len(c.hosts)} hosts"]
    lines.append("  ranks: " + " ".join(f"{r}:{h}" for r, h in enumerate(c.rank_hosts)))
    seen = c.counters() if counters else {}
    for link in c.links:
        up, down = seen.get(link.child, (0, 0))
        lines.append(f"  {link.child:>10} -> {link.parent:<10} {link.bps / 1e6:8.0f} Mbit/s"
                     + (f"   sent up {_human(up):>10}, down {_human(down):>10}" if counters else ""))
    return "\n".join(lines)


def parser() -> Parser:
    ap = Parser(prog="ddl-cluster", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=emulate.__doc__)
    sub = ap.add_subparsers(dest="what", required=True)
    up = sub.add_parser("up", help="build a cluster and keep it")
    up.add_argument("spec", help="T1..T4, a shape such as 2x2x2:nic=1gbit, or a topology file")
    up.add_argument("--name", help="its name (default: generated)")
    st = sub.add_parser("status", help="list clusters with their hosts and link counters")
    st.add_argument("name", nargs="?")
    ex = sub.add_parser("exec", help="run a command on one emulated host")
    ex.add_argument("name")
    ex.add_argument("host")
    ex.add_argument("command", nargs=argparse.REMAINDER)
    run = sub.add_parser("run", help="run an MPI job on the cluster")
    run.add_argument("name")
    run.add_argument("--timeout", type=float, default=3600)
    run.add_argument("command", nargs=argparse.REMAINDER)
    dn = sub.add_parser("down", help="remove a cluster (or --all)")
    dn.add_argument("name", nargs="?")
    dn.add_argument("--all", action="store_true")
    return ap


def up(args, ap) -> int:
    why = cluster.available()
    if why:
        print(f"ddl-cluster: {why}", file=sys.stderr)
        return 2
    taken = set(cluster.saved())
    name = args.name or next(f"c{i}" for i in range(len(taken) + 1) if f"c{i}" not in taken)
    c = cluster.Cluster(args.spec, name=name)
    try:
        c.up()
        c.save()
    except BaseException:
        c.down()  # a half-built cluster is not left behind
        raise
    print(describe(c, counters=False))
    return 0


def status(args, ap) -> int:
    names = [args.name] if args.name else cluster.saved()
    if not names:
        print("no emulated clusters")
    for n in names:
        print(describe(cluster.Cluster.attach(n)))
    return 0


def down(args, ap) -> int:
    names = cluster.saved() if args.all else [args.name] if args.name else []
    if not names:
        ap.error("down needs a cluster name or --all")
    for n in names:
        c = cluster.Cluster.attach(n)
        c.down()
        c.forget()
        print(f"removed {n}")
    return 0


def run_command(args, ap) -> int:
    """``exec`` on one host, or ``run`` an MPI job over the cluster."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error(f"{args.what} needs a command after --")
    c = cluster.Cluster.attach(args.name)
    if args.what == "exec":
        import subprocess

        return subprocess.run(c.exec_argv(args.host, command)).returncode
    return c.mpirun(command, timeout=args.timeout).returncode


@one_line_errors("ddl-cluster")
def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    action = {"up": up, "status": status, "down": down, "exec": run_command, "run": run_command}[args.what]
    try:
        return action(args, ap)
    except DDLError as e:
        print(f"ddl-cluster: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
