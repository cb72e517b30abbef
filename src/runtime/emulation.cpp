// planning_model (emulation.hpp): the runtime's model as planners see it.
#include "ballast/runtime/emulation.hpp"

namespace ballast::runtime {

namespace {

/// fp32 activations the runtime's model keeps per token over all layers (its forward
/// saves about this many floats per token and layer: inputs of both norms, q, k, v,
/// attention output, MLP gate/up/activation, residuals; an MoE layer instead of the MLP's
/// keeps, per routed row (k per token), its input and output rows and the expert's
/// gate/up/activation, and the router's choice), used only for planning memory.
double activation_bytes_per_token(const ModelConfig& model) {
  const double ffn = model.moe() ? model.experts_per_token * (2.0 * model.hidden + 3.0 * model.expert_ffn_hidden + 2.0)
                                 : 3.0 * model.ffn_hidden;
  const double per_layer = 6.0 * model.hidden + 2.0 * model.kv_heads * model.head_dim() + ffn;
  return 4.0 * (per_layer * model.layers + 2.0 * model.hidden + model.vocab);
}

}  // namespace

Model planning_model(const ModelConfig& config) {
  Model model;
  model.name = "runtime";
  model.layers = config.layers;
  model.hidden = config.hidden;
  model.heads = config.heads;
  model.kv_heads = config.kv_heads;
  // An MoE FFN is priced as the dense SwiGLU of the same FLOPs per token (k experts of
  // expert_ffn_hidden; the router's hidden x experts neglected); the simulator's MoE terms
  // (expert all-to-alls, load skew) stay off: plans place attention, not experts.
  model.ffn_hidden = config.moe() ? config.experts_per_token * config.expert_ffn_hidden : config.ffn_hidden;
  model.vocab = config.vocab;
  model.bytes_per_element = 4;
  model.activation_bytes_per_token = activation_bytes_per_token(config);
  const Parameters parameters = init_parameters(config, 0);
  model.parameters = static_cast<double>(parameters.values.size());
  model.provenance = "the runtime's model (ballast run), fp32";
  return model;
}

}  // namespace ballast::runtime
