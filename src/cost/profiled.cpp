// ProfiledCostModel: FlexSP's (a1*s^2 + a2*s)/d + b1 with all-to-all at bw[d], whole-model
// fwd+bwd ms (SYSTEMS.md 2); its spec JSON is written and parsed in registry.cpp.
#include <algorithm>
#include <cmath>

#include "ballast/cost_model.hpp"
#include "ballast/error.hpp"

namespace ballast {

namespace {

constexpr double kSecondsPerMs = 1e-3;
// FlexSP's coefficients cover forward + backward; backward costs 2x forward (input and
// weight gradients), so the forward pass takes 1/3 and the backward 2/3.
constexpr double kForwardShare = 1.0 / 3.0;
constexpr double kBackwardShare = 2.0 / 3.0;

double pass_share(Pass pass) { return pass == Pass::forward ? kForwardShare : kBackwardShare; }

}  // namespace

ProfiledCostModel::ProfiledCostModel(Cluster cluster, Model model,
                                     ProfiledCoefficients coefficients)
    : CostModel(std::move(cluster), std::move(model)), coefficients_(std::move(coefficients)) {
  BALLAST_CHECK(!coefficients_.all_to_all_gb_per_s.empty(), "bw[d] table must not be empty");
  std::stable_sort(coefficients_.all_to_all_gb_per_s.begin(),
                   coefficients_.all_to_all_gb_per_s.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
}

Seconds ProfiledCostModel::attention_pair_floor_s(double pairs, Pass pass) const {
  // FlexSP charges a1 * s^2 per document; 2 * causal pairs = s^2 + s for a whole one.
  return 2.0 * coefficients_.a1_ms_per_token2 * pairs * pass_share(pass) * kSecondsPerMs;
}

Seconds ProfiledCostModel::attention_time_s(std::span<const AttentionBlock> blocks,
                                            int head_split, Pass pass) const {
  BALLAST_CHECK(head_split >= 1, "head_split must be >= 1");
  Tokens pairs = 0;
  for (const AttentionBlock& block : blocks) pairs += causal_pairs(block);
  return attention_pair_floor_s(static_cast<double>(pairs), pass) / head_split;
}

Seconds ProfiledCostModel::linear_time_s(Tokens tokens, Pass pass) const {
  return coefficients_.a2_ms_per_token * static_cast<double>(tokens) * pass_share(pass) *
         kSecondsPerMs;
}

Seconds ProfiledCostModel::micro_batch_overhead_s(Pass pass) const {
  return coefficients_.b1_ms * pass_share(pass) * kSecondsPerMs;
}

Seconds ProfiledCostModel::all_to_all_time_s(std::span<const int> ranks,
                                             std::span<const Bytes> bytes_per_rank) const {
  BALLAST_CHECK(ranks.size() == bytes_per_rank.size(), "one byte count per rank");
  if (ranks.size() <= 1) return 0.0;
  const int degree = static_cast<int>(ranks.size());
  // bw[d] of the smallest listed degree >= d (the largest listed one beyond the table).
  const auto& table = coefficients_.all_to_all_gb_per_s;
  auto entry = std::find_if(table.begin(), table.end(),
                            [degree](const auto& row) { return row.first >= degree; });
  const double gb_per_s = entry == table.end() ? table.back().second : entry->second;
  const Bytes max_bytes = *std::max_element(bytes_per_rank.begin(), bytes_per_rank.end());
  // FlexSP reads GB/s as MB/ms with MB = 2^20 bytes.
  const double ms_per_layer = static_cast<double>(max_bytes) / kMiB / gb_per_s;
  return model_.layers * ms_per_layer * kSecondsPerMs;
}

Seconds ProfiledCostModel::gradient_sync_time_s() const {
  // FlexSP's model has no separate gradient term: it is folded into b1.
  return 0.0;
}

Seconds ProfiledCostModel::gradient_bucket_sync_time_s(int /*buckets*/) const { return 0.0; }

Bytes ProfiledCostModel::model_state_bytes_per_rank() const {
  // FlexSP's ZeRO-3 mixed-precision Adam, model_states_MB = params * 16 * 1024 / N: the
  // same 16 bytes per parameter as the analytical model.
  return saturating_bytes(std::ceil(coefficients_.parameters_gi * kGiB *
                                    kModelStateBytesPerParameter / cluster_.ranks()));
}

Bytes ProfiledCostModel::activation_bytes_per_token() const {
  return saturating_bytes(std::ceil(coefficients_.activation_mib_per_token * kMiB));
}

Bytes ProfiledCostModel::memory_limit_bytes() const {
  return saturating_bytes(coefficients_.memory_limit_gib * kGiB);
}

}  // namespace ballast
