"""The shape of the house: rooms that depend one way, stubs that match the extension, old names that still
import, sizes read the same everywhere, every CLI answering bad input in one line, and IBM's Python calls."""
import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ddl
from ddl.units import bandwidth, parse_size

PACKAGE = Path(ddl.__file__).parent
# Rooms from the ground up: a room may import only rooms listed before it (and itself).
LAYERS = ["errors", "config", "units", "options", "_native", "topology", "schedule", "planner", "core", "gpu",
          "elastic", "runner", "cluster", "torch", "keras", "horovod", "tools"]
TOP = {"__init__", "_moved"}  # the public API and the old names: they may import anything


def _room(module: str) -> str:
    return module.split(".")[1] if module.count(".") >= 1 else module


def _imports(path: Path) -> set[str]:
    """Every ddl module ``path`` imports, at any depth (function-level imports included)."""
    module = "ddl." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    package = package.removesuffix(".__init__")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "ddl":  # from ddl import x: x is the module
                found.update(f"ddl.{a.name}" for a in node.names)
            elif target.startswith("ddl."):
                found.add(target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("ddl."))
    return found


def test_rooms_depend_one_way():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        room = rel.parts[0].removesuffix(".py")
        if room in TOP:
            continue
        for target in _imports(path):
            other = _room(target)
            if other == room or other in TOP and target == "ddl":
                continue
            if other not in LAYERS or room not in LAYERS or LAYERS.index(other) > LAYERS.index(room):
                wrong.append(f"{rel} imports {target}")
    assert not wrong, "imports against the layering:\n" + "\n".join(sorted(wrong))


def test_no_module_reads_another_rooms_private_members():
    """The seam: no ``x._name`` on objects of another room (ddl.gpu on the communicator, for instance)."""
    suspects = []
    for path in (PACKAGE / "gpu").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Attribute) and node.value.attr in ("comm", "outer")):
                suspects.append(f"{path.name}:{node.lineno} .{node.value.attr}.{node.attr}")
    assert not suspects


def test_type_stubs_match_the_extension():
    done = subprocess.run([sys.executable, "-m", "ddl.tools.stubs", "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_step_layout_comes_from_the_executor():
    from ddl import _native
    from ddl.schedule.compile import program_rows
    from ddl.schedule.ir import Op, Program, Step

    prog = Program(0, (Step(0, Op.SEND, 1, 3, 4), Step(0, Op.RECV_REDUCE, 1, 3, 4)), 1)
    rows, scratch = program_rows(prog)
    f = {name: i for i, name in enumerate(_native.STEP_FIELDS)}
    assert rows.shape == (2, len(_native.STEP_FIELDS)) and scratch == 4
    assert rows[0, f["kind"]] == int(_native.StepKind.send) and rows[1, f["kind"]] == int(_native.StepKind.recv_reduce)
    assert rows[1, f["scratch"]] == 0 and rows[0, f["offset"]] == 3 and rows[0, f["count"]] == 4


@pytest.mark.parametrize("old, new", [("hierarchical", "ddl.topology.tree"), ("discover", "ddl.topology.discover"),
                                      ("fusion", "ddl.core.fusion"), ("emulate", "ddl.cluster.spec"),
                                      ("bench", "ddl.tools.bench"), ("mpirun", "ddl.runner.mpirun")])
def test_old_module_names_still_import(old, new):
    assert importlib.import_module(f"ddl.{old}") is importlib.import_module(new)
    assert getattr(ddl, old) is importlib.import_module(new)


@pytest.mark.parametrize("text, expected", [("8", 8), ("64K", 65536), ("64KiB", 65536), ("64KB", 65536),
                                            ("64kb", 65536), ("16M", 16 << 20), ("1.5G", 3 << 29), (" 2 MiB ", 2 << 20)])
def test_sizes_are_read_alike(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "64Q", "-1", "1.3", "64 KK", "1e3"])
def test_bad_sizes_are_named(text):
    with pytest.raises(ValueError, match="bad size"):
        parse_size(text)


def test_bandwidth_is_nccl_tests_busbw():
    assert bandwidth(8e9, 2.0, 4) == (4.0, 4.0 * 2 * 3 / 4)
    assert bandwidth(1e9, 1.0, 1) == (1.0, 1.0)


CLI_BAD_INPUT = [
    ["ddl-topo", "summit", "--plan", "64Q"],
    ["ddl-topo", "no-such-machine"],
    ["ddl-topo", "--ranks", "0", "summit"],
    ["ddl-topo", "--bogus"],
    ["ddl-bench", "-b", "lots"],
    ["ddl-bench", "-d", "complex"],
    ["ddl-bench", "-N", "0"],
    ["ddl-bench", "--algo", "ddl,nccl2"],
    ["ddl-bench", "--collective", "broadcast", "--algo", "ddl,ddl-ring"],
    ["ddl-bench", "-b", "1M", "-e", "1K"],
    ["ddl-cluster", "frobnicate"],
    ["ddl-trace", "/no/such/folder"],
    ["ddl-trace"],
    ["ddlrun", "-np", "zero", "python", "x.py"],
    ["ddlrun", "-H", "a;rm -rf ~", "--dry-run", "python", "x.py"],
]


@pytest.mark.parametrize("argv", CLI_BAD_INPUT, ids=lambda a: " ".join(a))
def test_every_cli_answers_bad_input_in_one_line(argv):
    exe = os.path.join(os.path.dirname(sys.executable), argv[0])
    done = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_old_names_never_hide_the_api_functions():
    importlib.import_module("ddl.hierarchical")
    assert callable(ddl.communicator) and callable(ddl.explain)


def test_ibm_python_signatures():
    ddl.finalize()
    try:
        ddl.init("-mode r -dbg_level 0")  # IBM's ddl.init(options)
        assert ddl.communicator().options.mode.letter == "r"
        a, b = ddl.allreduce_n([np.ones(3, np.float32), np.arange(4.0)], average=True)
        np.testing.assert_array_equal(a, np.ones(3, np.float32))
        np.testing.assert_array_equal(b, np.arange(4.0))
        pairs = ddl.grads_reduce([(np.full(2, 3.0), "w"), (None, "frozen")])
        np.testing.assert_array_equal(pairs[0][0], np.full(2, 3.0))
        assert pairs[0][1] == "w" and pairs[1] == (None, "frozen")
    finally:
        ddl.finalize()
