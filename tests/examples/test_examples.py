"""The README's training examples, launched as a user would (ddlrun -np 2 and 4): they train to a useful
accuracy on held-out digits and only rank 0 prints it."""
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples")
DDLRUN = os.path.join(sys.prefix, "bin", "ddlrun")


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("script", ["keras_digits.py", "torch_digits.py"])
def test_example_trains_and_rank_0_reports(script, ranks):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    done = subprocess.run([DDLRUN, "-np", str(ranks), sys.executable, os.path.join(EXAMPLES, script)],
                          capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = re.findall(r"ranks (\d+): test accuracy ([0-9.]+)", done.stdout)
    assert len(reports) == 1, done.stdout  # rank 0 only
    assert int(reports[0][0]) == ranks and float(reports[0][1]) >= 0.85
