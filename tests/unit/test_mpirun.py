"""mpiexec command building (pure: the flavour is mocked, nothing is launched)."""
from unittest import mock

from ddl.runner import mpirun


def test_open_mpi_gets_root_oversubscribe_and_timeout_settings():
    with mock.patch.object(mpirun, "mpiexec_path", return_value="/v/bin/mpiexec"), \
            mock.patch.object(mpirun, "flavor", return_value="openmpi"), \
            mock.patch("os.cpu_count", return_value=2):
        cmd, env = mpirun.command(4, ["python", "x.py"], timeout=60)
    assert cmd == ["/v/bin/mpiexec", "-n", "4", "--bind-to", "none", "--timeout", "60", "python", "x.py"]
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert env["PRTE_MCA_rmaps_default_mapping_policy"] == ":oversubscribe"
    assert env["OMPI_MCA_mpi_yield_when_idle"] == "1"  # 4 ranks on 2 cores


def test_mpich_needs_no_flags_and_takes_its_timeout_from_the_environment():
    with mock.patch.object(mpirun, "mpiexec_path", return_value="/v/bin/mpiexec"), \
            mock.patch.object(mpirun, "flavor", return_value="mpich"):
        cmd, env = mpirun.command(3, ["a"], timeout=9)
    assert cmd == ["/v/bin/mpiexec", "-n", "3", "a"]
    assert env == {"MPIEXEC_TIMEOUT": "9"}
