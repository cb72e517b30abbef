// Shared fixtures for the Plan tests: a small cluster and model built field by field, a
// cost model with simple formulas, and builders for groups and a valid plan of every scheme.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ballast/cost_model.hpp"
#include "ballast/plan.hpp"

namespace ballast::testing {

/// 2 nodes x 4 GPUs, 80 GiB of which 90 % usable: a 72.0 GiB limit per rank.
inline Cluster small_cluster(int nodes = 2, int gpus_per_node = 4) {
  Cluster cluster;
  cluster.name = "test-cluster";
  cluster.gpu_name = "test-gpu";
  cluster.nodes = nodes;
  cluster.gpus_per_node = gpus_per_node;
  cluster.gpu_memory_bytes = Bytes{80} << 30;
  cluster.peak_flops_per_s = 1e15;
  cluster.matmul_efficiency = 0.5;
  cluster.attention_efficiency = 0.5;
  cluster.attention_tile_tokens = 128;
  cluster.memory_usable_fraction = 0.9;
  cluster.intra_node_bus_bw_bytes_per_s = 2e11;
  cluster.intra_node_p2p_bw_bytes_per_s = 1e11;
  cluster.intra_node_latency_s = 1e-5;
  cluster.nics_per_node = gpus_per_node;
  cluster.nic_bw_bytes_per_s = 5e10;
  cluster.inter_node_latency_s = 2e-5;
  cluster.provenance = "made up for the plan tests";
  return cluster;
}

/// 8 query heads, 4 KV heads (GQA), head dim 128: 2,048 KV bytes and 4,096 QKV bytes per
/// token and layer; 1 MiB of activations per token; 1e9 parameters.
inline Model small_model() {
  Model model;
  model.name = "test-model";
  model.layers = 4;
  model.hidden = 1024;
  model.heads = 8;
  model.kv_heads = 4;
  model.ffn_hidden = 4096;
  model.vocab = 32000;
  model.gated_mlp = true;
  model.bytes_per_element = 2;
  model.activation_bytes_per_token = 1024.0 * 1024.0;
  model.parameters = 1e9;
  model.provenance = "made up for the plan tests";
  return model;
}

/// Simple formulas; memory comes from the CostModel base (ZeRO-3 states, the cluster's limit).
class FakeCostModel final : public CostModel {
 public:
  using CostModel::CostModel;
  std::string name() const override { return "fake"; }
  nlohmann::json spec() const override { return {{"family", "fake"}}; }
  Seconds attention_time_s(std::span<const AttentionBlock> blocks, int head_split,
                           Pass /*pass*/) const override {
    double pairs = 0;
    for (const auto& block : blocks) pairs += static_cast<double>(causal_pairs(block));
    return pairs * 1e-9 / head_split;
  }
  Seconds attention_pair_floor_s(double pairs, Pass /*pass*/) const override {
    return pairs * 1e-9;
  }
  Seconds linear_time_s(Tokens tokens, Pass /*pass*/) const override {
    return static_cast<double>(tokens) * 1e-6;
  }
};

/// (sequence id, padded length) pairs placed by a builder.
using Placed = std::vector<std::pair<std::int64_t, Tokens>>;

/// Each sequence whole on one rank.
inline AttentionGroup local_group(int rank, const Placed& sequences) {
  AttentionGroup group{Scheme::local, {rank}, {}, 1};
  for (const auto& [id, length] : sequences) {
    group.sequences.push_back({id, length, {{rank, 0, length}}});
  }
  return group;
}

/// Zigzag: 2d equal chunks, rank i takes chunks i and 2d-1-i (padded length divisible by 2d).
inline SequenceChunks zigzag(std::int64_t id, Tokens padded, const std::vector<int>& ranks) {
  const auto d = static_cast<Tokens>(ranks.size());
  const Tokens chunk = padded / (2 * d);
  SequenceChunks sequence{id, padded, {}};
  for (Tokens i = 0; i < d; ++i) {
    const int rank = ranks[static_cast<std::size_t>(i)];
    sequence.chunks.push_back({rank, i * chunk, (i + 1) * chunk});
    sequence.chunks.push_back({rank, (2 * d - 1 - i) * chunk, (2 * d - i) * chunk});
  }
  return sequence;
}

/// Contiguous equal split (padded length divisible by the group size).
inline SequenceChunks contiguous(std::int64_t id, Tokens padded, const std::vector<int>& ranks) {
  const auto d = static_cast<Tokens>(ranks.size());
  const Tokens chunk = padded / d;
  SequenceChunks sequence{id, padded, {}};
  for (Tokens i = 0; i < d; ++i) {
    sequence.chunks.push_back({ranks[static_cast<std::size_t>(i)], i * chunk, (i + 1) * chunk});
  }
  return sequence;
}

inline AttentionGroup split_group(Scheme scheme, std::vector<int> ranks, const Placed& sequences) {
  AttentionGroup group{scheme, ranks, {}, 1};
  for (const auto& [id, padded] : sequences) {
    group.sequences.push_back(scheme == Scheme::ulysses ? contiguous(id, padded, ranks)
                                                        : zigzag(id, padded, ranks));
  }
  return group;
}

inline MicroBatch micro_batch_of(std::vector<AttentionGroup> groups) {
  MicroBatch micro_batch;
  micro_batch.groups = std::move(groups);
  return micro_batch;
}

/// Lengths of the base plan's sequences (index = id).
inline std::vector<Tokens> base_lengths() { return {1000, 2000, 3000, 4000, 5000, 6000, 800, 64}; }

/// A valid plan on small_cluster() using every scheme:
///   micro-batch 0: g0 local [0] {0}; g1 local [1] {1, 6}; g2 ring [2, 3] {2};
///                  g3 ulysses [4, 5, 6, 7] {3}
///   micro-batch 1: g0 all_gather [0, 1, 2, 3] {4}; g1 ulysses [4, 5] {5}; g2 local [6] {7}
inline Plan base_plan() {
  Plan plan;
  plan.strategy = "hand-made";
  plan.step = 3;
  plan.cluster = small_cluster();
  plan.model = small_model();
  plan.cost_model = {{"family", "fake"}};
  plan.sequence_lengths_tokens = base_lengths();
  MicroBatch first;
  first.groups.push_back(local_group(0, {{0, 1000}}));
  first.groups.push_back(local_group(1, {{1, 2000}, {6, 800}}));
  first.groups.push_back(split_group(Scheme::ring, {2, 3}, {{2, 3000}}));
  first.groups.push_back(split_group(Scheme::ulysses, {4, 5, 6, 7}, {{3, 4000}}));
  MicroBatch second;
  second.groups.push_back(split_group(Scheme::all_gather, {0, 1, 2, 3}, {{4, 5000}}));
  second.groups.push_back(split_group(Scheme::ulysses, {4, 5}, {{5, 6000}}));
  second.groups.push_back(local_group(6, {{7, 64}}));
  plan.micro_batches = {first, second};
  return plan;
}

inline FakeCostModel fake_cost() { return FakeCostModel(small_cluster(), small_model()); }

}  // namespace ballast::testing
