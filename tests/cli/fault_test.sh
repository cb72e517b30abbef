#!/usr/bin/env bash
# Runtime faults of `ballast run` under mpiexec: a rank that throws or is SIGKILLed at a
# step (BALLAST_FAULT, docs/runtime.md) ends the whole job non-zero within a bounded
# time, naming the rank; plan files and flags that do not match the job are rejected
# before any communication (no step runs).
# Usage: fault_test.sh PATH/TO/ballast MPIEXEC [MPIEXEC FLAGS...]
set -uo pipefail
ballast="$1"
mpiexec="$2"
shift 2
flags=("$@")
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bound=30      # seconds a failing job may take to end (measured: docs/hardening.md)
# run NAME FAULT ARGS...: runs mpiexec ARGS with BALLAST_FAULT=FAULT under an outer
# timeout (a hang fails instead of blocking CI); sets $code, $milliseconds and
# $work/NAME.{out,err}.
run() {
  local name="$1" fault="$2"; shift 2
  local start
  start=$(date +%s%N)
  BALLAST_FAULT="$fault" timeout -k 5 60 "$mpiexec" "${flags[@]}" "$@" >"$work/$name.out" 2>"$work/$name.err"
  code=$?
  milliseconds=$(( ($(date +%s%N) - start) / 1000000 ))
  echo "  $name: exit $code after $((milliseconds / 1000)).$(printf '%03d' $((milliseconds % 1000))) s" >&2
}
has() { grep -q -- "$2" "$1" || { echo "  '$1' lacks '$2':" >&2; tail -15 "$1" >&2; return 1; }; }
lacks() { ! grep -q -- "$2" "$1" || { echo "  '$1' has '$2'" >&2; return 1; }; }
within() { [ "$milliseconds" -lt $((bound * 1000)) ] || { echo "  took $milliseconds ms (bound $bound s)" >&2; return 1; }; }
failed_fast() {  # failed_fast CASE: non-zero, not the outer timeout, within the bound
  check "$1 exits non-zero" test "$code" != 0
  check "$1 does not hang" test "$code" != 124  # mpiexec itself exits 137 for a SIGKILLed rank
  check "$1 ends within $bound s" within
}

# Small steps, one ring of all 4 ranks (static-cp, degree 4), so faults at step 1 hit a job
# whose ranks have already communicated; 4 ranks share the cores.
job=(-np 4 "$ballast" run --strategy static-cp --degree 4 --steps 3 --rank-tokens 1024)

run throw-step 1:1:throw "${job[@]}"
failed_fast "rank 1 throwing at the start of step 1 (others blocked in a collective)"
check "throw-step names the rank" has "$work/throw-step.err" "error on rank 1"
check "throw-step carries the message" has "$work/throw-step.err" "fault injected by BALLAST_FAULT=1:1:throw"
check "throw-step prints no report" test ! -s "$work/throw-step.out"

run throw-attention 1:1:throw:attention "${job[@]}"
failed_fast "rank 1 throwing inside attention (others blocked in ring waits)"
check "throw-attention names the rank" has "$work/throw-attention.err" "error on rank 1"
check "throw-attention fired with messages in flight" has "$work/throw-attention.err" "in a ring shift, messages in flight"

run kill-attention 2:1:kill:attention "${job[@]}"
failed_fast "rank 2 SIGKILLed inside attention"
check "kill-attention: mpiexec names rank 2" has "$work/kill-attention.err" "rank 2"
check "kill-attention: mpiexec names the signal" has "$work/kill-attention.err" "signal 9"

run kill-step 2:1:kill "${job[@]}"
failed_fast "rank 2 SIGKILLed at the start of step 1"
check "kill-step: mpiexec names rank 2" has "$work/kill-step.err" "rank 2"

