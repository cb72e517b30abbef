// `ballast run`: the MPI runtime (launched under mpirun -np N, one rank per emulated GPU).
#include <mpi.h>

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "ballast/cluster.hpp"
#include "ballast/driver/host_calibration.hpp"
#include "ballast/error.hpp"
#include "ballast/runtime/mpi.hpp"
#include "ballast/driver/run.hpp"
#include "ballast/trace.hpp"
#include "commands.hpp"

namespace ballast::cli {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

/// The attention groups a run's plans held, by scheme: "local 12, ring 2 (g2)", with each
/// size's count when a scheme ran in several ("ring 5 (g2 x3, g4 x2)").
std::string groups_run_text(const driver::RunReport& report) {
  std::vector<std::string> schemes;
  for (std::size_t i = 0; i < report.groups_run.size();) {
    const std::string& scheme = report.groups_run[i].scheme;
    std::size_t end = i;
    int total = 0;
    while (end < report.groups_run.size() && report.groups_run[end].scheme == scheme) {
      total += report.groups_run[end++].groups;
    }
    std::vector<std::string> sizes;
    for (std::size_t k = i; k < end; ++k) {
      const driver::GroupsRun& groups = report.groups_run[k];
      sizes.push_back(end - i == 1 ? fmt::format("g{}", groups.ranks) : fmt::format("g{} x{}", groups.ranks, groups.groups));
    }
    const bool sized = !(end - i == 1 && report.groups_run[i].ranks == 1);
    schemes.push_back(sized ? fmt::format("{} {} ({})", scheme, total, fmt::join(sizes, ", "))
                            : fmt::format("{} {}", scheme, total));
    i = end;
  }
  return fmt::format("{}", fmt::join(schemes, ", "));
}

/// How old an ISO 8601 UTC time ("2026-12-08T00:12:41Z") is, in words ("3.2 h ago"); ""
/// when it does not parse.
std::string age_of(const std::string& utc) {
  std::tm parsed{};
  std::istringstream in(utc);
  in >> std::get_time(&parsed, "%Y-%m-%dT%H:%M:%SZ");
  if (in.fail()) return "";
  const double seconds = std::difftime(std::time(nullptr), timegm(&parsed));
  if (seconds < 0) return "";
  if (seconds < 120) return fmt::format("{:.0f} s ago", seconds);
  if (seconds < 7200) return fmt::format("{:.0f} min ago", seconds / 60);
  if (seconds < 2 * 86400) return fmt::format("{:.1f} h ago", seconds / 3600);
  return fmt::format("{:.0f} days ago", seconds / 86400);
}

/// How to measure the calibration a run used again: --recalibrate for the cache, the
/// calibrate command for a --cluster file.
std::string calibration_refresh(const driver::RunReport& report, const RunArgs& args) {
  if (args.workload.cluster) {
    return fmt::format("`mpirun -np {} ballast calibrate --host -o {}`", report.ranks, *args.workload.cluster);
  }
  return "--recalibrate";
}

/// The report's calibration line: which one, when it was measured and how to refresh it
/// (one taken while the machine was busy makes every prediction of the run too slow).
std::string calibration_line(const driver::RunReport& report, const RunArgs& args) {
  const std::string age = age_of(report.host_measured_at);
  return fmt::format("{} ({}), measured {}{}; if this host was busy then, measure it again with {}",
                     report.host_name, report.host_source,
                     report.host_measured_at.empty() ? "at an unknown time" : report.host_measured_at,
                     age.empty() ? "" : fmt::format(" ({})", age), calibration_refresh(report, args));
}

/// The first step of `report` that --check failed, or nullptr.
const driver::StepReport* failed_check(const driver::RunReport& report) {
  for (const driver::StepReport& step : report.steps) {
    if (!step.check_passed()) return &step;
  }
  return nullptr;
}

/// Why `step` of `report` failed --check.
std::string check_failure(const driver::RunReport& report, const driver::StepReport& step) {
  return fmt::format("{}: step {} differs from the single-process reference by {:.2e} ({}), over the "
                     "tolerance {:.0e} (docs/runtime.md#exactness)",
                     report.strategy, step.step, step.max_relative_error, step.worst_tensor,
                     driver::kCheckTolerance);
}

/// --check's verdict on a run, one line: pass, or the first failing step and the tolerance.
std::string check_verdict(const driver::RunReport& report) {
  double worst = 0;
  for (const driver::StepReport& step : report.steps) worst = std::max(worst, step.max_relative_error);
  if (const driver::StepReport* step = failed_check(report)) {
    return "check: FAIL: " + check_failure(report, *step);
  }
  return fmt::format("check: pass: every step within {:.0e} of the single-process reference (worst {:.2e})",
                     driver::kCheckTolerance, worst);
}

void write_text(const driver::RunReport& report, const RunArgs& args, std::ostream& out) {
  fmt::print(out, "ballast run: strategy {}, {} ranks ({} per emulated node), corpus: {}\n",
             report.strategy, report.ranks, report.gpus_per_node, report.corpus_provenance);
  fmt::print(out, "groups run: {}\n", groups_run_text(report));
  fmt::print(out, "calibration: {}\n", calibration_line(report, args));
  const driver::PredictionSummary summary = driver::summarise_prediction(report.steps);
  for (const driver::StepReport& step : report.steps) {
    fmt::print(out, "step {}: {} micro-batches, loss {:.4f}, imbalance {:.3f} (max/mean busy), step wall {:.3f} s",
               step.step, step.micro_batches, step.loss, step.imbalance, step.step_wall_s);
    if (!step.predicted_busy_s.empty()) {
      fmt::print(out, " (predicted {:.3f} s, {:+.1f}%)", step.predicted_step_s,
                 100 * (step.predicted_step_s / step.step_wall_s - 1));
    }
    if (step.max_relative_error >= 0) {
      fmt::print(out, ", max relative error vs single process {:.2e} ({}): {}", step.max_relative_error,
                 step.worst_tensor,
                 step.check_passed() ? fmt::format("pass (at most {:.0e})", driver::kCheckTolerance)
                                     : fmt::format("FAIL (over {:.0e})", driver::kCheckTolerance));
    }
    // Without any prediction the summary says why, once.
    if (!step.prediction_note.empty() && summary.predicted_steps > 0) {
      fmt::print(out, "\n  {}", step.prediction_note);
    }
    const bool predicted = !step.predicted_busy_s.empty();
    fmt::print(out, "\n  {:>4} {:>4} {:>9} {:>9} {:>7} {:>9} {:>9} {:>8} {:>10} {:>10}\n", "rank", "node",
               "busy (s)", "pred (s)", "error", "wait (s)", "wall (s)", "tokens", "intra MiB", "inter MiB");
    for (std::size_t r = 0; r < step.ranks.size(); ++r) {
      const auto& m = step.ranks[r];
      const double busy_predicted = predicted ? step.predicted_busy_s[r] : 0.0;
      fmt::print(out, "  {:>4} {:>4} {:>9.4f} {:>9} {:>7} {:>9.4f} {:>9.4f} {:>8} {:>10.2f} {:>10.2f}\n", r,
                 static_cast<int>(r) / std::max(1, report.gpus_per_node), m.busy_s,
                 predicted ? fmt::format("{:.4f}", busy_predicted) : "-",
                 predicted && m.busy_s > 0 ? fmt::format("{:+.1f}%", 100 * (busy_predicted / m.busy_s - 1)) : "-",
                 m.wait_s, m.wall_s, m.tokens, m.intra_node_bytes / kMiB, m.inter_node_bytes / kMiB);
    }
  }
  if (summary.predicted_steps == 0) {
    fmt::print(out, "prediction vs measurement over {} step(s): - ({})\n", report.steps.size(), summary.note);
  } else {
    const std::string steps =
        summary.predicted_steps == static_cast<int>(report.steps.size())
            ? fmt::format("{} step(s)", report.steps.size())
            : fmt::format("the {} of {} steps predicted", summary.predicted_steps, report.steps.size());
    fmt::print(out,
               "prediction vs measurement over {}: busy per rank and step |error| median {:.1f}%, "
               "worst {:+.1f}%; busiest rank {:.4f} s predicted vs {:.4f} s measured ({:+.1f}%); step "
               "{:.4f} s predicted vs {:.4f} s wall ({:+.1f}%)\n",
               steps, 100 * summary.busy_median_relative_error, 100 * summary.busy_worst_relative_error,
               summary.predicted_busiest_s, summary.measured_busiest_s, 100 * summary.busiest_relative_error,
               summary.predicted_step_s, summary.measured_step_s,
               100 * (summary.measured_step_s > 0 ? summary.predicted_step_s / summary.measured_step_s - 1 : 0.0));
  }
  if (args.options.check) fmt::print(out, "{}\n", check_verdict(report));
  if (!report.blas_note.empty()) fmt::print(out, "{}\n", report.blas_note);
}

nlohmann::ordered_json to_json(const driver::RunReport& report, const RunArgs& args) {
  const bool check = args.options.check;
  nlohmann::ordered_json json;
  json["schema"] = "ballast.run/1";
  json["strategy"] = report.strategy;
  json["ranks"] = report.ranks;
  json["steps"] = report.steps.size();
  json["groups_run"] = nlohmann::ordered_json::array();
  for (const driver::GroupsRun& groups : report.groups_run) {
    json["groups_run"].push_back({{"scheme", groups.scheme}, {"ranks", groups.ranks}, {"groups", groups.groups}});
  }
  json["loss"] = report.steps.empty() ? 0.0 : report.steps.back().loss;
  double worst = 0, imbalance = 0, wall = 0;
  for (const auto& step : report.steps) {
    worst = std::max(worst, step.max_relative_error);
    imbalance += step.imbalance / static_cast<double>(report.steps.size());
    wall += step.step_wall_s / static_cast<double>(report.steps.size());
  }
  if (check) {
    json["max_rel_error"] = worst;
    json["check"] = {{"tolerance", driver::kCheckTolerance}, {"passed", failed_check(report) == nullptr}};
  }
  json["imbalance"] = imbalance;
  json["step_wall_s"] = wall;
  // Without a prediction every figure of it is null (never a 0 that means unknown).
  const driver::PredictionSummary summary = driver::summarise_prediction(report.steps);
  const bool predicted = summary.predicted_steps > 0;
  const auto figure = [&](double value) { return predicted ? nlohmann::ordered_json(value) : nlohmann::ordered_json(); };
  json["predicted_step_s"] = figure(summary.predicted_step_s / std::max(1, summary.predicted_steps));
  json["prediction"] = {{"predicted_steps", summary.predicted_steps},
                        {"busy_median_relative_error", figure(summary.busy_median_relative_error)},
                        {"busy_worst_relative_error", figure(summary.busy_worst_relative_error)},
                        {"busiest_busy_s", figure(summary.measured_busiest_s)},
                        {"predicted_busiest_busy_s", figure(summary.predicted_busiest_s)},
                        {"busiest_relative_error", figure(summary.busiest_relative_error)},
                        {"step_median_relative_error", figure(summary.step_median_relative_error)},
                        {"step_worst_relative_error", figure(summary.step_worst_relative_error)},
                        {"cluster", report.host_cluster},
                        {"cluster_provenance", report.host_provenance}};
  json["calibration"] = {{"name", report.host_name},
                         {"source", report.host_source},
                         {"measured_at", report.host_measured_at.empty() ? nlohmann::ordered_json()
                                                                         : nlohmann::ordered_json(report.host_measured_at)},
                         {"refresh", calibration_refresh(report, args)}};
  if (!summary.note.empty()) json["prediction"]["note"] = summary.note;
  json["blas_threads"] = report.blas_note;
  json["corpus"] = report.corpus_provenance;
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (const auto& step : report.steps) {
    nlohmann::ordered_json s;
    s["step"] = step.step;
    s["micro_batches"] = step.micro_batches;
    s["loss"] = step.loss;
    if (check) {
      s["max_rel_error"] = step.max_relative_error;
      s["worst_tensor"] = step.worst_tensor;
      s["check_passed"] = step.check_passed();
    }
    s["imbalance"] = step.imbalance;
    s["step_wall_s"] = step.step_wall_s;
    const bool predicted = !step.predicted_busy_s.empty();
    s["predicted_step_s"] = predicted ? nlohmann::ordered_json(step.predicted_step_s) : nlohmann::ordered_json();
    if (!predicted) s["prediction_note"] = step.prediction_note;
    nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
    for (std::size_t r = 0; r < step.ranks.size(); ++r) {
      const auto& m = step.ranks[r];
      nlohmann::ordered_json rank = {{"busy_s", m.busy_s}};
      rank["predicted_busy_s"] =
          predicted ? nlohmann::ordered_json(step.predicted_busy_s[r]) : nlohmann::ordered_json();
      rank["wait_s"] = m.wait_s;
      rank["wall_s"] = m.wall_s;
      rank["tokens"] = m.tokens;
      rank["intra_node_bytes"] = m.intra_node_bytes;
      rank["inter_node_bytes"] = m.inter_node_bytes;
      ranks.push_back(std::move(rank));
    }
    s["ranks"] = ranks;
    steps.push_back(s);
  }
  json["per_step"] = steps;
  return json;
}

void write_ranking(const driver::StrategyRanking& ranking, std::ostream& out) {
  fmt::print(out, "\nstrategies on the same batches, busiest rank's busy time summed over the steps:\n");
  fmt::print(out, "  {:<32} {:>12} {:>12} {:>8}\n", "strategy", "measured (s)", "predicted (s)", "error");
  for (std::size_t i = 0; i < ranking.strategies.size(); ++i) {
    const double measured = ranking.measured_busiest_s[i];
    const std::optional<double> predicted = ranking.predicted_busiest_s[i];
    if (!predicted) {  // no prediction: "-", never a 0, and why (left out of the order)
      fmt::print(out, "  {:<32} {:>12.4f} {:>12} {:>8}  (no prediction: {})\n", ranking.strategies[i], measured, "-",
                 "-", ranking.notes[i]);
      continue;
    }
    fmt::print(out, "  {:<32} {:>12.4f} {:>12.4f} {:>8}\n", ranking.strategies[i], measured, *predicted,
               measured > 0 ? fmt::format("{:+.1f}%", 100 * (*predicted / measured - 1)) : "-");
  }
  fmt::print(out, "rank correlation {:+.2f}; the predicted order {} the measured one{}\n", ranking.rank_correlation,
             ranking.disagreements.empty() ? "matches" : "differs from",
             ranking.disagreements.empty()
                 ? fmt::format(" (measured times within {:.0f}% count as ties)", 100 * ranking.margin)
                 : fmt::format(" on {} (measured more than {:.0f}% apart)", fmt::join(ranking.disagreements, ", "),
                               100 * ranking.margin));
}

nlohmann::ordered_json ranking_json(const driver::StrategyRanking& ranking) {
  nlohmann::ordered_json json;
  json["strategies"] = ranking.strategies;
  json["busiest_busy_s"] = ranking.measured_busiest_s;
  nlohmann::ordered_json predicted = nlohmann::ordered_json::array();
  for (const std::optional<double>& value : ranking.predicted_busiest_s) {
    predicted.push_back(value ? nlohmann::ordered_json(*value) : nlohmann::ordered_json(nullptr));
  }
  json["predicted_busiest_busy_s"] = predicted;  // null: no prediction (notes says why)
  json["notes"] = ranking.notes;
  json["rank_correlation"] = ranking.rank_correlation;
  json["order_agrees"] = ranking.disagreements.empty();
  json["disagreements"] = ranking.disagreements;
  json["tie_margin"] = ranking.margin;
  return json;
}

/// `ballast run`'s progress on rank 0's stderr: what the run is predicted to take before
/// its first step, then the steps as they end (at most one line a second, and the last).
/// Always printed, as plain lines: under mpirun a rank's stderr is a pipe to mpirun, never
/// a terminal, so `compare`'s terminal-only status line would never show, and a run of
/// large plans can take minutes.
class RunProgressLines {
 public:
  driver::RunProgress callbacks() {
    driver::RunProgress progress;
    progress.started = [this](const driver::RunReport& report, const driver::RunForecast& forecast) {
      started(report, forecast);
    };
    progress.stepped = [this](const driver::StepReport& step, std::size_t index, std::size_t steps) {
      stepped(step, index, steps);
    };
    return progress;
  }

