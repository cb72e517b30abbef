#!/usr/bin/env bash
# `--plot FILE` of compare and simulate (tools/plot.py, matplotlib), its errors, the trace
# categories, and progress on stderr only when it is a terminal.
# Usage: plot_test.sh PATH/TO/ballast SOURCE_DIR
# Exits 77 (ctest: skipped) after the checks that need no matplotlib when it is missing.
set -uo pipefail
ballast="$1"
source_dir="$2"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
export BALLAST_TOOLS_DIR="$source_dir/tools"
run() { local out="$1" err="$2"; shift 2; "$@" >"$out" 2>"$err"; echo $?; }
empty() { [ ! -s "$1" ] || { echo "  '$1' is not empty:" >&2; head -5 "$1" >&2; return 1; }; }
small=(--steps 1 --strategies packed-dp,static-cp,zeppelin)  # seconds, not the default's MILP

# --- errors that need no matplotlib: exit 2, one line naming the fix, before any work ---
code=$(run "$work/out" "$work/err" "$ballast" compare "${small[@]}" --plot "$work/x.pdf")
check "bad extension exits 2" test "$code" = 2
check "bad extension names the fix" has "$work/err" "use a file name ending in .svg or .png"
code=$(run "$work/out" "$work/err" "$ballast" simulate --strategy zeppelin --plot "$work/noext")
check "no extension exits 2" test "$code" = 2
code=$(run "$work/out" "$work/err" "$ballast" compare "${small[@]}" --plot "$work/no/such/dir/x.svg")
check "unwritable plot exits 2" test "$code" = 2
check "unwritable plot says so" has "$work/err" "cannot write this file"

code=$(BALLAST_PYTHON="$work/no-such-python3" run "$work/out" "$work/err" "$ballast" compare "${small[@]}" --plot "$work/x.svg")
check "missing python exits 2" test "$code" = 2
check "missing python names the package" has "$work/err" "ballast compare --plot needs python3 with matplotlib"
check "missing python says how to install" has "$work/err" "sudo apt-get install python3-matplotlib"
check "a refused --plot leaves no file behind" test ! -e "$work/x.svg"

# A BALLAST_PYTHON that runs but fails (here /bin/false) is a usage error naming it, not
# an internal error.
code=$(BALLAST_PYTHON=/bin/false run "$work/out" "$work/err" "$ballast" compare "${small[@]}" --plot "$work/x.svg")
check "failing BALLAST_PYTHON exits 2" test "$code" = 2
check "failing BALLAST_PYTHON is named" has "$work/err" "BALLAST_PYTHON=/bin/false"
check "failing BALLAST_PYTHON is no internal error" bash -c "! grep -q 'internal error' '$work/err'"
code=$(BALLAST_PYTHON="$work/no-such-python3" run "$work/out" "$work/err" "$ballast" simulate --strategy zeppelin --plot "$work/x.svg")
check "missing BALLAST_PYTHON is named" has "$work/err" "BALLAST_PYTHON=$work/no-such-python3"

# A Python without site-packages cannot import matplotlib, installed or not.
printf '#!/bin/sh\nexec /usr/bin/python3 -S "$@"\n' > "$work/python-without-site"
chmod +x "$work/python-without-site"
code=$(BALLAST_PYTHON="$work/python-without-site" run "$work/out" "$work/err" "$ballast" simulate --strategy zeppelin --plot "$work/t.svg")
check "missing matplotlib exits 2" test "$code" = 2
check "missing matplotlib names the fix" has "$work/err" "ballast simulate --plot needs matplotlib"
check "missing matplotlib says how to install" has "$work/err" "sudo apt-get install python3-matplotlib"

code=$(BALLAST_TOOLS_DIR="$work/nowhere" run "$work/out" "$work/err" "$ballast" compare "${small[@]}" --plot "$work/x.svg")
check "missing plot.py exits 2" test "$code" = 2
check "missing plot.py names BALLAST_TOOLS_DIR" has "$work/err" "BALLAST_TOOLS_DIR"

code=$(run "$work/out" "$work/err" "$ballast" simulate --plan "$work/p.json" --scenario default)
check "--plan with --scenario exits 2" test "$code" = 2

# --- trace categories (docs/simulator.md section 6) ---
code=$(run "$work/out" "$work/err" "$ballast" simulate --strategy zeppelin --cluster a800-roce --trace "$work/trace.json")
check "trace exits 0" test "$code" = 0
check "trace events carry categories" /usr/bin/python3 - "$work/trace.json" <<'PY'
import json, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
categories = {e["args"]["category"] for e in events}
assert {"linear", "gradient sync"} <= categories, categories
assert categories & {"ring intra-node", "ring inter-node", "local"}, categories
assert all(e["cat"] in ("compute", "send", "recv", "collective") for e in events)
PY

