"""Files users write are validated, not trusted: every machine file in topology/, mutated value by value (wrong
types, negative, huge, missing keys, truncated JSON), loads or fails with a TopologyError naming the path,
never a traceback of another kind and never slowly; plan files likewise. The schemas are checked against the
code's own lists."""
import copy
import json
import time
from pathlib import Path

import pytest

from ddl import topology
from ddl.errors import DDLError, TopologyError
from ddl.planner.sources import load_plan
from ddl.topology import links
from ddl.topology.validate import path_text

FILES = Path(__file__).resolve().parents[2] / "topology"
MACHINES = sorted(p for p in FILES.glob("*.json") if not p.name.endswith(".schema.json"))
BAD_VALUES = [-1, 0, 10**30, 1e308, 1.5, True, "x", None, [], {}]


def _leaves(d, path=()):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(d, list) and d:
        for i, v in enumerate(d[:3]):  # the first few items of a list are representative
            yield from _leaves(v, path + (i,))
    yield path


def _set(d, path, value):
    for p in path[:-1]:
        d = d[p]
    if value is _DELETE:
        del d[path[-1]]
    else:
        d[path[-1]] = value


_DELETE = object()


def _small(d: dict) -> dict:
    """The machine with at most 8 nodes: validation is what is tested here, not expanding Summit 400 times."""
    d = copy.deepcopy(d)
    if isinstance(d.get("nodes"), int) and d["nodes"] > 8:
        d["nodes"] = 8
    return d


@pytest.mark.parametrize("path", MACHINES, ids=lambda p: p.stem)
def test_mutated_machine_files_fail_clearly_and_quickly(path):
    base = _small(json.loads(path.read_text()))
    cases = [(p, v) for p in _leaves(base) if p for v in BAD_VALUES + [_DELETE]
             if not (v is _DELETE and isinstance(p[-1], int))]
    outcomes = {"loaded": 0, "refused": 0}
    for where, value in cases:
        d = copy.deepcopy(base)
        _set(d, where, value)
        start = time.perf_counter()
        try:
            topology.load(d)
            outcomes["loaded"] += 1
        except TopologyError as e:
            outcomes["refused"] += 1
            text = str(e)
            named = {path_text(where), path_text(where[:-1])}
            if where[0] in ("description",):
                continue
            assert any(n in text for n in named) or "topology" in text or "machine" in text, \
                f"{path_text(where)} = {value!r}: {text}"
        assert time.perf_counter() - start < 5, f"{path_text(where)} = {value!r} took too long"
    assert outcomes["refused"] > outcomes["loaded"]  # most of these values are wrong, and said to be


@pytest.mark.parametrize("path", MACHINES, ids=lambda p: p.stem)
def test_truncated_files_are_refused_in_one_sentence(path):
    text = path.read_text()
    for cut in range(1, len(text), max(1, len(text) // 25)):
        with pytest.raises(TopologyError, match="not valid JSON|must be"):
            topology.load(text[:cut] if text[:cut].lstrip().startswith("{") else "{" + text[:cut])


@pytest.mark.parametrize("where, value, message", [
    (("node", "gpu_links", 0, 0), -1, "node.gpu_links[0][0]: must be >= 0"),
    (("node", "nic", "links"), True, "node.nic.links: must be integer"),
    (("node", "nic", "bandwidth"), 1e308, "node.nic.bandwidth: must be <= 1e+06"),
    (("node", "nic"), "x", "node.nic: must be object"),
    (("nodes",), 10**30, "nodes: must be <= 65536"),
    (("node", "gpus"), 10**30, "node.gpus: must be <= 256"),
    (("node", "gpus"), 2.5, "node.gpus: must be integer"),
    (("node", "gpu_links", 0, 1), 7, "node.gpu_links[0]: GPUs 0 and 7 must differ and be below gpus (6)"),
    (("switches", 0, "uplink", "bandwidth"), 0, "switches[0].uplink.bandwidth: must be > 0"),
    (("switches", 0, "fanout"), 1, "switches: fanouts 1x256 do not join"),
    (("hostnames",), "node{bad}", "hostnames: not a name pattern"),
    (("node", "colour"), "blue", "node: unknown key(s): 'colour'"),
])
def test_each_invalid_value_is_named(where, value, message):
    d = json.loads((FILES / "summit.json").read_text())
    d["nodes"] = 512
    _set(d, where, value)
    with pytest.raises(TopologyError) as e:
        topology.load(d)
    assert message in str(e.value)


def test_graph_dumps_round_trip_and_are_checked(tmp_path):
    t = topology.load("dgx1")
    again = topology.load(t.to_json())

    def canonical(d):
        return sorted(json.dumps(v, sort_keys=True) for v in d["vertices"]), \
            sorted(json.dumps(e, sort_keys=True) for e in d["links"])
    assert canonical(again.to_dict()) == canonical(t.to_dict())
    d = json.loads(t.to_json())
    d["links"][0]["a"] = "nowhere"
    d["vertices"][0]["kind"] = "toaster"
    with pytest.raises(TopologyError, match=r"vertices\[0\].kind: must be one of .*links\[0\].a: no vertex|"
                                            r"vertices\[0\].kind: must be one of"):
        topology.load(d)


def test_plan_files_are_checked(tmp_path):
    good = {"tree": [[0, 1], [2, 3]], "levels": [
        {"name": "node", "link": "shm", "alpha": 3e-6, "bandwidth": 4e9, "gamma": 2.5e-10},
        {"name": "top", "link": "veth", "alpha": 6e-5, "bandwidth": 1.25e8, "gamma": 2.5e-10}],
        "algorithms": ["ring", "ring"], "shape": "hierarchical", "block_bytes": 65536, "inflight": 2}
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(good))
    assert load_plan(str(f)).algorithms == ("ring", "ring")
    for where, value, message in [(("block_bytes",), 0, "block_bytes: must be >= 1"),
                                  (("levels", 0, "bandwidth"), -5, "levels[0].bandwidth: must be > 0"),
                                  (("algorithms", 1), "magic", "algorithms[1]: must be one of"),
                                  (("inflight",), True, "inflight: must be integer")]:
        d = copy.deepcopy(good)
        _set(d, where, value)
        f.write_text(json.dumps(d))
        with pytest.raises(DDLError, match=message.replace("[", r"\[").replace("]", r"\]")):
            load_plan(str(f))


def test_schemas_know_every_link_kind():
    schema = json.loads((FILES / "machine.schema.json").read_text())
    assert schema["$defs"]["link"]["properties"]["kind"]["enum"] == list(links.BY_NAME)
