// The Ulysses head rule (plan.hpp, docs/plan-format.md "Ulysses degrees"): which group
// sizes shard a model's heads, how many members hold each KV head, and the bytes per token
// its all-to-alls carry (and a USP member's share of the KV its ring passes on).
#include <algorithm>

#include "ballast/plan.hpp"

namespace ballast {

namespace {

/// Heads and KV heads of each TP GPU, or {0, 0} when N does not divide them.
struct HeadsPerGpu {
  int heads = 0;
  int kv_heads = 0;
};

HeadsPerGpu heads_per_gpu(const Model& model, int tensor_parallel) {
  if (tensor_parallel < 1 || model.heads % tensor_parallel != 0 ||
      model.kv_heads % tensor_parallel != 0) {
    return {};
  }
  return {model.heads / tensor_parallel, model.kv_heads / tensor_parallel};
}

}  // namespace

bool ulysses_degree_allowed(const Model& model, int tensor_parallel, int degree) {
  const HeadsPerGpu per_gpu = heads_per_gpu(model, tensor_parallel);
  if (degree < 1 || per_gpu.heads < 1 || per_gpu.kv_heads < 1) return false;
  return per_gpu.heads % degree == 0 &&
         (per_gpu.kv_heads % degree == 0 || degree % per_gpu.kv_heads == 0);
}

std::vector<int> allowed_ulysses_degrees(const Model& model, int tensor_parallel,
                                         int max_degree) {
  std::vector<int> degrees;
  for (int degree = 1; degree <= max_degree; ++degree) {
    if (ulysses_degree_allowed(model, tensor_parallel, degree)) degrees.push_back(degree);
  }
  return degrees;
}

int ulysses_kv_replication(const Model& model, int tensor_parallel, int degree) {
  const int kv_heads = heads_per_gpu(model, tensor_parallel).kv_heads;
  if (kv_heads < 1 || degree <= kv_heads) return 1;
  return (degree + kv_heads - 1) / kv_heads;
}

Bytes usp_kv_bytes_per_token(const Model& model, int tensor_parallel, int degree) {
  const Bytes replication = ulysses_kv_replication(model, tensor_parallel, degree);
  return model.kv_bytes_per_token() * replication / std::max(degree, 1);
}

Bytes ulysses_qkv_bytes_per_token(const Model& model, int tensor_parallel, int degree) {
  const Bytes replication = ulysses_kv_replication(model, tensor_parallel, degree);
  return model.qkv_bytes_per_token() + (replication - 1) * model.kv_bytes_per_token();
}

}  // namespace ballast
