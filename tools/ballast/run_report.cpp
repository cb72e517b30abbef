// `ballast run`'s report (run_report.hpp): text, JSON, the ranking of strategies, the
// --check verdict and the progress lines.
#include "run_report.hpp"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <iomanip>
#include <optional>
#include <sstream>
#include <thread>

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

}  // namespace

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

namespace {

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

}  // namespace

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
                        {"cluster", fmt::format("{} ({})", report.host_name, report.host_source)},
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

driver::RunProgress RunProgressLines::callbacks() {
  driver::RunProgress progress;
  progress.started = [this](const driver::RunReport& report, const driver::RunForecast& forecast) {
    started(report, forecast);
  };
  progress.stepped = [this](const driver::StepReport& step, std::size_t index, std::size_t steps) {
    stepped(step, index, steps);
  };
  return progress;
}

void RunProgressLines::started(const driver::RunReport& report, const driver::RunForecast& forecast) {
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

void RunProgressLines::stepped(const driver::StepReport& step, std::size_t index, std::size_t steps) {
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

}  // namespace ballast::cli
