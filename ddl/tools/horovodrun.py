"""horovodrun on ddl: Horovod's launcher command line, run by ddlrun.

Installed only with the extra (``pip install ddl[horovod]``; from a checkout, ``pip install --no-deps
./extras/horovodrun``), since a ``horovodrun`` command shadows a real Horovod's. Every option ddlrun shares with horovodrun (-np, -H,
--hostfile, -p, --start-timeout, --network-interface, --timeline-filename, --fusion-threshold-mb,
--cycle-time-ms, --verbose, --min-np, --max-np, --host-discovery-script, --reset-limit, --gloo, --mpi,
--output-filename, --tcp) means what it means to ddlrun; this module adds horovodrun's other spellings,
``--check-build``, and says which of its options ddl has no use for or refuses.
"""
from __future__ import annotations

import importlib.util
import os
import sys

from . import ddlrun
from .cli import USAGE_ERROR

# horovodrun's spelling -> ddlrun's
RENAMED = {"--num-proc": "-np", "--hosts": "-H", "--mpi-args": "--mpiarg"}
# accepted, changing nothing, and why (printed with --verbose)
NO_EFFECT = {
    "--hierarchical-allreduce": "ddl's plans are hierarchical wherever the topology has levels",
    "--hierarchical-allgather": "ddl's plans are hierarchical wherever the topology has levels",
    "--disable-cache": "ddl keeps no response cache: each collective is planned once per shape and reused",
    "--no-stall-check": "ddl has no stall checker: every wait has a deadline (DDL_TIMEOUT)",
    "--mpi-threads-disable": "ddl's MPI runs at the thread level it needs",
}
NO_EFFECT_WITH_VALUE = {
    "--log-level": "ddl's own messages follow --verbose and DDL_OPTIONS '-dbg_level'",
    "--cache-capacity": "ddl keeps no response cache",
    "--stall-check-warning-time-seconds": "ddl has no stall checker: set DDL_TIMEOUT for its deadline",
    "--stall-check-shutdown-time-seconds": "ddl has no stall checker: set DDL_TIMEOUT for its deadline",
    "--gloo-timeout-seconds": "ddl runs over MPI: set DDL_TIMEOUT for its deadline",
    "--elastic-timeout": "ddl's elastic waits are bounded by DDL_TIMEOUT",
}
# refused, with what to do instead
REFUSED = {
    "-i": "put the key in ~/.ssh/config (IdentityFile) for the hosts",
    "--ssh-identity-file": "put the key in ~/.ssh/config (IdentityFile) for the hosts",
    "--config-file": "give the options on the command line",
    "--autotune": "ddl plans from its cost model and the probed topology; see ddl-topo",
    "--autotune-log-file": "ddl plans from its cost model and the probed topology; see ddl-topo",
    "--jsrun": "use ddlrun inside the LSF job (it reads the job's hosts)",
    "--binding-args": "pass mpirun's own binding flags with --mpi-args",
    "--timeline-mark-cycles": "ddl has no background cycle to mark",
    "--num-nccl-streams": "ddl's GPU path chooses its streams",
    "--thread-affinity": "pass mpirun's binding flags with --mpi-args",
    "--blacklist-cooldown-range": "ddl's elastic restarts take --max-restarts and a discovery script",
    "--slots-per-host": "give slots with -H host:N or the hostfile",
    "--prefix-output-with-timestamp": "use --output-filename DIR",
}
CHECK_BUILD = ("-cb", "--check-build")


def translate(argv: list[str], say=lambda text: None) -> tuple[list[str], list[str]]:
    """(ddlrun's options, the program and its arguments) from horovodrun's arguments: options up to the program
    are renamed or dropped; the program's own arguments pass untouched."""
    takes_value = ddlrun._parser()._option_string_actions
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--" or not word.startswith("-") or word == "-":
            return out, argv[i:]
        name, eq, value = word.partition("=")
        if name in CHECK_BUILD:
            out.append(name)
            i += 1
            continue
        if name in REFUSED:
            raise SystemExit(_usage(f"{name} is not supported by ddl: {REFUSED[name]}"))
        if name in NO_EFFECT:
            say(f"{name} accepted: {NO_EFFECT[name]}")
            i += 1
            continue
        if name in NO_EFFECT_WITH_VALUE:
            say(f"{name} accepted: {NO_EFFECT_WITH_VALUE[name]}")
            i += 1 if eq else 2
            continue
        name = RENAMED.get(name, name)
        action = takes_value.get(name)
        bare_mpi = name == "--mpi" and (i + 1 == len(argv) or argv[i + 1] not in ddlrun.MPI_NAMES)
        if bare_mpi or eq or action is None or action.nargs == 0 or i + 1 == len(argv):
            out.append(name + eq + value)  # unknown ones too: ddlrun names them
            i += 1
        else:
            out += [name, argv[i + 1]]
            i += 2
    return out, []


def _usage(message: str) -> int:
    print(f"horovodrun (ddl): {message} (see ddlrun --help)", file=sys.stderr)
    return USAGE_ERROR


def check_build() -> str:
    """horovodrun --check-build's report, for ddl: the frameworks ddl.horovod serves here and what carries the
    collectives."""
    from ..config import version

    def mark(found: bool) -> str:
        return "[X]" if found else "[ ]"

    def present(module: str) -> bool:
        return importlib.util.find_spec(module) is not None

    exe, kind = ddlrun._mpiexec(None)
    return "\n".join([
        f"ddl {version()} (Horovod's API and command line on ddl):",
        "",
        "Available Frameworks:",
        f"    {mark(present('torch'))} PyTorch       import ddl.horovod.torch as hvd",
        f"    {mark(present('tensorflow'))} TensorFlow    import ddl.horovod.tensorflow.keras as hvd (tf.keras)",
        f"    {mark(present('keras'))} Keras 3       import ddl.horovod.keras as hvd",
        "    [ ] MXNet",
        "",
        "Available Controllers:",
        f"    [X] MPI ({kind}: {exe})",
        "    [ ] Gloo      (--gloo is accepted; ddl runs over MPI)",
        "",
        "Available Tensor Operations:",
        "    [X] ddl       topology-aware reduce-scatter/allgather over MPI point-to-point",
        "    [X] NCCL      where a GPU and libnccl are found at run time",
    ])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    notes: list[str] = []
    options, program = translate(argv, notes.append)
    if any(w in CHECK_BUILD for w in options):
        print(check_build())
        return 0
    if any(w in ("-v", "--verbose") for w in options):
        for note in notes:
            print(f"horovodrun (ddl): {note}", file=sys.stderr)
    os.environ["DDL_HOROVOD_VARIABLES"] = "1"  # every rank gets horovodrun's HOROVOD_* (ddl.runner.rankenv)
    return ddlrun.main(options + (["--"] + program if program else []))


if __name__ == "__main__":
    sys.exit(main())
