"""The probe's decisions without MPI: rounds, grouping on a simulated network (max-min fair flows, noise),
its cost against all-pairs, the cache and its faults, and the topology built from a result."""
import json

import pytest

from ddl.errors import DDLError
from ddl.topology import discover
from ddl.topology.probe import cache, cost, patterns, round_flows
from ddl.topology.probe.grouping import Flow, group
from ddl.topology.probe.result import BudgetSpent, Level, ProbeError, ProbeResult
from ddl.topology.probe.schedule import unit_pairs
from ddl.topology.probe.calibrate import calibrate
from ddl.topology.probe.survey import survey
from fakes.flows import Network

G = 125e6  # 1 Gbit/s in bytes/s


def hosts_of(tree):
    return [tree] if isinstance(tree, str) else [h for t in tree for h in hosts_of(t)]


def names(n, prefix="node"):
    return [f"{prefix}{i}" for i in range(n)]


SHAPES = {  # name: (tree, NIC, uplinks per level above the leaves)
    "two racks, slower uplink": ([names(2), ["node2", "node3"]], G, [G / 2]),
    "two racks, 2:1 oversubscribed": ([names(2), ["node2", "node3"]], G, [G]),
    "flat switch": (names(8), G, []),
    "three tiers": ([[["n0", "n1"], ["n2", "n3"]], [["n4", "n5"], ["n6", "n7"]]], 50e6, [50e6, 12.5e6]),
    "three tiers, oversubscribed only": ([[["n0", "n1"], ["n2", "n3"]], [["n4", "n5"], ["n6", "n7"]]], 50e6,
                                         [50e6, 50e6]),
    "unequal racks": ([["a0", "a1", "a2"], ["a3", "a4"], ["a5"]], G, [G / 2]),
}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("seed", range(5))
def test_found_tree_is_the_networks_under_noise(shape, seed):
    tree, nic, uplinks = SHAPES[shape]
    net = Network.tree(tree, nic, uplinks, noise=0.2, seed=seed)
    hosts = hosts_of(tree)
    result = survey(hosts, net.measure(hosts))
    assert result.tree == tree
    assert len(result.levels) == (1 if shape == "flat switch" else len(uplinks) + 1)
    assert result.levels[0].bandwidth == pytest.approx(nic, rel=0.25)


def _cut_after(measure, rounds: int):
    """``measure`` whose budget runs out at its ``rounds``-th round, as the probe's leaders raise it."""
    def run(pairs, index):
        if index >= rounds:
            raise BudgetSpent(f"probe: past its budget after {index + 1} rounds")
        return measure(pairs, index)
    return run


@pytest.mark.parametrize("shape, settled", [
    ("two racks, slower uplink", [1]), ("unequal racks", [1]),
    # stage 1's cut leaves the racks under one switch: less structure than the network has, not a wrong level
    ("three tiers", [1, 2])])
@pytest.mark.parametrize("seed", range(3))
def test_a_budget_spent_keeps_the_stages_it_finished(shape, settled, seed):
    """Cut at every round: before the first stage ends nothing stands (the probe fails, the job falls back to
    hosts); after it, the groups found so far stand under one switch, marked doubtful for the next job."""
    tree, nic, uplinks = SHAPES[shape]
    hosts = hosts_of(tree)
    whole = survey(hosts, Network.tree(tree, nic, uplinks, noise=0.2, seed=seed).measure(hosts))
    assert whole.tree == tree
    flattened = {1: [g for rack in tree for g in (rack if isinstance(rack[0], list) else [rack])], 2: tree}
    outcomes = set()
    for cut in range(whole.rounds):
        net = Network.tree(tree, nic, uplinks, noise=0.2, seed=seed)
        try:
            got = survey(hosts, _cut_after(net.measure(hosts), cut))
        except BudgetSpent:
            outcomes.add(0)
            continue
        stood = next(k for k in settled if got.tree == flattened[k])  # StopIteration: a tree not allowed
        outcomes.add(stood)
        assert len(got.levels) == stood + 1 and got.levels[-1].groups == 1 and got.doubtful
        assert any("past its budget" in n and "placed under one switch" in n for n in got.notes)
    assert outcomes == {0, *settled}


