"""Files users write are validated, not trusted: machine descriptions, graph dumps and plan files are checked
against the JSON Schemas published in topology/ (``*.schema.json``, usable by editors too), then by the
checks a schema cannot express (GPU numbers inside the node, switch names defined before use, sizes bounded
before anything is expanded). Every problem is named with its path: ``switches[0].uplink.bandwidth: must be
> 0``."""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

from ..errors import DDLError, TopologyError

SCHEMAS = Path(__file__).resolve().parent.parent / "machines"  # the installed copy of topology/
MAX_VERTICES = 2_000_000  # a machine file expands to at most this many vertices (Summit: 41,473)
_SHOWN = 5


def _schema_dir() -> Path:
    if (SCHEMAS / "machine.schema.json").exists():
        return SCHEMAS
    return Path(__file__).resolve().parent.parent.parent / "topology"  # a source tree never installed


@functools.lru_cache(maxsize=None)
def _validator(kind: str):
    import jsonschema  # only when a file is read: import ddl stays light

    schema = json.loads((_schema_dir() / f"{kind}.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema)


def path_text(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top)"


def _message(error) -> str:
    v, value = error.validator, error.validator_value
    if v == "exclusiveMinimum":
        return f"must be > {value:g}"
    if v in ("minimum", "maximum"):
        return f"must be {'>=' if v == 'minimum' else '<='} {value:g}"
    if v == "type":
        return f"must be {' or '.join(value) if isinstance(value, list) else value}, not {json.dumps(error.instance)[:40]}"
    if v == "enum":
        return f"must be one of {', '.join(map(str, value))}, not {json.dumps(error.instance)[:40]}"
    if v == "const":
        return f"must be {value!r}"
    if v == "required":
        return error.message.replace(" is a required property", ": missing")
    if v == "additionalProperties":
        return "unknown key(s): " + error.message.split("(")[-1].rstrip(")").replace(" were unexpected", "") \
            .replace(" was unexpected", "")
    if v in ("minItems", "maxItems", "minLength", "maxLength"):
        return f"{'at least' if v.startswith('min') else 'at most'} {value} {'items' if 'Items' in v else 'characters'}"
    if v == "oneOf":
        return "matches none of the allowed forms (" + "; ".join(
            sorted({_message(e) for e in (error.context or [])})[:3]) + ")"
    return error.message


def _raise(where: str, problems: list[str]) -> None:
    if problems:
        more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
        raise TopologyError(f"{where}: " + "; ".join(problems[:_SHOWN]) + more)


def _schema_problems(kind: str, d) -> list[str]:
    errors = sorted(_validator(kind).iter_errors(d), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{path_text(e.absolute_path)}: {_message(e)}" for e in _closest(errors)]


def _closest(errors) -> list:
    """A value that fits none of several forms (``oneOf``) is judged by the form it comes closest to: that
    form's errors, each at its own path, instead of one vague line at the parent."""
    out = []
    for e in errors:
        if e.validator in ("oneOf", "anyOf") and e.context:
            branches: dict[int, list] = {}
            for c in e.context:
                branches.setdefault(c.schema_path[0], []).append(c)
            out += _closest(min(branches.values(), key=len))
        else:
            out.append(e)
    return out


def check_machine(d, where: str) -> None:
    """A machine description: the schema, then what it cannot say. Raises TopologyError naming every path."""
    _raise(where, _schema_problems("machine", d))
    problems: list[str] = []
    template = d.get("node", {})
    nodes = d.get("nodes", 1)
    specs = [template] * nodes if isinstance(nodes, int) else [{**template, **n} for n in nodes]
    where_of = (lambda i: "node") if isinstance(nodes, int) else (lambda i: f"nodes[{i}]")
    vertices = 0
    for i, spec in enumerate(specs[:1] if isinstance(nodes, int) else specs):
        gpus, sockets = spec.get("gpus", 0), spec.get("sockets", 0)
        for j, (a, b, _) in enumerate(spec.get("gpu_links", [])):
            if a >= gpus or b >= gpus or a == b:
                problems.append(f"{where_of(i)}.gpu_links[{j}]: GPUs {a} and {b} must differ and be below "
                                f"gpus ({gpus})")
        for j, (a, b) in enumerate(spec.get("socket_links") or []):
            if a >= sockets or b >= sockets or a == b:
                problems.append(f"{where_of(i)}.socket_links[{j}]: sockets {a} and {b} must differ and be below "
                                f"sockets ({sockets})")
        if gpus == 0 and spec.get("slots", 0) == 0:
            problems.append(f"{where_of(i)}: needs gpus or slots (ranks per node without GPUs)")
        if gpus and spec.get("gpu_parent", "socket" if sockets else "node") == "socket" and not sockets:
            problems.append(f"{where_of(i)}.gpu_parent: 'socket' needs sockets")
        vertices += (1 + sockets + gpus + 1) * (nodes if isinstance(nodes, int) else 1)
    if vertices > MAX_VERTICES:
        problems.append(f"nodes: the machine would expand to about {vertices} vertices (at most {MAX_VERTICES})")
    problems += _format_problems(d)
    problems += _name_problems(d, specs)
    problems += _switch_problems(d, len(specs))
    _raise(where, problems)


def _format_problems(d: dict) -> list[str]:
    out = []
    fields = [("hostnames", d.get("hostnames"))] + [
        (f"switches[{i}].names", s.get("names")) for i, s in enumerate(d.get("switches", []))]
    for path, fmt in fields:
        if fmt is None:
            continue
        try:
            fmt.format(index=0)
        except (KeyError, IndexError, ValueError, AttributeError) as e:
            out.append(f"{path}: not a name pattern with {{index}} ({e!r})")
    return out


def _name_problems(d: dict, specs: list[dict]) -> list[str]:
    """Nodes need distinct names: a pattern without {index}, or a name listed twice, would merge nodes."""
    if isinstance(d.get("nodes", 1), int):
        fmt = d.get("hostnames", "node{index}")
        try:
            same = len(specs) > 1 and fmt.format(index=0) == fmt.format(index=1)
        except (KeyError, IndexError, ValueError, AttributeError):
            return []  # said by _format_problems
        return [f"hostnames: {fmt!r} gives every node the same name; put {{index}} in it"] if same else []
    names = [n.get("name") for n in d["nodes"]]
    twice = sorted({n for n in names if n is not None and names.count(n) > 1})
    missing = [i for i, n in enumerate(names) if n is None]
    return ([f"nodes: {n!r} is listed twice" for n in twice]
            + [f"nodes[{i}].name: missing" for i in missing[:3]])


def _switch_problems(d: dict, nnodes: int) -> list[str]:
    switches = d.get("switches", [])
    if not switches:
        return [] if nnodes == 1 else [f"switches: {nnodes} nodes need switches to join them"]
    if "name" in switches[0]:  # listed by name: parents before children, nodes name existing switches
        out, seen = [], set()
        for i, s in enumerate(switches):
            if s.get("parent") is not None and s["parent"] not in seen:
                out.append(f"switches[{i}].parent: {s['parent']!r} is not a switch listed before it")
            if s["name"] in seen:
                out.append(f"switches[{i}].name: {s['name']!r} is listed twice")
            seen.add(s["name"])
        for i, n in enumerate(d.get("nodes") if isinstance(d.get("nodes"), list) else []):
            if n.get("switch") is not None and n["switch"] not in seen:
                out.append(f"nodes[{i}].switch: no switch named {n['switch']!r}")
        if len(switches) > 1 and any("switch" not in n for n in (d.get("nodes") if isinstance(d.get("nodes"), list)
                                                                else [{}])):
            out.append("nodes: with several named switches every node names its switch")
        return out
    out, below = [], nnodes
    for i, s in enumerate(switches):
        below = math.ceil(below / s.get("fanout", below))
        fmt = s.get("names", s["level"] + "{index}")
        try:
            if below > 1 and fmt.format(index=0) == fmt.format(index=1):
                out.append(f"switches[{i}].names: {fmt!r} gives all {below} switches the same name; put {{index}} in it")
        except (KeyError, IndexError, ValueError, AttributeError):
            pass  # said by _format_problems
        if "fanout" not in s and i < len(switches) - 1:
            out.append(f"switches[{i}].fanout: missing (only the top level may omit it)")
    fanouts = [s.get("fanout", nnodes) for s in switches]
    if math.prod(fanouts) < nnodes:
        out.append(f"switches: fanouts {'x'.join(map(str, fanouts))} do not join {nnodes} nodes under one top "
                   f"switch")
    return out


def check_graph(d, where: str) -> None:
    _raise(where, _schema_problems("graph", d))
    ids = [v["id"] for v in d["vertices"]]
    problems = [f"vertices: id {v!r} is listed twice" for v in sorted({x for x in ids if ids.count(x) > 1})][:3]
    known = set(ids)
    for i, e in enumerate(d["links"]):
        for end in ("a", "b"):
            if e[end] not in known:
                problems.append(f"links[{i}].{end}: no vertex {e[end]!r}")
    _raise(where, problems)


def check_plan(d, where: str) -> None:
    problems = _schema_problems("plan", d)
    if problems:
        raise DDLError(f"{where}: " + "; ".join(problems[:_SHOWN]))
