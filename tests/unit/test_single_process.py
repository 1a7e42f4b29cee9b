"""ddl started plainly (no mpiexec): size 1, no MPI initialised, a light import."""
import os
import subprocess
import sys

import numpy as np
import pytest

import ddl

LAUNCHER = ("OMPI_", "PMIX_", "PMI_", "MPI_LOCALNRANKS", "PRTE_")


def plain_env():
    return {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER)}


def run_python(code):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=plain_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_size_is_one_without_mpiexec():
    assert run_python("import ddl; print(ddl.size())") == "1"


def test_import_is_light():
    mods = run_python("import sys, ddl; ddl.allreduce([1.0]); "
                      "print(' '.join(m for m in ('mpi4py.MPI', 'tensorflow', 'keras', 'torch') if m in sys.modules))")
    assert mods == ""


@pytest.fixture
def alone(monkeypatch):
    for k in list(os.environ):
        if k.startswith(LAUNCHER):
            monkeypatch.delenv(k)
    ddl.finalize()
    yield
    ddl.finalize()


def test_single_process_api(alone):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert (ddl.rank(), ddl.size(), ddl.local_rank(), ddl.local_size(), ddl.num_hosts()) == (0, 1, 0, 1, 1)
    y = ddl.allreduce(x)
    assert y is not x and np.array_equal(y, x) and y.dtype == x.dtype
    assert ddl.allreduce(x, out=x) is x
    assert np.array_equal(ddl.broadcast(x), x) and np.array_equal(ddl.bcast(x, root=0), x)
    assert np.array_equal(ddl.allgather(x), x)
    a, b = ddl.allreduce_n([x, np.ones(2, np.int64)])
    assert np.array_equal(a, x) and np.array_equal(b, np.ones(2))
    ddl.barrier()


def test_repeated_calls_alone_run_natively_in_every_form_of_out(alone):
    x = np.arange(6, dtype=np.float64).reshape(3, 2)
    o = np.zeros_like(x)
    forms = [lambda: ddl.allreduce(x), lambda: ddl.allreduce(x, "avg", out=o), lambda: ddl.broadcast(x),
             lambda: ddl.broadcast(x, 0, out=o), lambda: ddl.allgather(x), lambda: ddl.allgather(x, out=o),
             lambda: ddl.reduce_scatter(x), lambda: ddl.reduce_scatter(x, "max", out=o)]
    for _ in range(2):  # the first call of each form is checked in Python and taught to the native table
        for form in forms:
            o[...] = 0
            got = form()
            assert got is not x and got.dtype == x.dtype and np.array_equal(got, x)
            assert np.array_equal(o, x) or got is not o
        assert ddl.allreduce(x, out=x) is x and ddl.broadcast(x, 0, out=x) is x
        ddl.barrier()
    native = ddl.communicator()._native
    for found in (native.allreduce(x, "sum", None), native.allreduce(x, "avg", None), native.broadcast(x, 0, None),
                  native.allgather(x, None), native.reduce_scatter(x, "max", None)):
        assert np.array_equal(found, x)  # every form was taught to the native table
    assert native.barrier() is True
    assert native.allreduce(x.astype(np.float32), "sum", None) is None  # another dtype: not known
    assert np.array_equal(ddl.allreduce(x[:, :1], out=np.zeros((3, 1))), x[:, :1])  # not contiguous: Python's path
    with pytest.raises(ddl.DDLError, match="out has shape"):
        ddl.allreduce(x, out=np.zeros(6))  # a known call with an out to refuse: Python's checks


def test_bad_input_alone(alone):
    with pytest.raises(ddl.DDLError, match="unknown reduction op"):
        ddl.allreduce(np.ones(2), op="median")
    ro = np.ones(2)
    ro.flags.writeable = False
    with pytest.raises(ddl.DDLError, match="read-only"):
        ddl.allreduce(np.ones(2), out=ro)
    with pytest.raises(ddl.DDLError, match="root 1"):
        ddl.broadcast(np.ones(2), root=1)


def test_init_is_idempotent_and_refuses_new_arguments(alone):
    c = ddl.init()
    assert ddl.init() is c and ddl.initialized()
    with pytest.raises(ddl.DDLError, match="already initialised"):
        ddl.init(options="-algo ring")
    ddl.finalize()
    assert ddl.init(options="-algo ring -timeout 5").options.algo == "ring"


@pytest.mark.parametrize("kwargs, message", [
    ({"options": "-frobnicate 1"}, "unknown DDL option"),
    ({"options": "-mode r:4x2"}, "invalid dim size=8 usr_size=1"),
    ({"options": "-algo ring,direct"}, "rank 0: 2 algorithms given for 1 levels"),
    ({"options": "-algo ring,warp"}, "'warp' is not an algorithm"),
    ({"options": "-plan no/such/plan.json"}, "plan file 'no/such/plan.json' cannot be used"),
    ({"topology": "no-such-machine"}, "no topology file 'no-such-machine'"),
])
def test_bad_options_at_init(alone, kwargs, message):
    with pytest.raises(ddl.DDLError, match=message):
        ddl.init(**kwargs)


def test_native_library_never_calls_mpi_collectives():
    """ddl's algorithms run on point-to-point messages only: the executor does not even link MPI's
    allreduce, reduce-scatter or allgather."""
    from ddl import _native

    nm = subprocess.run(["nm", "-D", "--undefined-only", _native.__file__], capture_output=True, text=True)
    assert nm.returncode == 0 and "MPI_Isend" in nm.stdout
    for banned in ("MPI_Allreduce", "MPI_Reduce_scatter", "MPI_Allgather", "MPI_Iallreduce"):
        assert banned not in nm.stdout
