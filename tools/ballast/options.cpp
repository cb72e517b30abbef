// The shared workload/output flags of the ballast CLI.
#include "options.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <limits>

#include "ballast/error.hpp"
#include "ballast/strategy.hpp"

namespace ballast::cli {

namespace {

/// --seed: a decimal integer in [0, 2^64 - 1], all of `text` (CLI11's own conversion
/// clamped -1 and 2^64 to 2^64 - 1 in silence, so the run used another seed).
std::uint64_t parse_seed(const std::string& text) {
  std::uint64_t seed = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, seed);
  if (text.empty() || error != std::errc() || stop != end) {
    throw InputError(fmt::format("--seed {}: the seed must be an integer from 0 to {}; e.g. --seed 1",
                                 text, std::numeric_limits<std::uint64_t>::max()));
  }
  return seed;
}

}  // namespace

void add_workload_flags(CLI::App& command, WorkloadFlags& flags) {
  command.add_option("--dataset", flags.dataset,
                     "bundled dataset (wlbllm, prolong, wikipedia, magi; see `ballast list "
                     "datasets`) or a length file [default: wlbllm]");
  command.add_option("--lengths", flags.lengths_file,
                     "length file: one length per line, a JSON array, or a histogram CSV");
  command.add_option("--cluster", flags.cluster, "cluster preset or JSON file [default: h100]");
  command.add_option("--nodes", flags.nodes, "override the cluster's node count");
  command.add_option("--tp", flags.tp,
                     "tensor-parallel degree: GPUs of one node per TP group (Megatron-LM with "
                     "sequence parallelism); strategies plan on TP groups [default: 1]");
  command.add_option("--model", flags.model, "model preset or JSON file [default: llama-7b]");
  command.add_option("--cost-model", flags.cost_model,
                     "analytical, a profiled preset (flexsp-a100-192k, flexsp-a100-384k) or a "
                     "JSON file [default: analytical]");
  command.add_option("--steps", flags.steps, "number of global batches (steps), at most 10,000 [default: compare 4; plan, simulate and run 1; a --scenario its own]");
  command.add_option_function<std::string>(
      "--seed", [&flags](const std::string& text) { flags.seed = parse_seed(text); },
      "sampler seed, 0 to 2^64 - 1 [default: 0]")
      ->type_name("UINT");
  command.add_option("--tokens-per-step", flags.tokens_per_step,
                     "token budget per global batch [default: 1048576]");
  command.add_option("--batch-size", flags.batch_size,
                     "sequences per global batch (instead of --tokens-per-step)");
  command.add_option("--max-context", flags.max_context,
                     "longest sequence kept [default: 131072]");
  command.add_option("--over-context", flags.over_context,
                     "documents longer than --max-context: split (default: into pieces of at "
                     "most --max-context), drop (as the papers do), truncate or error");
  command.add_option("--sampling", flags.sampling,
                     "random (i.i.d., seeded; default) or sequential (consecutive documents)");
  command.add_option("--grad-sync", flags.grad_sync,
                     "gradient sync: overlap (default: in per-layer buckets during the last "
                     "backward pass, as DDP/FSDP/ZeRO-3 run it) or end (all after it)");
  command.add_option("--recompute", flags.recompute,
                     "activation recomputation: selective (default: attention recomputed, "
                     "34*hidden bytes per token and layer kept), full (each layer's input "
                     "kept, its forward rerun in the backward pass) or none (under fused "
                     "attention, the same as selective); docs/cost-model.md");
  command.add_option("--degree", flags.degree,
                     "fixed SP/CP degree for static strategies [default: the smallest that fits]");
  command.add_flag("--no-routing", flags.no_routing,
                   "zeppelin without its routing layer (routing=off): inter-node ring transfers "
                   "use the sender's own NIC");
  command.add_flag("--no-remap", flags.no_remap,
                   "zeppelin without its remapping layer (remap=off): linear modules keep the "
                   "attention layout");
  command.add_flag("--even-split", flags.even_split,
                   "zeppelin with its partitioning replaced by even splitting (partition=even): "
                   "every sequence zigzag-split over static rings");
}

void add_output_flags(CLI::App& command, OutputFlags& flags, bool csv_allowed) {
  command.add_option("--format", flags.format,
                     csv_allowed ? "output format: text, csv or json [default: text]"
                                 : "output format: text or json [default: text]");
  command.add_option("-o,--output", flags.output_path, "write to FILE instead of stdout");
}

