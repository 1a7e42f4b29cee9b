"""Starts one rank's program: ddlrun launches ``python -m ddl.runner.rankenv PROGRAM [ARGS]`` as every MPI rank.

It gives the program the variables torchrun users expect (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK = the host's index, MASTER_ADDR/MASTER_PORT where unset, OMP_NUM_THREADS=1 where a host runs several
ranks and it is unset) and those keras.distribution.initialize() reads (KERAS_DISTRIBUTION_PROCESS_ID,
_NUM_PROCESSES, _JOB_ADDRESSES = MASTER_ADDR:MASTER_PORT), taken from MPI's launcher and ddlrun's
placement (DDL_HOST_LIST); one GPU by local rank (CUDA_VISIBLE_DEVICES) where ddlrun says so (DDL_BIND_GPU);
its own log files (DDL_OUTPUT_DIR/rank.N/stdout and stderr); under ddl's horovodrun, horovodrun's HOROVOD_RANK,
_SIZE, _LOCAL_RANK, _LOCAL_SIZE, _CROSS_RANK, _CROSS_SIZE and _HOSTNAME. The program runs as a child, so that a failure
is reported with the rank and host it happened on; signals from the launcher are passed on to it. In an
elastic job (DDL_ELASTIC=1) this process becomes the program instead (see _become).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

MASTER_PORT = "29500"  # torchrun's default


def _first(environ, *names: str) -> str | None:
    return next((environ[n] for n in names if environ.get(n) not in (None, "")), None)


def rank_variables(environ) -> dict[str, str]:
    """The variables this rank's program gets, from MPI's launcher (Open MPI's, hydra's or PMIx's names) and
    ddlrun's DDL_HOST_LIST (``host:0,1;host2:2,3``), which says the local rank and size exactly."""
    rank = _first(environ, "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
    size = _first(environ, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
    if rank is None or size is None:
        raise RuntimeError("ddl.runner.rankenv runs under an MPI launcher (ddlrun starts it); no rank was given")
    out = {"RANK": rank, "WORLD_SIZE": size}
    groups = [(h, [int(r) for r in rs.split(",")]) for h, _, rs in
              (g.partition(":") for g in (environ.get("DDL_HOST_LIST") or "").split(";") if g)]
    mine = [(i, h, rs) for i, (h, rs) in enumerate(groups) if int(rank) in rs]
    if mine:
        index, _, ranks = mine[0]
        out.update(LOCAL_RANK=str(ranks.index(int(rank))), LOCAL_WORLD_SIZE=str(len(ranks)),
                   GROUP_RANK=str(index))
        out.setdefault("MASTER_ADDR", groups[0][0])
    else:
        out["LOCAL_RANK"] = _first(environ, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID") or "0"
        out["LOCAL_WORLD_SIZE"] = _first(environ, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS") or "1"
    if environ.get("MASTER_ADDR"):
        out.pop("MASTER_ADDR", None)
    elif "MASTER_ADDR" in out:
        out["MASTER_PORT"] = environ.get("MASTER_PORT") or MASTER_PORT
    out.update(_keras_distribution(environ, out))
    if environ.get("DDL_HOROVOD_VARIABLES") == "1":
        out.update(_horovod(out, groups))
    if int(out["LOCAL_WORLD_SIZE"]) > 1 and not environ.get("OMP_NUM_THREADS"):
        out["OMP_NUM_THREADS"] = "1"  # ranks sharing a host would each start a thread per core (torch, numpy)
    if environ.get("DDL_BIND_GPU") == "1":
        visible = [d for d in (environ.get("CUDA_VISIBLE_DEVICES") or "").split(",") if d]
        local = int(out["LOCAL_RANK"])
        out["CUDA_VISIBLE_DEVICES"] = visible[local % len(visible)] if visible else str(local)
    return out


def _horovod(out: dict[str, str], groups: list) -> dict[str, str]:
    """What horovodrun's launcher gives each rank (scripts written for Horovod read HOROVOD_RANK before init):
    set by ddl's horovodrun command. Cross rank and size: the host's index and the number of hosts."""
    return {"HOROVOD_RANK": out["RANK"], "HOROVOD_SIZE": out["WORLD_SIZE"], "HOROVOD_LOCAL_RANK": out["LOCAL_RANK"],
            "HOROVOD_LOCAL_SIZE": out["LOCAL_WORLD_SIZE"], "HOROVOD_CROSS_RANK": out.get("GROUP_RANK", "0"),
            "HOROVOD_CROSS_SIZE": str(len(groups) or 1), "HOROVOD_HOSTNAME": socket.gethostname()}


def _keras_distribution(environ, out: dict[str, str]) -> dict[str, str]:
    """What ``keras.distribution.initialize()`` reads (Keras' own data parallelism on JAX: JAX's coordinator on
    rank 0's host at MASTER_PORT, JAX's collectives, not ddl's), each where the user has not set it."""
    address, port = environ.get("MASTER_ADDR") or out.get("MASTER_ADDR"), environ.get("MASTER_PORT") or out.get(
        "MASTER_PORT")
    wanted = {"KERAS_DISTRIBUTION_PROCESS_ID": out["RANK"], "KERAS_DISTRIBUTION_NUM_PROCESSES": out["WORLD_SIZE"]}
    if address and port:
        wanted["KERAS_DISTRIBUTION_JOB_ADDRESSES"] = f"{address}:{port}"
    return {k: v for k, v in wanted.items() if not environ.get(k)}


def _describe(status: int) -> str:
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m ddl.runner.rankenv PROGRAM [ARGS...] (ddlrun runs this on every rank)", file=sys.stderr)
        return 2
    try:
        extra = rank_variables(os.environ)
    except RuntimeError as e:
        print(f"ddl.runner.rankenv: {e}", file=sys.stderr)
        return 2
    where = f"rank {extra['RANK']} ({socket.gethostname()})"
    streams = {}
    if os.environ.get("DDL_OUTPUT_DIR"):
        folder = Path(os.environ["DDL_OUTPUT_DIR"]) / f"rank.{extra['RANK']}"
        folder.mkdir(parents=True, exist_ok=True)
        streams = {"stdout": open(folder / "stdout", "w"), "stderr": open(folder / "stderr", "w")}
    if os.environ.get("DDL_ELASTIC") == "1":
        return _become(argv, {**os.environ, **extra}, streams, where)
    try:
        # close_fds=False: MPICH's ranks reach their launcher through an inherited descriptor (PMI_FD).
        child = subprocess.Popen(argv, env={**os.environ, **extra}, close_fds=False, **streams)
    except OSError as e:
        print(f"ddlrun: {where}: cannot run {argv[0]!r}: {e.strerror}", file=sys.stderr, flush=True)
        return 127
    stopped = []

    def pass_on(signum, frame):
        stopped.append(signum)
        child.send_signal(signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, pass_on)
    status = child.wait()
    for f in streams.values():
        f.close()
    if status and not stopped:  # a rank stopped by the launcher (another failed, Ctrl-C) is no news
        shown = ' '.join(argv).replace(chr(10), ' ')[:160]
        print(f"ddlrun: {where}: {shown} {_describe(status)}", file=sys.stderr, flush=True)
        if _under_hydra(os.environ):
            # Hydra waits for the other ranks after a non-zero exit, but stops the job when a rank dies by a
            # signal: so this rank dies by one (the job's status then is that signal's number).
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
    return 128 - status if status < 0 else status


def _become(argv: list[str], env: dict[str, str], streams: dict, where: str) -> int:
    """Elastic jobs: this process becomes the program (exec), so the process MPI's runtime launched is the
    MPI rank itself. A failure is then seen by the runtime, which tells the survivors (ULFM); a child's death
    behind a wrapper was not (the survivors waited). The survivors name the failed rank themselves."""
    for fd, f in ((1, streams.get("stdout")), (2, streams.get("stderr"))):
        if f is not None:
            os.dup2(f.fileno(), fd)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        print(f"ddlrun: {where}: cannot run {argv[0]!r}: {e.strerror}", file=sys.stderr, flush=True)
        return 127


def _under_hydra(environ) -> bool:
    return "PMI_RANK" in environ and "OMPI_COMM_WORLD_RANK" not in environ


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
