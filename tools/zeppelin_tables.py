#!/usr/bin/python3
"""Reruns the zeppelin-* scenarios and prints the Markdown tables of docs/zeppelin.md.

Usage: /usr/bin/python3 tools/zeppelin_tables.py [PATH/TO/ballast] [--jobs N]
(default binary: build/tools/ballast). Every figure comes from `ballast compare
--scenario NAME --format json`; the ablation ladder adds `--ablation`. TE CP is each
scenario's baseline row (static-cp at the degree the scenario names).
"""
import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

jobs_at = sys.argv.index("--jobs") + 1 if "--jobs" in sys.argv else None
jobs = int(sys.argv[jobs_at]) if jobs_at is not None else 2
# The binary: the first argument that is neither an option nor --jobs' value.
ballast = next((a for i, a in enumerate(sys.argv[1:], 1) if not a.startswith("--") and i != jobs_at),
               "build/tools/ballast")


finished = []


def progress(text):
    """A status line on stderr, rewritten in place, only when stderr is a terminal."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\033[K{text}" if text else "\r\033[K")
        sys.stderr.flush()


def compare(*args):
    start = time.monotonic()
    out = subprocess.run([ballast, "compare", "--format", "json", *args], check=True,
                         capture_output=True, text=True).stdout
    result = json.loads(out)
    result["wall_s"] = time.monotonic() - start
    finished.append(args)
    progress(f"zeppelin_tables: {len(finished)}/{total} compares done ({' '.join(args)})")
    return result


def rows_by_strategy(result):
    """Rows by strategy name (a spec's part before ':', e.g. static-cp:degree=8 -> static-cp;
    the first row of each name), and "baseline" for the scenario's baseline row."""
    rows = {}
    for row in result["results"]:
        rows.setdefault(row["strategy"].split(":")[0], row)
        if row["strategy"] == result["settings"]["baseline"]:
            rows["baseline"] = row
    return rows


def fmt_time(row):
    return "n/a" if row["error"] else f"{row['step_time_s']:.3f}"


def fmt_speedup(row):
    """n/a when the strategy or the baseline could not run (speedup null)."""
    return "n/a" if row["speedup"] is None else f"{row['speedup']:.2f}x"


def fmt_figure(value, spec, scale=1, unit=""):
    """A figure (times scale, then unit), or n/a where the strategy could not run (null)."""
    return "n/a" if value is None else format(scale * value, spec) + unit


listing = subprocess.run([ballast, "list", "scenarios"], check=True, capture_output=True,
                         text=True).stdout
names = [line.split()[0] for line in listing.splitlines()
         if line.strip().startswith("zeppelin-")]
main = [n for n in names if not n.startswith("zeppelin-scale-") and not n.endswith("-cp16")
        and not re.search(r"-tp[0-9]+$", n)  # tensor parallelism: docs/zeppelin.md's own TP tables
        and "-h800-" not in n]  # cluster B runs no LLaMA CP: in the gap split and RESULTS.md only
scale = [n for n in names if n.startswith("zeppelin-scale-")]
rings16 = [n for n in names if n.endswith("-cp16")]
total = len(names) + 1  # and the ablation ladder

with ThreadPoolExecutor(max_workers=jobs) as pool:
    results = dict(zip(names, pool.map(lambda n: compare("--scenario", n), names)))
    ladder = pool.submit(compare, "--scenario", "zeppelin-a800-13b-wlbllm", "--ablation").result()
progress("")

strategies = ["static-cp", "static-cp-allgather", "hybrid-dp", "zeppelin"]
print("### Scenarios (64 GPUs, 512 Ki tokens per step, 128K context, mean of 4 steps)\n")
print("| scenario | TE CP (s) | LLaMA CP | Hybrid DP | Zeppelin (s) | Zeppelin speedup | bound (s) | imbalance TE CP -> Zeppelin | plan (ms) |")
print("|---|---|---|---|---|---|---|---|---|")
speedups = []
for name in main:
    rows = rows_by_strategy(results[name])
    z, te = rows["zeppelin"], rows["baseline"]  # TE CP at the scenario's degree
    if z["speedup"] is not None:
        speedups.append(z["speedup"])
    print(f"| {name} | {fmt_time(te)} | {fmt_speedup(rows['static-cp-allgather'])} | "
          f"{fmt_speedup(rows['hybrid-dp'])} | {fmt_time(z)} | {fmt_speedup(z)} | "
          f"{fmt_figure(z['lower_bound_s'], '.3f')} | {fmt_figure(te['imbalance'], '.2f')} -> "
          f"{fmt_figure(z['imbalance'], '.2f')} | {fmt_figure(z['plan_time_ms'], '.1f')} |")
if speedups:
    mean = sum(speedups) / len(speedups)
    print(f"\nZeppelin over TE CP: mean {mean:.2f}x, min {min(speedups):.2f}x, "
          f"max {max(speedups):.2f}x over {len(speedups)} scenarios.\n")