# --- simulate --scenario takes the scenario's workload ---
code=$(run "$work/scenario.json" "$work/err" "$ballast" simulate --scenario zeppelin-h200-3b-prolong --strategy zeppelin --steps 1 --format json)
check "simulate --scenario exits 0" test "$code" = 0
check "simulate --scenario runs one step" /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert len(d['steps']) == 1 and len(d['steps'][0]['ranks']) == 64" "$work/scenario.json"

# --- progress: nothing on stderr when it is not a terminal, a status line when it is ---
code=$(run "$work/out" "$work/err" "$ballast" compare --steps 2 --strategies static-cp,zeppelin)
check "compare is quiet when stderr is a file" empty "$work/err"
code=$(run "$work/out" "$work/err" "$ballast" simulate --strategy hybrid-dp --steps 2)
check "simulate is quiet when stderr is a file" empty "$work/err"
if command -v script >/dev/null; then
  script -qec "$ballast compare --steps 2 --strategies static-cp,zeppelin -o $work/tty-out.txt" /dev/null > "$work/tty" 2>&1
  check "compare shows progress on a terminal" has "$work/tty" "compare: zeppelin step 2/2"
  check "compare's table still goes to its output" has "$work/tty-out.txt" "zeppelin"
fi

if ! /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  echo "plot_test: $passed passed, $failed failed; SKIPPED the drawing checks: matplotlib is " \
       "missing (sudo apt-get install python3-matplotlib)"
  [ "$failed" -eq 0 ] && exit 77
  exit 1
fi

# --- compare --plot: valid SVG and PNG, byte-identical reruns, the usual output too ---
svg_ok() { /usr/bin/python3 -c "import sys, xml.etree.ElementTree as t; r=t.parse(sys.argv[1]).getroot(); assert r.tag.endswith('svg'), r.tag" "$1"; }
png_ok() { /usr/bin/python3 -c "import sys; d=open(sys.argv[1],'rb').read(); assert d[:8]==b'\x89PNG\r\n\x1a\n' and len(d) > 10000, len(d)" "$1"; }
code=$(run "$work/compare.json" "$work/err" "$ballast" compare "${small[@]}" --format json --plot "$work/c1.svg")
check "compare --plot svg exits 0" test "$code" = 0
check "compare --plot svg is quiet on stderr" empty "$work/err"
check "compare --plot keeps the JSON" /usr/bin/python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$work/compare.json"
check "compare svg is valid" svg_ok "$work/c1.svg"
check "compare svg marks the lower bound" has "$work/c1.svg" "lower bound"
check "compare svg labels speedups" has "$work/c1.svg" "baseline"
check "compare svg shows a strategy that cannot run" has "$work/c1.svg" "cannot run"
code=$(run "$work/out" "$work/err" "$ballast" compare "${small[@]}" --plot "$work/c2.svg")
check "compare --plot text exits 0" test "$code" = 0
check "compare --plot text says where" has "$work/out" "plot drawn to $work/c2.svg"
check "compare svg rerun is byte-identical" cmp -s "$work/c1.svg" "$work/c2.svg"
code=$(run "$work/out" "$work/err" "$ballast" compare "${small[@]}" --plot "$work/c.PNG")
check "compare --plot png exits 0" test "$code" = 0
check "compare png is valid" png_ok "$work/c.PNG"

# --- simulate --plot: the first step's per-rank timeline ---
code=$(run "$work/out" "$work/err" "$ballast" simulate --strategy zeppelin --steps 1 --plot "$work/t1.svg")
check "simulate --plot svg exits 0" test "$code" = 0
check "simulate --plot says where" has "$work/out" "timeline of step 0 drawn to"
check "timeline svg is valid" svg_ok "$work/t1.svg"
check "timeline svg has a legend" has "$work/t1.svg" "micro-batch boundary"
check "timeline svg names a tier" has "$work/t1.svg" "ring"
code=$(run "$work/out" "$work/err" "$ballast" simulate --strategy zeppelin --steps 1 --plot "$work/t2.svg")
check "timeline svg rerun is byte-identical" cmp -s "$work/t1.svg" "$work/t2.svg"
code=$(run "$work/out" "$work/err" "$ballast" simulate --strategy static-cp --steps 1 --plot "$work/t.png")
check "simulate --plot png exits 0" test "$code" = 0
check "timeline png is valid" png_ok "$work/t.png"
code=$(run "$work/out" "$work/err" "$ballast" simulate --strategy zeppelin --nodes 16 --steps 1 --plot "$work/big.svg")
check "timeline of 128 ranks exits 0" test "$code" = 0
check "timeline of 128 ranks shows 32 of them" has "$work/big.svg" "32 of 128 ranks"

finish plot_test
