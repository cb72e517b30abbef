// Flags shared by `ballast plan`, `simulate` and `compare`, and how they combine with
// a scenario (explicit flags win).
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "ballast/compare.hpp"
#include "ballast/runtime/model.hpp"

namespace ballast::cli {

enum class Format { text, csv, json };

/// Raw flag values; std::nullopt = not given on the command line.
struct WorkloadFlags {
  std::optional<std::string> dataset, lengths_file, cluster, model, cost_model;
  std::optional<int> nodes, steps, degree, tp;
  std::optional<std::uint64_t> seed;
  std::optional<Tokens> tokens_per_step, max_context;
  std::optional<std::int64_t> batch_size;
  std::optional<std::string> over_context, sampling, grad_sync, recompute;
  bool no_routing = false, no_remap = false, even_split = false;  ///< Zeppelin's ablation
};

struct OutputFlags {
  std::string format = "text";
  std::string output_path;  ///< empty: stdout
};

void add_workload_flags(CLI::App& command, WorkloadFlags& flags);
void add_output_flags(CLI::App& command, OutputFlags& flags, bool csv_allowed = true);
/// The runtime model's shape flags of `ballast run` and `ballast calibrate --host`
/// (--hidden, --layers, --heads, --kv-heads, --ffn, --untied); `prefix` starts each help.
void add_runtime_model_flags(CLI::App& command, runtime::ModelConfig& model,
                             const std::string& prefix = "");

/// Applies the flags that were given onto `settings` (after defaults and any scenario).
void apply_workload_flags(const WorkloadFlags& flags, RunSettings& settings);
Format parse_format(const std::string& text);
std::vector<std::string> split_list(const std::string& text);

/// The ablation flags (--no-routing, --no-remap, --even-split) applied to strategy specs:
/// each spec whose strategy takes the switch's key and does not set it gets
/// ":routing=off" / ":remap=off" / ":partition=even" appended, so report labels say what
/// ran. Throws InputError when a flag was given but no spec takes it.
std::vector<std::string> apply_ablation_flags(const WorkloadFlags& flags,
                                              std::vector<std::string> specs);

/// compare --sweep degree=V1,V2,... (`sweep`; each value a number or per-step): every spec
/// whose strategy takes a degree (Planner::takes_common_degree) becomes one spec per value,
/// the spec with any degree it names replaced by ":degree=V"; the others stay once.
/// `baseline` (the compare's baseline spec) also keeps its own row, first, so speedups stay
/// against it; repeated specs appear once. A value `cost` rules out for one strategy
/// (parse_strategy_spec / check_strategy_spec with `base`: a degree beyond the KV heads, a
/// non-divisor) is skipped with one line in `notes`; a value no strategy takes, another key
/// than degree, or no value is an InputError naming --sweep.
std::vector<std::string> expand_degree_sweep(const std::string& sweep,
                                             const std::vector<std::string>& specs,
                                             const std::string& baseline, const CostModel& cost,
                                             const PlannerOptions& base,
                                             std::vector<std::string>& notes);

}  // namespace ballast::cli
