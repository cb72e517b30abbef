// Model: the transformer's shape, from which FLOPs, bytes and memory are derived.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ballast/units.hpp"

namespace ballast {

/// A decoder-only transformer. Attention may use GQA (kv_heads < heads).
struct Model {
  std::string name;
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;
  int ffn_hidden = 0;
  int vocab = 0;
  bool gated_mlp = true;              ///< SwiGLU (3 FFN matrices) vs GELU MLP (2)
  int bytes_per_element = 2;          ///< bf16
  double activation_bytes_per_token = 0;  ///< stored activations, all layers, per token
  double parameters = 0;              ///< parameter count (numel)
  std::string provenance;

  int head_dim() const { return hidden / heads; }
  int kv_dim() const { return kv_heads * head_dim(); }
  /// Forward FLOPs of all linear layers (QKV, O, MLP; all layers) per token: 2 * weights.
  double linear_flops_per_token() const;
  /// Share of linear_flops_per_token() spent before attention (the QKV projections).
  double qkv_flops_fraction() const;
  /// Bytes of K and V for one token in one layer: 2 * kv_dim * bytes_per_element.
  Bytes kv_bytes_per_token() const;
  /// Bytes of Q, K and V for one token in one layer.
  Bytes qkv_bytes_per_token() const;
  /// Bytes of the attention output (hidden) for one token in one layer.
  Bytes hidden_bytes_per_token() const;
};

void validate_model(const Model& model, const std::string& source);
std::vector<std::string> model_preset_names();
/// Throws InputError listing the known presets when `name` is unknown.
Model model_preset(const std::string& name);
Model load_model(const std::string& preset_or_file);
nlohmann::json to_json(const Model& model);
Model model_from_json(const nlohmann::json& json, const std::string& source);

/// Estimated parameter count from the shape (embeddings + layers), used by presets.
double estimate_parameters(const Model& model, bool tied_embeddings);

}  // namespace ballast
