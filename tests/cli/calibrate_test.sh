#!/usr/bin/env bash
# `ballast calibrate`: the bundled nccl-tests CSV and the text samples of tests/cost/data
# give a cluster JSON that compare loads; bad files exit 2 naming the file and the line.
# Usage: calibrate_test.sh PATH/TO/ballast SOURCE_DIR
set -uo pipefail
ballast="$1"
source_dir="$2"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$source_dir" || exit 1

run() { local out="$1" err="$2"; shift 2; "$@" >"$out" 2>"$err"; echo $?; }

code=$(run "$work/help" "$work/err" "$ballast" calibrate --help)
check "help exits 0" test "$code" = 0
check "help has examples" has "$work/help" "examples"

# The bundled measurements onto h200, then a comparison on the calibrated cluster.
code=$(run "$work/table.txt" "$work/err" "$ballast" calibrate \
  --nccl-tests data/profiles/h200_8gpu_nccl_tests.csv --cluster h200 -o "$work/c.json")
check "calibrate exits 0" test "$code" = 0
check "calibrate writes the cluster" test -s "$work/c.json"
check "table has the worst error" has "$work/table.txt" "worst relative error"
check "table has every row" test "$(grep -c 'h200_8gpu_nccl_tests.csv:' "$work/table.txt")" = 99
check "cluster is named and calibrated" /usr/bin/python3 - "$work/c.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
assert c["name"] == "h200-calibrated", c["name"]
fits = c["intra_node_collectives"]
assert [f["gpus"] for f in fits["all_reduce"]] == [2, 4, 8], fits
assert "data/profiles/h200_8gpu_nccl_tests.csv (99 rows, 99 fitted)" in c["provenance"]
PY
code=$(run "$work/compare.txt" "$work/err" "$ballast" compare --cluster "$work/c.json" --steps 2)
check "compare on the calibrated cluster exits 0" test "$code" = 0
check "compare names the cluster" has "$work/compare.txt" "h200-calibrated"

# Deterministic: the same command writes the same bytes.
"$ballast" calibrate --nccl-tests data/profiles/h200_8gpu_nccl_tests.csv --cluster h200 \
  -o "$work/c2.json" >/dev/null 2>&1
check "output is deterministic" cmp -s "$work/c.json" "$work/c2.json"

# An all_reduce across hosts is not fitted but checked against the gradient sync's
# all-reduce (the nodes' NICs together): a hand-written 2-node sample at 86 GB/s busbw
# (nccl-tests#175's A100 nodes with 4 HDR NICs) against a800-roce's 4 x 24 GB/s.
code=$(run "$work/ar2.txt" "$work/err" "$ballast" calibrate --nccl-tests tests/cost/data/all_reduce_perf_2node.txt --cluster a800-roce)
check "all_reduce across hosts exits 0" test "$code" = 0
check "all_reduce across hosts is checked" has "$work/ar2.txt" "(checked, not fitted)"
check "all_reduce across hosts: the largest error" has "$work/ar2.txt" "checked against the cost model: largest error -9.8%"
code=$(run "$work/ar2.json" "$work/err" "$ballast" calibrate --format json --nccl-tests tests/cost/data/all_reduce_perf_2node.txt --cluster a800-roce)
check "all_reduce across hosts json" /usr/bin/python3 - "$work/ar2.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert len(rows) == 5, len(rows)
for r in rows:
    assert r["hosts"] == 2 and r["gpus"] == 16 and not r["fitted"] and r["checked"], r
    assert -0.10 < r["relative_error"] < 0, r  # 96 GB/s predicted against 86 measured
PY

# --format json, and the text samples of every op together (two hosts: NIC constants).
code=$(run "$work/rows.json" "$work/err" "$ballast" calibrate --format json --name mine \
  --nccl-tests tests/cost/data/all_reduce_perf_8gpu.txt tests/cost/data/all_gather_perf_4gpu.txt \
  tests/cost/data/reduce_scatter_perf_2gpu.txt tests/cost/data/alltoall_perf_8gpu.txt \
  tests/cost/data/sendrecv_perf_2gpu.txt tests/cost/data/sendrecv_perf_2node.txt \
  -o "$work/mine.json")
check "json exits 0" test "$code" = 0
check "json rows" /usr/bin/python3 - "$work/rows.json" "$work/mine.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
rows = doc["rows"]
assert len(rows) == 11 + 11 + 11 + 6 + 6 + 6, len(rows)
for key in ("op", "gpus", "bytes", "measured_s", "predicted_s", "relative_error"):
    assert key in rows[0], key
assert {r["op"] for r in rows} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
assert 0 < doc["worst_relative_error"] < 0.2, doc["worst_relative_error"]
c = json.load(open(sys.argv[2]))
assert c["name"] == "mine"
assert abs(c["nic_bw_bytes_per_s"] / 47e9 - 1) < 1e-3, c["nic_bw_bytes_per_s"]
PY

# Bad input: exit 2, one line naming the file and the line.
expect_error() {  # expect_error NAME TEXT args...
  local name="$1" text="$2"; shift 2
  local code; code=$(run "$work/out" "$work/err" "$ballast" "$@")
  check "$name exits 2" test "$code" = 2
  check "$name message" has "$work/err" "$text"
  check "$name one line" test "$(wc -l < "$work/err")" = 1
}
sed 's/   90.77 /    fast /' tests/cost/data/all_reduce_perf_8gpu.txt > "$work/all_reduce_perf_bad.txt"
expect_error "bad time" "all_reduce_perf_bad.txt:20: expected the out-of-place time in us in column 6 ('time'), got 'fast'" \
  calibrate --nccl-tests "$work/all_reduce_perf_bad.txt" -o "$work/never.json"
