"""ddl.torch names the torch it needs: older than 2.1 is refused at import with the version in the message."""
import re

import pytest

pytest.importorskip("torch")

import ddl.torch as dt  # noqa: E402
from ddl import DDLError  # noqa: E402


@pytest.mark.parametrize("version", ["2.0.1", "1.13.1+cpu", "2.0.0a0+git1234"])
def test_a_torch_too_old_is_refused_naming_it(version):
    with pytest.raises(DDLError, match=rf"needs torch 2\.1 or newer \(tested with 2\.13\); this is torch {re.escape(version)}"):
        dt.check_torch_version(version)


@pytest.mark.parametrize("version", ["2.1.0", "2.13.0+cpu", "2.14.0.dev20261101", "3.0.0"])
def test_supported_versions_pass(version):
    dt.check_torch_version(version)
