"""An elastic training job with a closed-form answer, for tests/launch/test_elastic.py (ddlrun --elastic).

    elastic_job.py STEPS COMMIT_EVERY KILL_SPEC OUT_DIR

Weights w (1 MiB of float32) start at 0; at step s each rank's gradient is (rank + 1) * (s + 1) * ones, so the
averaged gradient on n ranks is (n + 1) / 2 * (s + 1) and w -= 0.001 * that. The state commits every
COMMIT_EVERY steps. KILL_SPEC ``R@S[:how]`` (comma-separated, by the rank's number at launch; ``-`` for none):
rank R fails at step S: ``kill`` (SIGKILL, as a crash would), ``host`` (its MPI daemon, its parent, killed
too: the host is lost), ``raise`` (a Python exception), ``recovery``
(SIGKILL at the start of the first recovery's broadcast: a failure during recovery; S is ignored).
Each survivor writes OUT_DIR/result.<launch rank>.json: its final weights' first value, its final size, the
failures it saw and the recoveries.
"""
import json
import os
import signal
import sys

import numpy as np

import ddl
import ddl.elastic

steps, every, spec, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
launch_rank = ddl.rank()  # the numbering of the failures in KILL_SPEC
kills = {}
for item in filter(None, spec.strip("-").split(",")):
    who, _, rest = item.partition("@")
    when, _, how = rest.partition(":")
    kills[int(who)] = (int(when), how or "kill")
seen = []


class JobState(ddl.elastic.State):
    def sync(self, root=0):
        if self.recoveries and kills.get(launch_rank, (0, ""))[1] == "recovery":
            os.kill(os.getpid(), signal.SIGKILL)
        super().sync(root)


state = JobState(w=np.zeros(1 << 18, np.float32), step=0)


@ddl.elastic.run
def train(state):
    while state.step < steps:
        s = state.step
        if launch_rank in kills and kills[launch_rank][0] == s and kills[launch_rank][1] != "recovery":
            if kills[launch_rank][1] == "raise":
                raise RuntimeError(f"launch rank {launch_rank}: a bug at step {s}")
            if kills[launch_rank][1] == "host":  # the host is lost: MPI's daemon there dies with the rank
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


train(state)
with open(os.path.join(out, f"result.{launch_rank}.json"), "w") as f:
    json.dump({"w0": float(state.w[0]), "uniform": bool(np.all(state.w == state.w[0])), "size": ddl.size(),
               "rank": ddl.rank(), "seen": seen, "recoveries": [r.failed for r in state.recoveries]}, f)
