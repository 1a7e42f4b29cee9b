"""DDL_OPTIONS: IBM's grammar, ddl's additions, and clear errors."""
import pytest

from ddl import DDLError
from ddl import options
from ddl.options import Mode, parse, parse_mode


def test_ibm_options_parse():
    o = parse("-mode r:4x2 -dump_iter 100 -dev_sync 1 -rebind_iter 5 -dbg_level 2 -check 1e-5", environ={})
    assert o.mode == Mode("r", (4, 2))
    assert (o.dump_iter, o.dev_sync, o.rebind_iter, o.dbg_level, o.check) == (100, 1, 5, 2, 1e-5)
    assert o.algo == "ring"  # mode r: ring only


def test_ddl_options_and_environment_defaults():
    o = parse("-timeout 7.5 -algo rabenseifner -segment 65536 -inflight 3",
              environ={"DDL_TIMEOUT": "99", "DDL_SMALL_BYTES": "128"})
    assert (o.timeout, o.algo, o.segment, o.inflight, o.small_bytes) == (7.5, "rabenseifner", 65536, 3, 128)
    assert parse("", environ={"DDL_TIMEOUT": "99"}).timeout == 99.0
    assert parse(None, environ={"DDL_OPTIONS": "-algo ring"}).algo == "ring"
    assert (parse("", environ={}).rest, parse("", environ={"DDL_REST": "0"}).rest) == (100.0, 0.0)


@pytest.mark.parametrize("text, message", [
    ("-bogus 1", "unknown DDL option '-bogus'"),
    ("-mode", "needs a value"),
    ("-mode z:4", "bad -mode 'z:4'"),
    ("-mode r:4x0", "at least 1"),
    ("-dump_iter ten", "expects a number"),
    ("-algo magic", "-algo 'magic'"),
    ("-rest -1", "-rest must be at least 0"),
])
def test_bad_options_say_what_is_wrong(text, message):
    with pytest.raises(DDLError, match=message.replace("(", r"\(")):
        parse(text, environ={})


def test_bad_environment_variable_is_named():
    with pytest.raises(DDLError, match="DDL_ALGO"):
        parse("", environ={"DDL_ALGO": "fast"})


def test_mode_dims_must_multiply_to_the_rank_count_with_ibms_message():
    parse_mode("p:6x2x1x1").check_size(12)
    with pytest.raises(DDLError, match=r"invalid dim size=8 usr_size=6 dim\[0\]=4 dim\[1\]=2"):
        parse_mode("r:4x2").check_size(6)


def test_segment_is_capped_below_the_mpi_message_limit():
    assert parse("-segment 1073741824", environ={}).segment == 1 << 30
    with pytest.raises(DDLError, match="above the limit"):
        parse("", environ={"DDL_SEGMENT_BYTES": str(2 << 30)})


# A value for each option that names a setting, different from that setting's default.
SAMPLES = {"timeout": ("7.5", 7.5), "algo": ("ring,direct", "ring,direct"), "segment": ("4096", 4096),
           "inflight": ("3", 3), "topology": ("dgx1", "dgx1"), "plan": ("p.json", "p.json"),
           "probe": ("force", "force"), "timeline": ("t.json", "t.json"), "shm": ("0", "0"),
           "path": ("host_memory", "host memory"), "rest": ("250", 250.0)}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_option_and_the_setting_it_names_set_the_same_thing(name):
    option = options.OPTIONS[name]
    text, expected = SAMPLES[name]
    from_option = getattr(options.parse(f"-{name} {text}", environ={}), option.attribute)
    from_setting = getattr(options.parse("", environ={option.setting: text}), option.attribute)
    assert from_option == from_setting == expected


def test_every_option_is_documented_and_names_a_real_setting():
    from ddl.config import SETTINGS

    named = {name for name, o in options.OPTIONS.items() if o.setting}
    assert named == set(SAMPLES)
    assert all(o.setting in SETTINGS for o in options.OPTIONS.values() if o.setting)
    assert all(o.meaning or o.setting for o in options.OPTIONS.values())


def test_rests_only_where_some_level_is_slow():
    """DDL_REST applies where a level's links take 400 us or more for the planner's largest network block; over
    fast links only (one host, a 100 Gbit/s network) large runs keep polling."""
    from ddl.core.communicator import rest_seconds
    from ddl.topology import LevelCost

    shm = LevelCost("node", "shm", 3e-6, 4e9, 2.5e-10, "peer")
    gige = LevelCost("switch", "veth", 62e-6, 1.25e8, 2.5e-10, "uplink")
    ib = LevelCost("switch", "ib", 2e-6, 12.5e9, 2.5e-10, "uplink")
    o = parse("", environ={})
    assert rest_seconds((shm, gige), o) == pytest.approx(100e-6)
    assert rest_seconds((shm, ib), o) == 0.0 and rest_seconds((shm,), o) == 0.0
    assert rest_seconds((shm, gige), parse("-rest 0", environ={})) == 0.0
