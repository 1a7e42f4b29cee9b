"""ddlrun's restarts of elastic jobs (ddl.runner.restarts) and its discovery script (ddl.runner.discovery),
decided without MPI: the launch is a fake that returns the statuses a real one would, and records what each
launch got (hosts, ranks, the settings every rank would see)."""
import os
import stat
import time

import pytest

from ddl.elastic import persist
from ddl.runner import discovery, restarts
from ddl.runner.hosts import Host, HostError
from ddl.runner.supervise import INTERRUPTED, TIMED_OUT


class FakeLaunches:
    def __init__(self, statuses, during=None):
        self.statuses, self.during, self.calls = list(statuses), during, []

    def __call__(self, hosts, np, settings):
        self.calls.append((hosts, np, dict(settings)))
        if self.during:
            self.during(len(self.calls), settings)
        return self.statuses.pop(0)


def script(tmp_path, text: str, status: int = 0, name: str = "discover.sh") -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\ncat {tmp_path / 'hosts'}\nexit {status}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "hosts").write_text(text)
    return str(path)


@pytest.fixture
def folder(tmp_path):
    where = tmp_path / "state"
    return {"DDL_ELASTIC_STATE_DIR": str(where)}


def test_without_restarts_one_launch_and_no_settings():
    launches = FakeLaunches([137])
    assert restarts.run(restarts.Policy(), None, 4, launches, print) == 137
    assert launches.calls == [(None, 4, {})]


def test_failures_launch_again_until_the_restarts_are_used(folder):
    said = []
    launches = FakeLaunches([137, 75, 1])
    status = restarts.run(restarts.Policy(max_restarts=2), None, 4, launches, said.append, folder)
    assert status == 1 and len(launches.calls) == 3
    assert [c[2]["DDL_ELASTIC_RESTART"] for c in launches.calls] == ["0", "1", "2"]
    assert all(c[2]["DDL_ELASTIC_STATE_DIR"] == folder["DDL_ELASTIC_STATE_DIR"] for c in launches.calls)
    assert "restart 1 of 2: the job failed with status 137" in said[0]
    assert "restart 2 of 2: fewer ranks than --min-np were left" in said[1]
    assert "restart(s) of --max-restarts are used" in said[2] and "last commit is kept" in said[3]


@pytest.mark.parametrize("final", [0, TIMED_OUT, INTERRUPTED])
def test_success_and_stops_are_never_launched_again(folder, final):
    launches = FakeLaunches([final])
    assert restarts.run(restarts.Policy(max_restarts=3), None, 2, launches, print, folder) == final
    assert len(launches.calls) == 1


