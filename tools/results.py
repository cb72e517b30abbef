#!/usr/bin/python3
"""Reruns every scenario and writes docs/RESULTS.md with its tables and plots.

    /usr/bin/python3 tools/results.py [--ballast build/tools/ballast] [--jobs N]
                                      [--out docs] [--only TEXT]

Runs `ballast compare --scenario NAME --format json --plot docs/results/NAME.svg` for
every scenario of `ballast list scenarios` (data/scenarios.json), `ballast compare
--cluster NAME` (the default workload) on every other cluster preset, `ballast compare
--dataset D --cluster NAME` for every other bundled dataset on every preset, and `ballast
simulate --scenario NAME --strategy S --steps 1 --plot ...png` for the best strategy and
the baseline of a few representative scenarios; then writes docs/results/results.csv,
docs/results/results.json and docs/RESULTS.md. Needs matplotlib
(sudo apt-get install python3-matplotlib). `--only TEXT` keeps the runs whose name
contains TEXT (for trying the script; the page then lists only those). Progress goes to
stderr when it is a terminal, nothing otherwise. The FlexSP MILP scenarios take most
of the time (10-30 s per step).
"""

import argparse
import csv
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

# Scenarios whose first step is drawn as a timeline (best strategy, baseline, and any
# strategy listed): the default workload, Zeppelin's largest gain, FlexSP's SP = 64 setting.
TIMELINE_SCENARIOS = {"default": ["zeppelin"], "zeppelin-h200-3b-wlbllm": ["zeppelin"],
                      "flexsp-7b-384k": []}

# The papers' published headlines, as docs/flexsp.md and docs/zeppelin.md quote them
# (from ../shared/docs/SYSTEMS.md sections 2 and 3).
FLEXSP_HEADLINE = ("FlexSP (ASPLOS'25) reports up to 1.72x over DeepSpeed-Ulysses (and up to 1.98x "
                   "over Megatron-LM) on GitHub, CommonCrawl and Wikipedia "
                   "([flexsp.md](flexsp.md))")
ZEPPELIN_HEADLINE = ("Zeppelin (EuroSys'26) reports 2.80x over TE CP on average, up to 6.60x, on its "
                     "own datasets, clusters and models with tensor parallelism "
                     "([zeppelin.md](zeppelin.md))")
ZEPPELIN_SCALE_HEADLINE = ("Zeppelin (EuroSys'26) studies scaling from 16 to 128 GPUs; its headline is "
                           "2.80x over TE CP on average, up to 6.60x ([zeppelin.md](zeppelin.md))")
NO_HEADLINE = None  # ballast's own settings

# Which strategy each family's headline is about, and its baseline.
FAMILY_STRATEGY = {"flexsp": "flexsp", "zeppelin": "zeppelin", "zeppelin-cp16": "zeppelin",
                   "zeppelin-tp": "zeppelin"}


class Progress:
    """One rewritten status line on stderr, only when stderr is a terminal."""

    def __init__(self, total):
        self.enabled = sys.stderr.isatty()
        self.total = total
        self.done = 0
        self.running = set()
        self.start = time.monotonic()
        self.lock = threading.Lock()

    def update(self, started=None, finished=None):
        with self.lock:
            if started:
                self.running.add(started)
            if finished:
                self.running.discard(finished)
                self.done += 1
            if self.enabled:
                elapsed = time.monotonic() - self.start
                running = ", ".join(sorted(self.running))
                sys.stderr.write(f"\r\033[Kresults: {self.done}/{self.total} done, "
                                 f"{elapsed:.0f} s; running {running}"[:160])
                sys.stderr.flush()

    def clear(self):
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def slug(text):
    return re.sub(r"[^A-Za-z0-9.-]+", "-", text).strip("-")


