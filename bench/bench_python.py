"""Import and planning latency of the Python module (docs/python.md, "Latency").

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_python.py [--repeats N]

Prints the median wall time of a cold `import ballast` (a fresh interpreter each time,
minus a bare interpreter's start), of plan() for a 512-sequence global batch per strategy
on 64 GPUs (8 x 8 H100, LLaMA-7B, WLB-LLM lengths), of the per-rank views and of
simulate(). Figures only; nothing here passes or fails.
"""

import argparse
import statistics
import subprocess
import sys
import time

import ballast


def progress(text):
    """A status line on stderr, rewritten in place, only when stderr is a terminal."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\033[K{text}" if text else "\r\033[K")
        sys.stderr.flush()


def median_s(function, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sequences", type=int, default=512)
    args = parser.parse_args()

    progress("bench_python: timing imports")
    bare = median_s(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), args.repeats)
    with_ballast = median_s(lambda: subprocess.run([sys.executable, "-c", "import ballast"], check=True),
                            args.repeats)
    with_torch_glue = median_s(
        lambda: subprocess.run([sys.executable, "-c", "import ballast.torch"], check=True), 3)
    progress("")
    print(f"import ballast: {1e3 * (with_ballast - bare):.1f} ms "
          f"(interpreter start {1e3 * bare:.1f} ms excluded)")
    print(f"import ballast.torch (imports torch): {1e3 * (with_torch_glue - bare):.0f} ms")

    [lengths] = ballast.sample_batches("wlbllm", batch_size=args.sequences, seed=0)
    print(f"batch: {len(lengths)} sequences, {int(lengths.sum()):,} tokens, longest {int(lengths.max()):,}; "
          "cluster h100 (8 x 8 GPUs), model llama-7b")
    print(f"{'strategy':<16} {'plan ms':>9} {'64 rank views ms':>17} {'simulate ms':>12} {'micro-batches':>14}")
    strategies = ["packed-dp", "static-cp", "batch-adaptive", "hybrid-dp", "flexsp-fast", "zeppelin"]
    for index, strategy in enumerate(strategies):
        progress(f"bench_python: timing {strategy} ({index + 1}/{len(strategies)})")
        try:
            plan = ballast.plan(lengths, cluster="h100", model="llama-7b", strategy=strategy)
        except ballast.PlanningError as error:
            progress("")
            print(f"{strategy:<16} cannot run this batch: {str(error).split(':')[0]}")
            continue
        plan_s = median_s(lambda: ballast.plan(lengths, cluster="h100", model="llama-7b", strategy=strategy),
                          args.repeats)
        views_s = median_s(lambda: [plan.rank(r) for r in range(plan.ranks)], args.repeats)
        simulate_s = median_s(lambda: ballast.simulate(plan), args.repeats)
        progress("")
        print(f"{strategy:<16} {1e3 * plan_s:>9.1f} {1e3 * views_s:>17.1f} {1e3 * simulate_s:>12.1f} "
              f"{plan.num_micro_batches:>14}")


if __name__ == "__main__":
    main()
