"""One rank of the launcher tests: writes what it was given (and an allreduce's result) to DIR/rank<N>.json,
then does what argv asks: 'ok', 'fail R' (rank R exits 3 with a message, the others wait), 'kill R' (rank R
dies by SIGKILL, as a crash would, the others wait), 'sleep'."""
import json
import os
import socket
import sys
import time

out, action = sys.argv[1], sys.argv[2:]
rank = int(os.environ["RANK"])
info = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                       "DDL_OPTIONS", "DDL_HOST_LIST", "DDL_TOPOLOGY")}
info.update(pid=os.getpid(), host=socket.gethostname())
if action[0] == "ok":
    import numpy as np

    import ddl

    info["sum"] = ddl.allreduce(np.full(4, rank + 1, np.float64), op="sum").tolist()
    info["ddl_size"], info["ddl_rank"] = ddl.size(), ddl.rank()
    info["host_level"] = ddl.communicator().host_level
    sys.stdout.write(f"hello from rank {rank}\n")  # one write: MPICH interleaves print's two pieces
# written whole, then renamed: a test that polls DIR never reads a half-written report
with open(os.path.join(out, f".rank{rank}.json.part"), "w") as f:
    json.dump(info, f)
os.replace(os.path.join(out, f".rank{rank}.json.part"), os.path.join(out, f"rank{rank}.json"))
if action[0] == "kill":
    if rank == int(action[1]):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)
if action[0] == "fail":
    if rank == int(action[1]):
        sys.stderr.write(f"rank {rank}: something went wrong on purpose\n")
        sys.exit(3)
    time.sleep(120)
elif action[0] == "sleep":
    time.sleep(120)
