#!/usr/bin/env bash
# End-to-end checks of `ballast run` under mpiexec: exactness against the single-process
# reference (--check), the JSON keys, a plan that does not match the job, and a failing
# rank taking the job down with its message instead of hanging.
# Usage: run_test.sh PATH/TO/ballast MPIEXEC [MPIEXEC FLAGS...]
set -uo pipefail
ballast="$1"
mpiexec="$2"
shift 2
flags=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
run() { local out="$1" err="$2"; shift 2; timeout 120 "$mpiexec" "${flags[@]}" "$@" >"$out" 2>"$err"; echo $?; }
exact() {  # exact FILE: the JSON's max_rel_error is below 1e-5 and it has the documented keys
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
for key in ("strategy", "ranks", "steps", "loss", "max_rel_error", "imbalance", "step_wall_s"):
    assert key in run, key
assert run["max_rel_error"] < 1e-5, run["max_rel_error"]
assert run["imbalance"] >= 1.0
PY
}

code=$(run "$work/zeppelin.json" "$work/err" -np 2 "$ballast" run --check --format json)
check "run (zeppelin, 2 ranks) exits 0" test "$code" = 0
check "run (zeppelin, 2 ranks) is exact" exact "$work/zeppelin.json"
code=$(run "$work/cp.json" "$work/err" -np 4 "$ballast" run --strategy static-cp --steps 2 --check --format json)
check "run (static-cp, 4 ranks, 2 steps) exits 0" test "$code" = 0
check "run (static-cp, 4 ranks) is exact" exact "$work/cp.json"
code=$(run "$work/text.txt" "$work/err" -np 2 "$ballast" run --strategy hybrid-dp --trace "$work/trace.json")
check "run text exits 0" test "$code" = 0
check "run text has the rank table" has "$work/text.txt" "busy (s)"
check "run trace parses" /usr/bin/python3 -c "import json,sys; json.load(open(sys.argv[1]))['traceEvents']" "$work/trace.json"
# The measured trace uses the simulator's schema and categories (trace.hpp, group_category):
# every span has one, linear and gradient sync appear, and attention of a group with the
# plan's scheme and tier; a routed zeppelin ring over 2 emulated nodes shows its inter-node
# ring and the remap.
measured_categories() {  # measured_categories TRACE REQUIRED...
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
known = {"linear", "remap", "gradient sync", "local", "ring intra-node", "ring inter-node",
         "ulysses intra-node", "ulysses inter-node", "all-gather intra-node", "all-gather inter-node"}
spans = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
seen = {e["args"].get("category", "") for e in spans}
assert seen <= known, seen - known
assert all(e["dur"] >= 0 for e in spans)
for required in sys.argv[2:]:
    assert required in seen, (required, seen)
PY
}
check "run trace has the simulator's categories" measured_categories "$work/trace.json" linear "gradient sync"
code=$(run "$work/text.txt" "$work/err" -np 4 "$ballast" run --strategy zeppelin:partition=even:degree=4:routing=on:remap=on --trace "$work/ring.json")
check "run (routed ring, remap) with a trace exits 0" test "$code" = 0
check "run trace shows the inter-node ring and the remap" measured_categories "$work/ring.json" linear "gradient sync" "ring inter-node" remap

"$ballast" plan --strategy static-cp --nodes 1 --tokens-per-step 100000 -o "$work/plan.json" 2>"$work/err"
code=$(run "$work/out" "$work/err" -np 2 "$ballast" run --plan "$work/plan.json")
check "a plan for another job exits non-zero" test "$code" != 0
check "a plan for another job names the fix" has "$work/err" "mpirun -np 8"
code=$(run "$work/out" "$work/err" -np 4 "$ballast" run --gpus-per-node 3)
check "bad option exits non-zero" test "$code" != 0
check "bad option names itself" has "$work/err" "--gpus-per-node 3"
code=$(run "$work/out" "$work/err" -np 2 "$ballast" run --corpus "$work/no-such-corpus")
check "missing corpus exits non-zero (no hang)" test "$code" != 0 -a "$code" != 124
check "missing corpus names the path" has "$work/err" "no-such-corpus"

# scripts/ballast-run (the README's line): mpirun with the flags this machine needs; more
# ranks than cores on this 2-core machine, so --oversubscribe is needed.
wrapper="$(dirname "${BASH_SOURCE[0]}")/../../scripts/ballast-run"
BALLAST="$ballast" MPIRUN="$mpiexec" timeout 120 "$wrapper" 4 --steps 1 --format json >"$work/out" 2>"$work/err"
check "scripts/ballast-run 4 exits 0" test $? = 0
check "scripts/ballast-run oversubscribes past the cores" has "$work/err" "--oversubscribe -"
check "scripts/ballast-run runs 4 ranks" has "$work/out" '"ranks": 4'
BALLAST="$ballast" MPIRUN="$mpiexec" "$wrapper" four >"$work/out" 2>"$work/err"
check "scripts/ballast-run without N is a usage error" test $? = 2
check "scripts/ballast-run says how to call it" has "$work/err" "usage: scripts/ballast-run N"

finish run