void apply_workload_flags(const WorkloadFlags& flags, RunSettings& settings) {
  if (flags.dataset && flags.lengths_file) {
    throw InputError("give either --dataset or --lengths, not both");
  }
  if (flags.tokens_per_step && flags.batch_size) {
    throw InputError("give either --tokens-per-step or --batch-size, not both");
  }
  if (flags.dataset) settings.dataset = *flags.dataset;
  if (flags.lengths_file) settings.dataset = *flags.lengths_file;
  if (flags.cluster) settings.cluster = *flags.cluster;
  if (flags.nodes) settings.nodes = *flags.nodes;
  if (flags.tp) settings.tensor_parallel = *flags.tp;
  if (flags.model) settings.model = *flags.model;
  if (flags.cost_model) settings.cost_model = *flags.cost_model;
  if (flags.steps) settings.steps = *flags.steps;
  if (flags.degree) settings.planner.degree = *flags.degree;
  auto& sampler = settings.sampler;
  if (flags.seed) sampler.seed = *flags.seed;
  if (flags.tokens_per_step) {
    sampler.tokens_per_step = *flags.tokens_per_step;
    sampler.batch_size.reset();
  }
  if (flags.batch_size) {
    sampler.batch_size = *flags.batch_size;
    sampler.tokens_per_step.reset();
  }
  if (flags.max_context) sampler.max_context_tokens = *flags.max_context;
  if (flags.over_context) sampler.over_context = parse_over_context_policy(*flags.over_context);
  if (flags.sampling) sampler.order = parse_sampling_order(*flags.sampling);
  if (flags.grad_sync) {
    settings.gradient_sync = parse_gradient_sync(*flags.grad_sync, setting_name("--grad-sync"));
  }
  if (flags.recompute) settings.recompute = parse_recompute(*flags.recompute, "--recompute");
  if (settings.nodes && *settings.nodes < 1) {
    throw InputError(fmt::format("--nodes {} must be at least 1", *settings.nodes));
  }
  // Before anything is sampled or measured (every step's batch is held at once; `ballast
  // run` would calibrate the host first); resolve_inputs() checks again for library callers.
  check_step_count(settings.steps);
}

Format parse_format(const std::string& text) {
  if (text == "text") return Format::text;
  if (text == "csv") return Format::csv;
  if (text == "json") return Format::json;
  throw InputError(fmt::format("--format {}: unknown format; use text, csv or json", text));
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::string current;
  for (char c : text + ",") {
    if (c == ',') {
      if (!current.empty()) items.push_back(current);
      current.clear();
    } else if (c != ' ') {
      current += c;
    }
  }
  return items;
}

std::vector<std::string> apply_ablation_flags(const WorkloadFlags& flags,
                                              std::vector<std::string> specs) {
  const struct {
    bool given;
    const char* flag;
    const char* key;
    const char* value;
  } switches[] = {{flags.no_routing, "--no-routing", "routing", "off"},
                  {flags.no_remap, "--no-remap", "remap", "off"},
                  {flags.even_split, "--even-split", "partition", "even"}};
  for (const auto& ablation : switches) {
    if (!ablation.given) continue;
    bool taken = false;
    for (std::string& spec : specs) {
      const Planner& planner = find_planner(spec.substr(0, spec.find(':')));
      const auto parameters = planner.parameters();
      const bool takes = std::any_of(parameters.begin(), parameters.end(),
                                     [&](const PlannerParameter& p) { return p.key == ablation.key; });
      if (!takes) continue;
      taken = true;
      if (spec.find(fmt::format(":{}=", ablation.key)) == std::string::npos) {
        spec += fmt::format(":{}={}", ablation.key, ablation.value);
      }
    }
    if (!taken) {
      throw InputError(fmt::format("{} applies to strategies with a '{}' parameter (zeppelin); "
                                   "none of the given strategies has one",
                                   ablation.flag, ablation.key));
    }
  }
  return specs;
}

namespace {

/// `spec` without any degree= item ("static-cp:degree=8" -> "static-cp").
std::string without_degree(const std::string& spec) {
  std::string stem = spec.substr(0, spec.find(':'));
  for (std::size_t begin = spec.find(':'); begin != std::string::npos;) {
    const std::size_t end = spec.find(':', begin + 1);
    const std::string item = spec.substr(begin + 1, end == std::string::npos ? end : end - begin - 1);
    if (item.rfind("degree=", 0) != 0) stem += ":" + item;
    begin = end;
  }
  return stem;
}

}  // namespace

