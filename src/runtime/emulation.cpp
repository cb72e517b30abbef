// planning_model (emulation.hpp): the runtime's model as planners see it.
#include "ballast/runtime/emulation.hpp"

namespace ballast::runtime {

namespace {

/// fp32 activations the runtime's model keeps per token over all layers (its forward
/// saves about this many floats per token and layer: inputs of both norms, q, k, v,
/// attention output, MLP gate/up/activation, residuals), used only for planning memory.
double activation_bytes_per_token(const ModelConfig& model) {
  const double per_layer = 6.0 * model.hidden + 2.0 * model.kv_heads * model.head_dim() +
                           3.0 * model.ffn_hidden;
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
  model.ffn_hidden = config.ffn_hidden;
  model.vocab = config.vocab;
  model.bytes_per_element = 4;
  model.activation_bytes_per_token = activation_bytes_per_token(config);
  const Parameters parameters = init_parameters(config, 0);
  model.parameters = static_cast<double>(parameters.values.size());
  model.provenance = "the runtime's model (ballast run), fp32";
  return model;
}

}  // namespace ballast::runtime
