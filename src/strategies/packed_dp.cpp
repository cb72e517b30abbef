// packed-dp: Megatron-style packing + data parallelism. Token-balanced packs of one rank's
// token budget (every rank an equal share of the batch), dealt round-robin; every rank
// runs its pack locally.
#include <fmt/format.h>

#include "ballast/error.hpp"
#include "builders.hpp"

namespace ballast::strategies {

namespace {

constexpr const char* kName = "packed-dp";

/// A local group: the pack's whole sequences on one rank.
AttentionGroup local_group(const Pack& pack, const std::vector<int>& ranks, const Plan& plan) {
  AttentionGroup group;
  group.scheme = Scheme::local;
  group.ranks = ranks;
  for (std::int64_t id : pack) {
    group.sequences.push_back(
        whole_sequence(id, plan.sequence_lengths_tokens[static_cast<std::size_t>(id)], ranks[0]));
  }
  return group;
}

class PackedDpPlanner final : public Planner {
 public:
  std::string name() const override { return kName; }
  std::string description() const override {
    return "Megatron-style packing: token-balanced packs of one GPU's token budget, "
           "data parallel, no sequence splitting";
  }

  /// One GPU's local budget: packed-dp never splits a sequence.
  Tokens longest_sequence_tokens(const CostModel& cost,
                                 const PlannerOptions& /*options*/) const override {
    return usable_tokens_per_rank(cost, Scheme::local, 1);
  }

  Plan plan(const Batch& batch, const CostModel& cost,
            const PlannerOptions& /*options: no degree, every group is one rank*/,
            const PlanEvaluator& /*evaluator: not needed*/) const override {
    Plan plan = make_plan_skeleton(batch, cost, kName);
    const Tokens capacity_tokens = usable_tokens_per_rank(cost, Scheme::local, 1);
    std::vector<PackItem> items;
    for (std::size_t id = 0; id < batch.lengths_tokens.size(); ++id) {
      const Tokens length = batch.lengths_tokens[id];
      if (length > capacity_tokens) {
        throw PlanningError(fmt::format(
            "{} cannot run sequence {} ({} tokens): one GPU holds {} tokens and packed-dp never "
            "splits a sequence; use a strategy that splits sequences (static-cp, hybrid-dp) or "
            "{}",
            kName, id, with_thousands(length), with_thousands(capacity_tokens),
            shorter_sequences_advice()));
      }
      items.push_back({static_cast<std::int64_t>(id), length});
    }
    const std::vector<Pack> packs = balanced_packs(items, capacity_tokens, plan.cluster.ranks());
    deal_packs_round_robin(plan, packs, 1,
                           [&plan](const Pack& pack, const std::vector<int>& ranks) {
                             return local_group(pack, ranks, plan);
                           });
    return plan;
  }
};

}  // namespace

std::unique_ptr<Planner> make_packed_dp_planner() { return std::make_unique<PackedDpPlanner>(); }

}  // namespace ballast::strategies
