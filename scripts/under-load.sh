#!/usr/bin/env bash
# The suite's timing-sensitive tiers run again and again beside CPU hogs (docs/testing.md, "Under load"):
#   scripts/under-load.sh [RUNS] [HOGS] [PYTEST ARGS ...]    default: 3 runs, 2 hogs, tests/p2p tests/client tests/server
# Each hog is a process spinning on one core for the whole time; a run that fails stops the loop. Prints one
# line per run (its pytest summary and seconds) and exits with the first failing run's status.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
hogs=${2:-2}
shift $(($# < 2 ? $# : 2))
tiers=("$@")
[[ ${#tiers[@]} -gt 0 ]] || tiers=(tests/p2p tests/client tests/server)
pids=()
for _ in $(seq "$hogs"); do
  python -c 'while True: pass' &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
status=0
for run in $(seq "$runs"); do
  started=$SECONDS
  log=$(mktemp)
  python -m pytest -q -p no:cacheprovider "${tiers[@]}" >"$log" 2>&1
  status=$?
  echo "run $run/$runs: $(tail -1 "$log") ($((SECONDS - started)) s; log $log)"
  [[ $status -eq 0 ]] || break
done
exit $status
