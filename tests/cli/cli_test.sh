#!/usr/bin/env bash
# End-to-end CLI checks: every subcommand, every format, exit codes and error messages.
# Usage: cli_test.sh PATH/TO/ballast SOURCE_DIR
set -uo pipefail
ballast="$1"
source_dir="$2"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# run OUT ERR COMMAND...: prints the command's exit code
run() { local out="$1" err="$2"; shift 2; "$@" >"$out" 2>"$err"; echo $?; }
json_ok() { /usr/bin/python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$1"; }

# --- help with examples on every subcommand ---
for cmd in list plan validate simulate compare; do
  code=$(run "$work/help" "$work/err" "$ballast" "$cmd" --help)
  check "help $cmd exits 0" test "$code" = 0
  check "help $cmd has examples" has "$work/help" "examples"
done

# --- list ---
code=$(run "$work/list" "$work/err" "$ballast" list)
check "list exits 0" test "$code" = 0
for word in wlbllm prolong wikipedia magi a100-ib400 a800-roce h100 h200 h800 gpt-7b llama3-8b \
            packed-dp static-cp static-cp-allgather static-ulysses batch-adaptive hybrid-dp default; do
  check "list shows $word" has "$work/list" "$word"
done
# Bare `ballast list` is a short index (names only, ~2 KB); `ballast list SECTION` has the
# details (it printed every description, ~22 KB, before).
check "bare list is short" test "$(wc -c < "$work/list")" -lt 4096
check "bare list points to the details" has "$work/list" "ballast list scenarios"
check "bare list has no descriptions" bash -c "! grep -q 'Zeppelin' '$work/list'"
code=$(run "$work/list-all" "$work/err" "$ballast" list all)
check "list all keeps the details" has "$work/list-all" "Zeppelin"

# `ballast run --help` lists only what run takes: not the workload flags it rejects
# (--nodes, --model, --cost-model), and --cluster as the host calibration it reads.
code=$(run "$work/help" "$work/err" "$ballast" run --help)
check "help run exits 0" test "$code" = 0
for flag in --nodes --model --cost-model; do
  check "help run hides $flag" bash -c "! grep -q -- '$flag\b' '$work/help'"
done
check "help run: --cluster is the host calibration" has "$work/help" "calibrate --host"
check "help run: --cluster has no preset default" bash -c "! grep -q 'default: h100' '$work/help'"

# --- compare on defaults (the README's main command) ---
code=$(run "$work/compare.txt" "$work/err" "$ballast" compare --steps 1)
check "compare exits 0" test "$code" = 0
check "compare names the over-context policy" has "$work/compare.txt" "policy split"
for s in packed-dp static-cp hybrid-dp static-ulysses; do check "compare row $s" has "$work/compare.txt" "$s"; done

# The JSON and --grad-sync runs leave out the faithful MILP (`flexsp`, ~10 s of CBC per
# step; the text run above has it): every other registered strategy.
no_milp=$("$ballast" list strategies | awk '/^  [a-z]/ && $1 != "flexsp" {print $1}' | paste -sd, -)
code=$(run "$work/compare.json" "$work/err" "$ballast" compare --steps 1 --format json --strategies "$no_milp")
check "compare json exits 0" test "$code" = 0
check "compare json parses" json_ok "$work/compare.json"
check "compare json has keys" /usr/bin/python3 - "$work/compare.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
keys = {"strategy", "step_time_s", "lower_bound_s", "speedup", "imbalance",
        "exposed_comm_fraction", "peak_memory_bytes", "plan_time_ms"}
rows = [r for r in doc["results"] if r["error"] is None]
assert len(rows) >= 4, rows
for r in rows:
    assert keys <= set(r), (keys - set(r))
    assert r["step_time_s"] >= r["lower_bound_s"] > 0, r
    assert r["imbalance"] >= 1.0 - 1e-12, r
PY

# --grad-sync end pays the whole gradient sync after the last backward pass; overlap (the
# default) hides all but what the backward pass cannot, and says which it ran.
code=$(run "$work/sync_end.json" "$work/err" "$ballast" compare --steps 1 --grad-sync end --format json --strategies "$no_milp")
check "compare --grad-sync end exits 0" test "$code" = 0
check "grad sync: end exposes more than overlap" /usr/bin/python3 - "$work/compare.json" "$work/sync_end.json" <<'PY'
import json, sys
overlap, end = (json.load(open(p)) for p in sys.argv[1:3])
assert overlap["settings"]["grad_sync"] == "overlap" and end["settings"]["grad_sync"] == "end"
for o, e in zip(overlap["results"], end["results"]):
    if o["error"] is not None:
        continue
    # Buckets wait for every rank, so a strategy whose ranks end at different times
    # (hybrid-dp) may hide nothing and pay each bucket's latency: 32 buckets x 2 log2(64)
    # hops x 30 us = 11.5 ms more on h100 (of a 72 ms sync), and a few % more.
    assert 0 <= o["gradient_sync_exposed_s"] <= 1.05 * e["gradient_sync_exposed_s"] + 0.0116, (o, e)
    if o["strategy"] in ("static-cp", "static-ulysses"):  # synchronous: hides most of it
        assert o["gradient_sync_exposed_s"] < 0.5 * e["gradient_sync_exposed_s"], (o, e)
        assert o["step_time_s"] < e["step_time_s"], (o, e)
PY

# --recompute full keeps each layer's input (more tokens per GPU) and reruns the forward.
code=$(run "$work/recompute.json" "$work/err" "$ballast" compare --steps 1 --recompute full --strategies packed-dp,flexsp-fast --format json)
check "compare --recompute full exits 0" test "$code" = 0
check "recompute: full says so, costs more and holds more" /usr/bin/python3 - "$work/compare.json" "$work/recompute.json" <<'PY'
import json, sys
selective, full = (json.load(open(p)) for p in sys.argv[1:3])
assert selective["settings"]["recompute"] is None and full["settings"]["recompute"] == "full"
by_name = {r["strategy"]: r for r in selective["results"]}
for r in full["results"]:
    before = by_name[r["strategy"]]
    assert r["error"] is None, r
    if r["strategy"] == "packed-dp":  # one GPU holds a 128K document only with it
        assert before["error"] is not None, before
        continue
    assert r["lower_bound_s"] > before["lower_bound_s"], (r, before)  # the forward runs twice
PY

code=$(run "$work/compare.csv" "$work/err" "$ballast" compare --steps 1 --format csv --strategies packed-dp,hybrid-dp --baseline packed-dp)
check "compare csv exits 0" test "$code" = 0
check "compare csv header" has "$work/compare.csv" "strategy,step_time_s,lower_bound_s"
check "compare csv rows" test "$(wc -l < "$work/compare.csv")" = 3

code=$(run "$work/scenario.txt" "$work/err" "$ballast" compare --scenario prolong-a800 --steps 1 --strategies packed-dp,hybrid-dp)
check "compare scenario exits 0" test "$code" = 0
check "compare scenario uses its cluster" has "$work/scenario.txt" "a800-roce"

# plan --scenario takes the scenario's workload, as simulate --scenario does: the plan it
# writes simulates to the step simulate --scenario reports; a flag overrides the scenario.
code=$(run "$work/scenario_plan.json" "$work/err" "$ballast" plan --scenario zeppelin-h200-3b-prolong --steps 1 --strategy flexsp-fast -o "$work/scenario_plan.json")
check "plan --scenario exits 0" test "$code" = 0
code=$(run "$work/scenario_plan_sim.json" "$work/err" "$ballast" simulate --plan "$work/scenario_plan.json" --format json)
check "simulate --plan of it exits 0" test "$code" = 0
code=$(run "$work/scenario_sim.json" "$work/err" "$ballast" simulate --scenario zeppelin-h200-3b-prolong --steps 1 --strategy flexsp-fast --format json)
check "simulate --scenario exits 0" test "$code" = 0
check "plan --scenario: the plan simulates to simulate --scenario's step" /usr/bin/python3 - "$work/scenario_plan.json" "$work/scenario_plan_sim.json" "$work/scenario_sim.json" <<'PY'
import json, sys
plan, from_plan, direct = (json.load(open(p)) for p in sys.argv[1:4])
assert plan["cluster"]["name"] == "h200" and plan["model"]["name"] == "openllama-3b", (plan["cluster"]["name"], plan["model"]["name"])
assert from_plan["steps"][0]["step_time_s"] == direct["steps"][0]["step_time_s"], (from_plan["steps"][0]["step_time_s"], direct["steps"][0]["step_time_s"])
PY
code=$(run "$work/scenario_plan2.json" "$work/err" "$ballast" plan --scenario zeppelin-h200-3b-prolong --nodes 2 --steps 1 --strategy flexsp-fast -o "$work/scenario_plan2.json")
check "plan --scenario with --nodes exits 0" test "$code" = 0
check "plan --scenario: --nodes overrides it" /usr/bin/python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['cluster']; assert c['nodes'] == 2 and c['name'] == 'h200', c" "$work/scenario_plan2.json"

# FlexSP's scenario with strategy specs; --strategies without the scenario's baseline
# falls back to the first strategy.
code=$(run "$work/flexsp.txt" "$work/err" "$ballast" compare --scenario flexsp-7b-192k --nodes 2 --steps 1 --batch-size 32 --strategies flexsp-fast,flexsp:max-nodes=0)
check "compare flexsp scenario exits 0" test "$code" = 0
check "compare flexsp scenario lists the spec" has "$work/flexsp.txt" "flexsp:max-nodes=0"
check "compare flexsp scenario speedup against the first" has "$work/flexsp.txt" "speedup: flexsp-fast step time"
code=$(run "$work/strategies.txt" "$work/err" "$ballast" list strategies)
check "list strategies shows parameters" has "$work/strategies.txt" ":max-nodes="

# A strategy that fails on a later step reports the error and no partial figures: null in
# JSON, empty cells in CSV; speedups against it (the baseline here) are null / empty too.
printf '[1000, 50000]' > "$work/two.json"
partial_args=(compare --lengths "$work/two.json" --sampling sequential --batch-size 1 --steps 2 --max-context 4000000 --strategies packed-dp,hybrid-dp --baseline packed-dp --nodes 1)
code=$(run "$work/partial.json" "$work/err" "$ballast" "${partial_args[@]}" --format json)
check "compare with a failing step exits 0" test "$code" = 0
check "failed strategy has null figures" /usr/bin/python3 - "$work/partial.json" <<'PY'
import json, sys
rows = {r["strategy"]: r for r in json.load(open(sys.argv[1]))["results"]}
failed, ran = rows["packed-dp"], rows["hybrid-dp"]
assert failed["error"] and "50,000 tokens" in failed["error"], failed
figures = [k for k in failed if k not in ("strategy", "error")]
assert len(figures) == 10 and all(failed[k] is None for k in figures), failed
assert ran["error"] is None and ran["speedup"] is None, ran
assert all(ran[k] is not None for k in figures if k != "speedup"), ran
PY
code=$(run "$work/partial.csv" "$work/err" "$ballast" "${partial_args[@]}" --format csv)
check "compare csv with a failing strategy exits 0" test "$code" = 0
check "failed strategy has empty csv cells" /usr/bin/python3 - "$work/partial.csv" <<'PY'
import csv, sys
rows = {r["strategy"]: r for r in csv.DictReader(open(sys.argv[1]))}
failed, ran = rows["packed-dp"], rows["hybrid-dp"]
assert "50,000 tokens" in failed["error"], failed
assert all(failed[k] == "" for k in failed if k not in ("strategy", "error")), failed
assert ran["error"] == "" and ran["speedup"] == "" and float(ran["step_time_s"]) > 0, ran
PY
code=$(run "$work/partial.txt" "$work/err" "$ballast" "${partial_args[@]}")
check "compare text says cannot run" has "$work/partial.txt" "cannot run: packed-dp cannot run sequence"
check "compare text explains the missing speedups" has "$work/partial.txt" "the baseline cannot run"

# --- plan, validate, simulate ---
code=$(run "$work/plan.json" "$work/err" "$ballast" plan --strategy hybrid-dp --nodes 1 --tokens-per-step 200000)
check "plan exits 0" test "$code" = 0
check "plan json parses" json_ok "$work/plan.json"
"$ballast" plan --strategy hybrid-dp --nodes 1 --tokens-per-step 200000 -o "$work/plan2.json"
check "plan is deterministic" cmp -s "$work/plan.json" "$work/plan2.json"

# Without --strategy, plan and simulate use ballast's own strategy (issue 21).
code=$(run "$work/default-plan.json" "$work/err" "$ballast" plan --nodes 1 --tokens-per-step 200000)
check "plan without --strategy exits 0" test "$code" = 0
check "plan without --strategy uses ballast" has "$work/default-plan.json" '"strategy": "ballast"'
code=$(run "$work/default-sim.txt" "$work/err" "$ballast" simulate --nodes 1 --tokens-per-step 200000)
check "simulate without --strategy uses ballast" has "$work/default-sim.txt" "strategy ballast"

code=$(run "$work/valid.txt" "$work/err" "$ballast" validate "$work/plan.json")
check "validate good plan exits 0" test "$code" = 0
check "validate says valid" has "$work/valid.txt" "valid"

/usr/bin/python3 - "$work/plan.json" "$work/bad.json" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
group = plan["micro_batches"][0]["groups"][0]
chunk = group["sequences"][0]["chunks"][0]
chunk[2] -= 1          # drop the last token of the first chunk
json.dump(plan, open(sys.argv[2], "w"))
PY
code=$(run "$work/invalid.txt" "$work/err" "$ballast" validate "$work/bad.json")
check "validate bad plan exits 1" test "$code" = 1
check "validate names the violation" has "$work/invalid.txt" "invalid"
code=$(run "$work/sim.txt" "$work/err" "$ballast" simulate --plan "$work/bad.json")
check "simulate refuses an invalid plan" test "$code" = 2
check "simulate names the invalid plan's file" has "$work/err" "plan $work/bad.json is invalid"

code=$(run "$work/sim.txt" "$work/err" "$ballast" simulate --plan "$work/plan.json" --trace "$work/trace.json")
check "simulate plan exits 0" test "$code" = 0
check "simulate prints step time" has "$work/sim.txt" "lower bound"
check "simulate text points to the format flag" has "$work/sim.txt" "all ranks: --format csv or json"
check "trace parses" json_ok "$work/trace.json"
check "trace has events" has "$work/trace.json" "traceEvents"
# simulate --plan with --cluster/--nodes/--model/--cost-model simulates the plan there (it
# printed the plan's own h100 figures before) and says where; a plan that does not fit
# fails validation naming the cluster; flags that sample or plan batches are refused.
check "simulate --plan names the plan's cluster" has "$work/sim.txt" "on cluster h100 (1 nodes x 8"
code=$(run "$work/sim-h100.json" "$work/err" "$ballast" simulate --plan "$work/plan.json" --format json)
code=$(run "$work/sim-h200.txt" "$work/err" "$ballast" simulate --plan "$work/plan.json" --cluster h200 --nodes 1)
check "simulate --plan --cluster h200 exits 0" test "$code" = 0
check "simulate --plan --cluster names h200" has "$work/sim-h200.txt" "on cluster h200 (1 nodes x 8"
check "simulate --plan --cluster names the model" has "$work/sim-h200.txt" "model llama-7b"
code=$(run "$work/sim-a800.json" "$work/err" "$ballast" simulate --plan "$work/plan.json" --cluster a800-roce --nodes 1 --format json)
check "simulate --plan --cluster a800-roce is slower than h100" /usr/bin/python3 - "$work/sim-h100.json" "$work/sim-a800.json" <<'PY'
import json, sys
h100, a800 = (json.load(open(p))["steps"][0]["step_time_s"] for p in sys.argv[1:3])
assert a800 > 1.5 * h100, (h100, a800)  # the same plan on GPUs of a third the FLOP/s
PY
code=$(run "$work/sim-13b.txt" "$work/err" "$ballast" simulate --plan "$work/plan.json" --model llama-13b)
check "simulate --plan --model exits 0 or 2" test "$code" = 0 -o "$code" = 2
check "simulate --plan --model names llama-13b" bash -c "grep -q 'llama-13b' '$work/sim-13b.txt' '$work/err'"
expect_plan_error() {  # expect_plan_error NAME TEXT args...: exit 2 and TEXT on stderr
  local name="$1" text="$2"; shift 2
  code=$(run "$work/out" "$work/err" "$ballast" "$@")
  check "$name exits 2" test "$code" = 2
  check "$name message" has "$work/err" "$text"
}
expect_plan_error "simulate --plan on more GPUs" "is for 8 GPUs; cluster h200 has 64" \
  simulate --plan "$work/plan.json" --cluster h200
expect_plan_error "simulate --plan where it does not fit" "does not fit cluster a100-ib400" \
  simulate --plan "$work/plan.json" --cluster a100-ib400 --nodes 1 --model llama-13b
for flag in "--steps 2" "--dataset prolong" "--seed 3" "--tokens-per-step 1000" "--degree 2" "--no-routing" "--tp 2"; do
  expect_plan_error "simulate --plan refuses ${flag%% *}" "so ${flag%% *} would not apply" \
    simulate --plan "$work/plan.json" $flag
done
# 8 H100s hold LLaMA-7B rings of 113,744 tokens at most: a 64K context (the default 128K
# is an error for static-cp on one node).
code=$(run "$work/sim.json" "$work/err" "$ballast" simulate --strategy static-cp --nodes 1 --tokens-per-step 200000 --max-context 65536 --steps 2 --format json)
check "simulate json exits 0" test "$code" = 0
check "simulate json parses" json_ok "$work/sim.json"
code=$(run "$work/sim.csv" "$work/err" "$ballast" simulate --strategy packed-dp --nodes 1 --tokens-per-step 100000 --max-context 8192 --format csv)
check "simulate csv has a row per rank" test "$(wc -l < "$work/sim.csv")" = 9

# --- zeppelin: scenarios, the ablation ladder, the ablation flags ---
code=$(run "$work/scenarios.txt" "$work/err" "$ballast" list scenarios)
check "list scenarios shows zeppelin scenarios" has "$work/scenarios.txt" "zeppelin-a800-7b-prolong"
code=$(run "$work/ladder.txt" "$work/err" "$ballast" compare --scenario zeppelin-a800-7b-prolong --nodes 2 --steps 1 --tokens-per-step 131072 --ablation)
check "compare --ablation exits 0" test "$code" = 0
for s in "static-cp " "zeppelin:partition=even:routing=off:remap=off" "zeppelin:partition=even:remap=off" \
         "zeppelin:remap=off" "zeppelin:routing=off"; do
  check "ablation row $s" has "$work/ladder.txt" "$s"
done
code=$(run "$work/norouting.txt" "$work/err" "$ballast" compare --cluster a800-roce --nodes 2 --steps 1 --tokens-per-step 131072 --strategies static-cp,zeppelin --no-routing --no-remap)
check "compare --no-routing exits 0" test "$code" = 0
check "--no-routing labels the row" has "$work/norouting.txt" "zeppelin:routing=off:remap=off"
code=$(run "$work/zeppelin.json" "$work/err" "$ballast" plan --strategy zeppelin --cluster a800-roce --nodes 2 --tokens-per-step 131072)
check "plan zeppelin exits 0" test "$code" = 0
check "zeppelin plan has queues" has "$work/zeppelin.json" '"queues"'
code=$(run "$work/valid-z.txt" "$work/err" "$ballast" validate "$work/zeppelin.json")
check "zeppelin plan validates" test "$code" = 0

# --- compare --sweep degree=...: a row per degree for each strategy that takes one ---
# 16 GPUs, Llama-3-8B (8 KV heads): Ulysses cannot take 16, a note says so.
code=$(run "$work/sweep.json" "$work/sweep.err" "$ballast" compare --nodes 2 --model llama3-8b --steps 1 --tokens-per-step 131072 --max-context 32768 --strategies static-cp,static-ulysses,hybrid-dp --sweep degree=per-step,8,16 --format json)
check "compare --sweep exits 0" test "$code" = 0
check "--sweep: one row per degree, the baseline's own row, the others once" /usr/bin/python3 - "$work/sweep.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
labels = [r["strategy"] for r in doc["results"]]
assert labels == ["static-cp", "static-cp:degree=per-step", "static-cp:degree=8",
                  "static-cp:degree=16", "static-ulysses:degree=per-step",
                  "static-ulysses:degree=8", "hybrid-dp"], labels
assert doc["settings"]["baseline"] == "static-cp", doc["settings"]
PY
check "--sweep notes the skipped Ulysses degree" has "$work/sweep.err" "note: --sweep: static-ulysses:degree=16 skipped"

# --- bad input: one-line message naming the input, exit 2, never a crash ---
expect_error() {  # expect_error NAME TEXT args...
  local name="$1" text="$2"; shift 2
  local code; code=$(run "$work/out" "$work/err" "$ballast" "$@")
  check "$name exits 2" test "$code" = 2
  check "$name message" has "$work/err" "$text"
}
printf '100\n-5\n200\n' > "$work/negative.txt"
printf '100\nabc\n' > "$work/garbage.txt"
printf '100\n0\n' > "$work/zero.txt"
printf '[1, 2,' > "$work/broken.json"
printf '{"nodes": 2}' > "$work/cluster.json"
expect_error "unknown cluster" "h100" compare --cluster nope
expect_error "unknown model" "llama-7b" compare --model nope
expect_error "unknown strategy" "packed-dp" compare --strategies nope
expect_error "unknown dataset" "wlbllm" compare --dataset nope
expect_error "unknown scenario" "default" compare --scenario nope
expect_error "plan: unknown scenario" "see \`ballast list scenarios\`" plan --scenario nope
expect_error "unknown cost model" "analytical" compare --cost-model nope
expect_error "unknown recompute mode" "--recompute 'partial' is not a recomputation mode; use selective (the default), full or none" compare --recompute partial --steps 1
expect_error "full recompute on profiled coefficients" "was measured without full recomputation; use --recompute selective or --cost-model analytical" compare --recompute full --model gpt-7b --cluster a100-ib400 --cost-model flexsp-a100-192k --steps 1
expect_error "unknown gradient sync mode" "--grad-sync 'later' is not a gradient sync mode; use overlap" compare --grad-sync later --steps 1
expect_error "missing lengths file" "no-such-file" compare --lengths "$work/no-such-file.txt"
expect_error "missing lengths file says so" "file not found: nosuch.txt" compare --lengths nosuch.txt
check "missing lengths file is not called a dataset" bash -c "! grep -q 'unknown dataset' '$work/err'"
# "did you mean": flags, presets, datasets, strategies, parameters, scenarios, lists.
expect_error "misspelt flag" "unknown flag --datset (did you mean '--dataset'?)" compare --datset prolong
expect_error "--strategy on compare" "did you mean '--strategies'?" compare --strategy zeppelin
expect_error "misspelt strategy" "(did you mean 'zeppelin'?)" compare --strategies zepelin
expect_error "misspelt parameter" "(did you mean 'degree'?)" compare --strategies static-ulysses:dgree=4
expect_error "misspelt dataset" "(did you mean 'wlbllm'?)" compare --dataset wlbllmm
expect_error "misspelt scenario" "(did you mean 'default'?)" compare --scenario defualt
expect_error "misspelt list" "(did you mean 'strategies'?)" list strategy
# A parameter value the cluster or model rules out is a usage error in every subcommand,
# before any planning (compare used to print a "cannot run" row and exit 0).
for cmd in compare simulate plan; do
  flag=--strategies; [ "$cmd" = compare ] || flag=--strategy
  expect_error "$cmd rejects an invalid degree" "strategy 'static-ulysses:degree=12': --degree 12 is not valid" \
    "$cmd" "$flag" static-ulysses:degree=12 --steps 1
done
# compare with no strategy that could run: exit 2, each reason once; with one that ran: 0.
expect_error "compare where nothing ran" "no strategy could run: packed-dp cannot run" compare --strategies packed-dp --steps 1
code=$(run "$work/out" "$work/err" "$ballast" compare --strategies packed-dp,hybrid-dp --baseline packed-dp --steps 1 --format csv)
check "compare with a failing baseline exits 0" test "$code" = 0
check "failing baseline: empty figures" has "$work/out" '^packed-dp,,,,,,,,,,,"packed-dp cannot run'
check "failing baseline: no speedups" bash -c "grep -q '^hybrid-dp,[0-9.e+-]*,[0-9.e+-]*,[0-9.e+-]*,,' '$work/out'"
# --over-context split is the default: long documents become pieces, and a warning says so.
printf '300000\n1000\n2000\n' > "$work/long.txt"
code=$(run "$work/out" "$work/err" "$ballast" compare --lengths "$work/long.txt" --batch-size 3 --sampling sequential --steps 1 --strategies static-cp)
check "split default exits 0" test "$code" = 0
check "split default is in the header" has "$work/out" "policy split, split 1 into 3 pieces"
check "split warns on stderr" has "$work/err" "ballast: warning: 1 documents longer than --max-context 131072 were split into 3 pieces"
code=$(run "$work/out" "$work/err" "$ballast" simulate --lengths "$work/long.txt" --batch-size 3 --sampling sequential --strategy static-cp --over-context drop)
check "drop warns on stderr" has "$work/err" "ballast: warning: 2 documents longer than --max-context 131072 were dropped (600,000 tokens lost"
# --version and the cost models' descriptions.
code=$(run "$work/out" "$work/err" "$ballast" --version)
check "--version exits 0" test "$code" = 0
check "--version prints the version" has "$work/out" "^ballast [0-9][0-9.]*$"
"$ballast" list cost-models > "$work/out"
check "list describes every cost model" bash -c "! grep -qE '^  [a-z0-9-]+ *$' '$work/out'"
# --steps is limited (compare --steps 100000000 was killed for memory); small batches so
# that an unlimited binary finishes quickly.
tiny=(--nodes 1 --tokens-per-step 2048 --max-context 2048)
expect_error "compare --steps over the limit" "--steps 10001 is over ballast's limit of 10,000 steps" compare --steps 10001 --strategies packed-dp "${tiny[@]}"
expect_error "plan --steps over the limit" "--steps 10001 is over ballast's limit of 10,000 steps" plan --steps 10001 --strategy packed-dp "${tiny[@]}"
expect_error "simulate --steps over the limit" "--steps 10001 is over ballast's limit of 10,000 steps" simulate --steps 10001 --strategy packed-dp "${tiny[@]}"
# --seed is a 64-bit unsigned integer: CLI11 clamped -1 and 2^64 to 2^64 - 1 silently.
for seed in -1 18446744073709551616 99999999999999999999999 1e3; do
  expect_error "--seed $seed" "--seed $seed: the seed must be an integer from 0 to 18446744073709551615" plan --seed "$seed" --strategy packed-dp "${tiny[@]}"
done
code=$(run "$work/seed-max.json" "$work/err" "$ballast" plan --seed 18446744073709551615 --strategy packed-dp "${tiny[@]}")
check "--seed 2^64 - 1 exits 0" test "$code" = 0
expect_error "negative length" "negative.txt" compare --lengths "$work/negative.txt"
expect_error "garbage length" "garbage.txt" compare --lengths "$work/garbage.txt"
expect_error "zero length" "zero.txt" compare --lengths "$work/zero.txt"
expect_error "broken json lengths" "broken.json" compare --lengths "$work/broken.json"
expect_error "incomplete cluster file" "cluster.json" compare --cluster "$work/cluster.json"
expect_error "zero nodes" "--nodes" compare --nodes 0
expect_error "empty strategy list" "--strategies" compare --strategies ,
expect_error "unknown strategy parameter" "static-ulysses takes degree" compare --strategies static-ulysses:deg=8
expect_error "bad strategy parameter value" "refine=maybe" compare --strategies flexsp-fast:refine=maybe --steps 1
expect_error "ablation flag without zeppelin" "--no-routing applies" plan --strategy static-cp --no-routing
expect_error "zeppelin degree without even split" "partition=even" compare --strategies zeppelin:degree=8 --steps 1
code=$(run "$work/out" "$work/err" "$ballast" compare --degree 8 --steps 1 --strategies static-cp,zeppelin,zeppelin:partition=even)
check "--degree with zeppelin in the list exits 0" test "$code" = 0
check "--degree leaves hierarchical zeppelin choosing" has "$work/out" "^zeppelin  "
expect_error "ablation with strategies" "--ablation" compare --ablation --strategies zeppelin
expect_error "sweep of a degree no strategy takes" "--sweep degree=12: no compared strategy can take degree 12" compare --strategies static-cp,hybrid-dp --sweep degree=12 --steps 1
expect_error "sweep of another key" "--sweep size=8" compare --sweep size=8 --steps 1
expect_error "sweep with --degree" "either --degree or --sweep" compare --degree 8 --sweep degree=16 --steps 1
expect_error "spec degree not dividing the GPUs" "--degree 12 is not valid for static-cp" compare --strategies static-cp:degree=12 --steps 1
expect_error "context no static-cp degree holds" "static-cp cannot hold the run's context of 16,777,216 tokens (--max-context)" compare --strategies static-cp --nodes 1 --max-context 16777216 --steps 1
expect_error "context too short to fill a batch" "raise --max-context" compare --max-context 1 --steps 1
/usr/bin/python3 - "$source_dir/data/presets/example-cluster.json" "$work/impossible.json" <<'PY'
import json, sys
cluster = json.load(open(sys.argv[1]))
cluster["nics_per_node"] = 3
json.dump(cluster, open(sys.argv[2], "w"))
cluster["nics_per_node"] = 8
cluster["nics_per_nodes"] = 4  # misspelt: an error, not the file's NIC count in silence
json.dump(cluster, open(sys.argv[2].replace("impossible", "misspelt"), "w"))
PY
expect_error "impossible cluster" "nics_per_node" compare --cluster "$work/impossible.json"
expect_error "misspelt cluster key" "misspelt.json: unknown key \"nics_per_nodes\" (did you mean 'nics_per_node'?)" compare --cluster "$work/misspelt.json" --steps 1
expect_error "model too big for the cluster" "does not fit" compare --model gpt-30b --cluster a100-ib400 --nodes 1 --cost-model analytical
expect_error "both budgets" "--batch-size" compare --batch-size 10 --tokens-per-step 1000
expect_error "unknown format" "--format" compare --format xml
expect_error "malformed plan" "broken.json" validate "$work/broken.json"
expect_error "missing plan" "no-plan.json" validate "$work/no-plan.json"
expect_error "profiled model mismatch" "analytical" compare --cost-model flexsp-a100-192k --model llama-7b
printf '2000000\n1000\n' > "$work/huge.txt"
expect_error "too long for packed-dp" "(2,000,000 tokens)" plan --strategy packed-dp --lengths "$work/huge.txt" --batch-size 2 --max-context 4000000 --nodes 1
expect_error "too long for packed-dp names the CLI flag" "or lower --max-context" plan --strategy packed-dp --lengths "$work/huge.txt" --batch-size 2 --max-context 4000000 --nodes 1
expect_error "over-context error policy" "--max-context" plan --strategy packed-dp --lengths "$work/huge.txt" --batch-size 2 --over-context error
# A failing command leaves -o untouched: no new file, an existing one as it was.
"$ballast" plan --strategy packed-dp --lengths "$work/huge.txt" --batch-size 2 --max-context 4000000 --nodes 1 -o "$work/never.json" 2>/dev/null
check "failed plan creates no -o file" test ! -e "$work/never.json"
echo "previous contents" > "$work/kept.json"
"$ballast" plan --strategy packed-dp --lengths "$work/huge.txt" --batch-size 2 --max-context 4000000 --nodes 1 -o "$work/kept.json" 2>/dev/null
check "failed plan keeps an existing -o file" grep -qx "previous contents" "$work/kept.json"
expect_error "unwritable -o" "cannot write" plan --strategy hybrid-dp --nodes 1 -o "$work/no-such-folder/plan.json"

# --- tensor parallelism (--tp): plans on TP groups, validates, simulates; bad degrees ---
code=$(run "$work/tp.json" "$work/err" "$ballast" plan --strategy zeppelin --cluster h200 --nodes 2 --model llama-13b --tp 2 --tokens-per-step 131072)
check "plan --tp 2 exits 0" test "$code" = 0
check "a TP plan's cluster says so" has "$work/tp.json" '"tensor_parallel"'
code=$(run "$work/tp-valid.txt" "$work/err" "$ballast" validate "$work/tp.json")
check "a TP plan validates" test "$code" = 0
code=$(run "$work/tp-sim.txt" "$work/err" "$ballast" simulate --plan "$work/tp.json")
check "a TP plan simulates" test "$code" = 0
check "simulate names TP groups" has "$work/tp-sim.txt" "ranks are TP groups of 2 GPUs"
code=$(run "$work/tp-compare.json" "$work/err" "$ballast" compare --cluster h200 --nodes 2 --model llama-13b --tp 2 --steps 1 --tokens-per-step 131072 --strategies static-cp,hybrid-dp,zeppelin --format json)
check "compare --tp 2 exits 0" test "$code" = 0
check "compare --tp 2 reports TP" /usr/bin/python3 - "$work/tp-compare.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["settings"]["tp"] == 2, doc["settings"]
assert doc["settings"]["cluster_description"].endswith("16 GPUs in 8 TP groups of 2)"), doc["settings"]
assert all(r["error"] is None and r["step_time_s"] >= r["lower_bound_s"] for r in doc["results"]), doc
PY
expect_error "--tp 3 on 8 GPUs per node" "--tp 3 is not valid for cluster 'h100' (8 GPUs per node" compare --tp 3 --steps 1
check "--tp 3 lists the valid values" has "$work/err" "valid values: 1, 2, 4, 8"
expect_error "--tp 16 with 8 KV heads" "--tp 16 is not valid" compare --model llama3-8b --tp 16 --steps 1
check "--tp 16 names the KV heads" has "$work/err" "8 KV heads"
expect_error "--tp with a profiled cost model" "--tp 2: profiled cost model flexsp-a100-192k was measured without tensor parallelism" \
  compare --cluster a100-ib400 --model gpt-7b --cost-model flexsp-a100-192k --tp 2 --steps 1
check "--tp with a profiled cost model says what to do" has "$work/err" "use --cost-model analytical or drop --tp"
expect_error "Ulysses degree x TP over the KV heads" "--degree 8 is not valid for static-ulysses" \
  plan --strategy static-ulysses --model llama3-8b --nodes 2 --tp 2 --degree 8 --tokens-per-step 65536
check "the Ulysses error names --tp" has "$work/err" "at --tp 2 (degree x 2 must divide 8)"

finish cli
