// Model: FLOPs and bytes derived from the shape, parameter estimate, validation, JSON
// round trip and load_model (a preset name or a JSON file). Presets are in presets.cpp.
#include "ballast/error.hpp"
#include "ballast/json_file.hpp"
#include "ballast/model.hpp"
#include "ballast/text.hpp"

namespace ballast {

namespace {

/// Every member model_from_json reads (and to_json writes); any other is an error.
constexpr std::array<std::string_view, 13> kModelKeys = {
    "name",       "layers", "hidden",    "heads", "kv_heads", "ffn_hidden", "vocab", "gated_mlp",
    "bytes_per_element", "activation_bytes_per_token", "recompute", "parameters", "provenance"};

/// Weights of the Q and K, V projections of one layer (h*h + 2*h*kv_dim).
double qkv_weights_per_layer(const Model& model) {
  const double hidden = model.hidden;
  return hidden * hidden + 2.0 * hidden * model.kv_dim();
}

/// Weights of all linear layers of one layer: QKV, O (h*h) and the MLP (3 or 2 matrices).
double linear_weights_per_layer(const Model& model) {
  const double hidden = model.hidden;
  const double mlp_matrices = model.gated_mlp ? 3.0 : 2.0;
  return qkv_weights_per_layer(model) + hidden * hidden + mlp_matrices * hidden * model.ffn_hidden;
}

[[noreturn]] void reject(const std::string& source, const std::string& field,
                         const std::string& problem) {
  throw InputError(fmt::format("{}: model field '{}' {}", source, field, problem));
}

void require_positive_int(int value, const std::string& source, const std::string& field) {
  if (value < 1) reject(source, field, fmt::format("must be >= 1 (got {}); fix it", value));
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
  return embeddings + linear_weights_per_layer(model) * model.layers + norms;
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
