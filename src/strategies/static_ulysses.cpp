// static-ulysses (DeepSpeed-Ulysses): fixed SP degree d (fixed for the run from its
// context), token-balanced packs of the group's budget dealt round-robin; each pack's
// concatenation split evenly over the group.
#include "builders.hpp"
#include "ulysses.hpp"

namespace ballast::strategies {

AttentionGroup ulysses_group(const Pack& pack, const std::vector<int>& ranks, const Plan& plan) {
  const auto degree = static_cast<Tokens>(ranks.size());
  AttentionGroup group;
  group.scheme = scheme_at_degree(Scheme::ulysses, static_cast<int>(degree));
  group.ranks = ranks;
  Tokens pack_total_tokens = 0;
  for (std::int64_t id : pack) {
    pack_total_tokens += plan.sequence_lengths_tokens[static_cast<std::size_t>(id)];
  }
  // Member k holds [range_begin(k), range_begin(k+1)) of the concatenation; the first
  // total % degree ranges are one token longer.
  auto range_begin = [&](Tokens k) {
    return k * (pack_total_tokens / degree) + std::min(k, pack_total_tokens % degree);
  };
  Tokens sequence_begin = 0;
  for (std::int64_t id : pack) {
    const Tokens length = plan.sequence_lengths_tokens[static_cast<std::size_t>(id)];
    SequenceChunks sequence{id, length, {}};
    for (Tokens k = 0; k < degree; ++k) {
      const Tokens begin = std::max(range_begin(k), sequence_begin);
      const Tokens end = std::min(range_begin(k + 1), sequence_begin + length);
      if (begin < end) {
        sequence.chunks.push_back(
            {ranks[static_cast<std::size_t>(k)], begin - sequence_begin, end - sequence_begin});
      }
    }
    group.sequences.push_back(std::move(sequence));
    sequence_begin += length;
  }
  return group;
}

Plan plan_static_ulysses(const Batch& batch, const CostModel& cost, int degree,
                         const std::string& strategy) {
  Plan plan = make_plan_skeleton(batch, cost, strategy);
  const Tokens group_capacity_tokens =
      degree * usable_tokens_per_rank(cost, Scheme::ulysses, degree);
  std::vector<PackItem> items;
  for (std::size_t id = 0; id < batch.lengths_tokens.size(); ++id) {
    items.push_back({static_cast<std::int64_t>(id), batch.lengths_tokens[id]});
  }
  const std::vector<Pack> packs =
      balanced_packs(items, group_capacity_tokens, plan.cluster.ranks() / degree);
  deal_packs_round_robin(plan, packs, degree,
                         [&plan](const Pack& pack, const std::vector<int>& ranks) {
                           return ulysses_group(pack, ranks, plan);
                         });
  return plan;
}

namespace {

constexpr const char* kName = "static-ulysses";

class StaticUlyssesPlanner final : public Planner {
 public:
  std::string name() const override { return kName; }
  std::string description() const override {
    return "DeepSpeed-Ulysses: fixed SP degree d (<= KV heads), token-balanced packs, "
           "all-to-all head scatter";
  }
  std::vector<PlannerParameter> parameters() const override { return {degree_parameter()}; }
  Tokens longest_sequence_tokens(const CostModel& cost,
                                 const PlannerOptions& options) const override {
    return static_longest_sequence_tokens(cost, options, Scheme::ulysses, kName);
  }
  Plan plan(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
            const PlanEvaluator& /*evaluator: not needed*/) const override {
    make_plan_skeleton(batch, cost, kName);  // input checks before degree selection
    const int degree = static_degree(batch, cost, options, Scheme::ulysses, kName);
    return plan_static_ulysses(batch, cost, degree, kName);
  }
};

}  // namespace

std::unique_ptr<Planner> make_static_ulysses_planner() {
  return std::make_unique<StaticUlyssesPlanner>();
}

}  // namespace ballast::strategies
