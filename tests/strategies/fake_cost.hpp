// A tiny hand-built cluster, model and cost model whose token capacities are round
// numbers, for hand-checked strategy tests.
#pragma once

#include <nlohmann/json.hpp>

#include <exception>
#include <functional>
#include <string>

#include "ballast/cost_model.hpp"

namespace ballast::testing {

/// kv_bytes_per_token = 2 * kv_heads * 4 * 2; with kv_heads = 2: kv 32, qkv 48 bytes.
inline Model tiny_model(int kv_heads = 2) {
  Model model;
  model.name = "tiny";
  model.layers = 2;
  model.hidden = 8;
  model.heads = 2;
  model.kv_heads = kv_heads;
  model.ffn_hidden = 16;
  model.vocab = 100;
  model.activation_bytes_per_token = 68;
  model.parameters = 1000;
  model.provenance = "hand-built for tests";
  return model;
}

inline Cluster tiny_cluster(int nodes = 1, int gpus_per_node = 4) {
  Cluster cluster;
  cluster.name = "tiny";
  cluster.gpu_name = "fake";
  cluster.nodes = nodes;
  cluster.gpus_per_node = gpus_per_node;
  cluster.gpu_memory_bytes = 1 << 20;
  cluster.peak_flops_per_s = 1e12;
  cluster.matmul_efficiency = 0.5;
  cluster.attention_efficiency = 0.5;
  cluster.memory_usable_fraction = 0.9;
  cluster.intra_node_bus_bw_bytes_per_s = 1e11;
  cluster.intra_node_p2p_bw_bytes_per_s = 5e10;
  cluster.intra_node_latency_s = 1e-5;
  cluster.nics_per_node = 1;
  cluster.nic_bw_bytes_per_s = 1e10;
  cluster.inter_node_latency_s = 3e-5;
  cluster.provenance = "hand-built for tests";
  return cluster;
}

/// Memory: 13,200 free bytes and 68 activation bytes per token, so (with kv_heads = 2)
/// local 194, ring 100, ulysses 113, all-gather d=2 100 / d=4 67 tokens per rank.
/// Compute: 1 ns per causal pair (split by heads), 1 us per linear token.
class FakeCostModel final : public CostModel {
 public:
  explicit FakeCostModel(Cluster cluster = tiny_cluster(), Model model = tiny_model(),
                         Bytes free_bytes = 13200)
      : CostModel(std::move(cluster), std::move(model)), free_bytes_(free_bytes) {}
  std::string name() const override { return "fake"; }
  nlohmann::json spec() const override { return {{"family", "fake"}}; }
  Seconds attention_time_s(std::span<const AttentionBlock> blocks, int head_split,
                           Pass pass) const override {
    double pairs = 0;
    for (const auto& block : blocks) pairs += static_cast<double>(causal_pairs(block));
    return attention_pair_floor_s(pairs, pass) / head_split;
  }
  Seconds attention_pair_floor_s(double pairs, Pass pass) const override {
    return pairs * 1e-9 * (pass == Pass::backward ? 2.5 : 1.0);
  }
  Seconds linear_time_s(Tokens tokens, Pass pass) const override {
    return static_cast<double>(tokens) * 1e-6 * (pass == Pass::backward ? 2.0 : 1.0);
  }
  Bytes model_state_bytes_per_rank() const override { return 0; }
  Bytes activation_bytes_per_token() const override { return 68; }
  Bytes memory_limit_bytes() const override { return free_bytes_; }

 private:
  Bytes free_bytes_;
};

/// The message of whatever `action` throws, or "" when it throws nothing.
inline std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

}  // namespace ballast::testing
