// RunSettings: what a plan / simulate / compare / run is made of (dataset, cluster, model,
// cost model, strategies, steps, sampler, planner options), with the bundled defaults of
// `ballast compare` (docs/cli.md). Plain data: the CLI, compare and the run driver read it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ballast/simulator.hpp"
#include "ballast/strategy.hpp"
#include "ballast/workload.hpp"

namespace ballast {

/// Everything a plan / simulate / compare run is made of. Defaults are the bundled
/// defaults of `ballast compare` (documented in docs/cli.md).
struct RunSettings {
  std::string dataset = "wlbllm";  ///< bundled name or length-file path
  std::string cluster = "h100";    ///< preset or JSON file
  std::optional<int> nodes;        ///< overrides the cluster's node count
  /// --tp: GPUs per tensor-parallel group; the planners' ranks are the TP groups
  /// (tensor_parallel_units()). 1 = no tensor parallelism.
  int tensor_parallel = 1;
  std::string model = "llama-7b";  ///< preset or JSON file
  /// --recompute: overrides the model's activation recomputation (presets: selective).
  std::optional<Recompute> recompute;
  std::string cost_model = "analytical";
  std::vector<std::string> strategies;  ///< empty: every registered strategy
  std::string baseline;                 ///< empty: static-cp if compared, else the first
  int steps = 4;
  SamplerOptions sampler = default_sampler_options();
  PlannerOptions planner;  ///< without the context: see planner_options()
  GradientSync gradient_sync = GradientSync::overlap;  ///< --grad-sync

  /// What every strategy of the run is planned with: `planner` and the run's context
  /// (--max-context, the longest sequence the sampler lets through), from which the
  /// static strategies fix their default degree.
  PlannerOptions planner_options() const {
    PlannerOptions options = planner;
    options.context_tokens = sampler.max_context_tokens;
    return options;
  }

  static SamplerOptions default_sampler_options() {
    SamplerOptions options;
    // 1 Mi tokens per step on 64 GPUs: the long-context setting of Zeppelin's evaluation
    // (~0.5-1M tokens per step on 64 GPUs, SYSTEMS.md section 3); 128K context covers the
    // wlbllm distribution (max 124,913).
    options.tokens_per_step = Tokens{1} << 20;
    options.max_context_tokens = 131072;
    return options;
  }
};

}  // namespace ballast