def test_a_survey_cut_short_warns_and_is_cached_as_doubtful(tmp_path, monkeypatch):
    """The job that ran it plans with what stood and hears why; the next job measures again."""
    from ddl.options import parse
    from ddl.topology.probe import session

    tree, nic, uplinks = SHAPES["three tiers"]
    hosts = hosts_of(tree)
    cut = survey(hosts, _cut_after(Network.tree(tree, nic, uplinks).measure(hosts), 40))
    assert cut.doubtful and len(cut.levels) == 2  # stage 0's racks, cut in stage 1

    class Alone:
        rank = 0

        def bcast(self, x, root=0):
            return x

    monkeypatch.setattr(session, "probe", lambda *a, **k: cut)
    out = session.survey_hosts(Alone(), hosts, parse(""), {"DDL_PROBE_CACHE": str(tmp_path)})
    assert out.result is cut and out.warning.startswith("past its budget")
    assert "placed under one switch" in out.warning and "the next job measures again" in out.warning
    assert "past its budget" in cache.load(str(tmp_path), sorted(hosts))[0].doubtful


def test_levels_carry_the_measured_uplinks():
    tree, nic, uplinks = SHAPES["three tiers"]
    net = Network.tree(tree, nic, uplinks)
    result = survey(hosts_of(tree), net.measure(hosts_of(tree)))
    # a rack sends at most its uplink's rate out; an aisle at most its own
    assert [round(lv.bandwidth / 1e6, 1) for lv in result.levels] == [50.0, 50.0, 12.5]


def test_every_pair_is_measured_once_per_pattern_set_with_few_hosts():
    for n in (2, 3, 4, 5, 8, 9, 16):
        seen = {p for pat in patterns(n) for p in unit_pairs(n, pat)}
        assert len(seen) == n * (n - 1) // 2, n


def test_each_host_is_in_one_flow_per_direction_of_a_round():
    units = [[i] for i in range(40)]
    for pat in patterns(40, 16):
        flows = round_flows(units, pat, 16)
        assert len({s for s, _ in flows}) == len(flows) == len({d for _, d in flows})


@pytest.mark.parametrize("hosts, rack", [(64, 4), (1024, 16)])
def test_large_clusters_are_found_with_far_fewer_flows_than_all_pairs(hosts, rack):
    aisles = 4
    per_aisle = hosts // aisles // rack
    tree = [[[f"h{(a * per_aisle + r) * rack + i}" for i in range(rack)] for r in range(per_aisle)]
            for a in range(aisles)]
    # racks 4:1 oversubscribed; an aisle's uplink carries two racks' worth: a window of racks crossing it shows
    # that (a probe loads an uplink with at most half a window of units at once)
    net = Network.tree(tree, G, [G * rack / 4, G * rack / 2], noise=0.1, seed=3)
    result = survey(hosts_of(tree), net.measure(hosts_of(tree)))
    assert result.tree == tree
    assert hosts < 1000 or result.flows < hosts * (hosts - 1) / 4


def test_cost_grows_below_all_pairs():
    rows = [cost(h, 16, 16) for h in (64, 1024, 4608)]
    assert [r["stages"] for r in rows] == [2, 3, 4]
    assert all(r["flows"] < r["all_pairs"] for r in rows[1:])
    assert rows[2]["flows"] / rows[2]["all_pairs"] < 0.05


def test_flows_of_one_pattern_keep_their_best_repeat_and_the_pair_its_worst_pattern():
    units = [[0], [1], [2]]
    flows = [Flow(0, 0, 1, 50.0, pattern=0), Flow(1, 0, 1, 100.0, pattern=0),  # noise: the best repeat counts
             Flow(2, 1, 0, 30.0, pattern=1),                                   # heavier load: the pair's rate
             Flow(3, 1, 2, 100.0, pattern=2), Flow(4, 0, 2, 100.0, pattern=3)]
    g = group(units, flows)
    assert g.rates[(0, 1)] == 30.0 and g.groups == [[0], [1, 2]]


def result(hosts=("a", "b", "c", "d")):
    return ProbeResult(list(hosts), [list(hosts[:2]), list(hosts[2:])],
                       [Level("leaf", 1e8, 3e-5, 2), Level("spine", 5e7, 6e-5, 1)])


def test_cache_keeps_a_result_per_host_set(tmp_path):
    r = result()
    cache.save(str(tmp_path), r)
    got, why = cache.load(str(tmp_path), ["d", "c", "b", "a"])
    assert why is None and got.tree == r.tree and got.levels == r.levels
    assert cache.load(str(tmp_path), ["a", "b", "c"]) == (None, None)  # other hosts: another file


@pytest.mark.parametrize("damage, words", [
    (lambda d: "{not json", "unreadable"),
    (lambda d: json.dumps({**d, "hosts": ["a", "b", "c", "x"], "tree": [["a", "b"], ["c", "x"]]}), "other hosts"),
    (lambda d: json.dumps({**d, "levels": [{"bandwidth": -1, "latency": 0, "groups": 1}] * 2}),
     "levels[0].bandwidth"),
    (lambda d: json.dumps({**d, "tree": [["a", "b"], ["c"]]}), "every host once"),
    (lambda d: json.dumps({**d, "tree": ["a", "b", "c", "d"]}), "depth"),
    (lambda d: json.dumps({**d, "format": "other"}), "not a ddl-probe/1"),
])
def test_a_corrupt_or_foreign_cache_file_is_named_and_ignored(tmp_path, damage, words):
    r = result()
    path = cache.save(str(tmp_path), r)
    path.write_text(damage(r.to_dict()))
    got, why = cache.load(str(tmp_path), r.hosts)
    assert got is None and words in why and str(path) in why and "measuring again" in why


