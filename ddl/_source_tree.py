"""The one clear line for ``import ddl`` from a checkout that has no built native module (as numpy and torch say
when imported from their source trees): after ``pip install .``, the checkout's own ``ddl/`` shadows the
installed copy whenever Python starts in the checkout's root."""
from __future__ import annotations

import importlib.machinery
import os
import sys


def _built(package_dir: str) -> bool:
    names = os.listdir(package_dir)
    return any(n.startswith("_native.") and n.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)) for n in names)


def _installed_elsewhere(package_dir: str) -> str | None:
    """Another ddl on sys.path that has the native module (the one ``pip install .`` made), if any."""
    here = os.path.realpath(package_dir)
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), "ddl")
        if os.path.realpath(candidate) != here and os.path.isfile(os.path.join(candidate, "__init__.py")) \
                and _built(candidate):
            return candidate
    return None


def unbuilt_message(package_dir: str, error: ImportError) -> str:
    if _built(package_dir):  # built, but it does not load: say why
        return f"ddl's native module in {package_dir} does not load ({error}); rebuild it: make (or pip install -e .)"
    other = _installed_elsewhere(package_dir)
    where = f"the installed ddl ({other}) is shadowed by this source tree" if other else "no built ddl is installed"
    return (f"ddl is being imported from its source tree ({package_dir}), which has no built native module, and "
            f"{where}: run Python from another directory to use an installed ddl, or build this checkout in place "
            f"with `make` (or `pip install -e .`)")
