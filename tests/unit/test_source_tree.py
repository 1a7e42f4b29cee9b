"""`pip install .`, then `import ddl` from the checkout's root: one clear line that says what to do, never a
circular-import traceback (issue 31)."""
import importlib.machinery
import os
import shutil
import subprocess
import sys

import ddl

PACKAGE = os.path.dirname(ddl.__file__)


def unbuilt_copy(root):
    """The package's Python sources in root/ddl, as a checkout has them before any build."""
    shutil.copytree(PACKAGE, os.path.join(root, "ddl"),
                    ignore=lambda d, names: [n for n in names if not n.endswith(".py") and not os.path.isdir(
                        os.path.join(d, n))])
    return os.path.join(root, "ddl")


def import_ddl(cwd, pythonpath=""):
    """``import ddl`` in a fresh Python started in ``cwd`` (-S: without this venv's editable install of ddl, whose
    finder would supply the native module from the development checkout)."""
    env = {**os.environ, "PYTHONPATH": pythonpath}
    return subprocess.run([sys.executable, "-S", "-c", "import ddl"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


def test_an_unbuilt_checkout_says_what_to_do(tmp_path):
    source = unbuilt_copy(tmp_path / "checkout")
    run = import_ddl(tmp_path / "checkout")
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: ddl is being imported from its source tree ({source})")
    assert "`make`" in last and "another directory" in last
    assert "circular" not in run.stderr


def test_it_names_the_installed_copy_it_shadows(tmp_path):
    unbuilt_copy(tmp_path / "checkout")
    installed = tmp_path / "site" / "ddl"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("")
    (installed / ("_native" + importlib.machinery.EXTENSION_SUFFIXES[0])).write_text("")
    run = import_ddl(tmp_path / "checkout", str(tmp_path / "site"))
    assert f"the installed ddl ({installed}) is shadowed by this source tree" in run.stderr.strip().splitlines()[-1]
