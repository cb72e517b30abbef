// AnalyticalCostModel: roofline times from Cluster + Model, with causal attention
// quantised to the square tiles attention kernels compute (per block, or over a call's
// packed spans) and priced at the efficiency of its pass's curve at the block's
// equivalent length (a packed call: its blocks' mean; AttentionTilePricing).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "ballast/cost_model.hpp"
#include "ballast/error.hpp"

namespace ballast {

namespace {

// Linear layers: backward computes input and weight gradients, 2x the forward GEMMs.
/// Packed calls (several ranges) longer than this are priced per document block: 2^22
/// tokens is 40x the longest call `ballast run` makes, and counting is O(tiles).
constexpr Tokens kMaxPackedCallTokens = Tokens{1} << 22;
constexpr double kLinearBackwardFactor = 2.0;

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

}  // namespace

/// A tile holds an allowed pair when its first key is <= its last query, so query-tile
/// row r (last query q_begin + (r+1)T - 1 for full rows) holds clamp(floor((q_begin -
/// kv_begin - 1)/T) + 2 + r, 0, kv tiles) tiles: an arithmetic progression, summed in O(1)
/// (documents of 2^31 tokens have 2^24 tile rows). tests/cost checks it against a
/// brute-force tile scan.
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

double equivalent_causal_length(double pairs) {
  return pairs <= 0 ? 0.0 : (std::sqrt(8.0 * pairs + 1.0) - 1.0) / 2.0;
}

namespace {

/// Ids of constructed pricings (0: an empty memo entry).
std::atomic<std::uint64_t> next_pricing_memo_id{1};

/// One remembered price: the pricing's id and pass (tag), the block's shape, its price.
struct PricedShape {
  std::uint64_t tag = 0;
  Tokens q_tokens = 0;
  Tokens kv_tokens = 0;
  Tokens offset_tokens = 0;  ///< q_begin - kv_begin
  double pairs = 0;
};

/// Direct-mapped, 2^12 entries (160 KiB) per thread, allocated on the thread's first use:
/// callgrind on `ballast plan --strategy ballast --batch-size 512` (2026-12-04) measured
/// the planning instructions with 2^10 to 2^16 entries (docs/cost-model.md).
constexpr int kShapeMemoBits = 12;

PricedShape& memo_slot(std::uint64_t tag, Tokens q_tokens, Tokens kv_tokens, Tokens offset_tokens) {
  thread_local std::unique_ptr<PricedShape[]> memo;
  if (!memo) memo = std::make_unique<PricedShape[]>(std::size_t{1} << kShapeMemoBits);
  std::uint64_t hash = tag * 0x9E3779B97F4A7C15ULL;
  hash ^= static_cast<std::uint64_t>(q_tokens) * 0xC2B2AE3D27D4EB4FULL;
  hash ^= static_cast<std::uint64_t>(kv_tokens) * 0x165667B19E3779F9ULL;
  hash ^= static_cast<std::uint64_t>(offset_tokens) * 0xD6E8FEB86659FD93ULL;
  hash ^= hash >> 29;
  hash *= 0xBF58476D1CE4E5B9ULL;
  return memo[hash >> (64 - kShapeMemoBits)];
}

}  // namespace

AttentionTilePricing::AttentionTilePricing(const Cluster& cluster)
    : tile_tokens_(cluster.attention_tile_tokens),
      forward_(make_table(cluster.attention_forward_curve, cluster.attention_efficiency,
                          cluster.attention_tile_tokens)),
      backward_(make_table(cluster.attention_backward_curve, cluster.attention_efficiency,
                           cluster.attention_tile_tokens)),
      memo_id_(next_pricing_memo_id.fetch_add(1, std::memory_order_relaxed)) {}

AttentionTilePricing::Table AttentionTilePricing::make_table(
    const std::vector<EfficiencyPoint>& curve, double flat_efficiency, Tokens tile_tokens) {
  Table table;
  table.best = curve.empty() ? flat_efficiency : 0.0;
  const double tile_pairs = static_cast<double>(tile_tokens) * static_cast<double>(tile_tokens);
  for (const EfficiencyPoint& point : curve) {
    // The curve counts causal pairs; the model charges whole tiles: a whole document of
    // point.tokens tokens must take pairs / efficiency = tiles * T^2 / tile efficiency.
    const double pairs = static_cast<double>(causal_pairs(whole_document(point.tokens)));
    const double tiles =
        static_cast<double>(causal_tiles(whole_document(point.tokens), tile_tokens));
    table.tokens.push_back(static_cast<double>(point.tokens));
    table.log_tokens.push_back(std::log(static_cast<double>(point.tokens)));
    table.tile_efficiency.push_back(point.efficiency * tiles * tile_pairs / pairs);
    table.best = std::max(table.best, table.tile_efficiency.back());
  }
  for (std::size_t i = 0; i + 1 < table.log_tokens.size(); ++i) {
    table.inverse_log_step.push_back(1.0 / (table.log_tokens[i + 1] - table.log_tokens[i]));
  }
  return table;
}

double AttentionTilePricing::tile_efficiency(const Table& curve, double length) {
  if (length <= curve.tokens.front()) return curve.tile_efficiency.front();
  if (length >= curve.tokens.back()) return curve.tile_efficiency.back();
  std::size_t upper = 1;  // curves are short (FlashAttention's charts: 6 points): a scan
  while (curve.tokens[upper] < length) ++upper;
  const std::size_t lower = upper - 1;
  const double position =
      (std::log(length) - curve.log_tokens[lower]) * curve.inverse_log_step[lower];
  return curve.tile_efficiency[lower] +
         std::clamp(position, 0.0, 1.0) *
             (curve.tile_efficiency[upper] - curve.tile_efficiency[lower]);
}

double AttentionTilePricing::effective_pairs(const AttentionBlock& block, Pass pass) const {
  const Tokens q_tokens = block.q_end - block.q_begin;
  const Tokens kv_tokens = block.kv_end - block.kv_begin;
  const Tokens offset_tokens = block.q_begin - block.kv_begin;
  const std::uint64_t tag = 2 * memo_id_ + (pass == Pass::forward ? 0 : 1);
  PricedShape& slot = memo_slot(tag, q_tokens, kv_tokens, offset_tokens);
  if (slot.tag == tag && slot.q_tokens == q_tokens && slot.kv_tokens == kv_tokens &&
      slot.offset_tokens == offset_tokens) {
    return slot.pairs;
  }
  const double pairs = effective_pairs_computed(block, pass);
  slot = {tag, q_tokens, kv_tokens, offset_tokens, pairs};
  return pairs;
}

double AttentionTilePricing::effective_pairs_computed(const AttentionBlock& block, Pass pass) const {
  const Tokens tiles = causal_tiles(block, tile_tokens_);
  if (tiles == 0) return 0.0;
  const double tile_work = static_cast<double>(tiles) * static_cast<double>(tile_tokens_) *
                           static_cast<double>(tile_tokens_);
  const Table& curve = table(pass);
  if (curve.tokens.empty()) return tile_work;  // flat: every tile at the best efficiency
  // A block on the diagonal (a whole document, a zigzag chunk against itself) has
  // L = its length, no square root needed; the planners price whole documents most.
  const bool diagonal = block.q_begin == block.kv_begin && block.q_end == block.kv_end;
  const double length = diagonal ? static_cast<double>(block.q_end - block.q_begin)
                                 : equivalent_causal_length(static_cast<double>(causal_pairs(block)));
  const double efficiency = tile_efficiency(curve, length);
  return tile_work * (curve.best / std::min(efficiency, curve.best));
}

double AttentionTilePricing::effective_pairs(Tokens tiles, std::span<const AttentionBlock> blocks,
                                             Pass pass) const {
  if (tiles == 0) return 0.0;
  const double tile_work = static_cast<double>(tiles) * static_cast<double>(tile_tokens_) *
                           static_cast<double>(tile_tokens_);
  const Table& curve = table(pass);
  if (curve.tokens.empty()) return tile_work;  // flat: every tile at the best efficiency
  // The blocks' own tiles at their efficiencies (per-block pricing), rescaled to the tiles
  // the kernel computes: a batch of L-token documents (how a curve point is measured on
  // the runtime, `ballast calibrate --host`) runs at the point's efficiency either way.
  Tokens block_tiles = 0;
  double block_pairs = 0;
  for (const AttentionBlock& block : blocks) {
    block_tiles += causal_tiles(block, tile_tokens_);
    block_pairs += effective_pairs(block, pass);
  }
  if (block_tiles == tiles) return block_pairs;  // nothing shared: the per-block price
  if (block_tiles == 0) {  // masked tiles only: at the shortest documents' efficiency
    return tile_work * (curve.best / std::min(curve.tile_efficiency.front(), curve.best));
  }
  const double block_work = static_cast<double>(block_tiles) *
                            static_cast<double>(tile_tokens_) * static_cast<double>(tile_tokens_);
  return tile_work * (block_pairs / block_work);
}

double AttentionTilePricing::best_tile_efficiency(Pass pass) const { return table(pass).best; }

double AttentionTilePricing::best_tile_efficiency_up_to(double length, Pass pass) const {
  const Table& curve = table(pass);
  if (curve.tokens.empty()) return curve.best;
  // Linear in log(L) between points, clamped outside: the maximum over (0, length] is at
  // a point inside it or at `length` itself.
  double best = tile_efficiency(curve, length);
  for (std::size_t i = 0; i < curve.tokens.size() && curve.tokens[i] <= length; ++i) {
    best = std::max(best, curve.tile_efficiency[i]);
  }
  return std::min(best, curve.best);
}

AnalyticalCostModel::AnalyticalCostModel(Cluster cluster, Model model)
    : CostModel(std::move(cluster), std::move(model)), attention_pricing_(cluster_) {}

nlohmann::json AnalyticalCostModel::spec() const { return {{"family", "analytical"}}; }

Seconds AnalyticalCostModel::attention_pair_floor_s(double pairs, Pass pass) const {
  const double flops_per_pair =
      kAttentionFlopsPerPairPerHeadDim * model_.head_dim() * model_.heads;
  return model_.layers * pairs * flops_per_pair * attention_pass_factor(pass) /
         (cluster_.peak_flops_per_s * attention_pricing_.best_tile_efficiency(pass));
}

Seconds AnalyticalCostModel::attention_document_floor_s(Tokens length, Tokens padded_length,
                                                        Pass pass) const {
  const double pairs = static_cast<double>(causal_pairs(whole_document(length)));
  if (cluster_.attention_tiles_packed || length <= 0) return attention_pair_floor_s(pairs, pass);
  // Every block of the (padded) document has an equivalent causal length <= padded_length
  // and is priced at tile work (>= its pairs) x best / its efficiency.
  const double efficiency = attention_pricing_.best_tile_efficiency_up_to(
      static_cast<double>(std::max(length, padded_length)), pass);
  return attention_pair_floor_s(pairs, pass) * (attention_pricing_.best_tile_efficiency(pass) / efficiency);
}

Seconds AnalyticalCostModel::attention_time_s(std::span<const AttentionBlock> blocks,
                                              int head_split, Pass pass) const {
  BALLAST_CHECK(head_split >= 1, "head_split must be >= 1");
  if (cluster_.attention_tiles_packed && blocks.size() == 1) {  // the planners' hot path
    const AttentionBlock& block = blocks.front();
    const DocumentRange query{0, block.q_begin, block.q_end}, key{0, block.kv_begin, block.kv_end};
    return attention_call_time_s({{&query, 1}, {&key, 1}}, head_split, pass);
  }
  if (cluster_.attention_tiles_packed) {
    // Each block its own document, laid out in block order on both sides.
    std::vector<DocumentRange> queries, keys;
    queries.reserve(blocks.size());
    keys.reserve(blocks.size());
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const auto document = static_cast<std::int64_t>(i);
      queries.push_back({document, blocks[i].q_begin, blocks[i].q_end});
      keys.push_back({document, blocks[i].kv_begin, blocks[i].kv_end});
    }
    return attention_call_time_s({queries, keys}, head_split, pass);
  }
  // Each block's tiles in pairs at the pass's best efficiency (>= its causal pairs);
  // reusing the floor keeps time * d >= floor exact.
  double effective_pairs = 0;
  for (const AttentionBlock& block : blocks) {
    effective_pairs += attention_pricing_.effective_pairs(block, pass);
  }
  return attention_pair_floor_s(effective_pairs, pass) / head_split;
}

