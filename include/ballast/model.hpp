// Model: the transformer's shape, from which FLOPs, bytes and memory are derived.
#pragma once

#include <cstdint>
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
  double parameters = 0;              ///< parameter count (numel), all experts included
  std::string provenance;

  // ---- mixture of experts (docs/cost-model.md "Mixture of experts"); JSON "moe" ----
  // Every layer's MLP is an MoE layer: a router (hidden x experts) picks experts_per_token
  // of `experts` routed experts per token; each expert, and each shared expert every token
  // runs, is an MLP of ffn_hidden (gated_mlp decides 3 or 2 matrices).
  int experts = 0;                ///< routed experts per layer; 0 = a dense model
  int experts_per_token = 0;      ///< top-k: routed experts each token runs
  int shared_experts = 0;         ///< experts every token runs (DeepSeek-MoE); 0 in Mixtral
  int expert_parallel = 1;        ///< EP degree: consecutive ranks a layer's experts spread over
  /// Coefficient of variation of the tokens each routed expert receives in one layer of
  /// one micro-batch (0 = perfectly balanced routing).
  double routing_skew_cv = 0;
  std::uint64_t routing_seed = 0;  ///< seeds the expert loads the simulator draws

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
  bool is_moe() const { return experts > 0; }
  /// Forward FLOPs of all linear layers (QKV, O, MLP; all layers) per token: 2 * weights
  /// a token runs (MoE: the router, its experts_per_token routed and the shared experts).
  double linear_flops_per_token() const;
  /// The routed experts' part of linear_flops_per_token() (0 for a dense model): the part
  /// an unbalanced routing slows down.
  double expert_flops_per_token() const;
  /// Parameters of the routed experts, all layers (0 dense), from the shape: what expert
  /// parallelism shards over expert_parallel ranks.
  double routed_expert_parameters() const;
  /// Parameters a token's computation touches (embeddings, attention, router, its routed
  /// and shared experts, norms) from the shape: the "active" parameters; dense: the
  /// estimate of all parameters.
  double active_parameters(bool tied_embeddings) const;
  /// Parameters whose gradients one rank reduces with its data-parallel peers: all but the
  /// routed experts, which only their expert_parallel-th share (the experts it holds; ZeRO
  /// shards them within the expert-data-parallel group). `parameters` for a dense model.
  double gradient_sync_parameters() const;
  /// The time the routed experts of micro-batch `micro_batch` take over balanced routing:
  /// per layer, tokens per expert drawn (lognormal, mean 1, coefficient of variation
  /// routing_skew_cv; seeded by routing_seed, the micro-batch and the layer), the experts
  /// split over expert_parallel ranks in order, and the layer runs as long as its most
  /// loaded rank: max / mean of the ranks' loads, averaged over the layers. >= 1; exactly
  /// 1 for a dense model, expert_parallel 1 or routing_skew_cv 0. Deterministic.
  double expert_load_factor(std::int64_t micro_batch) const;
  /// Share of linear_flops_per_token() spent before attention (the QKV projections).
  double qkv_flops_fraction() const;
  /// Bytes of K and V for one token in one layer: 2 * kv_dim * bytes_per_element.
  Bytes kv_bytes_per_token() const;
  /// Bytes of Q, K and V for one token in one layer.
  Bytes qkv_bytes_per_token() const;
  /// Bytes of the attention output (hidden) for one token in one layer.
  Bytes hidden_bytes_per_token() const;
  /// Field by field (validate()'s fast path, as Cluster's).
  bool operator==(const Model&) const = default;
};

void validate_model(const Model& model, const std::string& source);
std::vector<std::string> model_preset_names();
/// Throws InputError listing the known presets when `name` is unknown.
Model model_preset(const std::string& name);
Model load_model(const std::string& preset_or_file);
nlohmann::json to_json(const Model& model);
Model model_from_json(const nlohmann::json& json, const std::string& source);

/// Estimated parameter count from the shape (embeddings + layers, every expert of an MoE
/// model), used by presets.
double estimate_parameters(const Model& model, bool tied_embeddings);

}  // namespace ballast
