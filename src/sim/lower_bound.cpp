// lower_bound(): a step time no valid plan beats, from total work spread over all ranks
// and from the micro-batches memory forces on the rank with the most tokens.
#include <fmt/format.h>

#include <algorithm>

#include "ballast/error.hpp"
#include "ballast/simulator.hpp"

namespace ballast {

namespace {

/// The TP collectives' time that grows with the tokens (0 without TP): a rank runs its
/// TP collectives between its compute tasks, never beside them, so every token's share
/// adds to some rank's serial time; their latency is paid once per rank and micro-batch.
/// Both passes, the forward's twice under full recomputation (tensor_parallel_time_s).
Seconds tensor_parallel_bandwidth_s(Tokens tokens, const CostModel& cost) {
  if (tokens <= 0) return 0.0;
  return cost.tensor_parallel_time_s(tokens) - cost.tensor_parallel_latency_s();
}

/// Linear layers (with their TP collectives' bandwidth time) plus attention at its pair
/// floor, forward (twice under full recomputation) and backward, all sequences.
Seconds total_compute_s(std::span<const Tokens> lengths_tokens, const CostModel& cost) {
  const double forward_passes = cost.model().forward_passes();
  Seconds total_s = 0;
  for (Tokens length : lengths_tokens) {
    const double pairs = static_cast<double>(length) * static_cast<double>(length + 1) / 2.0;
    total_s += tensor_parallel_bandwidth_s(length, cost) +
               forward_passes * (cost.linear_time_s(length, Pass::forward) +
                                 cost.attention_pair_floor_s(pairs, Pass::forward)) +
               cost.linear_time_s(length, Pass::backward) +
               cost.attention_pair_floor_s(pairs, Pass::backward);
  }
  return total_s;
}

}  // namespace

LowerBound lower_bound(std::span<const Tokens> lengths_tokens, const CostModel& cost,
                       GradientSync gradient_sync) {
  const int ranks = cost.cluster().ranks();
  BALLAST_CHECK(ranks > 0, "a validated cluster has ranks");
  if (static_cast<std::int64_t>(lengths_tokens.size()) > kMaxBatchSequences) {
    throw InputError(fmt::format("sequence lengths: {} sequences, over ballast's limit of {}",
                                 lengths_tokens.size(), kMaxBatchSequences));
  }
  Tokens total_tokens = 0;  // at most 10^6 x 2^31 < 2^51
  for (Tokens length : lengths_tokens) {
    if (length < 0) {
      throw InputError(
          fmt::format("sequence lengths: {} is negative; lengths are token counts >= 0", length));
    }
    if (length > kMaxSequenceTokens) {
      throw InputError(fmt::format(
          "sequence lengths: {} is over ballast's limit of 2^31 = {} tokens", length,
          kMaxSequenceTokens));
    }
    total_tokens += length;
  }
  const Tokens capacity_tokens = cost.token_capacity_per_rank();
  const Seconds overhead_s =
      cost.micro_batch_overhead_s(Pass::forward) + cost.micro_batch_overhead_s(Pass::backward);
  // Paid like the overhead by every rank-micro-batch holding tokens.
  const Seconds per_slot_s = overhead_s + cost.tensor_parallel_latency_s();

  LowerBound bound;
  // An empty batch needs no micro-batch (and pays no overhead).
  // Saturating: a cluster with absurd memory has a capacity near 2^63 tokens per rank.
  bound.min_micro_batches = ceil_div(total_tokens, saturating_multiply(ranks, capacity_tokens));
  bound.compute_per_rank_s = total_compute_s(lengths_tokens, cost) / ranks;
  bound.overhead_s = static_cast<double>(bound.min_micro_batches) * overhead_s;
  // Overlapped, the last bucket still waits for the end of the last backward pass.
  bound.gradient_sync_s =
      gradient_sync == GradientSync::end
          ? cost.gradient_sync_time_s()
          : cost.gradient_bucket_sync_time_s(gradient_sync_buckets(cost.model()));
  // Every rank-micro-batch holding tokens holds at most `capacity` of them and pays the
  // overhead: at least ceil(total / capacity) such slots exist, shared by all ranks.
  const Tokens slots = ceil_div(total_tokens, capacity_tokens);
  const Seconds spread_s =
      bound.compute_per_rank_s + static_cast<double>(slots) * per_slot_s / ranks;
  // The rank with the most linear tokens holds >= ceil(total / ranks) of them, at most
  // `capacity` per micro-batch, so it runs >= min_micro_batches micro-batches.
  const Tokens fullest_tokens = ceil_div(total_tokens, ranks);
  const Seconds fullest_s =
      bound.overhead_s +
      cost.model().forward_passes() * cost.linear_time_s(fullest_tokens, Pass::forward) +
      cost.linear_time_s(fullest_tokens, Pass::backward) +
      tensor_parallel_bandwidth_s(fullest_tokens, cost) +
      static_cast<double>(bound.min_micro_batches) * cost.tensor_parallel_latency_s();
  if (spread_s >= fullest_s) {
    bound.binding = fmt::format("compute spread over {} ranks", ranks);
  } else {
    bound.binding = "memory-forced micro-batches";
  }
  bound.time_s = std::max(spread_s, fullest_s) + bound.gradient_sync_s;
  return bound;
}

}  // namespace ballast
