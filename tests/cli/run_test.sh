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
assert run["check"] == {"tolerance": 1e-5, "passed": True}, run.get("check")
assert all(step["check_passed"] for step in run["per_step"])
assert run["imbalance"] >= 1.0
PY
}

code=$(run "$work/zeppelin.json" "$work/err" -np 2 "$ballast" run --check --format json)
check "run (zeppelin, 2 ranks) exits 0" test "$code" = 0
check "run (zeppelin, 2 ranks) is exact" exact "$work/zeppelin.json"
code=$(run "$work/cp.json" "$work/err" -np 4 "$ballast" run --strategy static-cp --steps 2 --check --format json)
check "run (static-cp, 4 ranks, 2 steps) exits 0" test "$code" = 0
check "run (static-cp, 4 ranks) is exact" exact "$work/cp.json"
# Progress on stderr (a run of large plans takes minutes): the predicted time before the
# first step, then the steps as they end.
check "run says what it will take before the first step" has "$work/err" "static-cp: 2 step(s) on 4 ranks, predicted [0-9.]* s"
check "... and the steps as they end" has "$work/err" "step 2/2 done, wall [0-9.]* s (predicted [0-9.]* s)"
# An MoE model (4 experts, top-2) with expert parallelism 2: exact, and its all-to-alls on
# the measured timeline (category "expert parallel"); EP that does not divide the experts
# is refused with exit 2 naming the flag.
code=$(run "$work/moe.json" "$work/err" -np 4 "$ballast" run --strategy static-cp --experts 4 --expert-parallel 2 --check --format json --trace "$work/moe_trace.json")
check "run (MoE, EP 2, 4 ranks) exits 0" test "$code" = 0
check "run (MoE, EP 2, 4 ranks) is exact" exact "$work/moe.json"
check "run (MoE) trace has the expert-parallel all-to-alls" has "$work/moe_trace.json" '"category":"expert parallel"'
code=$(run "$work/out" "$work/err" -np 2 "$ballast" run --experts 4 --expert-parallel 3)
check "run --expert-parallel 3 with 4 experts exits 2" test "$code" = 2
check "run --expert-parallel 3 names the flag" has "$work/err" "--expert-parallel 3"
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
         "ulysses intra-node", "ulysses inter-node", "usp intra-node", "usp inter-node",
         "all-gather intra-node", "all-gather inter-node"}
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
# The report says which groups ran, by scheme: the ring of 4 here; static-cp's degree comes
# from the scaled context, so at 4 ranks with default flags it runs local groups only.
check "run text says which groups ran" has "$work/text.txt" "^groups run: ring 1 (g4)$"
check "run JSON lists the groups run by scheme" /usr/bin/python3 -c "
import json, sys
groups = json.load(open(sys.argv[1]))['groups_run']
assert groups and all(g['scheme'] == 'local' and g['ranks'] == 1 and g['groups'] > 0 for g in groups), groups" "$work/cp.json"