check "failed calibrate writes nothing" test ! -e "$work/never.json"
expect_error "missing file" "nosuch.txt" calibrate --nccl-tests nosuch.txt
# A result row whose size is not a number, or overflows, is an error, not a skipped line
# (both exited 0 with the row left out); so are implausible sizes and times (a time of
# 1e308 us printed a 300-digit row).
sed 's/^     8388608 /         abc /' tests/cost/data/all_reduce_perf_8gpu.txt > "$work/all_reduce_perf_abc.txt"
expect_error "size abc" "all_reduce_perf_abc.txt:20: expected the size in bytes in column 1 ('size'), got 'abc'" \
  calibrate --nccl-tests "$work/all_reduce_perf_abc.txt"
sed 's/^     8388608 /99999999999999999999 /' tests/cost/data/all_reduce_perf_8gpu.txt > "$work/all_reduce_perf_huge.txt"
expect_error "size overflowing" "all_reduce_perf_huge.txt:20: expected the size in bytes in column 1 ('size'), got '99999999999999999999'" \
  calibrate --nccl-tests "$work/all_reduce_perf_huge.txt"
sed 's/   90.77 /   1e308 /' tests/cost/data/all_reduce_perf_8gpu.txt > "$work/all_reduce_perf_slow.txt"
expect_error "time 1e308" "all_reduce_perf_slow.txt:20: the time must be at most 3600000000 us (an hour), got '1e308'" \
  calibrate --nccl-tests "$work/all_reduce_perf_slow.txt"
printf 'op,ngpu,size_bytes,t_us_out\nall_reduce,8,1024,1e308\nall_reduce,8,2048,12\nall_reduce,8,4096,15\n' > "$work/slow.csv"
expect_error "csv time 1e308" "slow.csv:2: the time must be at most 3600000000 us (an hour), got '1e308'" \
  calibrate --nccl-tests "$work/slow.csv"
printf 'op,ngpu,size_bytes,t_us_out\nall_reduce,8,2048,12\nall_reduce,8,4096,15\nall_reduce,8,9223372036854775807,1000000\n' > "$work/big.csv"
expect_error "csv size over 2^40" "big.csv:4: column 'size_bytes' must be a byte count from 1 to 1099511627776" \
  calibrate --nccl-tests "$work/big.csv"
# A binary file is named as one; its bytes are not echoed.
printf '\177ELF\002\001,\001\000\000\377\376\n12 \033[31m\n' > "$work/binary.dat"
expect_error "binary file" "binary.dat: not a text file" calibrate --nccl-tests "$work/binary.dat"
check "binary file: no raw bytes echoed" bash -c "! LC_ALL=C grep -q '[^[:print:][:space:]]' '$work/err'"
printf 'op,ngpu,size_bytes,t_us_out\nallreduce,8,1024,10\n' > "$work/bad.csv"
expect_error "bad csv op" "bad.csv:2: column 'op': unknown collective 'allreduce' (did you mean 'all_reduce'?)" \
  calibrate --nccl-tests "$work/bad.csv"
expect_error "unknown format" "--format" calibrate --nccl-tests data/profiles/h200_8gpu_nccl_tests.csv --format csv
expect_error "unknown base" "unknown cluster" calibrate --nccl-tests data/profiles/h200_8gpu_nccl_tests.csv --cluster h300
code=$(run "$work/out" "$work/err" "$ballast" calibrate)
check "no --nccl-tests exits 2" test "$code" = 2

# --attention: the curves of the benchmarked passes become the measured points; the table
# and the JSON list each row against the base's prediction and the fitted one.
code=$(run "$work/att.json" "$work/err" "$ballast" calibrate --nccl-tests data/profiles/h200_8gpu_nccl_tests.csv \
  --attention tests/cost/data/attention_benchmark_made_up.csv --cluster h200 -o "$work/att-cluster.json" --format json)
check "calibrate --attention exits 0" test "$code" = 0
check "calibrate --attention fits the curves" /usr/bin/python3 - "$work/att.json" "$work/att-cluster.json" <<'PY'
import json, sys
doc, cluster = (json.load(open(p)) for p in sys.argv[1:3])
rows = doc["attention_rows"]
assert len(rows) >= 4 and {r["pass"] for r in rows} == {"forward", "backward"}, rows
for r in rows:
    assert r["measured_s"] > 0 and r["predicted_s"] > 0 and r["base_predicted_s"] > 0, r
curves = cluster["attention_efficiency_curve"]
assert [p["tokens"] for p in curves["backward"]] == sorted({r["seq_len_tokens"] for r in rows if r["pass"] == "backward"}), curves
assert "attention_benchmark_made_up.csv" in cluster["provenance"], cluster["provenance"]
PY
code=$(run "$work/out" "$work/err" "$ballast" compare --cluster "$work/att-cluster.json" --steps 1 --strategies static-cp,zeppelin)
check "compare runs on the attention-calibrated cluster" test "$code" = 0
printf 'seq_len_tokens,pass,time_s,heads,head_dim\n1024,sideways,0.001,16,128\n' > "$work/bad_attention.csv"
expect_error "bad attention pass" "bad_attention.csv:2" \
  calibrate --nccl-tests data/profiles/h200_8gpu_nccl_tests.csv --attention "$work/bad_attention.csv"

finish calibrate
