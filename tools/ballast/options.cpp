// The shared workload/output flags of the ballast CLI.
#include "options.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "ballast/error.hpp"
#include "ballast/strategy.hpp"

namespace ballast::cli {

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
  command.add_option("--steps", flags.steps, "number of global batches (steps) [default: 4; plan: 1]");
  command.add_option("--seed", flags.seed, "sampler seed [default: 0]");
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

void add_runtime_model_flags(CLI::App& command, runtime::ModelConfig& model, const std::string& prefix) {
  command.add_option("--hidden", model.hidden, prefix + "model width [default: 64]");
  command.add_option("--layers", model.layers, prefix + "layers [default: 2]");
  command.add_option("--heads", model.heads, prefix + "query heads [default: 4]");
  command.add_option("--kv-heads", model.kv_heads, prefix + "KV heads (GQA) [default: 2]");
  command.add_option("--ffn", model.ffn_hidden, prefix + "SwiGLU hidden size [default: 172]");
  command.add_flag("--untied", [&model](std::int64_t) { model.tied_embeddings = false; },
                   prefix + "separate LM head instead of the tied embedding");
}

}  // namespace ballast::cli
