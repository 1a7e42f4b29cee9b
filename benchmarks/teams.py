"""Teams (Horovod's process sets, the Cray PE ML plugin's teams) progressing at the same time, on an emulated
cluster of 2 racks x 2 nodes x 1 rank (NICs and uplinks 100 Mbit/s), as root:

    python benchmarks/teams.py

Two teams of two ranks each allreduce 4 MiB: alone one after the other, and both at once. Where the teams'
traffic shares no link (each team within its rack), together should take about as long as one alone, well under
the two one after the other; where both cross the racks' uplinks (the same teams split across racks), the
uplinks are shared and together approaches the sum. Bytes on the rack uplinks are read from the shapers.
Writes benchmarks/results/teams.md (and .json).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPEC = "2x2x1:nic=100mbit:uplink=100mbit"


def main() -> int:
    from ddl.cluster import Cluster
    from ddl.cluster import spec as emulate

    t = emulate.topology(SPEC)
    uplinks = [s for s in t.graph.nodes if t.kind(s) == "switch" and t.parent(s) is not None]
    rows = []
    with Cluster(t) as cluster:
        for layout in ("racks", "crossed"):
            out = cluster.workdir / f"{layout}.json"
            before = cluster.counters()
            done = cluster.mpirun([sys.executable, str(HERE / "teams_job.py"), "--layout", layout, "--out", str(out)],
                                  timeout=900, quiet=True, capture=True)
            if done.returncode:
                raise RuntimeError(f"{layout}: {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            after = cluster.counters()
            r = json.loads(out.read_text())
            r["layout"] = layout
            r["uplink_bytes"] = sum(after[u][i] - before[u][i] for u in uplinks for i in (0, 1))
            rows.append(r)
    lines = ["# Teams at the same time", "",
             f"Produced by `python benchmarks/teams.py` on {datetime.date.today()} ({platform.node()}, "
             f"{os.cpu_count()} cores). `{SPEC}`: 2 racks x 2 nodes x 1 rank; two teams of two ranks, each "
             f"allreducing {rows[0]['bytes'] / 2**20:.0f} MiB float32 with its own communicator (ddl.new_team). Medians "
             f"of {len(rows[0]['times']['together'])} rounds, each phase timed by its slowest rank.", "",
             "| teams | A alone (ms) | B alone (ms) | A then B (ms) | together (ms) | together / (A then B) | "
             "bytes on the rack uplinks |", "|:---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        med = {k: statistics.median(v) for k, v in r["times"].items()}
        seq = med["A alone"] + med["B alone"]
        where = ("each within its rack (no shared link)" if r["layout"] == "racks"
                 else "each across the racks (uplinks shared)")
        r["summary"] = {**med, "sequential": seq, "ratio": med["together"] / seq}
        lines.append(f"| {where}: A={r['members']['A']}, B={r['members']['B']} | {med['A alone'] * 1e3:.0f} | "
                     f"{med['B alone'] * 1e3:.0f} | {seq * 1e3:.0f} | {med['together'] * 1e3:.0f} | "
                     f"{med['together'] / seq:.2f} | {r['uplink_bytes'] / 1e6:.1f} MB |")
    lines += ["", "A 2-rank allreduce of n bytes sends n bytes each way on each rank's NIC: at 100 Mbit/s, "
              f"{rows[0]['bytes'] * 8 / 100e6 * 1e3:.0f} ms is the lower bound of one team alone."]
    out = HERE / "results" / "teams"
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