# Predicted next to measured (docs/fidelity.md): the JSON has predicted_step_s per step and
# predicted_busy_s next to busy_s per rank, on a host calibration (measured_on) of this job.
predicted() {  # predicted FILE RANKS
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
assert run["predicted_step_s"] > 0
assert run["prediction"]["busy_median_relative_error"] >= 0
assert "host-" in run["prediction"]["cluster"], run["prediction"]["cluster"]
for step in run["per_step"]:
    assert step["predicted_step_s"] > 0
    assert len(step["ranks"]) == int(sys.argv[2])
    for rank in step["ranks"]:
        assert rank["predicted_busy_s"] > 0 and rank["busy_s"] > 0
PY
}
check "run JSON has predicted_step_s and predicted_busy_s" predicted "$work/cp.json" 4
check "run text prints the prediction" has "$work/text.txt" "pred (s)"
check "run text says how many BLAS threads" has "$work/text.txt" "BLAS: "
two_timelines() {  # the trace holds the measured and the predicted ranks, each with spans
  /usr/bin/python3 - "$1" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
assert sorted(names.values()) == ["measured rank 0 (node 0)", "measured rank 1 (node 0)",
                                  "predicted rank 0 (node 0)", "predicted rank 1 (node 0)"], names
spans = {names[e["pid"]].split()[0] for e in events if e["ph"] == "X"}
assert spans == {"measured", "predicted"}, spans
PY
}
check "run trace has the measured and the predicted timelines" two_timelines "$work/trace.json"
code=$(run "$work/set.json" "$work/err" -np 2 "$ballast" run --strategy packed-dp,zeppelin --format json --trace "$work/set-trace.json")
check "run with two strategies exits 0" test "$code" = 0
check "... ranks them measured vs predicted" /usr/bin/python3 -c "
import json, sys
s = json.load(open(sys.argv[1]))
assert s['schema'] == 'ballast.run-set/1' and [r['strategy'] for r in s['runs']] == ['packed-dp', 'zeppelin']
assert s['runs'][0]['loss'] == s['runs'][1]['loss'] or abs(s['runs'][0]['loss'] - s['runs'][1]['loss']) < 1e-5
r = s['ranking']
assert r['strategies'] == ['packed-dp', 'zeppelin'] and len(r['predicted_busiest_busy_s']) == 2
assert -1 <= r['rank_correlation'] <= 1 and isinstance(r['order_agrees'], bool)" "$work/set.json"
check "... and --trace holds every strategy's measured and predicted timelines" /usr/bin/python3 -c "
import json, sys
events = json.load(open(sys.argv[1]))['traceEvents']
names = {e['pid']: e['args']['name'] for e in events if e.get('name') == 'process_name'}
groups = {' '.join(n.split()[:2]) for n in names.values()}
assert groups == {'packed-dp measured', 'packed-dp predicted', 'zeppelin measured', 'zeppelin predicted'}, names
spans = {' '.join(names[e['pid']].split()[:2]) for e in events if e['ph'] == 'X'}
assert spans == groups, spans" "$work/set-trace.json"
code=$(run "$work/set.txt" "$work/err" -np 2 "$ballast" run --strategy packed-dp,static-cp --trace "$work/set-trace2.json")
check "... says where the trace went once" test "$(grep -c 'written to' "$work/set.txt")" = 1
check "... for each strategy" has "$work/set.txt" "timelines of the first step of each of the 2 strategies written to"

# ballast calibrate --host writes a cluster of this job; another rank count, a preset or a
# single rank are refused with the reason and the fix.
code=$(run "$work/calibrate.txt" "$work/err" -np 2 "$ballast" calibrate --host -o "$work/host2.json")
check "calibrate --host exits 0" test "$code" = 0
check "calibrate --host prints measured vs fitted" has "$work/calibrate.txt" "attention fwd"
check "calibrate --host records where it measured" has "$work/host2.json" '"measured_on"'
code=$(run "$work/cluster-run.json" "$work/err" -np 2 "$ballast" run --cluster "$work/host2.json" --format json)
check "run --cluster (this job's calibration) exits 0" test "$code" = 0
# Which calibration a run used, when it was measured and how to refresh it; --recalibrate
# measures again and replaces the cached file (one taken on a busy machine is not reused).
check "run text names the calibration, its date and --recalibrate" has "$work/text.txt" \
  "^calibration: host-.* (.*cached at .*), measured 20[0-9-]*T[0-9:]*Z (.* ago); if this host was busy then, measure it again with --recalibrate"
