#!/usr/bin/env bash
# A benchmark of this checkout beside the same benchmark of an earlier revision, alternating, in one run: the
# revision is checked out in a worktree (its own extension built in place), and each round runs the earlier
# build, then this one, so both see the same machine at the same times.
#
#   benchmarks/before_after.sh REV ROUNDS OUTDIR benchmarks/small_path.py --np 2 --repeats 7
#
# Each run's table goes to OUTDIR/{before,after}-<round>.md (the command's own --out is not needed). The script
# path is taken relative to each tree, so each build runs its own version of the benchmark; SCRIPT_FROM=here runs
# this checkout's on both (for a benchmark the earlier revision's version cannot run the same way: its emulated
# clusters' ranks would not see PYTHONPATH, and would import this checkout).
set -euo pipefail
rev=$1 rounds=$2 outdir=$3; shift 3
script=$1; shift
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PY:-$here/.venv-openmpi/bin/python}
old=$(mktemp -d /tmp/ddl-before-XXXX)
git -C "$here" worktree add -q --detach "$old" "$rev"
trap 'git -C "$here" worktree remove --force "$old"' EXIT
(cd "$old" && "$py" setup.py -q build_ext --inplace >/dev/null)
mkdir -p "$outdir"
for round in $(seq 1 "$rounds"); do
  for side in before after; do
    tree=$here; [ "$side" = before ] && tree=$old
    from=$tree; [ "${SCRIPT_FROM:-}" = here ] && from=$here
    (cd /tmp && PYTHONPATH="$tree" "$py" "$from/$script" "$@" > "$outdir/$side-$round.md")
    echo "round $round: $side done"
  done
done