Seconds AnalyticalCostModel::attention_call_time_s(const PackedAttentionCall& call,
                                                   int head_split, Pass pass) const {
  if (!cluster_.attention_tiles_packed) {
    return CostModel::attention_call_time_s(call, head_split, pass);
  }
  BALLAST_CHECK(head_split >= 1, "head_split must be >= 1");
  if (call.queries.size() > 1 || call.keys.size() > 1) {
    // Counting a call's packed tiles takes O(its tiles); the runtime's calls hold at most
    // ~10^5 tokens. A longer one (a planner probing a 2^28-token ring step) shares
    // nothing worth counting: its document blocks are priced on their own tiles, which
    // is >= what packing would charge and >= the floor.
    Tokens tokens = 0;
    for (const DocumentRange& range : call.queries) tokens += range.end - range.begin;
    for (const DocumentRange& range : call.keys) tokens += range.end - range.begin;
    if (tokens > kMaxPackedCallTokens) {
      double effective_pairs = 0;
      for (const AttentionBlock& block : document_blocks(call)) {
        effective_pairs += attention_pricing_.effective_pairs(block, pass);
      }
      return attention_pair_floor_s(effective_pairs, pass) / head_split;
    }
  }
  // Every allowed pair lies in a computed tile (the kernel's mask decision is
  // conservative), so the tiles' work >= the call's pairs and time * d >= the floor.
  const Tokens tiles = packed_tile_pairs(call, cluster_.attention_tile_tokens);
  if (tiles == 0) return 0.0;
  double effective_pairs = 0;
  if (call.queries.size() == 1 && call.keys.size() == 1) {  // one block, no allocation
    const DocumentRange& query = call.queries.front();
    const DocumentRange& key = call.keys.front();
    const AttentionBlock block{query.begin, query.end, key.begin, key.end};
    effective_pairs = attention_pricing_.effective_pairs(tiles, {&block, 1}, pass);
  } else {
    effective_pairs = attention_pricing_.effective_pairs(tiles, document_blocks(call), pass);
  }
  return attention_pair_floor_s(effective_pairs, pass) / head_split;
}

Seconds AnalyticalCostModel::linear_time_s(Tokens tokens, Pass pass) const {
  return static_cast<double>(tokens) * model_.linear_flops_per_token() * linear_pass_factor(pass) /
         (cluster_.peak_flops_per_s * cluster_.matmul_efficiency);
}

}  // namespace ballast