code=$(run "$work/recal.json" "$work/err" -np 2 "$ballast" run --recalibrate --format json)
check "run --recalibrate exits 0" test "$code" = 0
check "... says it measures" has "$work/err" "measuring this host's calibration (--recalibrate; cached at "
check "... and reports the new calibration" /usr/bin/python3 -c "
import datetime, json, sys
c = json.load(open(sys.argv[1]))['calibration']
assert c['source'].startswith('measured now (--recalibrate) in ') and c['refresh'] == '--recalibrate', c
cache = c['source'].split('cached at ')[1]
assert json.load(open(cache))['measured_on']['measured_at'] == c['measured_at'], c
measured = datetime.datetime.strptime(c['measured_at'], '%Y-%m-%dT%H:%M:%SZ')
assert abs((datetime.datetime.utcnow() - measured).total_seconds()) < 300, c" "$work/recal.json"
check "run --cluster FILE says how to measure FILE again" /usr/bin/python3 -c "
import json, sys
c = json.load(open(sys.argv[1]))['calibration']
assert c['refresh'] == '\`mpirun -np 2 ballast calibrate --host -o ' + sys.argv[2] + '\`', c" "$work/cluster-run.json" "$work/host2.json"
code=$(run "$work/out" "$work/err" -np 2 "$ballast" run --recalibrate --cluster "$work/host2.json")
check "run --recalibrate with --cluster exits 2" test "$code" = 2
check "... and says to drop one" has "$work/err" "--recalibrate measures this host into the cache, --cluster .*host2.json gives a calibration: drop one"
code=$(run "$work/out" "$work/err" -np 4 "$ballast" run --cluster "$work/host2.json")
check "run --cluster of another rank count exits 2" test "$code" = 2
check "... and names the file and the ranks" has "$work/err" "host2.json: the calibration was measured with ranks 2 but this job has 4"
code=$(run "$work/out" "$work/err" -np 2 "$ballast" run --cluster h100)
check "run --cluster with a preset exits 2" test "$code" = 2
check "... and says what it needs" has "$work/err" "ballast calibrate --host"
code=$(run "$work/out" "$work/err" -np 2 "$ballast" run --cluster "$work/host2.json" --hidden 32 --heads 2 --kv-heads 1)
check "run --cluster for another model exits 2" test "$code" = 2
check "... and names the model" has "$work/err" "measured with the model 'hidden 64"
# Tensor parallelism: a TP group of 2 ranks per plan rank, each running half the heads and
# the FFN; exact against the single process, predicted per GPU; impossible splits refused.
code=$(run "$work/tp.json" "$work/err" -np 4 "$ballast" run --tp 2 --strategy static-cp:degree=2 --check --format json)
check "run --tp 2 exits 0" test "$code" = 0
check "run --tp 2 matches the single process and predicts every GPU" /usr/bin/python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
assert r['ranks'] == 4 and r['max_rel_error'] < 1e-5, r
ranks = r['per_step'][0]['ranks']
assert len(ranks) == 4 and all(x['busy_s'] > 0 and x['intra_node_bytes'] > 0 for x in ranks), ranks
# The members of a TP group share the group's prediction.
assert ranks[0]['predicted_busy_s'] == ranks[1]['predicted_busy_s'] > 0, ranks
assert ranks[2]['predicted_busy_s'] == ranks[3]['predicted_busy_s'] > 0, ranks
" "$work/tp.json"
code=$(run "$work/out" "$work/err" -np 4 "$ballast" run --tp 4)
check "run --tp 4 with 2 KV heads exits 2" test "$code" = 2
check "... and names --kv-heads and --tp" has "$work/err" "tensor parallelism 4 splits the runtime model's --kv-heads 2 unevenly"
code=$(run "$work/out" "$work/err" -np 4 "$ballast" run --tp 2 --ffn 171)
check "run --tp 2 with an odd FFN exits 2" test "$code" = 2
check "... and names --ffn" has "$work/err" "choose --ffn a multiple of 2"
"$ballast" plan --strategy static-cp --nodes 1 --tp 2 --tokens-per-step 100000 --max-context 65536 -o "$work/tp-plan.json" 2>"$work/err"
code=$(run "$work/out" "$work/err" -np 4 "$ballast" run --plan "$work/tp-plan.json")
check "run --plan of TP groups on too few ranks exits 2" test "$code" = 2
check "... and says how many" has "$work/err" "tp-plan.json: the plan is for 8 GPUs (4 TP groups of 2) but the job has 4; run with mpirun -np 8"
code=$(run "$work/out" "$work/err" -np 1 "$ballast" calibrate --host)
check "calibrate --host on one rank exits 2" test "$code" = 2
check "... and says why" has "$work/err" "this job has one rank"

"$ballast" plan --strategy static-cp --nodes 1 --tokens-per-step 100000 --max-context 65536 -o "$work/plan.json" 2>"$work/err"
code=$(run "$work/out" "$work/err" -np 2 "$ballast" run --plan "$work/plan.json")
check "a plan for another job exits non-zero" test "$code" != 0
check "a plan for another job names the fix" has "$work/err" "mpirun -np 8"
code=$(run "$work/out" "$work/err" -np 4 "$ballast" run --gpus-per-node 3)
check "bad option exits non-zero" test "$code" != 0
check "bad option names itself" has "$work/err" "--gpus-per-node 3"
code=$(run "$work/out" "$work/err" -np 2 "$ballast" run --corpus "$work/no-such-corpus")
check "missing corpus exits non-zero (no hang)" test "$code" != 0 -a "$code" != 124
check "missing corpus names the path" has "$work/err" "no-such-corpus"

# Started without mpirun, the job is one rank: said once on stderr (under mpirun -np 1 not).
timeout 120 "$ballast" run --steps 1 >"$work/out" 2>"$work/err"
check "run without mpirun exits 0" test $? = 0
check "... and says it runs 1 rank and how to run N" has "$work/err" "^ballast run: running 1 rank (started without mpirun); for N ranks use .mpirun -np N ballast run"
code=$(run "$work/out" "$work/err2" -np 1 "$ballast" run --steps 1)
check "run under mpirun -np 1 does not" bash -c "! grep -q 'started without mpirun' '$work/err2'"

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
