"""The module names of ddl before it was split into subpackages, kept importable: ``import ddl.planner``
style code and ``from ddl import hierarchical`` keep working. One table; nothing else refers to old names."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    # (ddl.communicator and ddl.explain are not here: those names are the API's functions)
    "ddl.dtypes": "ddl.core.dtypes", "ddl.fusion": "ddl.core.fusion",
    "ddl.algorithms": "ddl.schedule.algorithms",
    "ddl.check": "ddl.schedule.check", "ddl.plan": "ddl.schedule.compile",
    "ddl.hierarchical": "ddl.topology.tree", "ddl.links": "ddl.topology.links",
    "ddl.discover": "ddl.topology.discover",
    "ddl.device_arrays": "ddl.gpu.arrays",
    "ddl.hosts": "ddl.runner.hosts", "ddl.launch": "ddl.runner.launch", "ddl.mpirun": "ddl.runner.mpirun",
    "ddl.supervise": "ddl.runner.supervise", "ddl.prelaunch": "ddl.runner.prelaunch",
    "ddl.rankenv": "ddl.runner.rankenv", "ddl.ddlrun": "ddl.tools.ddlrun", "ddl.bench": "ddl.tools.bench",
    "ddl.topo_cli": "ddl.tools.topo", "ddl.cluster_cli": "ddl.tools.cluster", "ddl.emulate": "ddl.cluster.spec",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        pass  # the module under its new name is already executed


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())


def attribute(name: str):
    """``ddl.<old name>`` as an attribute of the package (``from ddl import hierarchical``)."""
    target = MOVED.get(f"ddl.{name}")
    return importlib.import_module(target) if target else None
