#!/usr/bin/env bash
# Runs make targets in order for one MPI and prints how long each took (also when one fails).
# usage: tests/stages.sh MPI TARGET...
set -uo pipefail
mpi=$1; shift
lines=()
status=0
for target in "$@"; do
  start=$SECONDS
  make --no-print-directory MPI="$mpi" "$target" || status=$?
  lines+=("$(printf '%-12s %-10s %5d s' "$target" "$mpi" $((SECONDS - start)))")
  [ "$status" -ne 0 ] && break
done
echo
echo "stage times ($mpi):"
printf '  %s\n' "${lines[@]}"
exit "$status"