def blas_environment():
    """The environment the runs get: OpenBLAS pinned to its Haswell kernels on a CPU with
    AVX2 (any x86-64 from 2013 on; the caller's OPENBLAS_CORETYPE wins). flexsp's MILP
    factorises through LAPACK, and OpenBLAS picks its kernels by the CPU it runs on, whose
    sums differ in the last bits: the default scenario's flexsp step was 2.15605 s with the
    Haswell kernels and 2.15749 s with SkylakeX's (docs/results.md), so without the pin the
    page depended on the machine that wrote it. None on a CPU without AVX2 (its kernels
    would not run), where the page notes it."""
    env = dict(os.environ)
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            avx2 = any(line.startswith("flags") and " avx2" in line for line in cpuinfo)
    except OSError:
        avx2 = False
    if avx2:
        env.setdefault("OPENBLAS_CORETYPE", "Haswell")
    return env


BLAS_ENVIRONMENT = blas_environment()


def run(command):
    """Runs a ballast command; returns (stdout, wall seconds); raises with its stderr."""
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=BLAS_ENVIRONMENT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout, time.monotonic() - start


def family_of(name):
    if name.startswith("flexsp-"):
        return "flexsp"
    if name.startswith("zeppelin-scale-"):
        return "zeppelin-scale"
    if name.startswith("zeppelin-") and name.endswith("-cp16"):
        return "zeppelin-cp16"  # the paper's TE CP set-up: rings of 16 GPUs
    if name.startswith("zeppelin-") and re.search(r"-tp[0-9]+$", name):
        return "zeppelin-tp"  # the paper's 13B and 30B with tensor parallelism
    if name.startswith("zeppelin-"):
        return "zeppelin"
    return "other"


def headline_of(name):
    return {"flexsp": FLEXSP_HEADLINE, "zeppelin": ZEPPELIN_HEADLINE,
            "zeppelin-cp16": ZEPPELIN_HEADLINE, "zeppelin-tp": ZEPPELIN_HEADLINE,
            "zeppelin-scale": ZEPPELIN_SCALE_HEADLINE}.get(family_of(name), NO_HEADLINE)


def best_row(result):
    rows = [r for r in result["results"] if not r["error"]]
    return min(rows, key=lambda r: r["step_time_s"]) if rows else None


def row_of(result, strategy):
    return next((r for r in result["results"] if r["strategy"] == strategy and not r["error"]), None)


def speedup_text(row):
    """The row's speedup, or n/a when the baseline could not run (speedup null)."""
    return "n/a" if row["speedup"] is None else f"{row['speedup']:.2f}x"


def table(result):
    lines = ["| strategy | step (s) | lower bound (s) | gap | speedup | imbalance | exposed comm |",
             "|---|---|---|---|---|---|---|"]
    for r in result["results"]:
        if r["error"]:
            lines.append(f"| `{r['strategy']}` | cannot run: {r['error'].split(';')[0]} | | | | | |")
            continue
        lines.append(f"| `{r['strategy']}` | {r['step_time_s']:.3f} | {r['lower_bound_s']:.3f} | "
                     f"{100 * r['gap_to_lower_bound']:.1f}% | {speedup_text(r)} | "
                     f"{r['imbalance']:.2f} | {100 * r['exposed_comm_fraction']:.1f}% |")
    return "\n".join(lines)