print("### Ablation ladder (zeppelin-a800-13b-wlbllm)\n")
print("| strategy | step (s) | speedup over TE CP | imbalance | exposed comm |")
print("|---|---|---|---|---|")
for row in ladder["results"]:
    print(f"| `{row['strategy']}` | {fmt_time(row)} | {fmt_speedup(row)} | "
          f"{fmt_figure(row['imbalance'], '.2f')} | "
          f"{fmt_figure(row['exposed_comm_fraction'], '.1f', 100, '%')} |")

print("\n### Scaling on cluster A (LLaMA-7B, ProLong, 8 Ki tokens per GPU)\n")
print("| GPUs | TE CP (s) | Hybrid DP (s) | Zeppelin (s) | speedup | plan (ms) |")
print("|---|---|---|---|---|---|")
for name in scale:
    rows = rows_by_strategy(results[name])
    gpus = name.split("-")[-1].removesuffix("gpu")
    print(f"| {gpus} | {fmt_time(rows['baseline'])} | {fmt_time(rows['hybrid-dp'])} | "
          f"{fmt_time(rows['zeppelin'])} | {fmt_speedup(rows['zeppelin'])} | "
          f"{fmt_figure(rows['zeppelin']['plan_time_ms'], '.1f')} |")
print("\n### TE CP on 16-GPU rings, as the paper sets it up (LLaMA-7B, ProLong window)\n")
print("| scenario | TE CP (s) | LLaMA CP | Hybrid DP | Zeppelin (s) | Zeppelin speedup | bound (s) | plan (ms) |")
print("|---|---|---|---|---|---|---|---|")
for name in rings16:
    rows = rows_by_strategy(results[name])
    z = rows["zeppelin"]
    print(f"| {name} | {fmt_time(rows['baseline'])} | {fmt_speedup(rows['static-cp-allgather'])} | "
          f"{fmt_speedup(rows['hybrid-dp'])} | {fmt_time(z)} | {fmt_speedup(z)} | "
          f"{fmt_figure(z['lower_bound_s'], '.3f')} | {fmt_figure(z['plan_time_ms'], '.1f')} |")


def gap_parts(name):
    """Zeppelin's gap to the lower bound on one scenario, split by `ballast simulate`'s
    per-rank figures, summed over its steps, each part as a share of the bound: compute
    above the bound (mean busy - bound: kernel efficiency, the bound's ideal packing),
    imbalance (max busy - mean busy), exposed communication (the rank with the most busy +
    exposed time, beyond its busy time), and the rest (waiting on other ranks, the
    gradient sync's exposed tail)."""
    out = subprocess.run([ballast, "simulate", "--scenario", name, "--strategy", "zeppelin",
                          "--format", "json"], check=True, capture_output=True, text=True).stdout
    parts = {"step": 0.0, "bound": 0.0, "compute": 0.0, "imbalance": 0.0, "exposed": 0.0,
             "rest": 0.0}
    for step in json.loads(out)["steps"]:
        ranks = step["ranks"]
        busy = [r["busy_s"] for r in ranks]
        mean_busy = sum(busy) / len(busy)
        critical = max(ranks, key=lambda r: r["busy_s"] + r["exposed_communication_s"])
        own = critical["busy_s"] + critical["exposed_communication_s"]
        parts["step"] += step["step_time_s"]
        parts["bound"] += step["lower_bound_s"]
        parts["compute"] += mean_busy - step["lower_bound_s"]
        parts["imbalance"] += max(busy) - mean_busy
        parts["exposed"] += own - max(busy)
        parts["rest"] += step["step_time_s"] - own
    return parts


with ThreadPoolExecutor(max_workers=jobs) as pool:
    gap_names = ["default"] + names  # issue 22's target: the default workload and every zeppelin-*
    gaps = dict(zip(gap_names, pool.map(gap_parts, gap_names)))
print("\n### Where zeppelin's gap to the bound goes (share of the bound, all steps)\n")
print("| scenario | gap | compute above bound | imbalance | exposed comm (slowest rank) | rest | largest |")
print("|---|---|---|---|---|---|---|")
for name in gap_names:
    g = gaps[name]
    shares = {k: g[k] / g["bound"] for k in ("compute", "imbalance", "exposed", "rest")}
    largest = max(shares, key=shares.get)
    print(f"| {name} | {100 * (g['step'] / g['bound'] - 1):.1f}% | "
          + " | ".join(f"{100 * shares[k]:.1f}%" for k in ("compute", "imbalance", "exposed", "rest"))
          + f" | {largest} |")
total = sum(r["wall_s"] for r in results.values()) + ladder["wall_s"]
print(f"\n({len(names) + 1} compares, {total:.0f} s of compare wall time.)")