def test_topology_from_a_probe_has_its_levels_and_measured_costs():
    reports = [{"host": h, "numa": None, "gpus": None} for h in ("a", "a", "b", "b", "c", "c", "d", "d")]
    t = discover.build(reports, environ={}, probed=result())
    tree, levels = t.hierarchy(t.placement)
    assert tree == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert [lv.measured for lv in levels] == [False, True, True]  # shared memory is nominal
    assert levels[1].bandwidth == pytest.approx(1e8) and levels[2].bandwidth == pytest.approx(5e7)
    assert 5e-5 < levels[2].alpha < 7e-5  # the spine's one-way latency, as measured
    again = type(t).from_dict(json.loads(t.to_json()))  # the dump keeps what was measured
    assert [lv.measured for lv in again.hierarchy(again.placement)[1]] == [False, True, True]


def test_tiers_given_win_over_the_probe():
    reports = [{"host": h, "numa": None, "gpus": None} for h in "abcd"]
    t = discover.build(reports, environ={"DDL_NODES": "1"}, probed=result())
    assert t.name == "discovered" and all(not lv.measured for lv in t.hierarchy(t.placement)[1])


def test_probe_settings_are_checked():
    from ddl.options import parse

    assert parse("-probe force").probe == "force" and parse(environ={"DDL_PROBE": "0"}).probe == "0"
    with pytest.raises(DDLError, match="expected one of auto, 0, 1, force"):
        parse("-probe sometimes")
    with pytest.raises(ProbeError):
        raise ProbeError("x")


# -- a cached result checked against the network (verify) ------------------------------------------------------

from ddl.topology.probe.verify import verify  # noqa: E402


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("seed", range(3))
def test_a_cached_tree_agrees_with_its_own_network_under_noise(shape, seed):
    tree, nic, uplinks = SHAPES[shape]
    hosts = hosts_of(tree)
    cached = survey(hosts, Network.tree(tree, nic, uplinks, noise=0.2, seed=seed).measure(hosts))
    verdict = verify(cached, hosts, Network.tree(tree, nic, uplinks, noise=0.2, seed=seed + 7).measure(hosts))
    assert verdict.agrees, verdict.why
    # a handful of rounds: both directions of one cut per level, twice; far below the survey's
    assert verdict.rounds <= 4 * len(cached.levels) < cached.rounds


RACKS = [["n0", "n1"], ["n2", "n3"]]
CHANGES = {  # (the network the cache was measured on, the network now): the same four names
    "flat, then two racks behind a slower uplink": ((["n0", "n1", "n2", "n3"], G, []), (RACKS, G, [G / 4])),
    "two racks, then flat": ((RACKS, G, [G / 4]), (["n0", "n1", "n2", "n3"], G, [])),
    "two racks, then a slower uplink": ((RACKS, G, [G / 2]), (RACKS, G, [G / 8])),
    "flat, then slower NICs": ((["n0", "n1", "n2", "n3"], G, []), (["n0", "n1", "n2", "n3"], G / 4, [])),
    "hosts moved between racks": ((RACKS, G, [G / 4]), ([["n0", "n2"], ["n1", "n3"]], G, [G / 4])),
}


@pytest.mark.parametrize("change", CHANGES, ids=str)
def test_a_cached_tree_of_another_network_is_refused_naming_a_flow(change):
    (before, nic0, up0), (after, nic1, up1) = CHANGES[change]
    hosts = ["n0", "n1", "n2", "n3"]
    cached = survey(hosts, Network.tree(before, nic0, up0).measure(hosts))
    verdict = verify(cached, hosts, Network.tree(after, nic1, up1, noise=0.1).measure(hosts))
    assert not verdict.agrees
    assert " -> " in verdict.why and "Mbit/s where the cached tree predicts" in verdict.why


