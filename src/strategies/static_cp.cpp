// static-cp (TransformerEngine / Megatron CP, ring) and static-cp-allgather (LLaMA-3 CP):
// fixed CP groups of d consecutive ranks (d fixed for the run from its context, as
// --context-parallel-size is), every sequence zigzag-split with padding to a multiple of
// 2d, token-balanced packs of the group's budget (THD format) dealt round-robin to groups.
#include <fmt/format.h>

#include "builders.hpp"

namespace ballast::strategies {

namespace {

/// One CP group holding all of a pack's sequences, each zigzag-split over the group
/// (degree 1: a local group, nothing split or padded).
AttentionGroup cp_group(const Pack& pack, const std::vector<int>& ranks, Scheme scheme,
                        const Plan& plan) {
  const auto degree = static_cast<int>(ranks.size());
  AttentionGroup group;
  group.scheme = scheme_at_degree(scheme, degree);
  group.ranks = ranks;
  for (std::int64_t id : pack) {
    const Tokens length = plan.sequence_lengths_tokens[static_cast<std::size_t>(id)];
    if (degree == 1) {
      group.sequences.push_back(whole_sequence(id, length, ranks[0]));
    } else {
      group.sequences.push_back(
          {id, zigzag_padded_length(length, degree), zigzag_chunks_padded(length, ranks)});
    }
  }
  return group;
}

class StaticCpPlanner final : public Planner {
 public:
  StaticCpPlanner(std::string name, std::string description, Scheme scheme)
      : name_(std::move(name)), description_(std::move(description)), scheme_(scheme) {}
  std::string name() const override { return name_; }
  std::string description() const override { return description_; }

  std::vector<PlannerParameter> parameters() const override { return {degree_parameter()}; }
  Tokens longest_sequence_tokens(const CostModel& cost,
                                 const PlannerOptions& options) const override {
    return static_longest_sequence_tokens(cost, options, scheme_, name_);
  }
  Plan plan(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
            const PlanEvaluator& /*evaluator: not needed*/) const override {
    Plan plan = make_plan_skeleton(batch, cost, name_);
    const int degree = static_degree(batch, cost, options, scheme_, name_);
    const auto sequences = static_cast<std::int64_t>(batch.lengths_tokens.size());
    check_plan_chunks(sequences * (degree == 1 ? 1 : 2 * degree), name_,
                      fmt::format("{} sequences, each cut into 2 x {} chunks", sequences, degree));
    const Tokens group_capacity_tokens = degree * usable_tokens_per_rank(cost, scheme_, degree);
    std::vector<PackItem> items;
    for (std::size_t id = 0; id < batch.lengths_tokens.size(); ++id) {
      items.push_back({static_cast<std::int64_t>(id),
                       footprint_tokens(batch.lengths_tokens[id], scheme_, degree)});
    }
    const std::vector<Pack> packs =
        balanced_packs(items, group_capacity_tokens, plan.cluster.ranks() / degree);
    if (scheme_at_degree(scheme_, degree) == Scheme::ring) {
      const auto groups = static_cast<std::int64_t>(packs.size());
      check_ring_steps(groups * degree * degree, name_,
                       fmt::format("{} rings of {} GPUs", groups, degree));
    }
    deal_packs_round_robin(plan, packs, degree,
                           [&](const Pack& pack, const std::vector<int>& ranks) {
                             return cp_group(pack, ranks, scheme_, plan);
                           });
    return plan;
  }

 private:
  std::string name_;
  std::string description_;
  Scheme scheme_;
};

}  // namespace

std::unique_ptr<Planner> make_static_cp_planner() {
  return std::make_unique<StaticCpPlanner>(
      "static-cp",
      "TransformerEngine / Megatron context parallelism: every sequence zigzag-split over a "
      "fixed ring of d GPUs, padded to a multiple of 2d",
      Scheme::ring);
}

std::unique_ptr<Planner> make_static_cp_allgather_planner() {
  return std::make_unique<StaticCpPlanner>(
      "static-cp-allgather",
      "LLaMA-3 context parallelism: KV all-gathered over a fixed group of d GPUs, head-tail "
      "chunks padded to a multiple of 2d",
      Scheme::all_gather);
}

}  // namespace ballast::strategies
