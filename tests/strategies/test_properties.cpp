// Property tests of every registered strategy on seeded random and extreme batches over
// real presets: a plan validates, its simulated step is never below the lower bound, it
// is byte-identical on a rerun, and a strategy throws PlanningError exactly when the
// batch's longest sequence exceeds what it can hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "ballast/error.hpp"
#include "ballast/simulator.hpp"
#include "ballast/strategy.hpp"
#include "builders.hpp"
#include "runnable.hpp"

namespace ballast::strategies {
namespace {

using testing::make_cost;
using testing::TestSetup;

double uniform01(std::uint64_t& state) {
  return static_cast<double>(splitmix64_next(state) >> 11) * 0x1.0p-53;
}

Tokens log_uniform_tokens(std::uint64_t& state, Tokens max_tokens) {
  const double value = std::exp(uniform01(state) * std::log(static_cast<double>(max_tokens)));
  return std::clamp<Tokens>(static_cast<Tokens>(value), 1, max_tokens);
}

/// Seeded batch of one of six shapes: random log-uniform (runnable by every strategy, or
/// up to the cluster's limit), one sequence as long as the strategy can hold, thousands
/// of 1-token sequences, all-equal lengths, powers of two plus one.
std::vector<Tokens> make_lengths(std::uint64_t seed, Tokens strategy_max, Tokens local_max,
                                 Tokens cluster_max, int ranks) {
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  std::vector<Tokens> lengths;
  switch (seed % 6) {
    case 0:
    case 1: {
      const Tokens max_length = seed % 6 == 0 ? local_max : cluster_max + cluster_max / 8;
      const double budget = ranks * static_cast<double>(local_max) * (0.2 + 2.0 * uniform01(state));
      double total = 0;
      while (total < budget && lengths.size() < 1500) {
        lengths.push_back(log_uniform_tokens(state, max_length));
        total += static_cast<double>(lengths.back());
      }
      break;
    }
    case 2:
      lengths.push_back(strategy_max);
      for (int i = 0; i < 20; ++i) lengths.push_back(log_uniform_tokens(state, local_max / 4));
      break;
    case 3:
      lengths.assign(1000 + uniform_below(state, 2000), 1);
      break;
    case 4:
      lengths.assign(ranks * (1 + uniform_below(state, 4)), log_uniform_tokens(state, local_max));
      break;
    default:
      for (Tokens power = 1; power + 1 <= cluster_max; power *= 2) lengths.push_back(power + 1);
      break;
  }
  return lengths;
}

constexpr int kBatchesPerSetup = 50;

std::uint64_t milp_seed_stride() {
  const char* text = std::getenv("BALLAST_PROPERTY_MILP_STRIDE");
  const long long stride = text != nullptr ? std::atoll(text) : 0;
  return stride > 0 ? static_cast<std::uint64_t>(stride) : 5;
}

void check_strategy(const Planner& planner, const TestSetup& setup) {
  const std::unique_ptr<CostModel> cost = make_cost(setup);
  const int ranks = cost->cluster().ranks();
  const SimulatorEvaluator evaluator(*cost);
  const Tokens strategy_max = planner.longest_sequence_tokens(*cost, {});
  const Tokens local_max = usable_tokens_per_rank(*cost, Scheme::local, 1);
  Tokens cluster_max = 0;  // the longest any strategy holds
  for (const auto& any : planners()) {
    cluster_max = std::max(cluster_max, any->longest_sequence_tokens(*cost, {}));
  }
  int planned = 0;
  int tried = 0;
  // The faithful MILP costs CBC seconds per plan: every fifth seed (all six shapes still),
  // or every BALLAST_PROPERTY_MILP_STRIDE-th (scripts/test-sanitized: 10).
  const std::uint64_t stride = planner.solves_milp({}) ? milp_seed_stride() : 1;
  for (std::uint64_t seed = 0; seed < kBatchesPerSetup; seed += stride) {
    ++tried;
    const Batch batch =
        make_batch(make_lengths(seed, strategy_max, local_max, cluster_max, ranks), seed);
    SCOPED_TRACE(::testing::Message() << planner.name() << " on " << setup.cluster << " x"
                                      << setup.nodes << " " << setup.model << ", seed " << seed
                                      << ", " << batch.lengths_tokens.size() << " sequences");
    const bool runnable = batch.max_length_tokens() <= strategy_max;
    if (!runnable) {
      EXPECT_THROW(planner.plan(batch, *cost, {}, evaluator), PlanningError);
      continue;
    }
    const Plan plan = planner.plan(batch, *cost, {}, evaluator);
    const ValidationResult validation = validate(plan, *cost);
    ASSERT_TRUE(validation.ok) << validation.message;
    EXPECT_EQ(plan_to_string(plan), plan_to_string(planner.plan(batch, *cost, {}, evaluator)));
    const SimulationReport report = simulate(plan, *cost);
    EXPECT_GE(report.step_time_s, report.lower_bound.time_s * (1 - 1e-9));
    EXPECT_GT(report.step_time_s, 0.0);
    if (std::getenv("BALLAST_STRATEGY_TEST_VERBOSE")) {
      std::printf("%s seed %d: %zu seqs, %zu mb, step %.4f s, bound %.4f s\n",
                  planner.name().c_str(), static_cast<int>(seed), batch.lengths_tokens.size(),
                  plan.micro_batches.size(), report.step_time_s, report.lower_bound.time_s);
    }
    ++planned;
  }
  EXPECT_GT(planned, tried / 2);
}

const std::vector<TestSetup>& setups() {
  static const std::vector<TestSetup> all = {
      {"h100", 1, "llama-7b"},
      {"h100", 2, "llama3-8b"},
      {"a800-roce", 1, "llama3-8b"},
      {"a800-roce", 2, "llama-7b"},
  };
  return all;
}

class StrategyProperties : public ::testing::TestWithParam<std::string> {};

TEST_P(StrategyProperties, ValidDeterministicAndAboveTheLowerBound) {
  const Planner& planner = find_planner(GetParam());
  for (const TestSetup& setup : setups()) check_strategy(planner, setup);
}

INSTANTIATE_TEST_SUITE_P(AllStrategies, StrategyProperties, ::testing::ValuesIn(planner_names()),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(StrategyProperties, ProfiledCostModelToo) {
  // FlexSP's profiled coefficients (per-micro-batch overhead b1) on its own cluster.
  const TestSetup setup{"a100-ib400", 1, "gpt-7b", "flexsp-a100-192k"};
  for (const auto& planner : planners()) check_strategy(*planner, setup);
}

TEST(EstimateAgainstSimulator, UlyssesPlansAgreeWithinATenthOfAPercent) {
  // batch-adaptive ranks degrees by estimate_plan_time_s; the simulator is the reference.
  // Ulysses groups are disjoint and synchronous, so both must agree up to the one-token
  // differences between members (the estimate takes each member's own sum).
  for (const TestSetup& setup : {TestSetup{"a100-ib400", 2, "gpt-7b", "flexsp-a100-192k"},
                                 TestSetup{"h100", 2, "llama-7b", "analytical"}}) {
    const auto cost = make_cost(setup);
    std::uint64_t state = 7;
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<Tokens> lengths;
      for (int i = 0; i < 64; ++i) lengths.push_back(log_uniform_tokens(state, 5'000));
      const Batch batch = make_batch(lengths, trial);
      for (int degree : {1, 2, 4, 8}) {
        PlannerOptions options;
        options.degree = degree;
        const Plan plan = find_planner("static-ulysses").plan(batch, *cost, options,
                                                                SimulatorEvaluator(*cost));
        const double simulated_s = simulate(plan, *cost).step_time_s;
        EXPECT_NEAR(estimate_plan_time_s(plan, *cost) / simulated_s, 1.0, 1e-3)
            << setup.cluster << " degree " << degree << " trial " << trial;
      }
    }
  }
}

}  // namespace
}  // namespace ballast::strategies
