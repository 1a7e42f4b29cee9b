"""When ddl forms its world through a store (no MPI launcher) and which MPI it refuses to try it with. The join
itself runs in tests/launch/test_torchrun.py (real processes)."""
import pytest

from ddl.core import bootstrap
from ddl.errors import DDLError

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_torchruns_variables_give_the_rank_and_size():
    assert bootstrap.environment(TORCHRUN) == (1, 4)


@pytest.mark.parametrize("launcher", ["OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMIX_RANK"])
def test_an_mpi_launcher_wins_over_the_variables(launcher):
    assert bootstrap.environment({**TORCHRUN, launcher: "4"}) is None


@pytest.mark.parametrize("missing", sorted(TORCHRUN))
def test_without_any_one_variable_the_process_is_alone(missing):
    assert bootstrap.environment({k: v for k, v in TORCHRUN.items() if k != missing}) is None


def test_a_job_of_one_needs_no_store():
    assert bootstrap.environment({**TORCHRUN, "RANK": "0", "WORLD_SIZE": "1"}) is None


def test_the_setting_mpi_turns_the_store_off():
    assert bootstrap.environment({**TORCHRUN, "DDL_BOOTSTRAP": "mpi"}) is None


@pytest.mark.parametrize("rank,size,says", [("4", "4", "outside 0..WORLD_SIZE-1"), ("-1", "4", "outside"),
                                            ("one", "4", "must be integers"), ("1", "4.0", "must be integers")])
def test_bad_variables_are_named(rank, size, says):
    with pytest.raises(DDLError, match=says):
        bootstrap.environment({**TORCHRUN, "RANK": rank, "WORLD_SIZE": size})


@pytest.mark.parametrize("library,joins", [
    ("MPICH Version:      4.3.2\nMPICH Release date: ...", True),
    ("MPICH Version:      4.1.3\n", True),
    ("MPICH Version:      5.0.2\n", False),
    ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11", False),
])
def test_only_mpich_4_is_trusted_to_connect_separate_processes(monkeypatch, library, joins):
    from mpi4py import MPI

    monkeypatch.setattr(MPI, "Get_library_version", lambda: library)
    if joins:
        bootstrap.check_mpi(2)
    else:
        with pytest.raises(DDLError, match=r"rank 2: .*needs MPICH 4.*launch with ddlrun") as e:
            bootstrap.check_mpi(2)
        assert library.splitlines()[0].split(",")[0].replace("Version:", "").split()[-1] in str(e.value)
