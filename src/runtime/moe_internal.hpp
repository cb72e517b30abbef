// The runtime model's mixture-of-experts FFN (docs/runtime-model.md, "Mixture of experts"):
// router, top-k selection, gate softmax, the experts' SwiGLU and their hand-written
// backward, with each (token, expert) row sent to the expert's owner in an expert-parallel
// group and back (docs/runtime.md, "Expert parallelism"). Internal to model.cpp.
#pragma once

#include <limits>
#include <vector>

#include "ballast/runtime/model.hpp"

namespace ballast::runtime {

/// Row-major C = op(A) * op(B) + beta * C of dense operands (model.cpp), shared by the
/// dense layers and the experts; empty shapes do nothing (k = 0 scales C by beta).
void matmul(bool transpose_a, bool transpose_b, int m, int n, int k, const float* a,
            const float* b, float beta, float* c);

}  // namespace ballast::runtime

namespace ballast::runtime::moe {

/// One layer's MoE weights (or gradients): the router [hidden, experts] and every expert's
/// w_gate [hidden, F], w_up [hidden, F], w_down [F, hidden] (F = expert_ffn_hidden), the
/// experts one after the other in expert order.
template <typename Float>
struct Weights {
  Float* router = nullptr;
  Float* experts = nullptr;
};

/// What one layer's backward needs from its forward. "Sent" rows are this member's (token,
/// selected expert) pairs, ordered by destination member, then the destination's local
/// expert, then token; "held" rows are the ones this member's experts ran, in the order
/// they arrived (source member, local expert, token).
struct Activations {
  std::vector<int> selected;    // [n, k] the chosen experts, by descending logit
  std::vector<float> gates;     // [n, k] softmax over the chosen logits
  std::vector<int> slot_row;    // [n, k] the sent row of each token's j-th expert
  std::vector<int> send_rows;   // [members] rows sent to each member
  std::vector<int> held_counts;  // [members * local experts] rows held per source and expert
  std::vector<int> held_rows;   // [members] rows held from each member
  std::vector<float> expert_out;  // [sent, hidden] the experts' outputs, back with the sender
  std::vector<float> held_in;   // [held, hidden] the rows this member's experts ran
  std::vector<float> gate_pre, up_pre;  // [held, F] held_in * w_gate, held_in * w_up
  std::vector<float> activated;  // [held, F] silu(gate_pre) * up_pre
  double smallest_margin = std::numeric_limits<double>::infinity();
};

/// out [n, hidden] (overwritten) = sum over each token's top-k experts of gate * SwiGLU of
/// x [n, hidden]; `group` null = every expert here. Collective over the group.
void forward(const ModelConfig& config, ExpertParallelGroup* group, const float* x, int n,
             const Weights<const float>& weights, float* out, Activations& saved);

/// d_x [n, hidden] (overwritten) = d(loss)/d(x) from d_out [n, hidden]; adds the router's
/// gradient and this member's experts' gradients to `gradients`. Collective.
void backward(const ModelConfig& config, ExpertParallelGroup* group, const float* x, int n,
              const Weights<const float>& weights, const Activations& saved,
              const float* d_out, const Weights<float>& gradients, float* d_x);

}  // namespace ballast::runtime::moe
