"""The documentation's runnable pages run: every code block titled ``NAME.py`` in the getting-started page and the
guides that run on one machine (PyTorch DDP, FSDP2, Horovod-style, Keras, Lightning, Accelerate) is written out
and launched with ``ddlrun -np 2`` (the getting-started one alone too), as the pages say; the blocks assert their
own results (closed forms; the weights of one process on the whole batch, computed in the script by torch or
Keras alone)."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DDLRUN = os.path.join(sys.prefix, "bin", "ddlrun")
RUNNABLE = {"getting-started.md": (1, 2), "guides/pytorch.md": (2,), "guides/fsdp.md": (2,),
            "guides/horovod.md": (2,), "guides/keras.md": (2,), "guides/lightning-accelerate.md": (2,)}
NEEDS = {"guides/pytorch.md": ("torch",), "guides/fsdp.md": ("torch",), "guides/horovod.md": ("torch",),
         "guides/keras.md": ("keras", "torch"), "guides/lightning-accelerate.md": ("lightning", "accelerate")}


def scripts(page):
    text = open(os.path.join(ROOT, "docs", page)).read()
    return re.findall(r'```python title="(\w+\.py)"\n(.*?)```', text, re.S)


def test_the_pages_have_runnable_scripts():
    assert all(scripts(page) for page in RUNNABLE)


# Lightning's and Accelerate's page in make test-all only (CI's time; tests/train runs both trainers in CI)
FULL = {"guides/lightning-accelerate.md"}


@pytest.mark.parametrize("page, ranks", [pytest.param(p, n, marks=[pytest.mark.full] if p in FULL else [])
                                         for p, counts in RUNNABLE.items() for n in counts])
def test_each_script_runs(page, ranks, tmp_path):
    for module in NEEDS.get(page, ()):
        pytest.importorskip(module)
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    for name, code in scripts(page):
        (tmp_path / name).write_text(code)
        argv = ["python", name] if ranks == 1 else [DDLRUN, "-np", str(ranks), "python", name]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        assert done.returncode == 0, f"{page} {name} at {ranks} rank(s):\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        printed = [line for line in done.stdout.splitlines()
                   if " ranks: sum " in line or re.match(r"\w+ on ddl: ", line)]
        assert len(printed) == 1, done.stdout[-2000:]  # rank 0 only