def test_the_cache_records_when_and_how_and_ddl_topo_shows_it(tmp_path):
    from ddl.tools.topo import cached_probes

    r = result()
    r.measured_at, r.verified_at = "2026-01-02T03:04:05+00:00", "2026-02-03T04:05:06+00:00"
    r.settings = {"window": 16, "repeats": 2, "budget": 5.0, "flow_bytes": 65536}
    cache.save(str(tmp_path), r)
    got, _ = cache.load(str(tmp_path), list(r.hosts))
    assert (got.measured_at, got.verified_at, got.settings) == (r.measured_at, r.verified_at, r.settings)
    (tmp_path / "probe-broken.json").write_text("{")
    text = cached_probes(str(tmp_path))
    assert "measured: 2026-01-02T03:04:05+00:00" in text and "last verified: 2026-02-03T04:05:06+00:00" in text
    assert "window 16" in text and "leaf 800 Mbit/s" in text and "spine 400 Mbit/s" in text
    assert "probe-broken.json: unusable" in text


@pytest.mark.parametrize("shape", ["three tiers", "two racks, 2:1 oversubscribed", "unequal racks", "flat switch"])
def test_calibration_measures_each_level_under_an_allreduces_load(shape):
    """Receivers that start their clocks late read the survey's short flows fast; the calibration's longer ones
    come within a few percent. The truth under a ring's load, by hand (max-min fair shares): every host of a child crosses at once, so a
    child moves its uplink's rate (or its hosts' NICs where the uplink is faster)."""
    tree, nic, uplinks = SHAPES[shape]
    truth = {"three tiers": [50e6, 50e6, 12.5e6], "two racks, 2:1 oversubscribed": [G, G],
             "unequal racks": [G, G / 2], "flat switch": [G]}[shape]
    skew = 0.0 if shape == "unequal racks" else 0.005  # (skewed, the survey misplaces a lone host's rack)
    net = Network.tree(tree, nic, uplinks, skew=skew, nbytes=2e5)
    hosts = hosts_of(tree)
    found = survey(hosts, net.measure(hosts))
    assert found.tree == tree
    if skew:
        assert max(lv.bandwidth / t for lv, t in zip(found.levels, truth)) > 1.2  # the skew misleads the survey
    calibrated = calibrate(found, hosts, net.measure(hosts), net.size_flows)
    assert [lv.how for lv in calibrated.levels] == ["calibrated"] * len(truth)
    assert [lv.bandwidth for lv in calibrated.levels] == pytest.approx(truth, rel=0.07)
    assert calibrated.tree == found.tree and calibrated.rounds > found.rounds
    assert "calibrated under an allreduce's load" in calibrated.notes[-1]
    again = ProbeResult.from_dict(json.loads(json.dumps(calibrated.to_dict())))
    assert [lv.how for lv in again.levels] == ["calibrated"] * len(truth)


def test_calibration_holds_under_noise():
    tree, nic, uplinks = SHAPES["three tiers"]
    net = Network.tree(tree, nic, uplinks, noise=0.1, seed=3)
    hosts = hosts_of(tree)
    calibrated = calibrate(survey(hosts, net.measure(hosts)), hosts, net.measure(hosts), net.size_flows, repeats=3)
    assert [lv.bandwidth for lv in calibrated.levels] == pytest.approx([50e6, 50e6, 12.5e6], rel=0.25)


def test_levels_that_noise_made_are_dropped_by_the_calibration():
    """A level is a boundary only where its flows run x1.5 slower than the level below's. A flat switch of four
    hosts that a noisy survey split into two "racks", and three racks under one switch (a star) that a noisy
    survey joined two and one under a "core" (as a job on the emulated star once did): both come out right."""
    flat = names(4)
    net = Network.tree(flat, G, [])
    wrong = ProbeResult(sorted(flat), [flat[:2], flat[2:]], [Level("leaf", G, 3e-5, 2), Level("spine", G, 3e-5, 1)])
    fixed = calibrate(wrong, flat, net.measure(flat), net.size_flows)
    assert fixed.tree == flat and [(lv.name, lv.groups) for lv in fixed.levels] == [("leaf", 1)]
    assert "level spine dropped" in fixed.notes[-1]
    star = [["s0", "s1"], ["s2", "s3"], ["s4", "s5"]]
    net = Network.tree(star, G, [0.3 * G])
    hosts = hosts_of(star)
    wrong = ProbeResult(sorted(hosts), [[star[0], star[1]], [star[2]]],
                        [Level("leaf", G, 3e-5, 3), Level("spine", 0.3 * G, 3e-5, 2), Level("core", 0.3 * G, 3e-5, 1)])
    fixed = calibrate(wrong, hosts, net.measure(hosts), net.size_flows)
    assert fixed.tree == star and [(lv.name, lv.groups) for lv in fixed.levels] == [("leaf", 3), ("spine", 1)]
    assert [lv.bandwidth for lv in fixed.levels] == pytest.approx([G, 0.3 * G], rel=0.02)
    assert "level core dropped" in fixed.notes[-1]
