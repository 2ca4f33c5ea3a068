#!/usr/bin/env bash
# Mutation testing of the core modules with mutmut (docs/testing.md; too slow for every CI run, so
# .github/workflows/mutation.yaml runs it weekly). Usage:
#   scripts/mutation.sh [MODULE ...]    e.g. scripts/mutation.sh protocol/wire.py; no MODULE: all of them
# Each module runs in a scratch copy of the tree (MUTATION_WORKDIR, default a fresh temporary folder) with the
# tests that exercise it, and prints "MODULE killed/total = score%"; it fails when a score is under
# MUTATION_MIN (default 85). mutmut needs `pip install mutmut` beside the dev extra. MUTANTS="NAME ..."
# runs only those mutants (mutmut's names, e.g. the survivors of an earlier run) and prints how many of them
# were killed, not a score.
#
# The mutants must be what the tests import, never an editable install of the tree: mutmut puts the mutated
# copy (mutants/src) first on sys.path, PYTHONPATH names it for the servers some tests start as subprocesses,
# and mutmut stops with an error when no test reached a mutant (the sign that another copy was imported).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# Fast tests (no cluster, no images, few servers) that exercise each module through its callers. mutmut runs,
# for each mutant, the tests that reached the mutated function; the property tests (seconds of random input
# each) are left to the ordinary suite.
hypothesis="--deselect=tests/protocol/test_wire.py::test_fuzzed_buffers_decode_or_raise_wire_error
  --deselect=tests/protocol/test_wire.py::test_round_trip_property"
# The pool's tests with in-process servers (the hostile-server tier runs its trainer in a subprocess, whose
# calls mutmut cannot attribute to a test).
pool="tests/client/test_client_backend.py tests/client/test_client_discovery.py tests/client/test_client_faults.py
  tests/client/test_client_features.py"
# Membership's parts: a real Membership whose connections (and, for upkeep, resolver) are scripted stand-ins, so
# each mutant runs in seconds (the pool's server tests took 20-90 s a mutant on two cores); members.py's
# short() is also checked on aiohttp's own connection errors.
short="tests/client/test_client_faults.py::test_a_refused_connection_is_named_in_words
  tests/client/test_client_faults.py::test_an_unresolvable_name_is_named_with_the_resolvers_words
  tests/client/test_client_faults.py::test_an_error_number_is_named_in_the_systems_words
  tests/client/test_client_faults.py::test_a_failure_is_one_short_line"
# Dispatch and failover: test_client_dispatch.py drives both with a real pool whose members are made healthy by
# hand, one path at a time and in milliseconds (the selection of server tests used before the module split took
# 20-90 s a mutant on two cores, too slow to measure each module on its own).
dispatch="tests/client/test_client_dispatch.py"
# The operator's pure functions (spec -> manifests, pods -> plan and status), none that starts kmock or a cluster.
operator="tests/operator/test_builders.py tests/operator/test_manifests.py tests/operator/test_fleet_defaults.py
  tests/operator/test_groups.py"
# A key ending in / is a package: every module in it is mutated in one run.
declare -A TESTS=(
  [protocol/wire.py]="tests/protocol/test_wire.py $hypothesis"
  [protocol/receive_pool.py]="tests/protocol/test_wire.py $hypothesis"
  [protocol/encodings.py]="tests/protocol/test_encodings.py tests/protocol/test_supervision.py"
  [protocol/model_info.py]="tests/protocol/test_contract.py tests/protocol/test_model_info.py tests/protocol/test_features.py"
  [protocol/supervision.py]="tests/protocol/test_supervision.py tests/protocol/test_encodings.py"
  [protocol/binding.py]="tests/server/test_request_binding.py $pool tests/client/test_client_encodings.py"
  [protocol/features.py]="tests/protocol/test_features.py tests/server/test_features.py"
  [protocol/families/]="tests/protocol/test_features.py tests/nemo/test_registry.py"
  [server/request.py]="tests/server/test_request.py"
  [server/sessions.py]="tests/server/test_sessions.py tests/server/test_service.py"
  [server/scheduler.py]="tests/server/test_scheduler.py tests/server/test_fair_share.py"
  [client/members.py]="tests/client/test_client_quarantine.py tests/client/test_client_upkeep.py
    tests/client/test_client_joining.py $dispatch $short"
  [client/joining.py]="tests/client/test_client_joining.py"
  [client/upkeep.py]="tests/client/test_client_upkeep.py"
  [client/quarantine.py]="tests/client/test_client_quarantine.py $dispatch"
  [client/dispatch.py]="$dispatch"
  [client/failover.py]="$dispatch"
  [client/limits.py]="tests/client/test_client_limits.py"
  [client/body.py]="tests/client/test_client_body.py"
  [operator/planner.py]="$operator tests/operator/test_planner.py"
  [operator/status.py]="$operator tests/operator/test_status.py"
)
ORDER=(protocol/wire.py protocol/receive_pool.py protocol/encodings.py protocol/model_info.py
  protocol/supervision.py protocol/binding.py protocol/features.py protocol/families/ server/request.py
  server/sessions.py server/scheduler.py client/members.py client/joining.py client/upkeep.py
  client/quarantine.py client/dispatch.py client/failover.py client/limits.py client/body.py
  operator/planner.py operator/status.py)

