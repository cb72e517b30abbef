// Per-rank token layouts and the remap's transfers (include/ballast/plan_layout.hpp).
#include "ballast/plan_layout.hpp"

#include <algorithm>
#include <map>
#include <string>

#include <fmt/format.h>

#include "ballast/error.hpp"

namespace ballast {

namespace {

const MicroBatch& micro_batch_at(const Plan& plan, int micro_batch) {
  if (micro_batch < 0 || static_cast<std::size_t>(micro_batch) >= plan.micro_batches.size()) {
    throw InputError(fmt::format("micro-batch {} is not in the plan; it has {} (0..{})", micro_batch,
                                 plan.micro_batches.size(),
                                 static_cast<std::int64_t>(plan.micro_batches.size()) - 1));
  }
  return plan.micro_batches[static_cast<std::size_t>(micro_batch)];
}

void check_rank(const Plan& plan, int rank) {
  if (rank < 0 || rank >= plan.cluster.ranks()) {
    throw InputError(fmt::format("rank {} is not in the plan's cluster of {} ranks (0..{})", rank,
                                 plan.cluster.ranks(), plan.cluster.ranks() - 1));
  }
}

Tokens length_of(const Plan& plan, std::int64_t sequence_id) {
  if (sequence_id < 0 ||
      static_cast<std::size_t>(sequence_id) >= plan.sequence_lengths_tokens.size()) {
    throw InputError(fmt::format("the plan names sequence {} but has {} sequence lengths",
                                 sequence_id, plan.sequence_lengths_tokens.size()));
  }
  return plan.sequence_lengths_tokens[static_cast<std::size_t>(sequence_id)];
}

}  // namespace

std::vector<TokenRange> attention_layout(const Plan& plan, int micro_batch, int rank) {
  const MicroBatch& batch = micro_batch_at(plan, micro_batch);
  check_rank(plan, rank);
  const auto queues = effective_queues(batch, plan.cluster.ranks());
  std::vector<TokenRange> layout;
  for (int g : queues[static_cast<std::size_t>(rank)]) {
    const AttentionGroup& group = batch.groups.at(static_cast<std::size_t>(g));
    for (const SequenceChunks& sequence : group.sequences) {
      const Tokens length = length_of(plan, sequence.sequence_id);
      for (const Chunk& chunk : sequence.chunks) {
        if (chunk.rank != rank) continue;
        const Tokens end = std::min(chunk.end_tokens, length);
        if (chunk.begin_tokens < end) layout.push_back({sequence.sequence_id, chunk.begin_tokens, end, g});
      }
    }
  }
  return layout;
}

std::vector<TokenRange> linear_layout(const Plan& plan, int micro_batch, int rank) {
  const MicroBatch& batch = micro_batch_at(plan, micro_batch);
  if (batch.linear_layout.empty()) return attention_layout(plan, micro_batch, rank);
  check_rank(plan, rank);
  std::vector<TokenRange> layout;
  for (const LinearSlice& slice : batch.linear_layout) {
    if (slice.rank == rank && slice.begin_tokens < slice.end_tokens) {
      layout.push_back({slice.sequence_id, slice.begin_tokens, slice.end_tokens, -1});
    }
  }
  return layout;
}

std::vector<LayoutTransfer> remap_transfers(const Plan& plan, int micro_batch) {
  const int ranks = plan.cluster.ranks();
  // Linear ranges per sequence, sorted by begin: who holds each token before attention.
  struct Held {
    Tokens begin_tokens;
    Tokens end_tokens;
    int rank;
  };
  std::map<std::int64_t, std::vector<Held>> held_by_sequence;
  for (int r = 0; r < ranks; ++r) {
    for (const TokenRange& range : linear_layout(plan, micro_batch, r)) {
      held_by_sequence[range.sequence_id].push_back({range.begin_tokens, range.end_tokens, r});
    }
  }
  for (auto& [sequence, held] : held_by_sequence) {
    std::sort(held.begin(), held.end(),
              [](const Held& a, const Held& b) { return a.begin_tokens < b.begin_tokens; });
  }
  std::vector<LayoutTransfer> transfers;
  for (int dst = 0; dst < ranks; ++dst) {
    for (const TokenRange& need : attention_layout(plan, micro_batch, dst)) {
      const auto found = held_by_sequence.find(need.sequence_id);
      if (found == held_by_sequence.end()) {
        throw InputError(fmt::format("micro-batch {}: sequence {} is in rank {}'s attention chunks "
                                     "but in no rank's linear layout; validate the plan",
                                     micro_batch, need.sequence_id, dst));
      }
      const std::vector<Held>& held = found->second;
      // First held range that ends after need.begin.
      auto it = std::upper_bound(held.begin(), held.end(), need.begin_tokens,
                                 [](Tokens position, const Held& h) { return position < h.end_tokens; });
      Tokens covered = need.begin_tokens;
      for (; it != held.end() && it->begin_tokens < need.end_tokens; ++it) {
        const Tokens begin = std::max(it->begin_tokens, need.begin_tokens);
        const Tokens end = std::min(it->end_tokens, need.end_tokens);
        if (begin != covered) break;
        if (begin != need.begin_tokens && transfers.back().src_rank == it->rank) {
          transfers.back().end_tokens = end;  // one piece per run of a source inside a range
        } else {
          transfers.push_back({it->rank, dst, need.sequence_id, begin, end});
        }
        covered = end;
      }
      if (covered != need.end_tokens) {
        throw InputError(fmt::format("micro-batch {}: tokens [{}, {}) of sequence {} are in rank {}'s "
                                     "attention chunks but not covered by the linear layout; validate "
                                     "the plan",
                                     micro_batch, covered, need.end_tokens, need.sequence_id, dst));
      }
    }
  }
  return transfers;
}

}  // namespace ballast