def test_a_folder_ddlrun_made_is_removed_after_success_and_kept_after_failure(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    made = []
    launches = FakeLaunches([1, 0], during=lambda n, s: made.append(s["DDL_ELASTIC_STATE_DIR"]))
    assert restarts.run(restarts.Policy(max_restarts=1), None, 2, launches, print, {}) == 0
    assert made[0] == made[1] and os.path.dirname(made[0]) == str(tmp_path) and not os.path.exists(made[0])
    launches = FakeLaunches([1])
    restarts.run(restarts.Policy(max_restarts=0), None, 2, launches, print, {})
    assert launches.calls[0][2] == {}  # no restarts asked: no folder either
    restarts.run(restarts.Policy(max_restarts=1), None, 2, FakeLaunches([1, 1]), print, {})
    kept = [p for p in os.listdir(tmp_path) if p.startswith(".ddl-elastic-")]
    assert len(kept) == 1


def test_a_folder_the_user_names_is_kept_and_an_old_hosts_file_dropped(folder):
    where = folder["DDL_ELASTIC_STATE_DIR"]
    os.makedirs(where)
    persist.write_hosts(persist.Path(where), 7, [("a", 2)])
    assert restarts.run(restarts.Policy(max_restarts=1), None, 2, FakeLaunches([0]), print, folder) == 0
    assert os.path.isdir(where) and persist.hosts_generation(persist.Path(where)) == 0


def test_discovered_hosts_and_sizes_between_min_and_max_np(tmp_path, folder):
    path = script(tmp_path, "a:2\nb:2\n")
    said = []

    def lose_b(n, settings):  # after the first launch host b is gone
        (tmp_path / "hosts").write_text("a:2\n")

    launches = FakeLaunches([137, 0], during=lose_b)
    policy = restarts.Policy(max_restarts=1, script=path, min_np=2, max_np=8)
    assert restarts.run(policy, None, None, launches, said.append, folder) == 0
    (h1, n1, s1), (h2, n2, s2) = launches.calls
    assert h1 == [Host("a", 2), Host("b", 2)] and n1 == 4       # every slot (below --max-np)
    assert h2 == [Host("a", 2)] and n2 == 2                     # what is left, at least --min-np
    assert s1["DDL_ELASTIC_GENERATION"] == "0"


def test_too_few_slots_to_launch_again_is_said_and_ends_the_job(tmp_path, folder):
    path = script(tmp_path, "a:4\n")
    said = []
    launches = FakeLaunches([137], during=lambda n, s: (tmp_path / "hosts").write_text("a:1\n"))
    policy = restarts.Policy(max_restarts=3, script=path, min_np=2)
    assert restarts.run(policy, None, 4, launches, said.append, folder) == 137
    assert len(launches.calls) == 1
    assert any("fewer than --min-np 2" in s and "not launched again" in s for s in said), said


def test_a_failing_or_garbled_script_is_an_error_before_the_first_launch(tmp_path, folder):
    with pytest.raises(HostError, match=r"failed with status 3: nope"):
        discovery.discover(str(_failing(tmp_path)))
    path = script(tmp_path, "a:2\nthis is; not a host\n")
    with pytest.raises(HostError, match=r"line 2: 'this' .*|unknown field"):
        restarts.run(restarts.Policy(script=path), None, None, FakeLaunches([0]), print, folder)
    path = script(tmp_path, "# nothing yet\n", name="empty.sh")
    with pytest.raises(HostError, match="no hosts"):
        discovery.discover(path)
    with pytest.raises(HostError, match="cannot be run"):
        discovery.discover(str(tmp_path / "missing.sh"))


def _failing(tmp_path):
    path = tmp_path / "fails.sh"
    path.write_text("#!/bin/sh\necho nope >&2\nexit 3\n")
    path.chmod(0o755)
    return path


def test_more_hosts_found_while_running_launch_again_without_using_a_restart(tmp_path, folder):
    path = script(tmp_path, "a:2\n")
    said = []

    def grow(n, settings):
        if n == 1:  # hosts appear while the first launch runs; the job sees the news and ends to grow
            (tmp_path / "hosts").write_text("a:2\nb:2\nc:2\n")
            where = persist.Path(settings["DDL_ELASTIC_STATE_DIR"])
            deadline = time.monotonic() + 10
            while persist.hosts_generation(where) == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            persist.mark_growing(where, 1)  # what rank 0 does before every rank ends

    launches = FakeLaunches([persist.EXIT_GROW, 0], during=grow)
    policy = restarts.Policy(max_restarts=0, script=path, min_np=1, max_np=4, interval=0.05)
    assert restarts.run(policy, None, 2, launches, said.append, folder) == 0
    (_, n1, s1), (h2, n2, s2) = launches.calls
    assert n1 == 2 and n2 == 4                                    # grown up to --max-np, not the 6 slots
    assert s1["DDL_ELASTIC_GENERATION"] == "0" and s2["DDL_ELASTIC_GENERATION"] == "1"
    assert persist.hosts_generation(persist.Path(folder["DDL_ELASTIC_STATE_DIR"])) == 1
    assert any("more hosts" in s for s in said)


def test_a_job_that_ends_without_its_mark_of_growing_is_a_failure(tmp_path, folder):
    launches = FakeLaunches([persist.EXIT_GROW, 0])
    policy = restarts.Policy(max_restarts=1, script=script(tmp_path, "a:2\n"), max_np=4, interval=60)
    said = []
    assert restarts.run(policy, None, 2, launches, said.append, folder) == 0
    assert len(launches.calls) == 2 and "restart 1 of 1: the job failed with status 77" in said[0]


def test_the_watcher_reports_a_failing_script_once_and_keeps_going(tmp_path):
    said, found = [], []
    with discovery.Watcher(str(_failing(tmp_path)), 2, 0.02, found.append, said.append):
        time.sleep(0.3)
    assert len(said) == 1 and "keeping the hosts known" in said[0] and not found