def ours_vs_headline(name, result):
    """One sentence: the strategy the paper is about against the paper's baseline."""
    strategy = FAMILY_STRATEGY.get(family_of(name).removesuffix("-scale"))
    baseline = result["settings"]["baseline"]
    if strategy:
        row = row_of(result, strategy)
        if row:
            return (f"ballast: `{strategy}` {speedup_text(row)} over `{baseline}` "
                    f"({row['gap_to_lower_bound'] * 100:.0f}% above the lower bound)")
    best = best_row(result)
    if best is None:
        return "ballast: no strategy could run"
    return (f"ballast: best `{best['strategy']}`, {speedup_text(best)} over `{baseline}` "
            f"({best['gap_to_lower_bound'] * 100:.0f}% above the lower bound)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ballast", default="build/tools/ballast")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="docs", help="writes OUT/RESULTS.md and OUT/results/")
    parser.add_argument("--only", default="", help="run only the names that contain this text")
    args = parser.parse_args()
    script_start = time.monotonic()
    ballast = args.ballast
    results_dir = os.path.join(args.out, "results")
    os.makedirs(results_dir, exist_ok=True)

    listing, _ = run([ballast, "list", "scenarios"])
    scenarios = {}
    for line in listing.splitlines()[1:]:
        name, _, description = line.strip().partition(" ")
        scenarios[name] = description.strip()
    clusters_listing, _ = run([ballast, "list", "clusters"])
    clusters = [line.split()[0] for line in clusters_listing.splitlines()[1:]]

    # (label, ballast compare arguments, description)
    compares = [(name, ["--scenario", name], description) for name, description in scenarios.items()]
    default_cluster = "h100"  # the default scenario already runs it
    compares += [(f"default-{cluster}", ["--cluster", cluster],
                  f"The default workload (wlbllm, LLaMA-2-7B, 1 Mi tokens per step, every "
                  f"strategy) on the `{cluster}` preset.")
                 for cluster in clusters if cluster != default_cluster]
    # Issue 21's other target set: a batch of every bundled dataset but the default's on every
    # preset, with the default workload's other settings (LLaMA-2-7B, 1 Mi tokens per step).
    datasets_listing, _ = run([ballast, "list", "datasets"])
    datasets = [line.split()[0] for line in datasets_listing.splitlines()[1:]]
    default_dataset = "wlbllm"  # the default workload's, on every preset above
    compares += [(f"dataset-{dataset}-{cluster}", ["--dataset", dataset, "--cluster", cluster],
                  f"The default workload's settings (LLaMA-2-7B, 1 Mi tokens per step, every "
                  f"strategy) with `{dataset}` documents on the `{cluster}` preset.")
                 for dataset in datasets if dataset != default_dataset for cluster in clusters]
    compares = [c for c in compares if args.only in c[0]]

    progress = Progress(len(compares))

    def compare(job):
        label, extra, _ = job
        progress.update(started=label)
        plot = os.path.join(results_dir, f"{slug(label)}.svg")
        out, wall_s = run([ballast, "compare", *extra, "--format", "json", "--plot", plot])
        progress.update(finished=label)
        return label, json.loads(out), wall_s, plot

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        ran = list(pool.map(compare, compares))
    results = {label: result for label, result, _, _ in ran}
    walls = {label: wall for label, _, wall, _ in ran}
    plots = {label: plot for label, _, _, plot in ran}

    timeline_jobs = []
    for name, extra in TIMELINE_SCENARIOS.items():
        if name not in results:
            continue
        best = best_row(results[name])
        baseline = results[name]["settings"]["baseline"]
        for strategy in dict.fromkeys([best["strategy"], baseline, *extra]):
            timeline_jobs.append((name, strategy))
    progress.total += len(timeline_jobs)

    def timeline(job):
        name, strategy = job
        label = f"{name} {strategy}"
        progress.update(started=label)
        plot = os.path.join(results_dir, f"timeline-{slug(name)}-{slug(strategy)}.png")
        _, wall_s = run([ballast, "simulate", "--scenario", name, "--strategy", strategy,
                         "--steps", "1", "--plot", plot])
        progress.update(finished=label)
        return name, strategy, plot, wall_s

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        timelines = list(pool.map(timeline, timeline_jobs))
    progress.clear()

    write_data(results_dir, results)
    total_s = time.monotonic() - script_start
    write_page(args, scenarios, compares, results, walls, plots, timelines, total_s)
    print(f"wrote {os.path.join(args.out, 'RESULTS.md')} and {len(plots) + len(timelines)} plots "
          f"in {results_dir} ({total_s:.0f} s)")


