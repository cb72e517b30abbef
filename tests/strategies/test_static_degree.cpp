// The static strategies as runs configure them: the degree fixed for the run from its
// context (and the per-step rule kept as degree=per-step), the spec grammar and errors of
// both, and static-ulysses's FlexSP conventions (packing=data-order, pad=N). On the tiny
// fake cluster of fake_cost.hpp (4 GPUs; ring 100, local 194, ulysses 113 tokens per GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <set>

#include "ballast/error.hpp"
#include "ballast/simulator.hpp"
#include "ballast/strategy.hpp"
#include "builders.hpp"
#include "fake_cost.hpp"

namespace ballast::strategies {
namespace {

using testing::error_of;
using testing::FakeCostModel;
using testing::tiny_cluster;

Scheme scheme_of(const std::string& strategy) {
  if (strategy == "static-cp") return Scheme::ring;
  return strategy == "static-cp-allgather" ? Scheme::all_gather : Scheme::ulysses;
}

PlannerOptions with_context(Tokens context_tokens) {
  PlannerOptions options;
  options.context_tokens = context_tokens;
  return options;
}

/// The spec planned and validated, with the run's context when given.
Plan plan_spec(const std::string& text, const CostModel& cost, std::vector<Tokens> lengths,
               std::optional<Tokens> context_tokens = std::nullopt) {
  PlannerOptions base;
  base.context_tokens = context_tokens;
  const StrategySpec spec = parse_strategy_spec(text, base);
  Plan plan = spec.planner->plan(make_batch(std::move(lengths), 0), cost, spec.options,
                                 SimulatorEvaluator(cost));
  const ValidationResult result = validate(plan, cost);
  EXPECT_TRUE(result.ok) << text << ": " << result.message;
  return plan;
}

/// The group size of every group of the plan (the static strategies use one).
std::set<std::size_t> group_sizes(const Plan& plan) {
  std::set<std::size_t> sizes;
  for (const MicroBatch& micro_batch : plan.micro_batches) {
    for (const AttentionGroup& group : micro_batch.groups) sizes.insert(group.ranks.size());
  }
  return sizes;
}

std::vector<std::int64_t> ids_of(const AttentionGroup& group) {
  std::vector<std::int64_t> ids;
  for (const auto& sequence : group.sequences) ids.push_back(sequence.sequence_id);
  return ids;
}

TEST(StaticDegree, ContextDegreeIsTheSmallestHoldingTheContext) {
  const FakeCostModel cost;
  for (Scheme scheme : {Scheme::ring, Scheme::all_gather, Scheme::ulysses}) {
    for (Tokens context : {1, 150, 194, 195, 200, 201, 226, 268, 400}) {
      const std::vector<int> degrees = allowed_degrees(cost, scheme);
      const auto holding = std::find_if(degrees.begin(), degrees.end(),
                                        [&](int d) { return fits_group(context, cost, scheme, d); });
      if (holding == degrees.end()) {
        EXPECT_THROW(context_degree(context, cost, scheme, "t"), InputError);
        continue;
      }
      EXPECT_EQ(context_degree(context, cost, scheme, "t"), *holding)
          << to_string(scheme) << " context " << context;
    }
  }
  EXPECT_EQ(context_degree(300, cost, Scheme::ring, "t"), 4);     // d = 2 holds 200
  EXPECT_EQ(context_degree(200, cost, Scheme::ulysses, "t"), 2);  // local holds 194
}

TEST(StaticDegree, OneDegreeForEveryBatchOfTheRun) {
  const FakeCostModel cost;
  // Context 250: groups of 4 for every batch, also for a batch of short documents that the
  // per-step rule runs at degree 1 (no CP at all).
  const std::vector<std::vector<Tokens>> batches = {{10, 20, 5}, {150, 5}, {250}, {60, 90, 40}};
  for (const std::string strategy : {"static-cp", "static-cp-allgather"}) {
    const int expected = context_degree(250, cost, scheme_of(strategy), strategy);
    EXPECT_EQ(expected, 4);
    for (const auto& lengths : batches) {
      EXPECT_EQ(group_sizes(plan_spec(strategy, cost, lengths, 250)),
                std::set<std::size_t>{static_cast<std::size_t>(expected)})
          << strategy;
    }
  }
  EXPECT_EQ(group_sizes(plan_spec("static-cp", cost, {10, 20, 5})), std::set<std::size_t>{1});
  // static-ulysses at context 200: degree 2 (two groups of 2) for every batch.
  for (const auto& lengths : {std::vector<Tokens>{10, 20, 5}, std::vector<Tokens>{200, 3}}) {
    EXPECT_EQ(group_sizes(plan_spec("static-ulysses", cost, lengths, 200)),
              std::set<std::size_t>{2});
  }
}

TEST(StaticDegree, SequenceLongerThanTheContextDegreeIsAPlanningError) {
  const FakeCostModel cost;
  // Context 150: local groups (194 tokens) for the run; a 195-token sequence is longer.
  const auto plan = [&] {
    find_planner("static-cp").plan(make_batch({5, 195}), cost, with_context(150),
                                   SimulatorEvaluator(cost));
  };
  EXPECT_THROW(plan(), PlanningError);
  EXPECT_EQ(error_of(plan),
            "static-cp cannot run sequence 1 (195 tokens): it is longer than the run's context "
            "(--max-context 150), whose degree-1 groups hold 194 tokens; raise --max-context to "
            "at least 195");
  // A batch within what the fixed degree holds plans, even past the context.
  EXPECT_EQ(group_sizes(plan_spec("static-cp", cost, {194}, 150)), std::set<std::size_t>{1});
}

TEST(StaticDegree, ContextNoDegreeHoldsIsAnInputErrorNamingTheFlag) {
  const FakeCostModel cost;
  const StrategySpec ring = parse_strategy_spec("static-cp", with_context(401));
  const std::string message = error_of([&] { check_strategy_spec(ring, cost); });
  EXPECT_EQ(message,
            "static-cp cannot hold the run's context of 401 tokens (--max-context): degree-4 "
            "groups hold 400 tokens and 4 is the largest power-of-two degree dividing the 4 "
            "ranks; lower --max-context or add --nodes, or give static-cp:degree=per-step (each "
            "step sized for its own longest sequence)");
  try {
    check_strategy_spec(ring, cost);
  } catch (const PlanningError&) {
    ADD_FAILURE() << "a context no degree holds is a setting error, not a batch's";
  } catch (const InputError&) {
  }
  // plan() says the same for callers that skip the check.
  EXPECT_EQ(error_of([&] {
              ring.planner->plan(make_batch({5}), cost, ring.options, SimulatorEvaluator(cost));
            }),
            message);
  // Ulysses: the KV heads stop the degree at 2, and the message says so.
  const StrategySpec ulysses = parse_strategy_spec("static-ulysses:pad=2", with_context(227));
  EXPECT_NE(error_of([&] { check_strategy_spec(ulysses, cost); })
                .find("strategy 'static-ulysses:pad=2': static-ulysses cannot hold the run's "
                      "context of 228 tokens (--max-context): degree-2 groups hold 226 tokens "
                      "and Ulysses degree is limited to 2 by the model's 2 KV heads"),
            std::string::npos);
  // A fixed degree or the per-step rule does not depend on the context.
  EXPECT_NO_THROW(check_strategy_spec(parse_strategy_spec("static-cp:degree=4", with_context(401)), cost));
  EXPECT_NO_THROW(
      check_strategy_spec(parse_strategy_spec("static-cp:degree=per-step", with_context(401)), cost));
}

TEST(StaticDegree, DegreeThatDoesNotDivideTheGpusNamesTheFlag) {
  const FakeCostModel cost;
  EXPECT_EQ(error_of([&] {
              check_strategy_spec(parse_strategy_spec("static-cp:degree=3", with_context(300)), cost);
            }),
            "strategy 'static-cp:degree=3': --degree 3 is not valid for static-cp: it must divide "
            "the 4 ranks; valid values: 1, 2, 4");
}

TEST(StaticDegree, PerStepReproducesTheOldRule) {
  const FakeCostModel cost;
  std::mt19937_64 random(7);
  for (const std::string strategy : {"static-cp", "static-cp-allgather", "static-ulysses"}) {
    const Scheme scheme = scheme_of(strategy);
    const Tokens longest = max_sequence_tokens(cost, scheme);
    for (int i = 0; i < 40; ++i) {
      std::vector<Tokens> lengths(1 + random() % 12);
      for (Tokens& length : lengths) length = 1 + static_cast<Tokens>(random() % longest);
      const Batch batch = make_batch(lengths, 0);
      // The old rule: the smallest degree holding this batch's longest sequence, which is
      // also what a plan without a context gets.
      const Plan per_step = plan_spec(strategy + ":degree=per-step", cost, lengths, longest);
      PlannerOptions options;
      options.degree = default_degree(batch, cost, scheme, strategy);
      Plan old_rule = find_planner(strategy).plan(batch, cost, options, SimulatorEvaluator(cost));
      old_rule.strategy = per_step.strategy;
      EXPECT_EQ(plan_to_string(per_step), plan_to_string(old_rule)) << strategy;
      EXPECT_EQ(plan_to_string(plan_spec(strategy, cost, lengths)), plan_to_string(per_step));
    }
  }
}

TEST(StaticDegree, SpecGrammarOfPerStep) {
  PlannerOptions base;
  base.degree = 4;  // --degree, for every strategy that takes one
  const StrategySpec per_step = parse_strategy_spec("static-cp:degree=per-step", base);
  EXPECT_TRUE(per_step.options.degree_per_step);
  EXPECT_FALSE(per_step.options.degree);  // the spec's rule wins over --degree
  EXPECT_FALSE(parse_strategy_spec("static-cp:degree=2", base).options.degree_per_step);
  EXPECT_TRUE(parse_strategy_spec("zeppelin:partition=even:degree=per-step").options.degree_per_step);
  EXPECT_EQ(error_of([] { parse_strategy_spec("static-cp:degree=some"); }),
            "strategy 'static-cp:degree=some': degree=some is neither a fixed degree (an "
            "integer from 1 to 1048576) nor per-step (the degree of each step's longest "
            "sequence)");
  EXPECT_THROW(parse_strategy_spec("batch-adaptive:degree=per-step"), InputError);
  EXPECT_THROW(parse_strategy_spec("zeppelin:degree=per-step"), InputError);  // hierarchical
}

TEST(StaticDegree, LongestSequenceFollowsTheRule) {
  const FakeCostModel cost;
  const Planner& cp = find_planner("static-cp");
  EXPECT_EQ(cp.longest_sequence_tokens(cost, with_context(300)), 400);  // rings of 4
  EXPECT_EQ(cp.longest_sequence_tokens(cost, with_context(150)), 194);  // local
  EXPECT_EQ(cp.longest_sequence_tokens(cost, {}), 400);                 // per step: the largest
  EXPECT_EQ(cp.longest_sequence_tokens(cost, parse_strategy_spec("static-cp:degree=per-step",
                                                                 with_context(150))
                                                 .options),
            400);
  EXPECT_THROW(cp.longest_sequence_tokens(cost, with_context(401)), InputError);
  // static-ulysses: what the fixed degree holds, rounded down to the padding.
  const StrategySpec padded = parse_strategy_spec("static-ulysses:pad=16", with_context(200));
  EXPECT_EQ(padded.planner->longest_sequence_tokens(cost, padded.options), 224);  // 226 -> 224
}

TEST(StaticDegree, ZeppelinEvenSplitFollowsStaticCp) {
  const FakeCostModel cost;
  // The ablation's static rings use static-cp's degree, fixed by the context.
  EXPECT_EQ(group_sizes(plan_spec("zeppelin:partition=even", cost, {10, 20, 5}, 300)),
            std::set<std::size_t>{4});
  EXPECT_EQ(group_sizes(plan_spec("zeppelin:partition=even:degree=per-step", cost, {10, 20, 5},
                                  300)),
            std::set<std::size_t>{1});
}

// ---- packing=data-order, pad=N ----

/// First fit in order, the obvious way: scan the packs for room.
std::vector<Pack> first_fit_reference(const std::vector<PackItem>& items, Tokens capacity) {
  std::vector<Pack> packs;
  std::vector<Tokens> used;
  for (const PackItem& item : items) {
    std::size_t p = 0;
    while (p < packs.size() && used[p] + item.size_tokens > capacity) ++p;
    if (p == packs.size()) {
      packs.emplace_back();
      used.push_back(0);
    }
    packs[p].push_back(item.sequence_id);
    used[p] += item.size_tokens;
  }
  return packs;
}

TEST(FirstFitInOrder, HandChecked) {
  // 60 -> P0, 50 -> P1, 30 -> P0 (90), 45 -> P1 (95), 10 -> P0 (100), 20 -> P2.
  const std::vector<PackItem> items = {{0, 60}, {1, 50}, {2, 30}, {3, 45}, {4, 10}, {5, 20}};
  EXPECT_EQ(first_fit_in_order(items, 100),
            (std::vector<Pack>{{0, 2, 4}, {1, 3}, {5}}));
}

TEST(FirstFitInOrder, MatchesTheReferenceOnRandomItems) {
  std::mt19937_64 random(11);
  for (int i = 0; i < 300; ++i) {
    const Tokens capacity = 1 + static_cast<Tokens>(random() % 200);
    std::vector<PackItem> items(random() % 60);
    for (std::size_t k = 0; k < items.size(); ++k) {
      items[k] = {static_cast<std::int64_t>(k), 1 + static_cast<Tokens>(random() % capacity)};
    }
    EXPECT_EQ(first_fit_in_order(items, capacity), first_fit_reference(items, capacity))
        << "instance " << i;
  }
}

TEST(StaticUlyssesDataOrder, PacksInBatchOrderDealtRoundRobin) {
  const FakeCostModel cost;
  // Degree 2: two groups of 226 tokens. First fit in order: 100, 100 -> P0; 50, 30 -> P1;
  // 20 -> P0 (220). Token-balanced packing would put 100 + 30 and 100 + 50 + 20 together.
  const Plan plan = plan_spec("static-ulysses:degree=2:packing=data-order", cost,
                              {100, 100, 50, 30, 20});
  ASSERT_EQ(plan.micro_batches.size(), 1u);
  const auto& groups = plan.micro_batches[0].groups;
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(ids_of(groups[0]), (std::vector<std::int64_t>{0, 1, 4}));
  EXPECT_EQ(groups[1].ranks, (std::vector<int>{2, 3}));
  EXPECT_EQ(ids_of(groups[1]), (std::vector<std::int64_t>{2, 3}));
}

TEST(StaticUlyssesDataOrder, MorePacksThanGroupsMakeMicroBatches) {
  const FakeCostModel cost;
  // Three 150-token sequences: no two share a 226-token pack; pack p goes to micro-batch
  // p / 2, group p % 2, so the second micro-batch runs one group and idles the other.
  const Plan plan = plan_spec("static-ulysses:degree=2:packing=data-order", cost,
                              {150, 150, 150});
  ASSERT_EQ(plan.micro_batches.size(), 2u);
  ASSERT_EQ(plan.micro_batches[1].groups.size(), 1u);
  EXPECT_EQ(plan.micro_batches[1].groups[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(ids_of(plan.micro_batches[1].groups[0]), (std::vector<std::int64_t>{2}));
}

TEST(StaticUlyssesPad, PaddedLengthsInThePlan) {
  const FakeCostModel cost;
  // pad=16: 100 -> 112 and 30 -> 32; each group splits its padded concatenation.
  const Plan plan = plan_spec("static-ulysses:degree=2:pad=16", cost, {100, 30});
  const auto& groups = plan.micro_batches.at(0).groups;
  ASSERT_EQ(groups.size(), 2u);
  const SequenceChunks& long_one = groups[0].sequences.at(0);
  EXPECT_EQ(long_one.padded_length_tokens, 112);
  ASSERT_EQ(long_one.chunks.size(), 2u);
  EXPECT_EQ(long_one.chunks[0].end_tokens, 56);
  EXPECT_EQ(long_one.chunks[1].end_tokens, 112);
  EXPECT_EQ(groups[1].sequences.at(0).padded_length_tokens, 32);
  // Degree 1 pads too (FlexSP pads every sequence): a local group over the padded length.
  const Plan local = plan_spec("static-ulysses:degree=1:pad=16", cost, {10});
  EXPECT_EQ(local.micro_batches[0].groups[0].scheme, Scheme::local);
  EXPECT_EQ(local.micro_batches[0].groups[0].sequences[0].padded_length_tokens, 16);
  // The padding counts against memory: degree-2 groups hold 226 tokens, so 225 padded to
  // 240 does not fit...
  EXPECT_THROW(find_planner("static-ulysses")
                   .plan(make_batch({225}), cost,
                         parse_strategy_spec("static-ulysses:degree=2:pad=16").options,
                         SimulatorEvaluator(cost)),
               PlanningError);
  // ...and the default degree is chosen for the padded lengths: 194 fits one GPU, its
  // padding to 208 does not.
  EXPECT_EQ(group_sizes(plan_spec("static-ulysses:pad=16", cost, {194})), std::set<std::size_t>{2});
  EXPECT_EQ(group_sizes(plan_spec("static-ulysses:pad=16", cost, {194}, 194)),
            std::set<std::size_t>{2});
}

TEST(StaticUlyssesPad, ParametersAreChecked) {
  EXPECT_THROW(parse_strategy_spec("static-ulysses:pad=0"), InputError);
  EXPECT_THROW(parse_strategy_spec("static-ulysses:pad=4096"), InputError);
  EXPECT_EQ(error_of([] { parse_strategy_spec("static-ulysses:packing=sorted"); }),
            "static-ulysses: packing=sorted is unknown; use balanced (the default) or "
            "data-order");
  EXPECT_THROW(parse_strategy_spec("static-cp:pad=16"), InputError);  // static-ulysses only
}

}  // namespace
}  // namespace ballast::strategies
