// Test fixtures for the simulator: a cost model with hand-computable costs and helpers
// that build clusters, models and plans by hand.
#pragma once

#include <utility>
#include <vector>

#include "ballast/cost_model.hpp"
#include "ballast/plan.hpp"

namespace ballast::testing {

/// Costs chosen for hand computation (backward = 2 x forward for compute):
///   attention   1 us per causal pair, divided by the head split
///   linear      10 us per token (1 ms per 100 tokens)
///   overhead    `overhead_forward_s` per rank per micro-batch (0 unless set)
///   p2p         2 ms (0 for the same rank or no bytes); with `p2p_from_links`, the
///               cluster's alpha-beta time instead (latency + bytes / bandwidth per layer)
///   all-to-all  3 ms, all-gather 4 ms (0 for one rank), gradient sync 5 ms (a bucket of
///               b: 5 / b ms)
class FakeCostModel final : public CostModel {
 public:
  FakeCostModel(Cluster cluster, Model model) : CostModel(std::move(cluster), std::move(model)) {}
  std::string name() const override { return "fake"; }
  nlohmann::json spec() const override { return {{"family", "fake"}}; }

  Seconds attention_time_s(std::span<const AttentionBlock> blocks, int head_split,
                           Pass pass) const override {
    Tokens pairs = 0;
    for (const AttentionBlock& block : blocks) pairs += causal_pairs(block);
    return attention_pair_floor_s(static_cast<double>(pairs), pass) / head_split;
  }
  Seconds attention_pair_floor_s(double pairs, Pass pass) const override {
    return pairs * 1e-6 * factor(pass);
  }
  Seconds linear_time_s(Tokens tokens, Pass pass) const override {
    return static_cast<double>(tokens) * 1e-5 * factor(pass);
  }
  Seconds micro_batch_overhead_s(Pass pass) const override {
    return overhead_forward_s * factor(pass);
  }
  Seconds p2p_time_s(Bytes bytes, int src_rank, int dst_rank) const override {
    if (p2p_from_links) return CostModel::p2p_time_s(bytes, src_rank, dst_rank);
    return src_rank == dst_rank || bytes <= 0 ? 0.0 : 2e-3;
  }
  Seconds p2p_latency_s(int src_rank, int dst_rank) const override {
    return p2p_from_links ? CostModel::p2p_latency_s(src_rank, dst_rank) : 0.0;
  }
  Seconds all_to_all_time_s(std::span<const int> ranks,
                            std::span<const Bytes> bytes_per_rank) const override {
    all_to_all_bytes.emplace_back(bytes_per_rank.begin(), bytes_per_rank.end());
    return ranks.size() > 1 ? 3e-3 : 0.0;
  }
  Seconds all_gather_time_s(std::span<const int> ranks, std::span<const Bytes>) const override {
    return ranks.size() > 1 ? 4e-3 : 0.0;
  }
  Seconds gradient_sync_time_s() const override { return 5e-3; }
  Seconds gradient_bucket_sync_time_s(int buckets) const override { return 5e-3 / buckets; }
  Bytes memory_limit_bytes() const override { return capacity_tokens; }  // 1 byte per token

  Seconds overhead_forward_s = 0;
  Bytes capacity_tokens = 1'000'000'000;
  bool p2p_from_links = false;  ///< byte-dependent transfers, for routing and pipelining
  /// bytes_per_rank of every all_to_all_time_s() call, in call order.
  mutable std::vector<std::vector<Bytes>> all_to_all_bytes;

 private:
  static double factor(Pass pass) { return pass == Pass::forward ? 1.0 : 2.0; }
};

/// nodes x gpus_per_node GPUs with nics_per_node NICs per node; link numbers are
/// placeholders (the fake cost model ignores them) but valid.
Cluster fake_cluster(int nodes, int gpus_per_node, int nics_per_node);

/// hidden 6, 2 heads, 2 KV heads, SwiGLU FFN 16, no vocabulary, 1 layer: QKV weights
/// 108 of 432 linear weights, so qkv_flops_fraction() = 1/4. 1 activation byte per token,
/// no parameters (no model states).
Model fake_model();

/// A plan shell for `lengths` on the cost model's cluster and model.
Plan empty_plan(const CostModel& cost, std::vector<Tokens> lengths);

/// A group of one scheme; chunks are (rank, begin, end) per sequence id.
struct SequenceSpec {
  std::int64_t id = 0;
  std::vector<Chunk> chunks;  ///< padded length = end of the last chunk
};
AttentionGroup make_group(Scheme scheme, std::vector<int> ranks,
                          std::vector<SequenceSpec> sequences);
/// A local group of sequence `id` (whole) on `rank`.
AttentionGroup local_group(int rank, std::int64_t id, Tokens length);

}  // namespace ballast::testing