modules=("$@")
[[ ${#modules[@]} -gt 0 ]] || modules=("${ORDER[@]}")
workdir=${MUTATION_WORKDIR:-$(mktemp -d)}
minimum=${MUTATION_MIN:-85}
children=${MUTATION_CHILDREN:-$(nproc)}
failed=0

for module in "${modules[@]}"; do
  tests=${TESTS[$module]:-}
  [[ -n $tests ]] || { echo "unknown module $module; one of: ${ORDER[*]}" >&2; exit 2; }
  scratch=$workdir/${module//\//_}
  pattern=$module
  [[ $pattern != */ ]] || pattern+="*"  # a package: all its modules
  rm -rf "$scratch" && mkdir -p "$scratch"
  # manifests/: the operator's tests check what it builds against the CRD's schema
  cp -r "$root/src" "$root/tests" "$root/manifests" "$root/pyproject.toml" "$scratch/"
  selection=$(printf '"%s", ' $tests)
  cat >>"$scratch/pyproject.toml" <<EOF

[tool.mutmut]
source_paths = ["src"]
only_mutate = ["src/eagle3_target/$pattern"]
also_copy = ["manifests"]  # mutmut runs the tests in its own copy of the tree
pytest_add_cli_args_test_selection = [${selection%, }]
pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]
timeout_multiplier = 5.0  # a mutant that loops forever is given up on sooner than mutmut's 15x ...
timeout_constant = 30.0  # ... but a forked pytest on a busy machine takes seconds to start
EOF
  (
    cd "$scratch"
    # PYTHONPATH names a folder mutmut fills later: create it now, or Python caches it as absent and the
    # editable install is imported instead.
    mkdir -p mutants/src
    export PYTHONPATH=$scratch/mutants/src
    # mutmut forks each mutant's test run from a process that has run the tests: one torch thread, so no
    # OpenMP pool exists to be broken by the fork.
    export OMP_NUM_THREADS=1
    # shellcheck disable=SC2086  # MUTANTS is a list of names
    mutmut run --max-children "$children" ${MUTANTS:-} >"$scratch/run.log" 2>&1 ||
      { tail -30 "$scratch/run.log" >&2; exit 1; }
    mutmut export-cicd-stats >/dev/null
    mutmut results >"$scratch/survivors.txt"
  ) || { echo "$module: mutmut failed (log: $scratch/run.log)" >&2; failed=1; continue; }
  read -r killed total checked < <(python - "$scratch/mutants/mutmut-cicd-stats.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
killed = s["killed"] + s["timeout"] + s["segfault"]
print(killed, s["total"] - s["skipped"], killed + s["survived"] + s["no_tests"] + s["suspicious"])
EOF
  )
  if [[ -n ${MUTANTS:-} ]]; then
    echo "$module killed $killed of the $checked mutants run (survivors: $scratch/survivors.txt)"
    continue
  fi
  score=$((total ? 100 * killed / total : 100))
  echo "$module killed $killed/$total = $score% (survivors: $scratch/survivors.txt)"
  [[ $score -ge $minimum ]] || failed=1
done
exit $failed
