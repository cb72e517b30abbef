// Scale figures: every strategy plans and simulates 10^5-sequence batches (and a 32 Mi-token
// wlbllm batch) on 4,096 GPUs (512 nodes x 8 H100, LLaMA-2-7B). Per strategy and batch it
// prints sequences, GPUs, micro-batches, plan time, simulate time, plan JSON size and the
// peak resident memory (getrusage ru_maxrss) of a process that did only that. Figures
// only, no pass/fail (docs/hardening.md, "Limits", quotes them).
//
// Run: build/bench/bench_scale [--cases a,b] [--strategies x,y] [--timeout-s N]
// (--cases short-1M,wlbllm-100k-64Ki-gpus runs the two cases at the limits.)
// Each (batch, strategy) runs in its own forked process, so the peak RSS is its own and a
// strategy that runs past --timeout-s (default 600, CPU seconds) is reported as such.
// Times are CPU seconds of that process (wall clock in parentheses: on a shared machine
// the wall clock also counts other processes).
#include <sys/resource.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ballast/compare.hpp"
#include "ballast/error.hpp"
#include "ballast/plan.hpp"
#include "ballast/simulator.hpp"
#include "ballast/strategy.hpp"

namespace {

using namespace ballast;
using Clock = std::chrono::steady_clock;

constexpr int kNodes = 512;  // x 8 H100 = 4,096 GPUs (the default cases)

/// One batch shape: a dataset and a budget (sequences or tokens) at a context length.
struct ScaleCase {
  std::string name;
  std::string dataset;
  std::optional<std::int64_t> batch_size;
  std::optional<Tokens> tokens_per_step;
  Tokens max_context_tokens = 131072;
  int nodes = kNodes;
  bool by_default = true;  ///< false: only with --cases (the limits' scale)
};

const std::vector<ScaleCase>& all_cases() {
  static const std::vector<ScaleCase> cases = {
      // 10^5 wlbllm documents up to 128K: ~4 x 10^8 tokens, several micro-batches.
      {"wlbllm-100k", "wlbllm", 100'000, std::nullopt, 131072},
      // One 4,096 x 8 Ki-token step of wlbllm documents (~8,500 sequences).
      {"wlbllm-32Mi", "wlbllm", std::nullopt, Tokens{4096} * 8192, 131072},
      // 10^5 short Wikipedia documents (<= 4 Ki tokens; longer ones dropped).
      {"short-100k", "wikipedia", 100'000, std::nullopt, 4096},
      // At the limits, only with --cases: 10^6 sequences (kMaxBatchSequences) on 4,096
      // GPUs, and 10^5 sequences on 65,536 GPUs (kMaxRanks).
      {"short-1M", "wikipedia", 1'000'000, std::nullopt, 4096, kNodes, false},
      {"wlbllm-100k-64Ki-gpus", "wlbllm", 100'000, std::nullopt, 131072, 8192, false},
      // The planning-time target of issue 21 (docs/strategies.md, "ballast"): 8,192
      // wlbllm sequences on 1,024 GPUs; only with --cases.
      {"wlbllm-8Ki-1Ki-gpus", "wlbllm", 8192, std::nullopt, 131072, 128, false},
  };
  return cases;
}

/// CPU time of this (single-threaded) process: on a loaded machine the wall clock also
/// counts the time other processes held the cores.
double cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

/// Wall and CPU seconds since a start point.
struct Stopwatch {
  Clock::time_point wall = Clock::now();
  double cpu = cpu_seconds();
  std::string elapsed() const {
    return fmt::format("{:.2f} ({:.2f})", cpu_seconds() - cpu,
                       std::chrono::duration<double>(Clock::now() - wall).count());
  }
};

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

/// Runs one (case, strategy) and returns its table row (or why it could not run).
std::string measure(const ScaleCase& scale_case, const std::string& strategy) {
  RunSettings settings;
  settings.dataset = scale_case.dataset;
  settings.nodes = scale_case.nodes;
  settings.steps = 1;
  settings.sampler.batch_size = scale_case.batch_size;
  settings.sampler.tokens_per_step = scale_case.tokens_per_step;
  settings.sampler.max_context_tokens = scale_case.max_context_tokens;
  const RunInputs inputs = resolve_inputs(settings);
  const Batch& batch = inputs.batches.front();
  const CostModel& cost = *inputs.cost;
  const std::string head = fmt::format("| {} | {} | {} | {} |", scale_case.name, strategy,
                                       batch.lengths_tokens.size(), cost.cluster().ranks());
  try {
    const Stopwatch plan_watch;
    const Plan plan = find_planner(strategy).plan(batch, cost, {}, SimulatorEvaluator(cost));
    const std::string plan_s = plan_watch.elapsed();
    const Stopwatch simulate_watch;
    const SimulationReport report = simulate(plan, cost);
    const std::string simulate_s = simulate_watch.elapsed();
    const double rss_mib = peak_rss_mib();
    const double json_mib = static_cast<double>(plan_to_string(plan).size()) / (1024.0 * 1024.0);
    return fmt::format("{} {} | {} | {} | {:.1f} | {:.0f} | {:.0f} | {:.3f} |", head,
                       plan.micro_batches.size(), plan_s, simulate_s, json_mib, rss_mib,
                       peak_rss_mib(),
                       gap_to_lower_bound(report.step_time_s, report.lower_bound.time_s));
  } catch (const PlanningError& error) {
    std::string message = error.what();
    if (message.size() > 90) message = message.substr(0, 90) + "...";
    return fmt::format("{} PlanningError: {} | | | | | | |", head, message);
  }
}

/// Forks, runs measure() in the child under an alarm, and returns the child's row.
std::string measure_in_child(const ScaleCase& scale_case, const std::string& strategy,
                             unsigned timeout_s) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  std::fflush(stdout);
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    // SIGXCPU ends the child after timeout_s CPU seconds; the parent reports it.
    const rlimit cpu_limit{timeout_s, timeout_s + 5};
    setrlimit(RLIMIT_CPU, &cpu_limit);
    std::string row;
    try {
      row = measure(scale_case, strategy);
    } catch (const std::exception& error) {
      row = fmt::format("| {} | {} | error: {} |", scale_case.name, strategy, error.what());
    }
    const ssize_t written = write(fds[1], row.data(), row.size());
    _exit(written == static_cast<ssize_t>(row.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string row;
  char buffer[4096];
  for (ssize_t got; (got = read(fds[0], buffer, sizeof buffer)) > 0;) row.append(buffer, got);
  close(fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  if (WIFSIGNALED(status)) {
    const char* why = WTERMSIG(status) == SIGXCPU ? "timed out" : strsignal(WTERMSIG(status));
    return fmt::format("| {} | {} | | {} | {} after {} CPU s | | | | | | |", scale_case.name,
                       strategy, scale_case.nodes * 8, why, timeout_s);
  }
  return row;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = text.find(',', begin);
    items.push_back(text.substr(begin, end == std::string::npos ? end : end - begin));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return items;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> strategies;
  for (const std::string& name : planner_names()) {
    // The faithful MILP takes CBC seconds per micro-batch of 10^4 sequences; name it
    // explicitly (--strategies flexsp) to measure it.
    if (name != "flexsp") strategies.push_back(name);
  }
  std::vector<std::string> case_names;
  for (const ScaleCase& scale_case : all_cases()) {
    if (scale_case.by_default) case_names.push_back(scale_case.name);
  }
  unsigned timeout_s = 600;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--strategies")
      strategies = split_list(argv[i + 1]);
    else if (flag == "--cases")
      case_names = split_list(argv[i + 1]);
    else if (flag == "--timeout-s")
      timeout_s = static_cast<unsigned>(std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: bench_scale [--cases a,b] [--strategies x,y] [--timeout-s N]\n");
      return 2;
    }
  }
  std::printf(
      "| batch | strategy | sequences | GPUs | micro-batches | plan s CPU (wall) "
      "| simulate s CPU (wall) | plan JSON MiB "
      "| peak RSS MiB (plan+simulate) | peak RSS MiB (+JSON) | gap to bound |\n"
      "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  // Progress on stderr, only when it is a terminal (logs keep just the table).
  const bool show_progress = isatty(STDERR_FILENO) != 0;
  const std::size_t runs = case_names.size() * strategies.size();
  std::size_t run = 0;
  for (const std::string& case_name : case_names) {
    for (const ScaleCase& scale_case : all_cases()) {
      if (scale_case.name != case_name) continue;
      for (const std::string& strategy : strategies) {
        if (show_progress) {
          std::fprintf(stderr, "\r\033[Kbench_scale: %s, %s (%zu of %zu)", case_name.c_str(),
                       strategy.c_str(), ++run, runs);
          std::fflush(stderr);
        }
        const std::string row = measure_in_child(scale_case, strategy, timeout_s);
        if (show_progress) std::fprintf(stderr, "\r\033[K");
        std::printf("%s\n", row.c_str());
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
