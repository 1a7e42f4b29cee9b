"""The documentation's runnable pages run: every code block titled ``NAME.py`` in the getting-started page is
written out and launched with ``ddlrun -np 2`` and alone, as the page says (the blocks assert their own results,
from closed forms)."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DDLRUN = os.path.join(sys.prefix, "bin", "ddlrun")
RUNNABLE = ["getting-started.md"]


def scripts(page):
    text = open(os.path.join(ROOT, "docs", page)).read()
    return re.findall(r'```python title="(\w+\.py)"\n(.*?)```', text, re.S)


def test_the_pages_have_runnable_scripts():
    assert all(scripts(page) for page in RUNNABLE)


@pytest.mark.parametrize("page", RUNNABLE)
@pytest.mark.parametrize("ranks", [1, 2])
def test_each_script_runs(page, ranks, tmp_path):
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    for name, code in scripts(page):
        (tmp_path / name).write_text(code)
        argv = ["python", name] if ranks == 1 else [DDLRUN, "-np", str(ranks), "python", name]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        assert done.returncode == 0, f"{page} {name} at {ranks} rank(s):\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        assert done.stdout.count(" ranks: sum ") == 1  # rank 0 only
