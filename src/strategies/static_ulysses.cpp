// static-ulysses (DeepSpeed-Ulysses): fixed SP degree d (fixed for the run from its
// context), token-balanced packs of the group's budget dealt round-robin (or, with
// packing=data-order, first-fit packs in the batch's order, FlexSP's baseline); each pack's
// concatenation split evenly over the group, every length optionally padded (pad=N).
#include <fmt/format.h>

#include "ballast/error.hpp"
#include "builders.hpp"
#include "ulysses.hpp"

namespace ballast::strategies {

Tokens padded_to_multiple(Tokens length_tokens, Tokens pad_multiple_tokens) {
  return ceil_div(length_tokens, pad_multiple_tokens) * pad_multiple_tokens;
}

AttentionGroup ulysses_group(const Pack& pack, const std::vector<int>& ranks, const Plan& plan,
                             Tokens pad_multiple_tokens) {
  const auto degree = static_cast<Tokens>(ranks.size());
  AttentionGroup group;
  group.scheme = scheme_at_degree(Scheme::ulysses, static_cast<int>(degree));
  group.ranks = ranks;
  auto padded_length = [&](std::int64_t id) {
    return padded_to_multiple(plan.sequence_lengths_tokens[static_cast<std::size_t>(id)],
                              pad_multiple_tokens);
  };
  Tokens pack_total_tokens = 0;
  for (std::int64_t id : pack) pack_total_tokens += padded_length(id);
  // Member k holds [range_begin(k), range_begin(k+1)) of the concatenation; the first
  // total % degree ranges are one token longer.
  auto range_begin = [&](Tokens k) {
    return k * (pack_total_tokens / degree) + std::min(k, pack_total_tokens % degree);
  };
  Tokens sequence_begin = 0;
  for (std::int64_t id : pack) {
    const Tokens length = padded_length(id);
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
                         const std::string& strategy, const UlyssesConventions& conventions) {
  Plan plan = make_plan_skeleton(batch, cost, strategy);
  const Tokens group_capacity_tokens =
      degree * usable_tokens_per_rank(cost, Scheme::ulysses, degree);
  std::vector<PackItem> items;
  for (std::size_t id = 0; id < batch.lengths_tokens.size(); ++id) {
    items.push_back({static_cast<std::int64_t>(id),
                     padded_to_multiple(batch.lengths_tokens[id], conventions.pad_multiple_tokens)});
  }
  const int groups = plan.cluster.ranks() / degree;
  const std::vector<Pack> packs = conventions.data_order
                                      ? first_fit_in_order(items, group_capacity_tokens)
                                      : balanced_packs(items, group_capacity_tokens, groups);
  deal_packs_round_robin(plan, packs, degree,
                         [&plan, &conventions](const Pack& pack, const std::vector<int>& ranks) {
                           return ulysses_group(pack, ranks, plan, conventions.pad_multiple_tokens);
                         });
  return plan;
}

namespace {

constexpr const char* kName = "static-ulysses";

/// The packing and padding parameters; InputError naming the parameter and its values.
UlyssesConventions conventions_of(const PlannerOptions& options) {
  UlyssesConventions conventions;
  const std::string packing = parameter_or(options, "packing", "balanced");
  if (packing != "balanced" && packing != "data-order") {
    throw InputError(fmt::format("{}: packing={} is unknown; use balanced (the default) or "
                                 "data-order",
                                 kName, packing));
  }
  conventions.data_order = packing == "data-order";
  conventions.pad_multiple_tokens = integer_parameter_or(options, "pad", 1, 1, kMaxPadMultipleTokens);
  return conventions;
}

/// `batch` with every length padded to a multiple of `pad_multiple_tokens` (the lengths the
/// degree rule must hold), and the options with the context padded likewise.
Batch padded_batch(const Batch& batch, Tokens pad_multiple_tokens) {
  Batch padded = batch;
  for (Tokens& length : padded.lengths_tokens) length = padded_to_multiple(length, pad_multiple_tokens);
  return padded;
}
PlannerOptions padded_context(PlannerOptions options, Tokens pad_multiple_tokens) {
  if (options.context_tokens) {
    options.context_tokens = padded_to_multiple(*options.context_tokens, pad_multiple_tokens);
  }
  return options;
}

/// `action()`, its errors (the degree rule's, on padded lengths) told that they are.
template <typename Action>
auto noting_padding(Tokens pad_multiple_tokens, Action action) {
  if (pad_multiple_tokens == 1) return action();
  const auto note = [pad_multiple_tokens](const InputError& error) {
    return fmt::format("{} (lengths padded to a multiple of {}: pad={})", error.what(),
                       pad_multiple_tokens, pad_multiple_tokens);
  };
  try {
    return action();
  } catch (const PlanningError& error) {
    throw PlanningError(note(error));
  } catch (const InputError& error) {
    throw InputError(note(error));
  }
}

class StaticUlyssesPlanner final : public Planner {
 public:
  std::string name() const override { return kName; }
  std::string description() const override {
    return "DeepSpeed-Ulysses: fixed SP degree d (<= KV heads), token-balanced packs, "
           "all-to-all head scatter";
  }
  std::vector<PlannerParameter> parameters() const override {
    return {degree_parameter(),
            {"packing", "balanced (default: token-balanced packs, an equal share per group) or "
                        "data-order (first fit in the batch's order to each group's capacity, "
                        "packs dealt round-robin: FlexSP's DeepSpeed-Ulysses baseline)"},
            {"pad", fmt::format("pad every sequence to a multiple of N tokens, 1 to {} (FlexSP: "
                                "128) [default: 1, no padding]",
                                kMaxPadMultipleTokens)}};
  }
  void check_options(const PlannerOptions& options) const override { conventions_of(options); }
  Tokens longest_sequence_tokens(const CostModel& cost,
                                 const PlannerOptions& options) const override {
    const Tokens pad = conventions_of(options).pad_multiple_tokens;
    const Tokens held = noting_padding(pad, [&] {
      return static_longest_sequence_tokens(cost, padded_context(options, pad), Scheme::ulysses,
                                            kName);
    });
    return held / pad * pad;  // a longer sequence pads beyond what the groups hold
  }
  Plan plan(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
            const PlanEvaluator& /*evaluator: not needed*/) const override {
    make_plan_skeleton(batch, cost, kName);  // input checks before degree selection
    const UlyssesConventions conventions = conventions_of(options);
    const Tokens pad = conventions.pad_multiple_tokens;
    const int degree = noting_padding(pad, [&] {  // the degree holds the padded lengths
      return pad == 1 ? static_degree(batch, cost, options, Scheme::ulysses, kName)
                      : static_degree(padded_batch(batch, pad), cost, padded_context(options, pad),
                                      Scheme::ulysses, kName);
    });
    return plan_static_ulysses(batch, cost, degree, kName, conventions);
  }
};

}  // namespace

std::unique_ptr<Planner> make_static_ulysses_planner() {
  return std::make_unique<StaticUlyssesPlanner>();
}

}  // namespace ballast::strategies