# --check's verdict: a rank whose gradients are wrong (corrupt: scaled by 1.001 before
# the sync) fails the check against the documented tolerance, exit 1, naming the step.
run corrupt 1:1:corrupt -np 2 "$ballast" run --check --steps 2
check "run --check with wrong gradients exits 1" test "$code" = 1
check "... says why on stderr" has "$work/corrupt.err" "ballast run: --check failed: zeppelin: step 1 differs from the single-process reference by"
check "... and the report's verdict is FAIL" has "$work/corrupt.out" "check: FAIL: zeppelin: step 1 .*over the tolerance 1e-05"
check "... while the good step passes" has "$work/corrupt.out" "^step 0: .*: pass (at most 1e-05)"

run bad-fault 1:one:throw "${job[@]}"
check "a malformed BALLAST_FAULT is rejected" test "$code" != 0 -a "$code" != 124
check "a malformed BALLAST_FAULT names the form" has "$work/bad-fault.err" "RANK:STEP:throw|kill"
run unreachable-fault 7:0:throw "${job[@]}"
check "a fault outside the job is rejected" has "$work/unreachable-fault.err" "would never fire"

# Plans: a 2-rank emulated cluster and the runtime's default model shape (4 heads, 2 KV
# heads), from a length file, so that the good plan runs on -np 2.
presets="${BALLAST_DATA_DIR:-$(dirname "$0")/../../data}/presets"
sed -e 's/"nodes": 2/"nodes": 1/' -e 's/"gpus_per_node": 8/"gpus_per_node": 2/' \
    -e 's/"nics_per_node": 8/"nics_per_node": 2/' "$presets/example-cluster.json" >"$work/cluster.json"
sed -e 's/"heads": 32/"heads": 4/' -e 's/"kv_heads": 8/"kv_heads": 2/' \
    -e 's/"activation_bytes_per_token": [0-9]*/"activation_bytes_per_token": 1024/' \
    "$presets/example-model.json" >"$work/model.json"
printf '300\n120\n45\n' >"$work/lengths.txt"
printf '40000\n30000\n' >"$work/long.txt"
plan() {  # plan OUT MODEL LENGTHS COUNT; the context is the file's longest length (static-cp
  # fixes its degree from it, and the example model's 128K would not fit two GPUs)
  "$ballast" plan --strategy static-cp --cluster "$work/cluster.json" --model "$2" --lengths "$3" \
    --batch-size "$4" --sampling sequential --max-context "$(sort -n "$3" | tail -1)" \
    -o "$work/$1" 2>"$work/$1.err" || cat "$work/$1.err" >&2
}
plan good.json "$work/model.json" "$work/lengths.txt" 3
plan heads.json "$presets/example-model.json" "$work/lengths.txt" 3
plan long.json "$work/model.json" "$work/long.txt" 2

run plan-good "" -np 2 "$ballast" run --plan "$work/good.json"
check "a matching plan runs" test "$code" = 0
check "a matching plan reports its step" has "$work/plan-good.out" "step 0:"
# A plan made by `ballast plan` on another cluster with the job's rank count is priced on
# the host calibration (its own cluster's constants are not this host's): a prediction.
run plan-good-json "" -np 2 "$ballast" run --plan "$work/good.json" --format json
check "a plan from another cluster is predicted on the host" /usr/bin/python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
assert r['predicted_step_s'] > 0 and r['prediction']['predicted_steps'] == 1, r['prediction']
assert all(rank['predicted_busy_s'] > 0 for rank in r['per_step'][0]['ranks'])" "$work/plan-good-json.out"
# One that does not fit the host's pricing (its model recomputes, so it keeps ~1.8 KB per
# token; the runtime's model keeps ~9 KB, over the plan's 1.2 MB): no prediction, and every
# figure of it is null in JSON and "-" in text with the reason, never 0.
/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
model = json.load(open(f"{work}/model.json"))
model.update(hidden=4, layers=100, ffn_hidden=8, activation_bytes_per_token=100000, recompute="full",
             parameters=1000)
