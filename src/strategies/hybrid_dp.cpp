// hybrid-dp (ByteScale / Megatron dynamic CP): each sequence gets the smallest
// power-of-two ring degree that fits memory, placed on buddy-aligned rank blocks by LPT
// over the FLOP proxy s^2/d, then into per-rank micro-batches that respect memory.
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "ballast/error.hpp"
#include "block_loads.hpp"
#include "builders.hpp"

namespace ballast::strategies {

namespace {

constexpr const char* kName = "hybrid-dp";

struct Placement {
  std::int64_t sequence_id = 0;
  Tokens length_tokens = 0;
  int degree = 1;         ///< d_s; 1 = local
  double flop_proxy = 0;  ///< s^2 / d_s
  int first_rank = 0;     ///< block [first_rank, first_rank + degree)
  int micro_batch = 0;
};

/// Smallest power-of-two degree whose ring holds the sequence (padded); PlanningError if none.
int sequence_degree(std::int64_t id, Tokens length, Tokens ring_tokens_per_rank, int ranks) {
  for (int degree = 1; degree <= ranks; degree *= 2) {
    if (static_cast<Tokens>(degree) * ring_tokens_per_rank >=
        footprint_tokens(length, Scheme::ring, degree)) {
      return degree;
    }
  }
  const int largest = static_cast<int>(next_power_of_two(ranks + 1) / 2);
  const Tokens held = largest * ring_tokens_per_rank / (2 * largest) * (2 * largest);
  throw PlanningError(fmt::format(
      "{} cannot run sequence {} ({} tokens): the largest ring ({} of the {} ranks) holds {} "
      "tokens; {} or add {}",
      kName, id, with_thousands(length), largest, ranks, with_thousands(held),
      shorter_sequences_advice(), setting_name("--nodes")));
}

/// Sequences with their degrees, in placement order: proxy descending, id ascending.
std::vector<Placement> placement_order(const Batch& batch, Tokens ring_tokens_per_rank, int ranks) {
  std::vector<Placement> placements;
  for (std::size_t id = 0; id < batch.lengths_tokens.size(); ++id) {
    const Tokens length = batch.lengths_tokens[id];
    const auto sequence_id = static_cast<std::int64_t>(id);
    const int degree = sequence_degree(sequence_id, length, ring_tokens_per_rank, ranks);
    const auto length_d = static_cast<double>(length);
    placements.push_back({sequence_id, length, degree, length_d * length_d / degree, 0, 0});
  }
  std::stable_sort(placements.begin(), placements.end(),
                   [](const Placement& a, const Placement& b) {
                     return a.flop_proxy > b.flop_proxy;  // stable: ids stay ascending on ties
                   });
  return placements;
}

/// LPT: the buddy-aligned block with the smallest maximum proxy load (ties: lowest start).
void place_blocks(std::vector<Placement>& placements, int ranks) {
  BlockLoads loads(ranks);
  for (Placement& placement : placements) {
    placement.first_rank = loads.least_loaded(placement.degree);
    loads.charge(placement.first_rank, placement.degree, placement.flop_proxy);
  }
}

/// Smallest micro-batch index where every rank of the block still has room.
void assign_micro_batches(std::vector<Placement>& placements, int ranks, Tokens tokens_per_rank) {
  std::vector<std::vector<Tokens>> used(static_cast<std::size_t>(ranks));
  for (Placement& placement : placements) {
    const Tokens tokens =
        footprint_tokens(placement.length_tokens, Scheme::ring, placement.degree) /
        placement.degree;
    auto has_room = [&](std::size_t m) {
      for (int r = placement.first_rank; r < placement.first_rank + placement.degree; ++r) {
        const auto& rank_used = used[static_cast<std::size_t>(r)];
        if (m < rank_used.size() && rank_used[m] + tokens > tokens_per_rank) return false;
      }
      return true;
    };
    std::size_t m = 0;
    while (!has_room(m)) ++m;
    for (int r = placement.first_rank; r < placement.first_rank + placement.degree; ++r) {
      auto& rank_used = used[static_cast<std::size_t>(r)];
      if (rank_used.size() <= m) rank_used.resize(m + 1, 0);
      rank_used[m] += tokens;
    }
    placement.micro_batch = static_cast<int>(m);
  }
}

/// Micro-batch m: ring groups (degree descending, then placement order), then one local
/// group per rank (by rank) with its sequences in placement order.
/// `placements`: the micro-batch's sequences, in placement order.
MicroBatch build_micro_batch(const std::vector<const Placement*>& placements, int ranks) {
  std::vector<const Placement*> rings;
  std::vector<AttentionGroup> locals(static_cast<std::size_t>(ranks));
  for (const Placement* pointer : placements) {
    const Placement& placement = *pointer;
    if (placement.degree > 1) {
      rings.push_back(&placement);
      continue;
    }
    locals[static_cast<std::size_t>(placement.first_rank)].sequences.push_back(
        whole_sequence(placement.sequence_id, placement.length_tokens, placement.first_rank));
  }
  std::stable_sort(rings.begin(), rings.end(),
                   [](const Placement* a, const Placement* b) { return a->degree > b->degree; });
  MicroBatch micro_batch;
  for (const Placement* ring : rings) {
    AttentionGroup group;
    group.scheme = Scheme::ring;
    group.ranks = consecutive_ranks(ring->first_rank, ring->degree);
    group.sequences.push_back({ring->sequence_id,
                               zigzag_padded_length(ring->length_tokens, ring->degree),
                               zigzag_chunks_padded(ring->length_tokens, group.ranks)});
    micro_batch.groups.push_back(std::move(group));
  }
  for (int rank = 0; rank < ranks; ++rank) {
    AttentionGroup& local = locals[static_cast<std::size_t>(rank)];
    if (local.sequences.empty()) continue;
    local.scheme = Scheme::local;
    local.ranks = {rank};
    micro_batch.groups.push_back(std::move(local));
  }
  return micro_batch;
}

class HybridDpPlanner final : public Planner {
 public:
  std::string name() const override { return kName; }
  std::string description() const override {
    return "ByteScale / Megatron dynamic CP: short sequences data-parallel, long ones on "
           "power-of-two rings, FLOP-balanced (s^2/d)";
  }
  /// Rings of any power of two up to the rank count, the ring budget per rank, padded.
  Tokens longest_sequence_tokens(const CostModel& cost,
                                 const PlannerOptions& /*options*/) const override {
    const Tokens per_rank = usable_tokens_per_rank(cost, Scheme::ring, 2);
    Tokens longest = per_rank;
    for (Tokens d = 2; d <= cost.cluster().ranks(); d *= 2) {
      longest = std::max(longest, d * per_rank / (2 * d) * (2 * d));
    }
    return longest;
  }
  Plan plan(const Batch& batch, const CostModel& cost,
            const PlannerOptions& /*options: the degree is per sequence*/,
            const PlanEvaluator& /*evaluator: not needed*/) const override {
    Plan plan = make_plan_skeleton(batch, cost, kName);
    const int ranks = cost.cluster().ranks();
    // The ring budget also bounds local sequences, so one rank may mix both in a micro-batch.
    const Tokens tokens_per_rank = usable_tokens_per_rank(cost, Scheme::ring, 2);
    std::vector<Placement> placements = placement_order(batch, tokens_per_rank, ranks);
    std::int64_t chunks = 0;      // a ring of d ranks cuts its (padded) sequence into 2d chunks
    std::int64_t ring_steps = 0;  // and is simulated as d^2 steps
    for (const Placement& placement : placements) {
      const std::int64_t degree = placement.degree;
      chunks += degree == 1 ? 1 : 2 * degree;
      ring_steps += degree == 1 ? 0 : degree * degree;
    }
    check_plan_chunks(chunks, kName, "each sequence cut into 2 x its ring size");
    check_ring_steps(ring_steps, kName, "one ring per sequence longer than a GPU holds");
    place_blocks(placements, ranks);
    assign_micro_batches(placements, ranks, tokens_per_rank);
    std::vector<std::vector<const Placement*>> by_micro_batch;
    for (const Placement& placement : placements) {
      const auto m = static_cast<std::size_t>(placement.micro_batch);
      if (by_micro_batch.size() <= m) by_micro_batch.resize(m + 1);
      by_micro_batch[m].push_back(&placement);
    }
    for (const auto& micro_batch : by_micro_batch) {
      plan.micro_batches.push_back(build_micro_batch(micro_batch, ranks));
    }
    return plan;
  }
};

}  // namespace

std::unique_ptr<Planner> make_hybrid_dp_planner() { return std::make_unique<HybridDpPlanner>(); }

}  // namespace ballast::strategies
