"""Shared test set-up. Under mpiexec, a guard makes sure no rank waits forever for a peer that failed."""
import json
import os
import sys
import time

_guard_comm = None  # a private duplicate of COMM_WORLD, so the guard never matches a test's own messages


def _under_mpi(config) -> bool:
    return bool(config.getoption("--with-mpi", default=False))


def pytest_sessionstart(session):
    global _guard_comm
    if not _under_mpi(session.config):
        return
    from mpi4py import MPI

    if MPI.COMM_WORLD.size > 1:
        _guard_comm = MPI.COMM_WORLD.Dup()


def pytest_sessionfinish(session, exitstatus):
    """Also leaves this rank's counts in $DDL_TEST_RESULTS_DIR (mpi_suite.py reads them: the ranks' printed
    summaries may interleave on one line)."""
    session.config._ddl_exit = int(exitstatus)
    where = os.environ.get("DDL_TEST_RESULTS_DIR")
    if where and _under_mpi(session.config):
        from mpi4py import MPI

        stats = session.config.pluginmanager.get_plugin("terminalreporter").stats
        counts = {k: len([r for r in stats.get(k, []) if getattr(r, "when", "call") in ("call", "setup")])
                  for k in ("passed", "failed", "skipped", "error")}
        with open(os.path.join(where, f"rank{MPI.COMM_WORLD.rank}.json"), "w") as f:
            json.dump({**counts, "exit": int(exitstatus)}, f)


def pytest_unconfigure(config):
    """Runs after the summary is printed: if a peer never arrives, abort the whole job instead of hanging."""
    if _guard_comm is None:
        return
    request = _guard_comm.Ibarrier()
    deadline = time.monotonic() + float(os.environ.get("DDL_TEST_PEER_TIMEOUT", "20"))
    while not request.Test():
        if time.monotonic() > deadline:
            sys.stderr.write(f"[rank {_guard_comm.rank}] peers stuck at exit; MPI_Abort\n")
            _guard_comm.Abort(getattr(config, "_ddl_exit", 1) or 1)
        time.sleep(0.01)
