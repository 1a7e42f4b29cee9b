"""Horovod scripts on ddl (issue 19): a script written as Horovod's examples are runs under ddlrun with
horovodrun's flags and trains the weights one process gets on the global batch (the same script, alone, with
the global batch and the learning rate Horovod scales by the ranks). Where a real Horovod is installed
(HOROVOD_PYTHON: its interpreter; toolchain.md §9) the script with Horovod's import line runs under horovodrun
and must print the same."""
import os
import re
import subprocess
import sys

import pytest

DDLRUN = os.path.join(sys.prefix, "bin", "ddlrun")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_scripts", "pytorch_mnist.py")
pytest.importorskip("torch")


def result(text: str) -> tuple[float, float, int]:
    m = re.search(r"final loss ([-0-9.]+) weights ([-0-9.]+) ranks (\d+)", text)
    assert m, text[-3000:]
    return float(m.group(1)), float(m.group(2)), int(m.group(3))


def test_a_horovod_script_under_horovodruns_flags_equals_one_process(tmp_path):
    alone = subprocess.run([sys.executable, SCRIPT, "--batch-size", "32", "--lr", "0.1"], capture_output=True,
                           text=True, timeout=120)
    assert alone.returncode == 0, alone.stderr[-3000:]
    done = subprocess.run([DDLRUN, "-np", "2", "-H", "localhost:2", "--fusion-threshold-mb", "32",
                           "--cycle-time-ms", "1", "--gloo", sys.executable, SCRIPT, "--batch-size", "16",
                           "--lr", "0.05"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    ref_loss, ref_weights, _ = result(alone.stdout)
    loss, weights, ranks = result(done.stdout)
    assert ranks == 2 and done.stdout.count("final loss") == 1  # rank 0 alone prints
    assert abs(weights - ref_weights) < 1e-4 * max(1.0, abs(ref_weights))
    # the loss printed is the mean over ranks of each rank's mean over its batches: the reference's over the
    # same batches, within float32 rounding
    assert abs(loss - ref_loss) < 1e-4


@pytest.mark.skipif(not os.environ.get("HOROVOD_PYTHON"), reason="no real Horovod here (HOROVOD_PYTHON)")
def test_the_same_script_on_real_horovod_prints_the_same(tmp_path):
    horovod_script = tmp_path / "pytorch_mnist.py"
    text = open(SCRIPT).read()
    assert text.count("import ddl.horovod.torch as hvd") == 1
    horovod_script.write_text(text.replace("import ddl.horovod.torch as hvd", "import horovod.torch as hvd"))
    python = os.environ["HOROVOD_PYTHON"]
    horovodrun = os.path.join(os.path.dirname(python), "horovodrun")
    real = subprocess.run([horovodrun, "-np", "2", "--gloo", python, str(horovod_script)], capture_output=True,
                          text=True, timeout=300)
    assert real.returncode == 0, real.stderr[-3000:]
    ours = subprocess.run([DDLRUN, "-np", "2", "--gloo", sys.executable, SCRIPT], capture_output=True, text=True,
                          timeout=180)
    assert ours.returncode == 0, ours.stderr[-3000:]
    (l1, w1, _), (l2, w2, _) = result(real.stdout), result(ours.stdout)
    assert abs(w1 - w2) < 1e-4 * max(1.0, abs(w1)) and abs(l1 - l2) < 1e-4
