"""An elastic training job with a closed-form answer, for tests/launch/test_elastic.py (ddlrun --elastic).

    elastic_job.py STEPS COMMIT_EVERY KILL_SPEC OUT_DIR

Weights w (1 MiB of float32) start at 0; at step s each rank's gradient is (rank + 1) * (s + 1) * ones, so the
averaged gradient on n ranks is (n + 1) / 2 * (s + 1) and w -= 0.001 * that. The state commits every
COMMIT_EVERY steps. KILL_SPEC ``R@S[:how]`` (comma-separated, by the rank's number at launch; ``-`` for none):
rank R fails at step S: ``kill`` (SIGKILL, as a crash would), ``host`` (its MPI daemon, its parent, killed
too: the host is lost; it leaves OUT_DIR/hosts, where that lists hosts for a discovery script), ``raise`` (a Python exception), ``recovery``
(SIGKILL at the start of the first recovery's broadcast: a failure during recovery; S is ignored).
Failures happen in the first launch only (DDL_ELASTIC_RESTART 0): a job ddlrun launches again runs clean.
``grow@S`` (rank 0 only, with ddlrun --host-discovery-script): at step S rank 0 adds slots to the host list the
script prints (OUT_DIR/hosts, "localhost:N") and waits for ddlrun to notice before going on.
Each survivor writes OUT_DIR/result.<launch rank>.json: its final weights' first value, its final size, the
failures it saw, the recoveries, the step each call of train started at and ddlrun's restarts.
"""
import json
import os
import signal
import socket
import sys
import time

import numpy as np

import ddl
import ddl.elastic
from ddl.elastic import persist

steps, every, spec, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
launch_rank = ddl.rank()  # the numbering of the failures in KILL_SPEC
kills, grow = {}, None
for item in filter(None, spec.strip("-").split(",")):
    if item.startswith("grow@"):
        grow = int(item[5:])
        continue
    who, _, rest = item.partition("@")
    when, _, how = rest.partition(":")
    kills[int(who)] = (int(when), how or "kill")
seen, starts = [], []
if persist.restart_count():
    kills = {}


class JobState(ddl.elastic.State):
    def sync(self, root=0):
        if self.recoveries and kills.get(launch_rank, (0, ""))[1] == "recovery":
            os.kill(os.getpid(), signal.SIGKILL)
        super().sync(root)


state = JobState(w=np.zeros(1 << 18, np.float32), step=0)


@ddl.elastic.run
def train(state):
    starts.append(state.step)
    while state.step < steps:
        s = state.step
        if grow == s and ddl.rank() == 0 and not persist.restart_count():
            _add_a_host()
        if launch_rank in kills and kills[launch_rank][0] == s and kills[launch_rank][1] != "recovery":
            if kills[launch_rank][1] == "raise":
                raise RuntimeError(f"launch rank {launch_rank}: a bug at step {s}")
            if kills[launch_rank][1] == "host":  # the host is lost: MPI's daemon there dies with the rank
                _drop_this_host()
                os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        g = np.full(state.w.shape, (ddl.rank() + 1) * (s + 1), np.float32)
        try:
            state.w -= np.float32(0.001) * ddl.allreduce(g, op="avg")
        except ddl.RankFailure as e:
            seen.append({"ranks": e.ranks, "message": str(e)})
            raise
        state.step = s + 1
        if state.step % every == 0:
            state.commit()


def _drop_this_host():
    """A discovery script that lists OUT_DIR/hosts lists this host no more."""
    hosts = os.path.join(out, "hosts")
    if os.path.exists(hosts):
        kept = [h for h in open(hosts).read().split() if h.split(":")[0] != socket.gethostname()]
        with open(hosts + ".new", "w") as f:
            f.write("".join(f"{h}\n" for h in kept))
        os.replace(hosts + ".new", hosts)


def _add_a_host():
    """Twice the slots in the list the discovery script prints; back once ddlrun has written its news."""
    hosts = os.path.join(out, "hosts")
    name, slots = open(hosts).read().split(":")
    with open(hosts + ".new", "w") as f:
        f.write(f"{name}:{2 * int(slots)}\n")
    os.replace(hosts + ".new", hosts)
    deadline = time.monotonic() + 30
    while persist.hosts_generation(persist.folder()) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)


train(state)
with open(os.path.join(out, f"result.{launch_rank}.json"), "w") as f:
    json.dump({"w0": float(state.w[0]), "uniform": bool(np.all(state.w == state.w[0])), "size": ddl.size(),
               "rank": ddl.rank(), "seen": seen, "recoveries": [r.failed for r in state.recoveries], "starts": starts,
               "restarts": state.restarts}, f)
