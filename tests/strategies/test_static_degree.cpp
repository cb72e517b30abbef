// The static strategies as runs configure them: the degree fixed for the run from its
// context (and the per-step rule kept as degree=per-step), the spec grammar and errors of
// both. On the tiny fake cluster of fake_cost.hpp (4 GPUs; ring 100, local 194, ulysses
// 113 tokens per GPU).
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

using testing::FakeCostModel;
using testing::tiny_cluster;

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

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
  const StrategySpec ulysses = parse_strategy_spec("static-ulysses", with_context(227));
  EXPECT_NE(error_of([&] { check_strategy_spec(ulysses, cost); })
                .find("static-ulysses cannot hold the run's context of 227 tokens "
                      "(--max-context): degree-2 groups hold 226 tokens and Ulysses degree is "
                      "limited to 2 by the model's 2 KV heads"),
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

}  // namespace
}  // namespace ballast::strategies
