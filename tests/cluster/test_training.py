"""DDP, FSDP2 and HSDP on the "ddl" backend across an emulated cluster (root and network namespaces needed;
skipped otherwise): tests/train/test_torch_backend.py and test_torch_fsdp.py, run by ddlrun on 4 hosts in 2
racks, one rank each, so every collective, every dist.new_group and every DeviceMesh is planned over switch
levels. Their expected values are closed forms and one process on the global batch, as on one host."""
import os
import re
import subprocess
import sys

import pytest

from ddl import cluster

WHY = cluster.available()
pytestmark = [pytest.mark.skipif(WHY is not None, reason=str(WHY)), pytest.mark.timeout(300)]
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("suite", ["train/test_torch_backend.py",
                                   pytest.param("train/test_torch_fsdp.py", marks=pytest.mark.full)])  # CI: DDP
def test_torch_on_the_ddl_backend_across_two_racks(suite):
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-m", "ddl.tools.ddlrun", "--emulate", "2x2x1", sys.executable, "-m",
                           "pytest", "-q", "-p", "no:cacheprovider", "--with-mpi", "--color=no", "--timeout=200",
                           suite], capture_output=True, text=True, timeout=280, cwd=TESTS)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summaries = re.findall(r"(\d+) passed", done.stdout)
    assert len(summaries) == 4 and len(set(summaries)) == 1 and int(summaries[0]) >= 9, done.stdout[-2000:]
    assert "failed" not in done.stdout and "skipped" not in done.stdout