def write_data(results_dir, results):
    """results.csv (one row per scenario and strategy) and results.json; planner
    latencies are left out so that a rerun gives identical files."""
    fields = ["step_time_s", "lower_bound_s", "gap_to_lower_bound", "speedup", "imbalance",
              "exposed_comm_fraction", "peak_memory_bytes", "micro_batches", "error"]
    with open(os.path.join(results_dir, "results.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["scenario", "strategy", *fields])
        for label, result in results.items():
            for row in result["results"]:
                writer.writerow([label, row["strategy"], *[row[k] for k in fields]])
    stable = {}
    for label, result in results.items():
        copy = json.loads(json.dumps(result))
        for row in copy["results"]:
            row.pop("plan_time_ms", None)
        stable[label] = copy
    with open(os.path.join(results_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(stable, f, indent=1)
        f.write("\n")


def ballast_figures(result):
    """(ballast's row, the best other strategy's row, the better of flexsp-fast and
    zeppelin's rows) of one compare; None for a row that is missing or could not run."""
    rows = {r["strategy"]: r for r in result["results"] if not r["error"]}
    ours = rows.get("ballast")
    others = [r for name, r in rows.items() if name != "ballast"]
    best_other = min(others, key=lambda r: r["step_time_s"]) if others else None
    pair = [rows[name] for name in ("flexsp-fast", "zeppelin") if name in rows]
    better_seed = min(pair, key=lambda r: r["step_time_s"]) if pair else None
    return ours, best_other, better_seed


def write_ballast_section(add, compares, results, jobs):
    """Issue 21's table: per run, the best other strategy, ballast, their ratio, ballast's
    gap to the lower bound and its planning time; then the targets' summary figures."""
    add("## The ballast strategy against the best other")
    add("")
    add("Per run: the fastest strategy other than `ballast` and its step, `ballast`'s step, "
        "their ratio (ballast / best other; at most 1.005 is the target), `ballast`'s gap to the "
        "lower bound (target: under 10% on average), its speedup over the better of "
        "`flexsp-fast` and `zeppelin` (target: geometric mean at least 1.10x) and its planning "
        f"time per step, as `ballast compare` measured it (`plan_time_ms`, with `--jobs {jobs}` on a "
        "machine other jobs may share: a rough figure, not a benchmark; "
        "`bench/bench_planners` is the benchmark).")
    add("")
    add("| run | best other | its step (s) | ballast (s) | ratio | gap | over flexsp-fast/zeppelin | plan time (ms) |")
    add("|---|---|---|---|---|---|---|---|")
    ratios, gaps, speedups, ceilings, plan_ms, missing = [], [], [], [], [], []
    for label, _, _ in compares:
        ours, best_other, better_seed = ballast_figures(results[label])
        if ours is None or best_other is None:
            missing.append(label)
            add(f"| [{label}](#{slug(label).lower()}) | | | cannot compare | | | | |")
            continue
        ratio = ours["step_time_s"] / best_other["step_time_s"]
        ratios.append((ratio, label))
        gaps.append(ours["gap_to_lower_bound"])
        speedup = better_seed["step_time_s"] / ours["step_time_s"] if better_seed else None
        speedups.append(speedup)  # None where neither flexsp-fast nor zeppelin ran
        # What a plan at the lower bound would reach: no plan beats the bound, so no
        # strategy's speedup over the better of the two can exceed this.
        ceilings.append(better_seed["step_time_s"] / ours["lower_bound_s"]
                        if better_seed and ours["lower_bound_s"] > 0 else None)
        plan = ours.get("plan_time_ms")
        plan_ms.append(plan)
        add(f"| [{label}](#{slug(label).lower()}) | `{best_other['strategy']}` | "
            f"{best_other['step_time_s']:.3f} | {ours['step_time_s']:.3f} | {ratio:.3f} | "
            f"{100 * ours['gap_to_lower_bound']:.1f}% | "
            f"{'-' if speedup is None else f'{speedup:.3f}x'} | "
            f"{'-' if plan is None else f'{plan:.0f}'} |")
    add("")
    summarize(add, ratios, gaps, speedups, ceilings, plan_ms, "")  # the lists are per run, aligned
    dataset_runs = {label for label, _, _ in compares if label.startswith("dataset-")}
    if dataset_runs and len(dataset_runs) < len(ratios):
        for title, keep in (("the scenarios and the default workload's runs",
                             lambda label: label not in dataset_runs),
                            ("every other dataset on every preset", lambda label: label in dataset_runs)):
            kept = [i for i, (_, label) in enumerate(ratios) if keep(label)]
            add("")
            summarize(add, [ratios[i] for i in kept], [gaps[i] for i in kept],
                      [speedups[i] for i in kept], [ceilings[i] for i in kept],
                      [plan_ms[i] for i in kept], f" of {title}")
    if missing:
        add("")
        add(f"No comparison (ballast or every other strategy could not run): {', '.join(missing)}.")
    add("")


def summarize(add, ratios, gaps, speedups, ceilings, plan_ms, of_what):
    """The targets' summary sentence over these runs (per-run lists; None: not reported),
    with the speedup's ceiling: the better of flexsp-fast and zeppelin over the lower bound
    (what ballast would reach with a step at the bound on every run)."""
    speedups = [s for s in speedups if s is not None]
    ceilings = [c for c in ceilings if c is not None]
    plan_ms = [p for p in plan_ms if p is not None]
    if ratios:
        worst, worst_label = max(ratios)
        within = sum(1 for r, _ in ratios if r <= 1.005)
        geomean = statistics.geometric_mean(speedups) if speedups else None
        geomean_text = "-" if geomean is None else f"{geomean:.3f}x"
        plan_text = (f"median {statistics.median(plan_ms):.0f} ms, largest {max(plan_ms):.0f} ms"
                     if plan_ms else "not reported")
        add(f"Over {len(ratios)} runs{of_what}: `ballast` is within 1.005x of the best other strategy on "
            f"{within} (worst {worst:.3f}x, {worst_label}); geometric-mean speedup over the better "
            f"of `flexsp-fast` and `zeppelin` {geomean_text} (target 1.10x); mean gap to the lower "
            f"bound {100 * sum(gaps) / len(gaps):.1f}% (target under 10%); planning time per step "
            f"{plan_text}.")
        if ceilings:
            ceiling = statistics.geometric_mean(ceilings)
            under = sum(1 for c in ceilings if c < 1.10)
            add("")
            add(f"A step at the lower bound on every one of these runs would make that speedup "
                f"{ceiling:.3f}x (the better of `flexsp-fast` and `zeppelin` over the bound, geometric "
                f"mean; no plan beats the bound), and on {under} of the {len(ceilings)} runs even that "
                f"is under 1.10x: those two already run within 10% of the bound there.")


def relative(path, out):
    return os.path.relpath(path, out)


def write_page(args, scenarios, compares, results, walls, plots, timelines, total_s):
    out = args.out
    lines = []
    add = lines.append
    add("# Results: every scenario, rerun")
    add("")
    add("<!-- Generated by tools/results.py; edit the script, not this file. -->")
    add("")
    add("Generated by one script, which reruns every scenario of `ballast list scenarios` "
        "(`data/scenarios.json`), the default workload on every cluster preset and its "
        "settings with every other bundled dataset on every preset, draws one "
        "compare plot per run and the first step's timeline of a few, and writes this page. "
        "Every figure is simulated and deterministic; the hand-written reading of these results "
        "is in [results.md](results.md), [flexsp.md](flexsp.md) and [zeppelin.md](zeppelin.md).")
    add("")
    add("Regenerate (builds `build/tools/ballast` first; needs `python3-matplotlib`):")
    add("")
    add("```sh")
    add("scripts/build && /usr/bin/python3 tools/results.py --jobs 2")
    add("```")
    add("")
    minutes, seconds = divmod(round(total_s), 60)
    compare_s = sum(walls.values())
    milp_s = sum(wall for label, wall in walls.items() if family_of(label) == "flexsp")
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_minutes, cpu_seconds = divmod(round(children.ru_utime + children.ru_stime), 60)
    add(f"This run took {minutes} min {seconds:02d} s of wall time and {cpu_minutes} min "
        f"{cpu_seconds:02d} s of CPU time with `--jobs {args.jobs}` on a {os.cpu_count()}-core "
        f"machine (15-minute load average {os.getloadavg()[2]:.1f} at the end: other jobs shared "
        f"it): {len(compares)} compares ({compare_s:.0f} s of compare wall time in all, "
        f"{milp_s:.0f} s of it in the `flexsp-*` scenarios, whose MILP plans each step in "
        f"10-30 s) and {len(timelines)} timelines. Each section below names the command that "
        "reruns it alone.")
    add("")
    coretype = BLAS_ENVIRONMENT.get("OPENBLAS_CORETYPE")
    add("OpenBLAS kernels: " + (f"`OPENBLAS_CORETYPE={coretype}` (the script pins Haswell's on "
                                "a CPU with AVX2, so flexsp's MILP, which factorises through "
                                "LAPACK, gives the same plans on any such machine; the other "
                                "strategies use no BLAS)." if coretype else
                                "the CPU's own (it has no AVX2, so the script could not pin "
                                "Haswell's): flexsp's MILP rows may differ in the last digits "
                                "from a page written on another machine."))
    add("")
    add("Tables: mean over the scenario's steps (4 unless it says otherwise); gap = step / lower "
        "bound - 1; speedup = baseline step / step; imbalance = max / mean busy time; exposed "
        "comm = communication not hidden by compute, share of rank-time (docs/compare-schema.md). "
        "Plots: bars are step times, the dashed line the lower bound, labels the speedup.")
    add("")

    add("## Summary")
    add("")
    add("| run | best strategy | its step (s) | its speedup | the paper's strategy | published headline |")
    add("|---|---|---|---|---|---|")
    for label, _, _ in compares:
        result = results[label]
        best = best_row(result)
        family = family_of(label)
        paper = {"flexsp": "FlexSP: up to 1.72x over DeepSpeed-Ulysses",
                 "zeppelin": "Zeppelin: 2.80x mean, up to 6.60x over TE CP",
                 "zeppelin-cp16": "Zeppelin: 2.80x mean, up to 6.60x over TE CP",
                 "zeppelin-tp": "Zeppelin: 2.80x mean, up to 6.60x over TE CP",
                 "zeppelin-scale": "Zeppelin: scaling 16-128 GPUs"}.get(family, "none")
        strategy = FAMILY_STRATEGY.get(family.removesuffix("-scale"))
        row = row_of(result, strategy) if strategy else None
        ours = f"`{strategy}` {speedup_text(row)}" if row else "-"
        if best:
            add(f"| [{label}](#{slug(label).lower()}) | `{best['strategy']}` | "
                f"{best['step_time_s']:.3f} | {speedup_text(best)} | {ours} | {paper} |")
        else:
            add(f"| [{label}](#{slug(label).lower()}) | none could run | | | {ours} | {paper} |")
    zeppelin = [row_of(results[l], "zeppelin") for l, _, _ in compares if family_of(l) == "zeppelin"]
    zeppelin = [r["speedup"] for r in zeppelin if r and r["speedup"] is not None]
    if zeppelin:
        add("")
        add(f"Zeppelin over TE CP (`static-cp` at each scenario's degree) in the {len(zeppelin)} "
            "`zeppelin-*` scenarios: mean "
            f"{sum(zeppelin) / len(zeppelin):.2f}x, {min(zeppelin):.2f}-{max(zeppelin):.2f}x "
            "(published: 2.80x mean, up to 6.60x).")
    flexsp = [row_of(results[l], "flexsp") for l, _, _ in compares if family_of(l) == "flexsp"]
    flexsp = [r["speedup"] for r in flexsp if r and r["speedup"] is not None]
    if flexsp:
        add(f"FlexSP's MILP over DeepSpeed-Ulysses in the {len(flexsp)} `flexsp-*` scenarios: "
            f"{min(flexsp):.2f}-{max(flexsp):.2f}x (published: up to 1.72x over DeepSpeed-Ulysses).")
    add("")

    write_ballast_section(add, compares, results, args.jobs)

    if timelines:
        add("## Timelines")
        add("")
        add("The first step of a few scenarios, best strategy and baseline (`ballast simulate "
            "--scenario NAME --strategy S --steps 1 --plot FILE.png`). One row per rank (node in "
            "brackets, gray lines between nodes); bars are compute coloured by what it serves "
            "(linear modules, or attention by scheme and tier: local, ring inside a node or across "
            "nodes, Ulysses, all-gather); the thin band under each bar is the rank's communication, "
            "pale where its own compute hides it and full colour where exposed; gaps are idle; "
            "black ticks are micro-batch boundaries; the red rank finishes its compute last and "
            "so sets the step, which ends with the gradient sync.")
        add("")
        for name, strategy, plot, wall_s in timelines:
            add(f"### {name}: `{strategy}`")
            add("")
            add(f"`ballast simulate --scenario {name} --strategy {strategy} --steps 1 --plot "
                f"{os.path.basename(plot)}` ({wall_s:.1f} s)")
            add("")
            add(f"![{name} {strategy} timeline]({relative(plot, out)})")
            add("")

    sections = [("Default workload on every cluster preset", lambda l: l == "default" or l.startswith("default-")),
                ("FlexSP's evaluation", lambda l: family_of(l) == "flexsp"),
                ("Zeppelin's evaluation", lambda l: family_of(l) == "zeppelin"),
                ("Zeppelin's scaling study", lambda l: family_of(l) == "zeppelin-scale"),
                ("Zeppelin's setting with TE CP on 16-GPU rings",
                 lambda l: family_of(l) == "zeppelin-cp16"),
                ("Zeppelin's 13B and 30B with tensor parallelism",
                 lambda l: family_of(l) == "zeppelin-tp"),
                ("Every bundled dataset on every cluster preset", lambda l: l.startswith("dataset-")),
                ("Other scenarios", lambda l: family_of(l) == "other" and not l.startswith(("default", "dataset-")))]
    for title, keep in sections:
        chosen = [c for c in compares if keep(c[0])]
        if not chosen:
            continue
        add(f"## {title}")
        add("")
        for label, extra, description in chosen:
            result = results[label]
            add(f"### {label}")
            add("")
            add(description)
            add("")
            workload = result["workload"]
            add(f"`ballast compare {' '.join(extra)}` ({walls[label]:.1f} s): "
                f"{result['settings']['cluster_description']}, model {result['settings']['model']}, "
                f"{workload['sequences_per_step']:.0f} sequences / {workload['tokens_per_step']:,.0f} "
                f"tokens per step, {result['settings']['steps']} steps.")
            add("")
            add(table(result))
            add("")
            headline = headline_of(label)
            published = f"Published: {headline}." if headline else "No published counterpart (ballast's own setting)."
            add(f"{published} {ours_vs_headline(label, result)}.")
            add("")
            add(f"![{label}]({relative(plots[label], out)})")
            add("")

    add("## Generated files")
    add("")
    add(f"In `{os.path.join(out, 'results')}/`, written by this script: "
        "`results.csv` (one row per run and strategy), `results.json` (every compare's JSON, "
        "planner latencies left out), and these plots:")
    add("")
    all_plots = [plots[label] for label, _, _ in compares] + [p for _, _, p, _ in timelines]
    total_bytes = 0
    for plot in all_plots:
        size = os.path.getsize(plot)
        total_bytes += size
        add(f"- `{os.path.basename(plot)}` ({size / 1024:.0f} KiB)")
    add("")
    add(f"{len(all_plots)} plots, {total_bytes / 2**20:.1f} MiB in all.")
    add("")
    with open(os.path.join(out, "RESULTS.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
