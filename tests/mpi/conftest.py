"""Fixtures shared by the MPI tests."""
import pytest
from mpi4py import MPI

import ddl


@pytest.fixture(scope="module")
def world():
    """ddl's world on MPI_COMM_WORLD with a 60 s deadline, for one module's tests (made afresh, ended after)."""
    ddl.finalize()
    ddl.init(MPI.COMM_WORLD, options="-timeout 60")
    yield
    ddl.finalize()
