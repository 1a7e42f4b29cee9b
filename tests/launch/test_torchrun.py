"""Jobs started without an MPI launcher: torchrun (--standalone, one host) and the variables set by hand for
each process (a Kubernetes operator's way). On MPICH 4 the processes join one MPI communicator through the
store; on Open MPI (whose separate processes cannot connect) ddl refuses in one line. The job is
tests/launch/torchrun_job.py; every check in it is against torch alone or a closed form."""
import json
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("mpi4py.MPI")
from ddl.core import bootstrap  # noqa: E402

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # torchrun, wherever torch is installed
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrun_job.py")
JOINS = bootstrap.can_join()
joins = pytest.mark.skipif(not JOINS, reason="separately started processes join only on MPICH 4")


def torchrun(nproc: int, *args: str, flags=(), env=None, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run([*TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), *flags, JOB, *args],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def by_hand(size: int, *args: str, env=None, timeout=120, started=None) -> list[subprocess.CompletedProcess]:
    """Each process started alone with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (rank 0 hosts the store); only
    the ranks in `started` when given (the others never come)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, JOB, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
                                   "WORLD_SIZE": str(size), **(env or {})})
             for r in (range(size) if started is None else started)]
    try:
        return [subprocess.CompletedProcess(p.args, p.wait(timeout), *p.communicate()) for p in procs]
    finally:
        for p in procs:
            p.kill()


@joins
@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
@pytest.mark.parametrize("nproc", [2, pytest.param(4, marks=pytest.mark.full)])  # CI: 2 (its time)
def test_torchrun_trains_with_only_the_backend_name_changed(nproc, kind):
    done = torchrun(nproc, kind)
    assert done.returncode == 0, done.stderr[-3000:]
    for r in range(nproc):
        assert f"rank {r} of {nproc}: {kind} equals one process" in done.stdout


@joins
def test_a_horovod_style_script_runs_under_torchrun():
    done = torchrun(2, "horovod")
    assert done.returncode == 0, done.stderr[-3000:]
    for r in range(2):
        assert f"rank {r} of 2: horovod equals one process" in done.stdout


@joins
# test-all: CI runs both trainers under ddlrun (tests/train/test_trainers.py) and DDP and FSDP2 under torchrun here
@pytest.mark.parametrize("trainer", [pytest.param("lightning", marks=pytest.mark.full),
                                     pytest.param("accelerate", marks=pytest.mark.full)])
def test_the_trainers_run_on_ddl_under_torchrun(trainer):
    pytest.importorskip(trainer)
    done = torchrun(2, trainer)
    assert done.returncode == 0, done.stderr[-3000:]
    for r in range(2):
        assert f"rank {r} of 2: {trainer} equals one process" in done.stdout


@joins
def test_a_plain_script_under_torchrun_sees_the_ranks_and_its_host(tmp_path):
    done = torchrun(4, "numpy", str(tmp_path / "seen.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert [s["rank"] for s in seen] == [s["env_rank"] for s in seen] == [0, 1, 2, 3]
    assert {(s["local_rank"], s["local_size"], s["hosts"]) for s in seen} == {(r, 4, 1) for r in range(4)}
    assert all("MPICH 4." in s["transport"] and "joined through the launcher's store" in s["transport"] for s in seen)


@joins
def test_the_variables_set_by_hand_form_the_job(tmp_path):
    done = by_hand(3, "numpy", str(tmp_path / "seen.json"))
    assert [d.returncode for d in done] == [0, 0, 0], done[0].stderr[-3000:]
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert [(s["rank"], s["size"]) for s in seen] == [(0, 3), (1, 3), (2, 3)]


@joins
def test_a_process_that_dies_is_named_at_the_others_within_the_deadline():
    done = by_hand(3, "dies", env={"DDL_TIMEOUT": "20"}, timeout=90)
    assert done[2].returncode == 3
    for r in (0, 1):
        assert done[r].returncode == 0, done[r].stderr[-3000:]
        assert f"rank {r} failed" in done[r].stdout and "rank 2" in done[r].stdout.split("failed", 1)[1]


@joins
def test_a_process_that_never_comes_is_named_at_the_deadline():
    """Two of three processes start: the store wait ends at DDL_TIMEOUT naming what was missing."""
    done = by_hand(3, "numpy", os.devnull, env={"DDL_TIMEOUT": "8"}, timeout=60, started=(0, 1))
    assert all(d.returncode != 0 for d in done)
    assert any("rank 2" in d.stderr for d in done), [d.stderr[-2000:] for d in done]


@joins
def test_torchrun_restarts_bring_the_job_back_on_ddl():
    done = torchrun(3, "restarts", flags=("--max-restarts", "1"))
    assert done.returncode == 0, done.stderr[-3000:]
    for r in range(3):
        assert f"rank {r} of 3: attempt 1 allreduced" in done.stdout


@pytest.mark.skipif(JOINS, reason="on MPICH 4 the processes join")
def test_without_mpich_4_torchrun_is_refused_in_one_line():
    done = torchrun(2, "ddp", timeout=120)
    assert done.returncode != 0
    assert "needs MPICH 4 (make MPI=mpich setup" in done.stderr and "launch with ddlrun" in done.stderr


@pytest.mark.skipif(JOINS, reason="on MPICH 4 the processes join one MPI world instead")
@pytest.mark.parametrize("nproc", [2, 4])
def test_without_mpich_4_gpu_tensors_run_over_nccl_through_the_store(tmp_path, nproc):
    """Open MPI: the ddl backend's world is made over torch's store, GPU arrays (the stand-ins) run on NCCL at
    every level with groups made through the store, and host tensors are refused on every rank in one line."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from fakes import build

    done = torchrun(nproc, "device", env=build(str(tmp_path)))
    assert done.returncode == 0, done.stderr[-3000:]
    for r in range(nproc):
        assert f"rank {r} of {nproc}: device world ran every collective, NCCL groups [{nproc}]" in done.stdout
        assert f"rank {r} mismatch: rank {r}: ranks called ddl differently: rank 0: allreduce(cuda, shape=(9,)" \
            in done.stdout
        assert f"rank {r} host refused: rank {r}: collectives on host (CPU) arrays without an MPI launcher" \
            in done.stdout
