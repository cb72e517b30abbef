// Model: the transformer's shape, from which FLOPs, bytes and memory are derived.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ballast/units.hpp"

namespace ballast {

/// Activation recomputation (Korthikanti et al. 2022, "Reducing Activation Recomputation
/// in Large Transformer Models", Table 2 and section 5; docs/cost-model.md "Activation
/// recomputation"). Attention runs in a fused kernel (FlashAttention's tiles) in every
/// ballast cost model, so the attention scores Korthikanti's 5as/h term stores without
/// recomputation are never materialised, and their recomputation is what the kernel's
/// backward does anyway: `none` and `selective` keep the same bytes and cost the same.
enum class Recompute {
  selective,  ///< the model's activation_bytes_per_token (34*h per layer), no extra compute
  full,       ///< each layer's input kept (h * bytes_per_element per layer), its forward rerun
  none,       ///< nothing recomputed: under fused attention, the same as selective
};

/// "selective", "full" or "none"; throws InputError naming `what` and the values.
Recompute parse_recompute(const std::string& text, const std::string& what);
const char* recompute_name(Recompute recompute);

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
  /// Stored activations, all layers, per token, under selective recomputation (a preset's
  /// or file's figure); what a rank keeps is stored_activation_bytes_per_token().
  double activation_bytes_per_token = 0;
  Recompute recompute = Recompute::selective;  ///< JSON "recompute", optional
  double parameters = 0;              ///< parameter count (numel)
  std::string provenance;

  int head_dim() const { return hidden / heads; }
  int kv_dim() const { return kv_heads * head_dim(); }
  /// Activation bytes a rank keeps per token of its micro-batch, all layers, under
  /// `recompute`: selective and none, activation_bytes_per_token; full, every layer's
  /// input (layers * hidden * bytes_per_element, Korthikanti's 2sbhL at bf16) plus one
  /// layer's activations while that layer is recomputed in the backward pass.
  double stored_activation_bytes_per_token() const;
  /// Forward passes per micro-batch: 2 under full recomputation (the backward pass reruns
  /// each layer's forward, its communication included), else 1.
  int forward_passes() const { return recompute == Recompute::full ? 2 : 1; }
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
