"""Writes ddl/_native.pyi from the built extension's own signatures (pybind11 docstrings), so the stubs never
drift from native/bindings.cpp: ``python -m ddl.tools.stubs`` rewrites the file, ``--check`` exits 1 when it
differs (a unit test runs the check)."""
from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path

HEADER = '''"""Type stubs of the native executor, generated from the built module by ``python -m ddl.tools.stubs``."""
from enum import Enum
from typing import Any

import numpy as np
'''

_TYPES = [
    (r"ddl\._native\.", ""),
    (r"typing\.SupportsFloat \| typing\.SupportsIndex", "float"),
    (r"typing\.SupportsInt \| typing\.SupportsIndex", "int"),
    (r"typing_extensions\.\w+|typing\.Any|\bobject\b|\bcapsule\b|\bhandle\b", "Any"),
    (r"typing\.Annotated\[numpy\.typing\.ArrayLike, [\w.]+\]", "np.ndarray"),
    (r"numpy\.typing\.NDArray\[[^\]]*\]|numpy\.ndarray\[[^\]]*\]|numpy\.ndarray", "np.ndarray"),
    (r"collections\.abc\.Sequence|typing\.List|List", "list"),
    (r"typing\.Tuple|Tuple", "tuple"),
]


def _clean(annotation: str) -> str:
    for pattern, repl in _TYPES:
        annotation = re.sub(pattern, repl, annotation)
    return annotation.strip()


def _signature(doc: str | None, name: str) -> tuple[str, str]:
    """(parameters, return type) from a pybind11 docstring's first line; defaults become '...'."""
    line = (doc or "").strip().splitlines()[0] if doc and doc.strip() else ""
    m = re.match(rf"(?:{re.escape(name)})?\((.*)\) -> (.+)$", line)
    if not m:
        return "*args: Any", "Any"
    params = []
    for part in _split(m.group(1)):
        pname, _, rest = part.partition(":")
        annotation, eq, _default = rest.partition(" = ")
        pname = pname.strip()
        if pname == "self" or (name == "" and not params and re.fullmatch(r"arg0", pname)):
            params.append("self")
            continue
        params.append(f"{pname}: {_clean(annotation)}" + (" = ..." if eq else ""))
    return ", ".join(params), _clean(m.group(2))


def _split(text: str) -> list[str]:
    """Top-level comma split (brackets and default values such as <ReduceOp.sum: 0> nest)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(<":
            depth += 1
        elif ch in "])>":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        out.append(text[start:].strip())
    return out


def _function(name: str, obj, indent: str = "", static: bool = False) -> list[str]:
    params, returns = _signature(obj.__doc__, name)
    if not static and not params.startswith("self") and indent:
        params = "self" + (", " + params if params else "")
    lines = [f"{indent}@staticmethod"] if static else []
    return lines + [f"{indent}def {name}({params}) -> {returns}: ..."]


def _class(name: str, cls) -> list[str]:
    if hasattr(cls, "__members__"):  # a pybind11 enum
        return [f"class {name}(Enum):"] + [f"    {k} = {int(v)}" for k, v in cls.__members__.items()]
    lines = [f"class {name}:"]
    for attr, value in cls.__dict__.items():
        if attr.startswith("_") and attr not in ("__init__", "__buffer__"):
            continue
        if isinstance(value, staticmethod):
            lines += _function(attr, value.__func__, "    ", static=True)
        elif isinstance(value, property):
            _, returns = _signature(value.fget.__doc__ if value.fget else None, "")
            lines += ["    @property", f"    def {attr}(self) -> {returns}: ..."]
        elif callable(value):
            if attr == "__init__" and _signature(value.__doc__, attr)[1] == "Any":
                continue  # no constructor: made by a static factory
            lines += _function(attr, value, "    ")
    return lines if len(lines) > 1 else lines + ["    ..."]


def render(module) -> str:
    parts = [HEADER]
    for name, value in sorted(vars(module).items(), key=lambda kv: (not inspect.isclass(kv[1]), kv[0])):
        if name.startswith("_"):
            continue
        if inspect.isclass(value):
            parts.append("\n".join(_class(name, value)) + "\n")
        elif callable(value):
            parts.append("\n".join(_function(name, value)) + "\n")
        else:
            parts.append(f"{name}: {type(value).__name__}[{type(value[0]).__name__}, ...]\n"
                         if isinstance(value, tuple) and value else f"{name}: {type(value).__name__}\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddl.tools.stubs", description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 if ddl/_native.pyi differs from the module")
    args = ap.parse_args(argv)
    from .. import _native

    path = Path(_native.__file__).with_name("_native.pyi")
    text = render(_native)
    if args.check:
        if not path.exists() or path.read_text() != text:
            print(f"{path} is out of date: run python -m ddl.tools.stubs", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
