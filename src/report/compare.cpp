// run_compare: sample the batches once, plan each with every strategy, simulate, and
// average the figures; plus input resolution shared by plan / simulate / compare.
#include "ballast/compare.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "ballast/error.hpp"
#include "ballast/simulator.hpp"
#include "ballast/tensor_parallel.hpp"

namespace ballast {

std::unique_ptr<CostModel> resolve_cost_model(const RunSettings& settings) {
  Model model = load_model(settings.model);
  if (settings.recompute) model.recompute = *settings.recompute;
  const Cluster cluster = tensor_parallel_units(load_cluster(settings.cluster, settings.nodes),
                                                model, settings.tensor_parallel);
  auto cost = make_cost_model(load_cost_model_spec(settings.cost_model), cluster, model);
  cost->token_capacity_per_rank();  // fails early, naming model and cluster
  return cost;
}

RunInputs resolve_inputs(const RunSettings& settings) {
  check_step_count(settings.steps);  // every step's batch is sampled and held below
  RunInputs inputs;
  inputs.dataset = load_dataset(settings.dataset);
  inputs.cost = resolve_cost_model(settings);
  BatchSampler sampler(inputs.dataset, settings.sampler);
  for (int step = 0; step < settings.steps; ++step) inputs.batches.push_back(sampler.next());
  inputs.sampler_stats = sampler.stats();
  return inputs;
}

namespace {

std::vector<std::string> strategies_to_run(const RunSettings& settings) {
  std::vector<std::string> names = settings.strategies.empty() ? planner_names()
                                                               : settings.strategies;
  for (const auto& name : names) parse_strategy_spec(name);  // bad specs fail before any work
  return names;
}

std::string choose_baseline(const RunSettings& settings, const std::vector<std::string>& names) {
  if (!settings.baseline.empty()) {
    if (std::find(names.begin(), names.end(), settings.baseline) == names.end()) {
      throw InputError(fmt::format("--baseline {} is not among the compared strategies ({}); add "
                                   "it to --strategies",
                                   settings.baseline, fmt::join(names, ",")));
    }
    return settings.baseline;
  }
  const bool has_static_cp = std::find(names.begin(), names.end(), "static-cp") != names.end();
  return has_static_cp ? "static-cp" : names.front();
}

StrategyResult run_strategy(const std::string& name, const RunInputs& inputs,
                            const PlannerOptions& options, GradientSync gradient_sync,
                            const CompareProgress& progress) {
  StrategyResult result;
  result.strategy = name;
  const StrategySpec spec = parse_strategy_spec(name, options);
  const Planner& planner = *spec.planner;
  const double steps = static_cast<double>(inputs.batches.size());
  const SimulatorEvaluator evaluator(*inputs.cost, gradient_sync);
  for (const Batch& batch : inputs.batches) {
    if (progress) {
      progress(name, static_cast<int>(batch.step), static_cast<int>(inputs.batches.size()));
    }
    Plan plan;
    const auto start = std::chrono::steady_clock::now();
    try {
      plan = planner.plan(batch, *inputs.cost, spec.options, evaluator);
    } catch (const InputError& error) {
      // This strategy cannot run this batch (options it cannot use at all were rejected
      // before any planning): report it and keep comparing the others. No partial figures.
      StrategyResult failed;
      failed.strategy = name;
      failed.error = error.what();
      return failed;
    }
    const auto stop = std::chrono::steady_clock::now();
    const SimulationReport report =
        simulate(plan, *inputs.cost, {.gradient_sync = gradient_sync});
    result.plan_time_ms += std::chrono::duration<double, std::milli>(stop - start).count() / steps;
    result.step_time_s += report.step_time_s / steps;
    result.lower_bound_s += report.lower_bound.time_s / steps;
    result.imbalance += report.imbalance / steps;
    result.exposed_comm_fraction += report.exposed_communication_fraction / steps;
    result.micro_batches += report.micro_batches / steps;
    result.gradient_sync_exposed_s += report.gradient_sync_exposed_s / steps;
    result.peak_memory_bytes = std::max(result.peak_memory_bytes, report.peak_memory_bytes);
  }
  result.gap_to_lower_bound = gap_to_lower_bound(result.step_time_s, result.lower_bound_s);
  return result;
}

}  // namespace

CompareResult run_compare(const RunSettings& settings, const CompareProgress& progress) {
  const std::vector<std::string> names = strategies_to_run(settings);
  CompareResult compare;
  compare.settings = settings;
  compare.baseline = choose_baseline(settings, names);
  const RunInputs inputs = resolve_inputs(settings);
  for (const auto& name : names) {  // options the cluster or model rule out: before any planning
    check_strategy_spec(parse_strategy_spec(name, settings.planner_options()), *inputs.cost);
  }
  const Cluster& cluster = inputs.cost->cluster();
  compare.dataset_description = fmt::format(
      "{} ({} documents, mean {:.0f} tokens, max {})", inputs.dataset.name,
      with_thousands(inputs.dataset.documents()), inputs.dataset.mean_length_tokens(),
      with_thousands(inputs.dataset.max_length_tokens()));
  compare.cluster_description = describe_cluster(cluster);
  compare.sampler_stats = inputs.sampler_stats;
  double sequences = 0, tokens = 0;
  for (const Batch& batch : inputs.batches) {
    sequences += static_cast<double>(batch.lengths_tokens.size());
    tokens += static_cast<double>(batch.total_tokens());
  }
  const auto steps = static_cast<double>(inputs.batches.size());
  compare.sequences_per_step = std::llround(sequences / steps);
  compare.tokens_per_step = std::llround(tokens / steps);
  for (const auto& name : names) {
    compare.results.push_back(run_strategy(name, inputs, settings.planner_options(),
                                           settings.gradient_sync, progress));
  }
  const auto baseline = std::find_if(compare.results.begin(), compare.results.end(),
                                     [&](const auto& r) { return r.strategy == compare.baseline; });
  const bool baseline_ran = baseline != compare.results.end() && baseline->error.empty();
  for (auto& result : compare.results) {
    if (baseline_ran && result.error.empty()) {
      result.speedup = baseline->step_time_s / result.step_time_s;
    }
  }
  return compare;
}

}  // namespace ballast