 private:
  using Clock = std::chrono::steady_clock;

  void started(const driver::RunReport& report, const driver::RunForecast& forecast) {
    strategy_ = report.strategy;
    std::string predicted;
    if (forecast.predicted_steps == 0) {
      predicted = fmt::format("its time is not predicted ({})", forecast.note);
    } else {
      const unsigned cores = std::thread::hardware_concurrency();
      const std::string shared =
          cores > 0 && static_cast<unsigned>(report.ranks) > cores
              ? fmt::format("; this host has {} cores for the {} ranks, so expect up to {:.1f}x that", cores,
                            report.ranks, static_cast<double>(report.ranks) / cores)
              : "";
      predicted = fmt::format("predicted {:.3f} s ({}the simulator's step times on the host calibration, "
                              "each rank on its own core{})",
                              forecast.predicted_s,
                              forecast.predicted_steps < static_cast<int>(forecast.steps)
                                  ? fmt::format("{} of the steps: ", forecast.predicted_steps)
                                  : "",
                              shared);
    }
    fmt::print(stderr, "ballast run: {}: {} step(s) on {} ranks, {}\n", strategy_, forecast.steps, report.ranks,
               predicted);
    std::fflush(stderr);
    started_ = last_line_ = Clock::now();
  }

  void stepped(const driver::StepReport& step, std::size_t index, std::size_t steps) {
    const Clock::time_point now = Clock::now();
    if (index + 1 < steps && now - last_line_ < std::chrono::seconds(1)) return;
    last_line_ = now;
    const std::string predicted =
        step.predicted_busy_s.empty() ? "" : fmt::format(" (predicted {:.3f} s)", step.predicted_step_s);
    fmt::print(stderr, "ballast run: {}: step {}/{} done, wall {:.3f} s{}; {:.1f} s so far\n",
               strategy_, index + 1, steps, step.step_wall_s, predicted,
               std::chrono::duration<double>(now - started_).count());
    std::fflush(stderr);
  }

