// Model: FLOPs and bytes derived from the shape (mixture-of-experts layers and their
// seeded expert loads included), parameter estimate, validation, JSON round trip and
// load_model (a preset name or a JSON file). Presets are in presets.cpp.
#include <cmath>
#include <numbers>

#include "ballast/error.hpp"
#include "ballast/json_file.hpp"
#include "ballast/model.hpp"
#include "ballast/text.hpp"

namespace ballast {

namespace {

/// Every member model_from_json reads (and to_json writes); any other is an error.
constexpr std::array<std::string_view, 14> kModelKeys = {
    "name",       "layers", "hidden",    "heads", "kv_heads", "ffn_hidden", "vocab", "gated_mlp",
    "bytes_per_element", "activation_bytes_per_token", "recompute", "parameters", "provenance",
    "moe"};
/// Every member of a model's "moe" object.
constexpr std::array<std::string_view, 6> kMoeKeys = {
    "experts", "experts_per_token", "shared_experts", "expert_parallel", "routing_skew_cv",
    "routing_seed"};

/// Weights of the Q and K, V projections of one layer (h*h + 2*h*kv_dim).
double qkv_weights_per_layer(const Model& model) {
  const double hidden = model.hidden;
  return hidden * hidden + 2.0 * hidden * model.kv_dim();
}

/// Weights of one MLP (one expert of an MoE layer): 3 or 2 matrices of hidden x ffn_hidden.
double mlp_weights(const Model& model) {
  const double hidden = model.hidden;
  const double mlp_matrices = model.gated_mlp ? 3.0 : 2.0;
  return mlp_matrices * hidden * model.ffn_hidden;
}

/// Weights of one layer's linear modules that run `mlps` MLPs: QKV, O (h*h), the MLPs
/// and, in an MoE layer, the router (hidden x experts). A dense layer runs one MLP.
double layer_weights(const Model& model, double mlps) {
  const double hidden = model.hidden;
  if (!model.is_moe()) return qkv_weights_per_layer(model) + hidden * hidden + mlp_weights(model);
  return qkv_weights_per_layer(model) + hidden * hidden + mlps * mlp_weights(model) +
         hidden * model.experts;
}

/// Weights of the linear modules a token runs in one layer (MoE: its top-k routed
/// experts and the shared ones).
double linear_weights_per_layer(const Model& model) {
  return layer_weights(model, model.experts_per_token + model.shared_experts);
}

/// Weights stored per layer (MoE: every routed and shared expert).
double stored_weights_per_layer(const Model& model) {
  return layer_weights(model, model.experts + model.shared_experts);
}

/// SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators",
/// OOPSLA 2014): a portable, seedable stream, the same on every platform.
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// A uniform double in (0, 1): the top 53 bits, offset by half a step.
double uniform_open(std::uint64_t& state) {
  return (static_cast<double>(splitmix64(state) >> 11) + 0.5) * 0x1.0p-53;
}

/// One layer's max / mean rank load: each expert's tokens lognormal with mean 1 and
/// coefficient of variation `cv` (sigma^2 = ln(1 + cv^2), mu = -sigma^2 / 2; normal draws
/// by Box-Muller), experts / ranks consecutive experts per rank.
double layer_load_factor(std::uint64_t& state, int experts, int ranks, double cv) {
  const double sigma = std::sqrt(std::log1p(cv * cv));
  const double mu = -0.5 * sigma * sigma;
  const int experts_per_rank = experts / ranks;
  double total = 0;
  double most = 0;
  for (int rank = 0; rank < ranks; ++rank) {
    double load = 0;
    for (int e = 0; e < experts_per_rank; ++e) {
      const double normal = std::sqrt(-2.0 * std::log(uniform_open(state))) *
                            std::cos(2.0 * std::numbers::pi * uniform_open(state));
      load += std::exp(mu + sigma * normal);
    }
    total += load;
    most = std::max(most, load);
  }
  return most * ranks / total;
}

[[noreturn]] void reject(const std::string& source, const std::string& field,
                         const std::string& problem) {
  throw InputError(fmt::format("{}: model field '{}' {}", source, field, problem));
}

void require_positive_int(int value, const std::string& source, const std::string& field) {
  if (value < 1) reject(source, field, fmt::format("must be >= 1 (got {}); fix it", value));
}

/// The "moe" fields of an MoE model (experts >= 1).
void validate_moe(const Model& model, const std::string& source) {
  if (model.experts_per_token < 1 || model.experts_per_token > model.experts) {
    reject(source, "moe.experts_per_token",
           fmt::format("must be between 1 and experts ({}) (got {}); fix it", model.experts,
                       model.experts_per_token));
  }
  if (model.shared_experts < 0) {
    reject(source, "moe.shared_experts", fmt::format("must be >= 0 (got {})", model.shared_experts));
  }
  if (model.expert_parallel < 1 || model.experts % model.expert_parallel != 0) {
    reject(source, "moe.expert_parallel",
           fmt::format("({}) must be >= 1 and divide experts ({}); each rank of an expert-"
                       "parallel group holds experts / expert_parallel experts",
                       model.expert_parallel, model.experts));
  }
  if (!(model.routing_skew_cv >= 0) || !std::isfinite(model.routing_skew_cv)) {
    reject(source, "moe.routing_skew_cv",
           fmt::format("must be a finite number >= 0 (got {}); 0 is balanced routing",
                       model.routing_skew_cv));
  }
}

}  // namespace

Recompute parse_recompute(const std::string& text, const std::string& what) {
  if (text == "selective") return Recompute::selective;
  if (text == "full") return Recompute::full;
  if (text == "none") return Recompute::none;
  throw InputError(fmt::format("{} '{}' is not a recomputation mode; use selective (the "
                               "default), full or none",
                               what, text));
}

const char* recompute_name(Recompute recompute) {
  switch (recompute) {
    case Recompute::selective:
      return "selective";
    case Recompute::full:
      return "full";
    case Recompute::none:
      return "none";
  }
  return "selective";
}

double Model::stored_activation_bytes_per_token() const {
  if (recompute != Recompute::full) return activation_bytes_per_token;
  const double layer_inputs = static_cast<double>(hidden) * bytes_per_element * layers;
  return layer_inputs + activation_bytes_per_token / layers;
}

double Model::linear_flops_per_token() const {
  // 2 FLOPs per multiply-add; the LM head (hidden x vocab) runs once, after the layers.
  return 2.0 * linear_weights_per_layer(*this) * layers + 2.0 * hidden * static_cast<double>(vocab);
}

double Model::expert_flops_per_token() const {
  if (!is_moe()) return 0.0;
  return 2.0 * experts_per_token * mlp_weights(*this) * layers;
}

double Model::routed_expert_parameters() const {
  if (!is_moe()) return 0.0;
  return static_cast<double>(experts) * mlp_weights(*this) * layers;
}

double Model::active_parameters(bool tied_embeddings) const {
  const double hidden = this->hidden;
  const double embedding = hidden * vocab;
  const double embeddings = tied_embeddings ? embedding : 2.0 * embedding;
  const double norms = 2.0 * hidden * layers + hidden;
  return embeddings + linear_weights_per_layer(*this) * layers + norms;
}

double Model::gradient_sync_parameters() const {
  if (!is_moe()) return parameters;
  const double routed = routed_expert_parameters();
  return std::max(0.0, parameters - routed) + routed / expert_parallel;
}

double Model::expert_load_factor(std::int64_t micro_batch) const {
  if (!is_moe() || expert_parallel <= 1 || !(routing_skew_cv > 0)) return 1.0;
  double sum = 0;
  for (int layer = 0; layer < layers; ++layer) {
    // One stream per (seed, micro-batch, layer): SplitMix64's outputs of the mixed keys.
    std::uint64_t key = routing_seed;
    std::uint64_t state = splitmix64(key) ^ static_cast<std::uint64_t>(micro_batch);
    state = splitmix64(state) ^ static_cast<std::uint64_t>(layer);
    sum += layer_load_factor(state, experts, expert_parallel, routing_skew_cv);
  }
  return sum / layers;
}

double Model::qkv_flops_fraction() const {
  return 2.0 * qkv_weights_per_layer(*this) * layers / linear_flops_per_token();
}

Bytes Model::kv_bytes_per_token() const {
  return Bytes{2} * kv_dim() * bytes_per_element;
}

Bytes Model::qkv_bytes_per_token() const {
  return (Bytes{hidden} + Bytes{2} * kv_dim()) * bytes_per_element;
}

Bytes Model::hidden_bytes_per_token() const {
  return static_cast<Bytes>(hidden) * bytes_per_element;
}

double estimate_parameters(const Model& model, bool tied_embeddings) {
  const double hidden = model.hidden;
  const double embedding = hidden * model.vocab;
  const double embeddings = tied_embeddings ? embedding : 2.0 * embedding;
  // Two RMSNorm weight vectors per layer (attention, MLP) and one final norm.
  const double norms = 2.0 * hidden * model.layers + hidden;
  return embeddings + stored_weights_per_layer(model) * model.layers + norms;
}

void validate_model(const Model& model, const std::string& source) {
  if (model.name.empty()) reject(source, "name", "must not be empty");
  require_positive_int(model.layers, source, "layers");
  require_positive_int(model.hidden, source, "hidden");
  require_positive_int(model.heads, source, "heads");
  require_positive_int(model.kv_heads, source, "kv_heads");
  require_positive_int(model.ffn_hidden, source, "ffn_hidden");
  require_positive_int(model.vocab, source, "vocab");
  require_positive_int(model.bytes_per_element, source, "bytes_per_element");
  if (model.hidden % model.heads != 0) {
    reject(source, "heads",
           fmt::format("({}) must divide hidden ({})", model.heads, model.hidden));
  }
  if (model.heads % model.kv_heads != 0) {
    reject(source, "kv_heads",
           fmt::format("({}) must divide heads ({})", model.kv_heads, model.heads));
  }
  if (!(model.activation_bytes_per_token > 0)) {
    reject(source, "activation_bytes_per_token",
           fmt::format("must be > 0 (got {})", model.activation_bytes_per_token));
  }
  if (!(model.parameters > 0)) {
    reject(source, "parameters", fmt::format("must be > 0 (got {})", model.parameters));
  }
  if (model.is_moe()) validate_moe(model, source);
}

nlohmann::json to_json(const Model& model) {
  nlohmann::json json;
  json["name"] = model.name;
  json["layers"] = model.layers;
  json["hidden"] = model.hidden;
  json["heads"] = model.heads;
  json["kv_heads"] = model.kv_heads;
  json["ffn_hidden"] = model.ffn_hidden;
  json["vocab"] = model.vocab;
  json["gated_mlp"] = model.gated_mlp;
  json["bytes_per_element"] = model.bytes_per_element;
  json["activation_bytes_per_token"] = model.activation_bytes_per_token;
  // Written only when not the default, so files and plans from before the option read
  // and write byte-identically.
  if (model.recompute != Recompute::selective) json["recompute"] = recompute_name(model.recompute);
  json["parameters"] = model.parameters;
  json["provenance"] = model.provenance;
  // Only for MoE models: dense models' files and plans stay as they were.
  if (model.is_moe()) {
    json["moe"] = {{"experts", model.experts},
                   {"experts_per_token", model.experts_per_token},
                   {"shared_experts", model.shared_experts},
                   {"expert_parallel", model.expert_parallel},
                   {"routing_skew_cv", model.routing_skew_cv},
                   {"routing_seed", model.routing_seed}};
  }
  return json;
}

Model model_from_json(const nlohmann::json& json, const std::string& source) {
  if (!json.is_object()) {
    throw InputError(fmt::format("{}: a model must be a JSON object; see "
                                 "data/presets/example-model.json", source));
  }
  // First, so that a misspelt required key gets its suggestion, not "missing field".
  reject_unknown_keys(json, kModelKeys, source);
  Model model;
  model.name = required_field<std::string>(json, "name", source);
  model.layers = required_field<int>(json, "layers", source);
  model.hidden = required_field<int>(json, "hidden", source);
  model.heads = required_field<int>(json, "heads", source);
  model.kv_heads = required_field<int>(json, "kv_heads", source);
  model.ffn_hidden = required_field<int>(json, "ffn_hidden", source);
  model.vocab = required_field<int>(json, "vocab", source);
  model.gated_mlp = required_field<bool>(json, "gated_mlp", source);
  model.bytes_per_element = required_field<int>(json, "bytes_per_element", source);
  model.activation_bytes_per_token = required_field<double>(json, "activation_bytes_per_token", source);
  model.recompute = parse_recompute(
      optional_field<std::string>(json, "recompute", "selective", source),
      source + ": model field 'recompute'");
  model.parameters = required_field<double>(json, "parameters", source);
  model.provenance = optional_field<std::string>(json, "provenance", "", source);
  if (json.contains("moe")) {
    const nlohmann::json& moe = json["moe"];
    const std::string where = source + ": model field 'moe'";
    if (!moe.is_object()) {
      throw InputError(fmt::format("{} must be an object with experts, experts_per_token and "
                                   "optionally shared_experts, expert_parallel, "
                                   "routing_skew_cv, routing_seed", where));
    }
    reject_unknown_keys(moe, kMoeKeys, where);
    model.experts = required_field<int>(moe, "experts", where);
    if (model.experts < 1) reject(source, "moe.experts", fmt::format("must be >= 1 (got {})", model.experts));
    model.experts_per_token = required_field<int>(moe, "experts_per_token", where);
    model.shared_experts = optional_field<int>(moe, "shared_experts", 0, where);
    model.expert_parallel = optional_field<int>(moe, "expert_parallel", 1, where);
    model.routing_skew_cv = optional_field<double>(moe, "routing_skew_cv", 0.0, where);
    model.routing_seed = optional_field<std::uint64_t>(moe, "routing_seed", 0, where);
  }
  validate_model(model, source);
  return model;
}

Model load_model(const std::string& preset_or_file) {
  const auto presets = model_preset_names();
  if (std::find(presets.begin(), presets.end(), preset_or_file) != presets.end()) {
    return model_preset(preset_or_file);
  }
  if (std::filesystem::is_regular_file(preset_or_file)) {
    return model_from_json(read_json_file(preset_or_file), preset_or_file);
  }
  throw InputError(fmt::format(
      "unknown model '{}'{}: not a preset ({}) and not a JSON file; pick a preset or give the "
      "path of a model JSON file",
      preset_or_file, did_you_mean(preset_or_file, presets), fmt::join(presets, ", ")));
}

}  // namespace ballast
