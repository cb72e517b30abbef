// Per-rank peak memory of a plan (docs/plan-format.md, "Memory"): model states +
// activations of the rank's tokens + the largest one-layer attention buffer, and that
// buffer's per-scheme rule (attention_buffer_bytes).
#include <algorithm>
#include <utility>

#include "ballast/plan.hpp"
#include "plan_internal.hpp"

namespace ballast {
namespace plan_detail {
namespace {

bool in_range(int rank, int ranks) { return rank >= 0 && rank < ranks; }

/// Tokens each member holds in a group, as (rank, tokens) sorted by rank.
std::vector<std::pair<int, Tokens>> tokens_per_member(const AttentionGroup& group) {
  std::vector<std::pair<int, Tokens>> held;
  for (const auto& sequence : group.sequences) {
    for (const auto& chunk : sequence.chunks) held.emplace_back(chunk.rank, chunk.size());
  }
  std::sort(held.begin(), held.end());
  std::vector<std::pair<int, Tokens>> summed;
  for (const auto& [rank, tokens] : held) {
    if (!summed.empty() && summed.back().first == rank) {
      summed.back().second += tokens;
    } else {
      summed.emplace_back(rank, tokens);
    }
  }
  return summed;
}

/// One layer's attention buffer on each member of the group.
Bytes group_transient_bytes(const AttentionGroup& group, const Model& model, int tensor_parallel) {
  if (group.scheme == Scheme::local || group.ranks.empty()) return 0;
  Tokens group_tokens = 0;
  Tokens largest_member_tokens = 0;
  for (const auto& [rank, tokens] : tokens_per_member(group)) {
    group_tokens += tokens;
    largest_member_tokens = std::max(largest_member_tokens, tokens);
  }
  return attention_buffer_bytes(model, tensor_parallel, group.scheme,
                                static_cast<int>(group.ranks.size()), largest_member_tokens,
                                group_tokens, group.ulysses_degree);
}

struct MicroBatchUsage {
  std::vector<Tokens> attention_tokens;
  std::vector<Tokens> linear_tokens;
  std::vector<Bytes> transient_bytes;
};

MicroBatchUsage micro_batch_usage(const MicroBatch& micro_batch, const Model& model,
                                  int tensor_parallel, int ranks) {
  const auto count = static_cast<std::size_t>(ranks);
  MicroBatchUsage usage{std::vector<Tokens>(count, 0), std::vector<Tokens>(count, 0),
                        std::vector<Bytes>(count, 0)};
  for (const auto& group : micro_batch.groups) {
    for (const auto& sequence : group.sequences) {
      for (const auto& chunk : sequence.chunks) {
        if (in_range(chunk.rank, ranks)) usage.attention_tokens[chunk.rank] += chunk.size();
      }
    }
    const Bytes transient = group_transient_bytes(group, model, tensor_parallel);
    for (int rank : group.ranks) {
      if (in_range(rank, ranks)) {
        usage.transient_bytes[rank] = std::max(usage.transient_bytes[rank], transient);
      }
    }
  }
  if (micro_batch.linear_layout.empty()) {
    usage.linear_tokens = usage.attention_tokens;
  } else {
    for (const auto& slice : micro_batch.linear_layout) {
      if (in_range(slice.rank, ranks)) {
        usage.linear_tokens[slice.rank] += slice.end_tokens - slice.begin_tokens;
      }
    }
  }
  return usage;
}

}  // namespace

std::vector<RankPeak> rank_peaks(const Plan& plan, const CostModel& cost) {
  const int ranks = plan.cluster.ranks();
  const Bytes model_states = cost.model_state_bytes_per_rank();
  const Bytes per_token = cost.activation_bytes_per_token();
  std::vector<RankPeak> peaks(static_cast<std::size_t>(std::max(ranks, 0)));
  for (auto& peak : peaks) peak.peak_bytes = model_states;
  for (std::size_t index = 0; index < plan.micro_batches.size(); ++index) {
    const auto usage = micro_batch_usage(plan.micro_batches[index], cost.model(),
                                         plan.cluster.tensor_parallel.gpus, ranks);
    for (std::size_t rank = 0; rank < peaks.size(); ++rank) {
      const Tokens tokens = std::max(usage.attention_tokens[rank], usage.linear_tokens[rank]);
      const Bytes transient = usage.transient_bytes[rank];
      if (tokens == 0 && transient == 0) continue;
      const Bytes bytes = saturating_add(
          saturating_add(model_states, saturating_multiply(per_token, tokens)), transient);
      auto& peak = peaks[rank];
      if (peak.micro_batch >= 0 && bytes <= peak.peak_bytes) continue;
      peak = RankPeak{bytes, static_cast<int>(index), tokens, transient};
    }
  }
  return peaks;
}

}  // namespace plan_detail

Bytes attention_buffer_bytes(const Model& model, int tensor_parallel, Scheme scheme,
                             int group_ranks, Tokens largest_member_tokens, Tokens group_tokens,
                             int ulysses_degree) {
  switch (scheme) {
    case Scheme::local:
      return 0;
    case Scheme::ring:  // the KV block in use plus the one in flight
      return saturating_multiply(2 * model.kv_bytes_per_token(), largest_member_tokens);
    case Scheme::all_gather:  // the whole group's KV
      return saturating_multiply(model.kv_bytes_per_token(), group_tokens);
    case Scheme::ulysses:  // the full sequence's QKV for this rank's heads (KV replicated)
      return saturating_multiply(
          ulysses_qkv_bytes_per_token(model, tensor_parallel, group_ranks),
          ceil_div(group_tokens, group_ranks));
    case Scheme::usp: {  // the stage's Ulysses buffer + the ring's two KV blocks of its heads
      const Tokens stage_tokens =
          std::min(group_tokens, saturating_multiply(ulysses_degree, largest_member_tokens));
      return saturating_add(
          saturating_multiply(ulysses_qkv_bytes_per_token(model, tensor_parallel, ulysses_degree),
                              largest_member_tokens),
          saturating_multiply(2 * usp_kv_bytes_per_token(model, tensor_parallel, ulysses_degree),
                              stage_tokens));
    }
  }
  return 0;
}

std::vector<Bytes> peak_memory_bytes_per_rank(const Plan& plan, const CostModel& cost) {
  const auto peaks = plan_detail::rank_peaks(plan, cost);
  std::vector<Bytes> bytes;
  bytes.reserve(peaks.size());
  for (const auto& peak : peaks) bytes.push_back(peak.peak_bytes);
  return bytes;
}

}  // namespace ballast