  std::string strategy_;
  Clock::time_point started_, last_line_;
};

/// Workload flags `ballast run` has no use for: it plans for the job it runs in.
constexpr struct {
  const char* flag;
  const char* instead;
} kIgnoredFlags[] = {
    {"--nodes", "the emulated cluster is the job's ranks (mpirun -np) in nodes of --gpus-per-node"},
    {"--model", "the model is the runtime's own: set it with --hidden, --layers, --heads, --kv-heads, --ffn"},
    {"--cost-model", "plans use the analytical cost model on this host's calibration (--cluster)"},
};

/// Flags that choose, sample or plan the batches. A plan file fixes all of that (its
/// sequence lengths, its steps, its strategy and its emulated cluster), so with --plan
/// they would silently run something other than what was asked. (--seed still picks
/// the text cut from the corpus and the initial weights.)
constexpr const char* kPlanningFlags[] = {
    "--dataset", "--lengths", "--steps", "--tokens-per-step", "--batch-size", "--max-context",
    "--over-context", "--sampling", "--degree", "--no-routing", "--no-remap", "--even-split",
    "--strategy", "--length-scale", "--rank-tokens", "--gpus-per-node"};

bool given(const RunArgs& args, const std::string& flag) {
  return std::find(args.flags_given.begin(), args.flags_given.end(), flag) != args.flags_given.end();
}

/// Throws InputError for flags that would have no effect on this run (before MPI talks).
void reject_flags_without_effect(const RunArgs& args) {
  for (const auto& ignored : kIgnoredFlags) {
    if (given(args, ignored.flag)) {
      throw InputError(fmt::format("{} has no effect on ballast run: {}; drop it", ignored.flag, ignored.instead));
    }
  }
  if (args.options.plan_path.empty()) return;
  std::vector<std::string> conflicting;
  for (const char* flag : kPlanningFlags) {
    if (given(args, flag)) conflicting.push_back(flag);
  }
  if (!conflicting.empty()) {
    throw InputError(fmt::format("--plan {}: the file's plans fix the batches (their sequence lengths and "
                                 "steps), the strategy and the emulated cluster, so {} would not apply; "
                                 "drop {} or plan again with `ballast plan`",
                                 args.options.plan_path, fmt::join(conflicting, ", "),
                                 conflicting.size() == 1 ? "it" : "them"));
  }
}

/// Ends every rank of the job with `code` (mpirun reports it). MPI_Abort does not
/// return; if it fails there is nothing left to report, so exit.
[[noreturn]] void abort_job(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

/// The job's exit code after set-up: 0 when every rank succeeded, else the worst code of
/// the failing ranks. The lowest failing rank prints its message once, saying how many
/// ranks failed. Collective: every rank of MPI_COMM_WORLD calls it.
int agree_on_setup(int code, const std::string& message, int rank, int ranks) {
  using runtime::check_mpi;
  int worst = 0, first = 0, failing = 0;
  const int mine_first = code != 0 ? rank : ranks;
  const int mine_failing = code != 0 ? 1 : 0;
  check_mpi(MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  if (worst == 0) return 0;
  check_mpi(MPI_Allreduce(&mine_first, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce");
  check_mpi(MPI_Allreduce(&mine_failing, &failing, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  if (rank == first) {
    const std::string others = failing == ranks && ranks > 1 ? " (and every other rank)"
                               : failing > 1 ? fmt::format(" (and {} other ranks)", failing - 1)
                                             : "";
    std::cerr << fmt::format("ballast run: error on rank {}{}: {}\n", rank, others, message);
  }
  return worst;
}


/// The host calibration the run plans and predicts with, the same on every rank
/// (collective): --cluster FILE, checked against this job; else the cached calibration of
/// this host, job and model, measured now (and cached) when missing or stale. Rank 0 reads
/// and decides; the others receive the cluster. Throws InputError (on rank 0) for a bad
/// --cluster; `code`/`message` carry it so the ranks agree before anyone fails.
struct HostResolution {
  Cluster cluster;
  std::string source;
  bool measure = false;
  std::string cache_path;
};

HostResolution read_host_calibration(const RunArgs& args, const HostRecord& here) {
  HostResolution resolution;
  if (args.workload.cluster) {
    const std::string& path = *args.workload.cluster;
    if (args.recalibrate) {
      throw InputError(fmt::format("--recalibrate measures this host into the cache, --cluster {} gives a "
                                   "calibration: drop one (to measure into {}: `mpirun -np {} ballast "
                                   "calibrate --host -o {}`)", path, path, here.ranks, path));
    }
    if (!std::filesystem::is_regular_file(path)) {
      throw InputError(fmt::format("--cluster {}: ballast run needs this host's calibration, a file written by "
                                   "`mpirun -np {} ballast calibrate --host -o FILE`; drop --cluster to use "
                                   "(or make) the cached one", path, here.ranks));
    }
    resolution.cluster = load_cluster(path);
    driver::check_host_calibration(resolution.cluster, here, "--cluster " + path);
    resolution.source = "--cluster " + path;
    return resolution;
  }
  resolution.cache_path = driver::host_calibration_cache_path(here);
  if (!args.recalibrate && std::filesystem::is_regular_file(resolution.cache_path)) {
    try {
      resolution.cluster = load_cluster(resolution.cache_path);
      driver::check_host_calibration(resolution.cluster, here, resolution.cache_path);
      resolution.source = "cached at " + resolution.cache_path;
      return resolution;
    } catch (const InputError&) {
      // Stale or damaged: measure again and replace it.
    }
  }
  resolution.measure = true;
  return resolution;
}

}  // namespace

int run_run(const RunArgs& args) {
  using runtime::check_mpi;
  const std::string blas_note = driver::pin_blas_threads();  // before any GEMM
  check_mpi(MPI_Init(nullptr, nullptr), "MPI_Init");
  // Failing calls return their code to check_mpi, which names the call and the rank
  // before aborting; MPI's default handler would abort without either.
  check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  int rank = 0, ranks = 1;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &ranks), "MPI_Comm_size");
  // Set-up (flags, plans, corpus) communicates nothing and is the same on every rank, so a
  // bad flag fails on all of them: the ranks agree on the outcome with collectives every
  // rank reaches, and the lowest failing rank alone prints the error (not one copy per
  // rank followed by MPI_Abort's banner); every rank then exits with the error's code.
  driver::RunOptions options = args.options;
  Format format = Format::text;
  std::optional<driver::PreparedRun> prepared;
  int setup_code = 0;
  std::string setup_error;
  const HostRecord here = driver::current_host(options.model, MPI_COMM_WORLD);
  HostResolution host;
  std::vector<std::pair<driver::RunOptions, driver::PreparedRun>> runs;
  // Runs a set-up stage, recording its failure (the ranks agree on it afterwards).
  const auto guarded = [&](const auto& stage) {
    try {
      stage();
    } catch (const InputError& error) {
      setup_code = kExitBadInput;
      setup_error = error.what();
    } catch (const std::exception& error) {
      setup_code = kExitInternal;
      setup_error = fmt::format("internal error (please report): {}", error.what());
    }
  };
  guarded([&] {
    format = parse_format(args.output.format);
    if (format == Format::csv) throw InputError("ballast run prints text or json; use --format text or json");
    reject_flags_without_effect(args);
    options.model.check();
    options.settings.steps = args.workload.steps.value_or(1);
    apply_workload_flags(args.workload, options.settings);
    if (!args.workload.tokens_per_step && !args.workload.batch_size) {
      // Default budget: half of the job's memory, in the dataset's own (unscaled) tokens.
      options.settings.sampler.tokens_per_step = options.rank_tokens * ranks / 2 * options.length_scale;
    }
    if (!options.plan_path.empty()) {
      // Plan files are checked against the job before anything is measured.
      prepared = driver::prepare_run(options, ranks);
    } else {
      // So are the flags: a bad one fails before the host is measured (and cached).
      for (const std::string& strategy : apply_ablation_flags(args.workload, split_list(options.strategy))) {
        driver::RunOptions strategy_options = options;
        strategy_options.strategy = strategy;
        driver::check_run_options(strategy_options, ranks);
      }
    }
    if (rank == 0) host = read_host_calibration(args, here);
  });
  // Collective: whether any rank failed so far; if so MPI is finalized and job_code holds
  // the worst code, which every rank returns.
  int job_code = 0;
  const auto agreed_failure = [&] {
    job_code = agree_on_setup(setup_code, setup_error, rank, ranks);
    if (job_code != 0) check_mpi(MPI_Finalize(), "MPI_Finalize");
    return job_code != 0;
  };
  if (agreed_failure()) return job_code;
  // Started without mpirun (Open MPI's launcher sets OMPI_COMM_WORLD_SIZE; a singleton has
  // no launcher), the job is this one rank: say so once the flags are good (a bad flag's
  // error stays the one line), rather than run it silently.
  if (ranks == 1 && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr && std::getenv("PMI_SIZE") == nullptr) {
    fmt::print(stderr, "ballast run: running 1 rank (started without mpirun); for N ranks use "
                       "`mpirun -np N ballast run ...` or scripts/ballast-run N ...\n");
  }
  // Rank 0 decided; measure here when needed (every rank), then every rank takes rank 0's.
  int measure = host.measure ? 1 : 0;
  check_mpi(MPI_Bcast(&measure, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast");
  if (measure != 0) {
    if (rank == 0) {  // progress (docs/cli.md): measuring takes seconds, more with many ranks
      fmt::print(stderr, "ballast run: measuring this host's calibration ({}; cached at {} for later runs)\n",
                 args.recalibrate ? "--recalibrate" : "none cached for this job, or stale", host.cache_path);
      std::fflush(stderr);
    }
    driver::HostCalibration calibration;
    try {  // every rank fits the same reductions: all fail or none
      calibration = driver::calibrate_host(options.model, MPI_COMM_WORLD);
    } catch (const InputError& error) {
      setup_code = kExitBadInput;
      setup_error = fmt::format("calibrating this host: {}", error.what());
    }
    if (agreed_failure()) return job_code;
    host.cluster = calibration.cluster;
    if (rank == 0) {
      try {
        driver::write_cluster_file(host.cluster, host.cache_path);
        host.source = fmt::format("measured now{} in {:.1f} s, cached at {}",
                                  args.recalibrate ? " (--recalibrate)" : "", calibration.seconds, host.cache_path);
      } catch (const InputError& error) {
        host.source = fmt::format("measured now in {:.1f} s, not cached: {}", calibration.seconds, error.what());
      }
    }
  }
  std::string cluster_text = rank == 0 ? to_json(host.cluster).dump() : std::string();
  driver::broadcast_string(cluster_text, MPI_COMM_WORLD);
  guarded([&] {
    options.host = cluster_from_json(nlohmann::json::parse(cluster_text), "the host calibration");
    options.host_source = host.source;
    if (prepared) {
      runs.push_back({options, std::move(*prepared)});
    } else {
      // Several strategies run the same sampled batches, one after the other, each from
      // the same initial weights.
      for (const std::string& strategy :
           apply_ablation_flags(args.workload, split_list(options.strategy))) {
        driver::RunOptions strategy_options = options;
        strategy_options.strategy = strategy;
        driver::PreparedRun strategy_run = driver::prepare_run(strategy_options, ranks);
        runs.push_back({std::move(strategy_options), std::move(strategy_run)});
      }
    }
  });
  if (agreed_failure()) return job_code;
  int check_code = 0;  // kExitCheckFailed when --check failed
  try {
    std::vector<driver::RunReport> reports;
    for (auto& [run_options, prepared_run] : runs) {
      run_options.record_trace = !args.trace_path.empty();  // every strategy's first step
      RunProgressLines progress;
      reports.push_back(
          driver::run_training(run_options, std::move(prepared_run), MPI_COMM_WORLD, progress.callbacks()));
      reports.back().blas_note = blas_note;
    }
    if (rank == 0) {
      const driver::RunReport& first = reports.front();
      if (!args.trace_path.empty()) {
        std::ofstream file(args.trace_path, std::ios::binary | std::ios::trunc);
        if (!file) throw InputError(fmt::format("--trace {}: cannot write this file", args.trace_path));
        // Two timelines per strategy, one above the other: "measured" and "predicted", with
        // several strategies prefixed by theirs ("zeppelin measured rank 0 (node 0)").
        std::vector<std::string> labels;
        for (const driver::RunReport& report : reports) {
          const std::string prefix = reports.size() == 1 ? "" : report.strategy + " ";
          labels.push_back(prefix + "measured");
          labels.push_back(prefix + "predicted");
        }
        std::vector<TraceTimeline> timelines;
        for (std::size_t i = 0; i < reports.size(); ++i) {
          timelines.push_back({labels[2 * i], reports[i].trace});
          timelines.push_back({labels[2 * i + 1], reports[i].predicted_trace});
        }
        write_chrome_trace(timelines, first.ranks, first.gpus_per_node, file);
      }
      std::ostringstream text;
      if (format == Format::json) {
        if (reports.size() == 1) {
          text << to_json(first, args).dump(1) << "\n";
        } else {
          nlohmann::ordered_json set;
          set["schema"] = "ballast.run-set/1";
          set["runs"] = nlohmann::ordered_json::array();
          for (const driver::RunReport& report : reports) set["runs"].push_back(to_json(report, args));
          set["ranking"] = ranking_json(driver::rank_strategies(reports));
          text << set.dump(1) << "\n";
        }
      } else {
        for (const driver::RunReport& report : reports) write_text(report, args, text);
        if (reports.size() > 1) write_ranking(driver::rank_strategies(reports), text);
        if (!args.trace_path.empty()) {
          fmt::print(text, "measured and predicted timelines of the first step{} written to {}\n",
                     reports.size() == 1 ? "" : fmt::format(" of each of the {} strategies", reports.size()),
                     args.trace_path);
        }
      }
      if (args.output.output_path.empty()) {
        std::cout << text.str();
      } else {
        std::ofstream file(args.output.output_path, std::ios::binary | std::ios::trunc);
        if (!file) throw InputError(fmt::format("-o {}: cannot write this file", args.output.output_path));
        file << text.str();
      }
      if (args.options.check) {
        for (const driver::RunReport& report : reports) {
          const driver::StepReport* step = failed_check(report);
          if (step == nullptr) continue;
          std::cout.flush();
          std::cerr << fmt::format("ballast run: --check failed: {}\n", check_failure(report, *step));
          check_code = kExitCheckFailed;
          break;
        }
      }
    }
  } catch (const InputError& error) {
    std::cerr << fmt::format("ballast run: error on rank {}: {}\n", rank, error.what());
    abort_job(kExitBadInput);
  } catch (const std::exception& error) {
    std::cerr << fmt::format("ballast run: error on rank {}: internal error (please report): {}\n", rank,
                             error.what());
    abort_job(kExitInternal);
  }
  // Rank 0's verdict is every rank's exit code (mpirun reports the worst).
  check_mpi(MPI_Bcast(&check_code, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast");
  check_mpi(MPI_Finalize(), "MPI_Finalize");
  return check_code;
}

}  // namespace ballast::cli
