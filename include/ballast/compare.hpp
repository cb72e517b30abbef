// Compare: run several strategies over the same sampled batches, simulate each plan,
// and summarise step time, gap to the lower bound, speedup, imbalance, exposed
// communication, peak memory and planner latency. Also the named scenarios.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ballast/cost_model.hpp"
#include "ballast/settings.hpp"
#include "ballast/simulator.hpp"
#include "ballast/strategy.hpp"
#include "ballast/text.hpp"
#include "ballast/workload.hpp"

namespace ballast {

/// The inputs a run resolves its settings into (loaded once, shared by every strategy).
struct RunInputs {
  Dataset dataset;
  std::unique_ptr<CostModel> cost;
  std::vector<Batch> batches;
  SamplerStats sampler_stats;
};

/// The cost model of the settings' cluster (in TP groups with --tp), model (with
/// --recompute) and cost model. Throws InputError on any bad setting, or when not one
/// token fits a GPU.
std::unique_ptr<CostModel> resolve_cost_model(const RunSettings& settings);
/// Loads dataset, cluster, model and cost model and samples settings.steps batches.
/// Throws InputError on any bad setting.
RunInputs resolve_inputs(const RunSettings& settings);

/// One strategy's figures, averaged over the steps. When `error` is set the strategy could
/// not run a batch and has no figures: they stay 0 here and the writers print null / empty.
struct StrategyResult {
  std::string strategy;
  std::string error;  ///< non-empty when the strategy could not run a batch
  double step_time_s = 0;
  double lower_bound_s = 0;
  double gap_to_lower_bound = 0;  ///< step / lower bound - 1
  /// Baseline step / this step; empty when this strategy or the baseline could not run.
  std::optional<double> speedup;
  double imbalance = 0;
  double exposed_comm_fraction = 0;
  Bytes peak_memory_bytes = 0;  ///< max over steps and ranks
  double plan_time_ms = 0;      ///< wall-clock planner latency, mean over steps
  double micro_batches = 0;     ///< mean over steps
  /// Mean gradient sync the backward pass did not hide (in step_time_s; the same for
  /// every strategy with --grad-sync end, so compare step_time_s minus it there).
  double gradient_sync_exposed_s = 0;
};

struct CompareResult {
  RunSettings settings;
  std::string baseline;
  std::string dataset_description;
  std::string cluster_description;
  std::int64_t sequences_per_step = 0;  ///< mean
  Tokens tokens_per_step = 0;           ///< mean
  SamplerStats sampler_stats;
  std::vector<StrategyResult> results;
};

/// Called before each strategy plans each step (strategy, step index, steps), so a
/// front end can show progress; the library itself prints nothing.
using CompareProgress = std::function<void(const std::string&, int, int)>;

CompareResult run_compare(const RunSettings& settings, const CompareProgress& progress = {});

void write_compare_text(const CompareResult& result, std::ostream& out);
void write_compare_csv(const CompareResult& result, std::ostream& out);
nlohmann::ordered_json compare_to_json(const CompareResult& result);

/// A named, documented bundle of settings (data/scenarios.json).
struct Scenario {
  std::string name;
  std::string description;
  nlohmann::json settings;  ///< keys: dataset, cluster, nodes, model, cost_model, strategies,
                            ///< baseline, steps, seed, tokens_per_step, batch_size,
                            ///< max_context, over_context, sampling, degree, grad_sync
};
/// Read from data/scenarios.json once.
const std::vector<Scenario>& scenarios();
/// Throws InputError listing the known scenarios.
const Scenario& find_scenario(const std::string& name);
/// Applies a scenario's settings onto `settings` (the CLI then applies explicit flags).
void apply_scenario(const Scenario& scenario, RunSettings& settings);

}  // namespace ballast
