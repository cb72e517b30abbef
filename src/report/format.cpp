// The compare table in text, CSV and JSON (schema in docs/compare-schema.md).
#include <algorithm>
#include <ostream>
#include <string>

#include <fmt/format.h>
#include <fmt/ostream.h>

#include "ballast/compare.hpp"

namespace ballast {

namespace {

std::string budget_text(const SamplerOptions& sampler) {
  if (sampler.batch_size) return fmt::format("{} sequences per step", *sampler.batch_size);
  return fmt::format("token budget {} per step", with_thousands(sampler.tokens_per_step.value_or(0)));
}

std::string over_context_text(const CompareResult& result) {
  const auto& stats = result.sampler_stats;
  const auto& sampler = result.settings.sampler;
  const Tokens limit_tokens = document_limit_tokens(sampler);
  std::string text = fmt::format(
      "documents longer than {} {}: policy {}",
      limit_tokens == sampler.max_context_tokens ? "--max-context" : "the token budget",
      with_thousands(limit_tokens), to_string(sampler.over_context));
  if (sampler.over_context == OverContextPolicy::drop) {
    text += fmt::format(", dropped {} ({} tokens)", with_thousands(stats.dropped_documents),
                        with_thousands(stats.dropped_tokens));
  } else if (sampler.over_context == OverContextPolicy::truncate) {
    text += fmt::format(", truncated {} ({} tokens lost)", with_thousands(stats.truncated_documents),
                        with_thousands(stats.truncated_tokens));
  } else if (sampler.over_context == OverContextPolicy::split) {
    text += fmt::format(", split {} into {} pieces", with_thousands(stats.split_documents),
                        with_thousands(stats.split_pieces));
  }
  return text;
}

}  // namespace

void write_compare_text(const CompareResult& result, std::ostream& out) {
  const auto& settings = result.settings;
  fmt::print(out, "dataset {}\n", result.dataset_description);
  fmt::print(out, "cluster {}, model {}{}, cost model {}\n", result.cluster_description,
             settings.model,
             settings.recompute
                 ? fmt::format(" ({} recomputation)", recompute_name(*settings.recompute))
                 : std::string(),
             settings.cost_model);
  fmt::print(out, "{} step{}, seed {}, {} sampling, {}; mean {} sequences / {} tokens per step\n",
             settings.steps, settings.steps == 1 ? "" : "s", settings.sampler.seed, to_string(settings.sampler.order),
             budget_text(settings.sampler), with_thousands(result.sequences_per_step),
             with_thousands(result.tokens_per_step));
  fmt::print(out, "{}\n\n", over_context_text(result));
  std::size_t name_width = 22;  // the longest strategy spec sets the first column
  for (const auto& r : result.results) name_width = std::max(name_width, r.strategy.size());
  fmt::print(out, "{:<{}} {:>10} {:>10} {:>8} {:>9} {:>9} {:>8} {:>9} {:>9} {:>6} {:>9}\n",
             "strategy", name_width, "step (s)", "bound (s)", "gap", "speedup", "imbalance",
             "exp.comm", "sync (s)", "peak GiB", "mbs", "plan (ms)");
  for (const auto& r : result.results) {
    if (!r.error.empty()) {
      fmt::print(out, "{:<{}} cannot run: {}\n", r.strategy, name_width, r.error);
      continue;
    }
    // A speedup against a baseline that could not run is unknown: "-", not 0.00x.
    const std::string speedup = r.speedup ? fmt::format("{:.2f}x", *r.speedup) : "-";
    fmt::print(out,
               "{:<{}} {:>10.3f} {:>10.3f} {:>7.1f}% {:>9} {:>9.2f} {:>7.1f}% {:>9.3f} {:>9.1f} "
               "{:>6.1f} {:>9.2f}\n",
               r.strategy, name_width, r.step_time_s, r.lower_bound_s,
               100.0 * r.gap_to_lower_bound, speedup, r.imbalance,
               100.0 * r.exposed_comm_fraction, r.gradient_sync_exposed_s,
               r.peak_memory_bytes / kGiB, r.micro_batches, r.plan_time_ms);
  }
  const bool baseline_failed =
      std::any_of(result.results.begin(), result.results.end(),
                  [](const auto& r) { return r.error.empty() && !r.speedup; });
  fmt::print(out, "\nspeedup: {} step time / strategy step time{}. gap: step / lower bound - 1. "
                  "imbalance: max/mean busy time. exp.comm: communication not hidden by compute, "
                  "share of rank-time. sync: gradient sync left after the last backward pass "
                  "(--grad-sync {}), part of the step. mbs: micro-batches. See "
                  "docs/compare-schema.md.\n",
             result.baseline, baseline_failed ? " (\"-\": the baseline cannot run)" : "",
             gradient_sync_name(result.settings.gradient_sync));
}

void write_compare_csv(const CompareResult& result, std::ostream& out) {
  fmt::print(out,
             "strategy,step_time_s,lower_bound_s,gap_to_lower_bound,speedup,imbalance,"
             "exposed_comm_fraction,peak_memory_bytes,plan_time_ms,micro_batches,"
             "gradient_sync_exposed_s,error\n");
  for (const auto& r : result.results) {
    std::string error = r.error;
    for (char& c : error) {
      if (c == '"') c = '\'';
    }
    if (!error.empty()) {  // no figures: empty cells, not zeros
      fmt::print(out, "{},,,,,,,,,,,\"{}\"\n", r.strategy, error);
      continue;
    }
    const std::string speedup = r.speedup ? fmt::format("{:.6g}", *r.speedup) : "";
    fmt::print(out, "{},{:.9g},{:.9g},{:.6g},{},{:.6g},{:.6g},{},{:.4f},{:.4g},{:.9g},\"\"\n",
               r.strategy, r.step_time_s, r.lower_bound_s, r.gap_to_lower_bound, speedup,
               r.imbalance, r.exposed_comm_fraction, r.peak_memory_bytes, r.plan_time_ms,
               r.micro_batches, r.gradient_sync_exposed_s);
  }
}

nlohmann::ordered_json compare_to_json(const CompareResult& result) {
  const auto& settings = result.settings;
  nlohmann::ordered_json json;
  json["schema"] = "ballast.compare/1";
  json["settings"] = {
      {"dataset", settings.dataset},
      {"cluster", settings.cluster},
      {"cluster_description", result.cluster_description},
      {"model", settings.model},
      {"recompute", settings.recompute ? nlohmann::json(recompute_name(*settings.recompute))
                                       : nlohmann::json(nullptr)},
      {"cost_model", settings.cost_model},
      {"steps", settings.steps},
      {"seed", settings.sampler.seed},
      {"tokens_per_step", settings.sampler.tokens_per_step
                              ? nlohmann::json(*settings.sampler.tokens_per_step)
                              : nlohmann::json(nullptr)},
      {"batch_size", settings.sampler.batch_size ? nlohmann::json(*settings.sampler.batch_size)
                                                 : nlohmann::json(nullptr)},
      {"max_context", settings.sampler.max_context_tokens},
      {"over_context", to_string(settings.sampler.over_context)},
      {"sampling", to_string(settings.sampler.order)},
      {"grad_sync", gradient_sync_name(settings.gradient_sync)},
      {"baseline", result.baseline},
  };
  // Only with TP, so reports without it keep their bytes (docs/compare-schema.md).
  if (settings.tensor_parallel > 1) json["settings"]["tp"] = settings.tensor_parallel;
  json["workload"] = {
      {"sequences_per_step", result.sequences_per_step},
      {"tokens_per_step", result.tokens_per_step},
      {"dropped_documents", result.sampler_stats.dropped_documents},
      {"dropped_tokens", result.sampler_stats.dropped_tokens},
      {"truncated_documents", result.sampler_stats.truncated_documents},
      {"truncated_tokens", result.sampler_stats.truncated_tokens},
      {"split_documents", result.sampler_stats.split_documents},
      {"split_pieces", result.sampler_stats.split_pieces},
  };
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (const auto& r : result.results) {
    nlohmann::ordered_json row;
    row["strategy"] = r.strategy;
    row["error"] = r.error.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.error);
    // A strategy that could not run has no figures: every one is null, not 0.
    const bool ran = r.error.empty();
    const auto figure = [ran](auto value) {
      return ran ? nlohmann::ordered_json(value) : nlohmann::ordered_json(nullptr);
    };
    row["step_time_s"] = figure(r.step_time_s);
    row["lower_bound_s"] = figure(r.lower_bound_s);
    row["gap_to_lower_bound"] = figure(r.gap_to_lower_bound);
    row["speedup"] =
        r.speedup ? nlohmann::ordered_json(*r.speedup) : nlohmann::ordered_json(nullptr);
    row["imbalance"] = figure(r.imbalance);
    row["exposed_comm_fraction"] = figure(r.exposed_comm_fraction);
    row["peak_memory_bytes"] = figure(r.peak_memory_bytes);
    row["plan_time_ms"] = figure(r.plan_time_ms);
    row["micro_batches"] = figure(r.micro_batches);
    row["gradient_sync_exposed_s"] = figure(r.gradient_sync_exposed_s);
    results.push_back(row);
  }
  json["results"] = results;
  return json;
}

}  // namespace ballast