std::vector<std::string> expand_degree_sweep(const std::string& sweep,
                                             const std::vector<std::string>& specs,
                                             const std::string& baseline, const CostModel& cost,
                                             const PlannerOptions& base,
                                             std::vector<std::string>& notes) {
  const std::size_t equals = sweep.find('=');
  if (equals == std::string::npos || sweep.substr(0, equals) != "degree") {
    throw InputError(fmt::format("--sweep {}: write --sweep degree=V1,V2,... (the degree is what "
                                 "can be swept), e.g. --sweep degree=8,16,32",
                                 sweep));
  }
  const std::vector<std::string> values = split_list(sweep.substr(equals + 1));
  if (values.empty()) {
    throw InputError(fmt::format("--sweep {}: give at least one degree, e.g. --sweep degree=8,16,32",
                                 sweep));
  }
  std::vector<std::string> expanded;
  const auto add = [&expanded](const std::string& spec) {
    if (std::find(expanded.begin(), expanded.end(), spec) == expanded.end()) expanded.push_back(spec);
  };
  if (std::find(specs.begin(), specs.end(), baseline) != specs.end()) add(baseline);
  std::vector<std::string> first_reason(values.size());  // why a value was skipped, first time
  std::vector<bool> taken(values.size(), false);
  bool any_sweepable = false;
  for (const std::string& spec : specs) {
    const StrategySpec parsed = parse_strategy_spec(spec, base);
    if (!parsed.planner->takes_common_degree(parsed.options)) {
      add(spec);
      continue;
    }
    any_sweepable = true;
    const std::string stem = without_degree(spec);
    for (std::size_t v = 0; v < values.size(); ++v) {
      const std::string swept = fmt::format("{}:degree={}", stem, values[v]);
      try {
        check_strategy_spec(parse_strategy_spec(swept, base), cost);
      } catch (const InputError& error) {
        notes.push_back(fmt::format("--sweep: {} skipped: {}", swept, error.what()));
        if (first_reason[v].empty()) first_reason[v] = error.what();
        continue;
      }
      taken[v] = true;
      add(swept);
    }
  }
  if (!any_sweepable) {
    throw InputError(fmt::format("--sweep {}: none of the compared strategies takes a degree; "
                                 "compare static-cp, static-cp-allgather, static-ulysses, "
                                 "batch-adaptive or zeppelin:partition=even",
                                 sweep));
  }
  for (std::size_t v = 0; v < values.size(); ++v) {
    if (!taken[v]) {
      throw InputError(fmt::format("--sweep {}: no compared strategy can take degree {} ({}); "
                                   "give degrees that divide the GPU count",
                                   sweep, values[v], first_reason[v]));
    }
  }
  return expanded;
}

void add_runtime_model_flags(CLI::App& command, runtime::ModelConfig& model, const std::string& prefix) {
  command.add_option("--hidden", model.hidden, prefix + "model width [default: 64]");
  command.add_option("--layers", model.layers, prefix + "layers [default: 2]");
  command.add_option("--heads", model.heads, prefix + "query heads [default: 4]");
  command.add_option("--kv-heads", model.kv_heads, prefix + "KV heads (GQA) [default: 2]");
  command.add_option("--ffn", model.ffn_hidden, prefix + "SwiGLU hidden size [default: 172]");
  command.add_flag("--untied", [&model](std::int64_t) { model.tied_embeddings = false; },
                   prefix + "separate LM head instead of the tied embedding");
  command.add_option("--experts", model.experts,
                     prefix + "mixture of experts: SwiGLU experts per layer instead of the MLP [default: 0, dense]");
  command.add_option("--experts-per-token", model.experts_per_token,
                     prefix + "with --experts: top-k experts each token runs [default: 2]");
  command.add_option("--expert-ffn", model.expert_ffn_hidden,
                     prefix + "with --experts: each expert's SwiGLU hidden size [default: --ffn]");
  command.callback([&model] {
    // Unless given, Mixtral's choices (Jiang et al. 2024): top-2, experts as wide as the
    // dense FFN (Mixtral 8x7B's experts have Mistral 7B's 14,336).
    if (model.experts > 0 && model.experts_per_token == 0) model.experts_per_token = std::min(2, model.experts);
    if (model.experts > 0 && model.expert_ffn_hidden == 0) model.expert_ffn_hidden = model.ffn_hidden;
  });
}

}  // namespace ballast::cli