json.dump(model, open(f"{work}/model-recompute.json", "w"))
cluster = json.load(open(f"{work}/cluster.json"))
cluster["gpu_memory_bytes"] = 1200000
json.dump(cluster, open(f"{work}/cluster-small.json", "w"))
PY
"$ballast" plan --strategy static-cp --cluster "$work/cluster-small.json" --model "$work/model-recompute.json" \
  --lengths "$work/lengths.txt" --batch-size 3 --sampling sequential --max-context 300 -o "$work/tight.json" \
  2>"$work/tight.err" || cat "$work/tight.err" >&2
run plan-tight "" -np 2 "$ballast" run --plan "$work/tight.json" --format json
check "a plan that does not fit the host runs" test "$code" = 0
check "... with null prediction figures and the reason" /usr/bin/python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
p = r['prediction']
assert r['predicted_step_s'] is None and p['predicted_steps'] == 0, p
assert p['busy_median_relative_error'] is None and p['predicted_busiest_busy_s'] is None, p
assert 'does not fit the host calibration' in p['note'], p['note']
assert r['per_step'][0]['predicted_step_s'] is None" "$work/plan-tight.out"
run plan-tight-text "" -np 2 "$ballast" run --plan "$work/tight.json"
check "... and '-' in text, saying why once" has "$work/plan-tight-text.out" \
  "over 1 step(s): - (no prediction: plan .*tight.json does not fit the host calibration"
check "... not a 0 that stands for unknown" lacks "$work/plan-tight-text.out" "0.0000 s predicted"
check "... and not 'plan plan'" lacks "$work/plan-tight-text.out" "plan plan"

rejected() {  # rejected CASE MESSAGE: exit 2 (bad input), the message once, no step ran
  check "$1 exits 2" test "$code" = 2
  check "$1 says why" has "$work/$1.err" "$2"
  check "$1 says it once" test "$(grep -c 'ballast run: error' "$work/$1.err")" = 1
  check "$1 names the ranks" has "$work/$1.err" "error on rank 0 (and every other rank)"
  check "$1 does not abort" bash -c "! grep -q MPI_ABORT '$work/$1.err'"
  check "$1 runs no step" test ! -s "$work/$1.out"
}
run plan-ranks "" -np 4 "$ballast" run --plan "$work/good.json"
rejected plan-ranks "the plan is for 2 ranks but the job has 4; run with mpirun -np 2"
run plan-heads "" -np 2 "$ballast" run --plan "$work/heads.json"
rejected plan-heads "pass --heads 32 --kv-heads 8"
run plan-batch "" -np 2 "$ballast" run --plan "$work/good.json" --dataset prolong --steps 2
rejected plan-batch "so --dataset, --steps would not apply"
run plan-messages "" -np 2 "$ballast" run --plan "$work/long.json" --hidden 8192
rejected plan-messages "beyond MPI's int counts"
run no-effect "" -np 2 "$ballast" run --model llama-7b
rejected no-effect "--model has no effect on ballast run"
run no-steps "" -np 2 "$ballast" run --steps 0
rejected no-steps "--steps 0 must be at least 1"
# Every flag is checked before the host is measured (seconds) and cached: a fresh cache
# stays empty.
fresh="$work/fresh-cache"
BALLAST_CACHE_DIR="$fresh" run ep-experts "" -np 2 "$ballast" run --experts 3 --expert-parallel 2
rejected ep-experts "--expert-parallel 2 needs an MoE model whose --experts (3) it divides"
check "ep-experts fails before measuring the host" test ! -e "$fresh"
BALLAST_CACHE_DIR="$fresh" run tp-experts "" -np 2 "$ballast" run --tp 2 --experts 4
rejected tp-experts "tensor parallelism 2 with an MoE model (--experts 4)"
check "tp-experts fails before measuring the host" test ! -e "$fresh"
BALLAST_CACHE_DIR="$fresh" run gpus-per-node "" -np 4 "$ballast" run --gpus-per-node 3
rejected gpus-per-node "--gpus-per-node 3 does not divide the job's 4 ranks"
check "gpus-per-node fails before measuring the host" test ! -e "$fresh"
run many-steps "" -np 2 "$ballast" run --steps 10001
rejected many-steps "--steps 10001 is over ballast's limit of 10,000 steps per command"

finish fault
