"""Fused buffers (ddl.core.fusion) and the rule that `import ddl` pulls in no training framework."""
import subprocess
import sys

import numpy as np
import pytest

from ddl import Communicator

from ddl.core import fusion


def test_buckets_follow_order_within_a_dtype_and_respect_the_threshold():
    nbytes = [40, 40, 40, 200, 8, 40]
    dtypes = ["<f4", "<f4", "<i8", "<f4", "<f4", "<f4"]
    assert fusion.buckets(nbytes, dtypes, 100) == [[0, 1], [3], [4, 5], [2]]  # '<f4' sorts before '<i8'
    assert fusion.buckets(nbytes, dtypes, 0) == [[0, 1, 3, 4, 5], [2]]
    assert fusion.buckets([], [], 100) == []


def test_threshold_from_the_environment_and_bad_values(monkeypatch):
    monkeypatch.setenv("DDL_FUSION_BYTES", "1024")
    assert fusion.threshold_bytes() == 1024 and fusion.threshold_bytes(7) == 7
    monkeypatch.setenv("DDL_FUSION_BYTES", "lots")
    with pytest.raises(ValueError, match="DDL_FUSION_BYTES='lots'"):
        fusion.threshold_bytes()
    with pytest.raises(ValueError, match="0 or more"):
        fusion.threshold_bytes(-1)


def test_fused_results_have_each_arrays_shape_and_values_alone():
    comm = Communicator(None, 0, 1)
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, np.int64), np.full((1,), 2.5, np.float32)]
    for got, want in zip(fusion.allreduce_arrays(arrays, "sum", threshold=16, comm=comm), arrays):
        assert got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want)
    for got, want in zip(fusion.broadcast_arrays(arrays, comm=comm), arrays):
        assert np.array_equal(got, want)


def test_import_ddl_imports_no_training_framework():
    code = "import sys, ddl; ddl.init(); print(sorted(m for m in ('keras', 'torch', 'tensorflow', 'jax') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_ibm_callback_names_load_keras_on_first_use(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    pytest.importorskip("torch")
    pytest.importorskip("keras")
    code = ("import os; os.environ.setdefault('KERAS_BACKEND', 'torch'); import ddl; "
            "print(ddl.DDLCallback.__module__, ddl.DDLGlobalVariablesCallback.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ddl.keras", "DDLGlobalVariablesCallback"]
