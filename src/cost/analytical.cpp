// AnalyticalCostModel: roofline times from Cluster + Model, with causal attention
// quantised to the square tiles attention kernels compute (shape-dependent efficiency).
#include <algorithm>

#include "ballast/cost_model.hpp"
#include "ballast/error.hpp"

namespace ballast {

namespace {

// SYSTEMS.md section 1: attention backward ~2.5x forward FLOPs.
constexpr double kAttentionBackwardFactor = 2.5;
// Linear layers: backward computes input and weight gradients, 2x the forward GEMMs.
constexpr double kLinearBackwardFactor = 2.0;
// QK^T and PV: 2 matrix products, 2 FLOPs per multiply-add, per (query, key, head dim).
constexpr double kAttentionFlopsPerPairPerHeadDim = 4.0;

double attention_pass_factor(Pass pass) {
  return pass == Pass::forward ? 1.0 : kAttentionBackwardFactor;
}

double linear_pass_factor(Pass pass) {
  return pass == Pass::forward ? 1.0 : kLinearBackwardFactor;
}

/// floor(numerator / denominator) for denominator > 0, also for negative numerators.
Tokens floor_div(Tokens numerator, Tokens denominator) {
  return numerator >= 0 ? numerator / denominator
                        : -((-numerator + denominator - 1) / denominator);
}

/// sum over r in [0, n) of clamp(r + offset, 0, limit), in O(1).
Tokens clamped_progression_sum(Tokens n, Tokens offset, Tokens limit) {
  const Tokens zero_end = std::clamp<Tokens>(-offset, 0, n);            // values <= 0 before
  const Tokens full_begin = std::clamp<Tokens>(limit - offset, zero_end, n);  // >= limit from
  const Tokens rising = full_begin - zero_end;  // values zero_end + offset, +1, ...
  return rising * (zero_end + offset) + rising * (rising - 1) / 2 + (n - full_begin) * limit;
}

/// Tiles of a block's q x kv grid (T x T, aligned to q_begin and kv_begin, the last
/// row/column possibly partial) holding at least one allowed causal pair. A tile holds
/// one when its first key is <= its last query, so query-tile row r (last query
/// q_begin + (r+1)T - 1 for full rows) holds clamp(floor((q_begin - kv_begin - 1)/T) + 2
/// + r, 0, kv tiles) tiles: an arithmetic progression, summed in O(1) (documents of 2^31
/// tokens have 2^24 tile rows). tests/cost checks it against a brute-force tile scan.
Tokens causal_tiles(const AttentionBlock& block, Tokens tile_tokens) {
  if (block.q_end <= block.q_begin || block.kv_end <= block.kv_begin) return 0;
  const Tokens kv_tiles = (block.kv_end - block.kv_begin + tile_tokens - 1) / tile_tokens;
  const Tokens q_rows = (block.q_end - block.q_begin + tile_tokens - 1) / tile_tokens;
  const Tokens offset = floor_div(block.q_begin - block.kv_begin - 1, tile_tokens) + 2;
  const Tokens full_rows = clamped_progression_sum(q_rows - 1, offset, kv_tiles);
  const Tokens last_query = block.q_end - 1;  // the last row may be partial
  const Tokens last_row = std::clamp<Tokens>(
      floor_div(last_query - block.kv_begin, tile_tokens) + 1, 0, kv_tiles);
  return full_rows + last_row;
}

}  // namespace

AnalyticalCostModel::AnalyticalCostModel(Cluster cluster, Model model)
    : CostModel(std::move(cluster), std::move(model)) {}

nlohmann::json AnalyticalCostModel::spec() const { return {{"family", "analytical"}}; }

Seconds AnalyticalCostModel::attention_pair_floor_s(double pairs, Pass pass) const {
  const double flops_per_pair =
      kAttentionFlopsPerPairPerHeadDim * model_.head_dim() * model_.heads;
  return model_.layers * pairs * flops_per_pair * attention_pass_factor(pass) /
         (cluster_.peak_flops_per_s * cluster_.attention_efficiency);
}

Seconds AnalyticalCostModel::attention_time_s(std::span<const AttentionBlock> blocks,
                                              int head_split, Pass pass) const {
  BALLAST_CHECK(head_split >= 1, "head_split must be >= 1");
  const Tokens tile = cluster_.attention_tile_tokens;
  Tokens tiles = 0;
  for (const AttentionBlock& block : blocks) tiles += causal_tiles(block, tile);
  // A tile costs as much as T^2 pairs; reusing the floor keeps time * d >= floor exact.
  const double tile_pairs = static_cast<double>(tile) * static_cast<double>(tile);
  return attention_pair_floor_s(static_cast<double>(tiles) * tile_pairs, pass) / head_split;
}

Seconds AnalyticalCostModel::linear_time_s(Tokens tokens, Pass pass) const {
  return static_cast<double>(tokens) * model_.linear_flops_per_token() * linear_pass_factor(pass) /
         (cluster_.peak_flops_per_s * cluster_.matmul_efficiency);
}

}  // namespace ballast
