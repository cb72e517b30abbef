// Hand-checked plans of every baseline strategy on a tiny cluster whose token
// capacities are round numbers (fake_cost.hpp: local 194, ring 100, ulysses 113).
#include <gtest/gtest.h>

#include "ballast/error.hpp"
#include "ballast/simulator.hpp"
#include "ballast/strategy.hpp"
#include "builders.hpp"
#include "fake_cost.hpp"

namespace ballast::strategies {
namespace {

using testing::FakeCostModel;
using testing::tiny_cluster;
using testing::tiny_model;

Plan plan_with(const std::string& strategy, const CostModel& cost, std::vector<Tokens> lengths,
               std::optional<int> degree = std::nullopt) {
  PlannerOptions options;
  options.degree = degree;
  Plan plan = find_planner(strategy).plan(make_batch(std::move(lengths), 3), cost, options,
                                          SimulatorEvaluator(cost));
  const ValidationResult result = validate(plan, cost);
  EXPECT_TRUE(result.ok) << strategy << ": " << result.message;
  return plan;
}

std::vector<std::int64_t> ids_of(const AttentionGroup& group) {
  std::vector<std::int64_t> ids;
  for (const auto& sequence : group.sequences) ids.push_back(sequence.sequence_id);
  return ids;
}

void expect_chunk(const Chunk& chunk, int rank, Tokens begin, Tokens end) {
  EXPECT_EQ(chunk.rank, rank);
  EXPECT_EQ(chunk.begin_tokens, begin);
  EXPECT_EQ(chunk.end_tokens, end);
}

TEST(PackedDp, BalancedPacksDealtRoundRobin) {
  const FakeCostModel cost(tiny_cluster(1, 2));
  // Capacity 194, two ranks. BFD needs 3 packs ({150, 40} {100, 90} {50}), so 2 rounds of
  // 2 packs: 150 -> P0, 100 -> P1, 90 -> P2, 50 -> P3, 40 -> P3 (the least loaded, 50).
  // Totals 150, 100, 90, 90: micro-batch 0 = P0 on rank 0, P1 on rank 1; micro-batch 1 =
  // P2 on rank 0, P3 on rank 1. Every rank gets a pack in every micro-batch (BFD left
  // rank 1 idle in micro-batch 1).
  const Plan plan = plan_with("packed-dp", cost, {150, 100, 90, 50, 40});
  EXPECT_EQ(plan.strategy, "packed-dp");
  EXPECT_EQ(plan.step, 3);
  EXPECT_EQ(plan.sequence_lengths_tokens.size(), 5u);
  ASSERT_EQ(plan.micro_batches.size(), 2u);
  const auto& first = plan.micro_batches[0].groups;
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].scheme, Scheme::local);
  EXPECT_EQ(first[0].ranks, std::vector<int>{0});
  EXPECT_EQ(ids_of(first[0]), (std::vector<std::int64_t>{0}));
  EXPECT_EQ(first[1].ranks, std::vector<int>{1});
  EXPECT_EQ(ids_of(first[1]), (std::vector<std::int64_t>{1}));
  const auto& second = plan.micro_batches[1].groups;
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0].ranks, std::vector<int>{0});
  EXPECT_EQ(ids_of(second[0]), (std::vector<std::int64_t>{2}));
  EXPECT_EQ(second[1].ranks, std::vector<int>{1});
  EXPECT_EQ(ids_of(second[1]), (std::vector<std::int64_t>{3, 4}));
  expect_chunk(first[0].sequences[0].chunks.at(0), 0, 0, 150);
}

TEST(PackedDp, FewSequencesSpreadOverRanks) {
  const FakeCostModel cost;
  // Capacity 194, four ranks: BFD would fill one pack {100, 60, 30} and leave three ranks
  // idle; balanced packing gives one round of 4 packs: 100 -> rank 0, 60 -> rank 1,
  // 30 -> rank 2, and the empty fourth pack is dropped (rank 3 has nothing to run).
  const Plan plan = plan_with("packed-dp", cost, {30, 100, 60});
  ASSERT_EQ(plan.micro_batches.size(), 1u);
  const auto& groups = plan.micro_batches[0].groups;
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(ids_of(groups[0]), std::vector<std::int64_t>{1});
  EXPECT_EQ(groups[0].ranks, std::vector<int>{0});
  EXPECT_EQ(ids_of(groups[1]), std::vector<std::int64_t>{2});
  EXPECT_EQ(groups[1].ranks, std::vector<int>{1});
  EXPECT_EQ(ids_of(groups[2]), std::vector<std::int64_t>{0});
  EXPECT_EQ(groups[2].ranks, std::vector<int>{2});
}

TEST(PackedDp, TooLongSequenceIsNamed) {
  const FakeCostModel cost;
  try {
    find_planner("packed-dp").plan(make_batch({10, 195}), cost, {}, SimulatorEvaluator(cost));
    FAIL() << "expected PlanningError";
  } catch (const PlanningError& error) {
    EXPECT_NE(std::string(error.what()).find("sequence 1 (195 tokens): one GPU holds 194 tokens"),
              std::string::npos)
        << error.what();
  }
}

TEST(StaticCp, OneRingOfFourWithPadding) {
  const FakeCostModel cost;
  // 250 needs degree 4; padded 256, 16, 32 all fit one pack of 4 * 100 tokens.
  const Plan plan = plan_with("static-cp", cost, {250, 10, 30});
  ASSERT_EQ(plan.micro_batches.size(), 1u);
  ASSERT_EQ(plan.micro_batches[0].groups.size(), 1u);
  const AttentionGroup& ring = plan.micro_batches[0].groups[0];
  EXPECT_EQ(ring.scheme, Scheme::ring);
  EXPECT_EQ(ring.ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(ids_of(ring), (std::vector<std::int64_t>{0, 2, 1}));
  EXPECT_EQ(ring.sequences[0].padded_length_tokens, 256);
  EXPECT_EQ(ring.sequences[1].padded_length_tokens, 32);
  EXPECT_EQ(ring.sequences[2].padded_length_tokens, 16);  // 10 tokens + 6 padding
  ASSERT_EQ(ring.sequences[0].chunks.size(), 8u);
  expect_chunk(ring.sequences[0].chunks[0], 0, 0, 32);
  expect_chunk(ring.sequences[0].chunks[1], 0, 224, 256);
  expect_chunk(ring.sequences[0].chunks[6], 3, 96, 128);
  expect_chunk(ring.sequences[0].chunks[7], 3, 128, 160);
  expect_chunk(ring.sequences[2].chunks[0], 0, 0, 2);
}

TEST(StaticCp, DegreeOverrideGivesTwoGroups) {
  const FakeCostModel cost;
  // d=2: 2 groups of 200 padded tokens; padded 152, 120, 60, 12. BFD needs 2 packs
  // ({152, 12} and {120, 60}), so one round of 2 packs: 152 -> P0, 120 -> P1, 60 -> P1
  // (120 < 152: 180), 12 -> P0 (152 < 180: 164). P1 (180) is dealt first, to ranks 0-1.
  const Plan plan = plan_with("static-cp", cost, {150, 120, 60, 10}, 2);
  ASSERT_EQ(plan.micro_batches.size(), 1u);
  const auto& groups = plan.micro_batches[0].groups;
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(ids_of(groups[0]), (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(groups[1].ranks, (std::vector<int>{2, 3}));
  EXPECT_EQ(ids_of(groups[1]), (std::vector<std::int64_t>{0, 3}));
  EXPECT_EQ(groups[1].sequences[0].padded_length_tokens, 152);
  EXPECT_EQ(groups[1].sequences[1].padded_length_tokens, 12);
}

TEST(StaticCp, ShortBatchRunsLocallyAtDegreeOne) {
  const FakeCostModel cost;
  // Degree 1 (local capacity 194): BFD fits all in 2 packs, so one round of 4 packs, one
  // sequence each on ranks 0-2 (the fourth pack is empty and dropped).
  const Plan plan = plan_with("static-cp", cost, {100, 90, 5});
  ASSERT_EQ(plan.micro_batches.size(), 1u);
  ASSERT_EQ(plan.micro_batches[0].groups.size(), 3u);
  EXPECT_EQ(ids_of(plan.micro_batches[0].groups[2]), std::vector<std::int64_t>{2});
  EXPECT_EQ(plan.micro_batches[0].groups[2].ranks, std::vector<int>{2});
  for (const auto& group : plan.micro_batches[0].groups) {
    EXPECT_EQ(group.scheme, Scheme::local);
    for (const auto& sequence : group.sequences) {
      EXPECT_EQ(sequence.padded_length_tokens, plan.sequence_lengths_tokens[sequence.sequence_id]);
    }
  }
}

TEST(StaticCpAllGather, CapacityShrinksWithTheGroup) {
  const FakeCostModel cost;
  // d=4 all-gather: 67 tokens per rank, 268 per group, one group: BFD needs 2 packs, so 2
  // rounds of one pack: 256 -> P0, 32 -> P1, 16 -> P1: {256} then {32, 16}.
  const Plan plan = plan_with("static-cp-allgather", cost, {250, 10, 30});
  ASSERT_EQ(plan.micro_batches.size(), 2u);
  const AttentionGroup& first = plan.micro_batches[0].groups.at(0);
  EXPECT_EQ(first.scheme, Scheme::all_gather);
  EXPECT_EQ(ids_of(first), (std::vector<std::int64_t>{0}));
  EXPECT_EQ(ids_of(plan.micro_batches[1].groups.at(0)), (std::vector<std::int64_t>{2, 1}));
  expect_chunk(first.sequences[0].chunks[1], 0, 224, 256);  // head-tail chunks
}

TEST(StaticUlysses, ContiguousSplitOfThePack) {
  const FakeCostModel cost;
  // 200 > 194 needs degree 2 (226 per group), 2 groups. BFD needs 2 packs ({200, 20},
  // {30}), so one round of 2 packs: 200 -> P0, 30 -> P1, 20 -> P1 (30 < 200): {200} on
  // ranks 0-1 (100 tokens each) and {30, 20} on ranks 2-3: the 50-token concatenation
  // splits 25 / 25, so sequence 1 spans both ranks and sequence 2 sits on rank 3 alone.
  const Plan plan = plan_with("static-ulysses", cost, {200, 30, 20});
  ASSERT_EQ(plan.micro_batches.size(), 1u);
  const auto& groups = plan.micro_batches[0].groups;
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].scheme, Scheme::ulysses);
  EXPECT_EQ(groups[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(ids_of(groups[0]), (std::vector<std::int64_t>{0}));
  ASSERT_EQ(groups[0].sequences[0].chunks.size(), 2u);
  expect_chunk(groups[0].sequences[0].chunks[0], 0, 0, 100);
  expect_chunk(groups[0].sequences[0].chunks[1], 1, 100, 200);
  EXPECT_EQ(groups[1].ranks, (std::vector<int>{2, 3}));
  EXPECT_EQ(ids_of(groups[1]), (std::vector<std::int64_t>{1, 2}));
  ASSERT_EQ(groups[1].sequences[0].chunks.size(), 2u);
  expect_chunk(groups[1].sequences[0].chunks[0], 2, 0, 25);
  expect_chunk(groups[1].sequences[0].chunks[1], 3, 25, 30);
  ASSERT_EQ(groups[1].sequences[1].chunks.size(), 1u);
  expect_chunk(groups[1].sequences[1].chunks[0], 3, 0, 20);
  EXPECT_EQ(groups[1].sequences[1].padded_length_tokens, 20);  // never padded
}

TEST(StaticUlysses, OddPackSplitsDifferByOne) {
  // Two ranks, so d = 2 is one group and {200, 7} one pack (on four ranks the two
  // sequences would go to the two groups).
  const FakeCostModel cost(tiny_cluster(1, 2));
  const Plan plan = plan_with("static-ulysses", cost, {200, 7}, 2);
  ASSERT_EQ(plan.micro_batches.size(), 1u);
  ASSERT_EQ(plan.micro_batches[0].groups.size(), 1u);
  const auto& group = plan.micro_batches[0].groups.at(0);
  // 207 tokens: member 0 holds 104, member 1 holds 103.
  expect_chunk(group.sequences[0].chunks[0], 0, 0, 104);
  expect_chunk(group.sequences[0].chunks[1], 1, 104, 200);
}

TEST(BatchAdaptive, PicksTheFastestFeasibleDegree) {
  const FakeCostModel cost;
  for (const std::vector<Tokens>& lengths :
       {std::vector<Tokens>{200, 30, 20}, std::vector<Tokens>{100, 90, 80, 3},
        std::vector<Tokens>{190, 190, 190, 190, 190, 190}}) {
    const Plan chosen = plan_with("batch-adaptive", cost, lengths);
    const Batch batch = make_batch(lengths, 3);
    int best_degree = 0;
    Seconds best_s = 0;
    for (int degree : allowed_degrees(cost, Scheme::ulysses)) {
      if (!fits_group(batch.max_length_tokens(), cost, Scheme::ulysses, degree)) continue;
      PlannerOptions options;
      options.degree = degree;
      const Seconds time_s =
          estimate_plan_time_s(find_planner("static-ulysses").plan(batch, cost, options, SimulatorEvaluator(cost)),
              cost);
      if (best_degree == 0 || time_s < best_s) {
        best_degree = degree;
        best_s = time_s;
      }
    }
    PlannerOptions options;
    options.degree = best_degree;
    Plan expected =
        find_planner("static-ulysses").plan(batch, cost, options, SimulatorEvaluator(cost));
    expected.strategy = "batch-adaptive";
    EXPECT_EQ(plan_to_string(chosen), plan_to_string(expected));
  }
}

TEST(BatchAdaptive, DegreeOverrideActsLikeStaticUlysses) {
  const FakeCostModel cost;
  Plan plan = plan_with("batch-adaptive", cost, {50, 60}, 2);
  EXPECT_EQ(plan.micro_batches[0].groups[0].ranks.size(), 2u);
  EXPECT_THROW(find_planner("batch-adaptive").plan(make_batch({300}), cost, {}, SimulatorEvaluator(cost)), PlanningError);
}

TEST(HybridDp, HandCheckedPlacement) {
  const FakeCostModel cost;
  // Degrees: 350 -> 4 (padded 352), 150 -> 2 (152), the rest local (ring budget 100/rank).
  // LPT on s^2/d: ring 350 on 0-3, ring 150 on 0-1, 90 -> rank 2, 80 -> 3, 60 -> 3, 50 -> 2.
  // Micro-batches by memory: m0 {350}; m1 {150, 90, 80}; m2 {50, 60}.
  const Plan plan = plan_with("hybrid-dp", cost, {350, 150, 90, 80, 60, 50});
  ASSERT_EQ(plan.micro_batches.size(), 3u);
  const auto& m0 = plan.micro_batches[0].groups;
  ASSERT_EQ(m0.size(), 1u);
  EXPECT_EQ(m0[0].scheme, Scheme::ring);
  EXPECT_EQ(m0[0].ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(m0[0].sequences[0].padded_length_tokens, 352);
  const auto& m1 = plan.micro_batches[1].groups;
  ASSERT_EQ(m1.size(), 3u);
  EXPECT_EQ(m1[0].scheme, Scheme::ring);
  EXPECT_EQ(m1[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(ids_of(m1[0]), std::vector<std::int64_t>{1});
  EXPECT_EQ(m1[1].scheme, Scheme::local);
  EXPECT_EQ(m1[1].ranks, std::vector<int>{2});
  EXPECT_EQ(ids_of(m1[1]), std::vector<std::int64_t>{2});
  EXPECT_EQ(m1[2].ranks, std::vector<int>{3});
  EXPECT_EQ(ids_of(m1[2]), std::vector<std::int64_t>{3});
  const auto& m2 = plan.micro_batches[2].groups;
  ASSERT_EQ(m2.size(), 2u);
  EXPECT_EQ(m2[0].ranks, std::vector<int>{2});
  EXPECT_EQ(ids_of(m2[0]), std::vector<std::int64_t>{5});
  EXPECT_EQ(ids_of(m2[1]), std::vector<std::int64_t>{4});
  EXPECT_TRUE(plan.micro_batches[1].queues.empty());
}

TEST(HybridDp, ManyLocalsSpreadAndRingsFirst) {
  const FakeCostModel cost;
  const Plan plan = plan_with("hybrid-dp", cost, {30, 30, 30, 30, 180, 30});
  // 180 -> ring of 2 on ranks 0-1 (largest proxy first); loads 16200, 16200, 0, 0, so the
  // 30s (900 each) go to ranks 2, 3, 2, 3, 2; all fit micro-batch 0.
  const auto& m0 = plan.micro_batches.at(0).groups;
  EXPECT_EQ(m0.at(0).scheme, Scheme::ring);
  EXPECT_EQ(m0.at(0).ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(m0.at(1).ranks, std::vector<int>{2});
  EXPECT_EQ(ids_of(m0.at(1)), (std::vector<std::int64_t>{0, 2, 5}));
  EXPECT_EQ(ids_of(m0.at(2)), (std::vector<std::int64_t>{1, 3}));
}

TEST(HybridDp, TooLongForTheWholeClusterIsNamed) {
  const FakeCostModel cost;
  try {
    find_planner("hybrid-dp").plan(make_batch({10, 20, 401}), cost, {}, SimulatorEvaluator(cost));
    FAIL() << "expected PlanningError";
  } catch (const PlanningError& error) {
    EXPECT_EQ(std::string(error.what()),
              "hybrid-dp cannot run sequence 2 (401 tokens): the largest ring (4 of the 4 ranks) "
              "holds 400 tokens; lower --max-context or add --nodes");
  }
}

TEST(Estimate, LocalGroupHandComputed) {
  const FakeCostModel cost;
  const Plan plan = plan_with("packed-dp", cost, {10});
  // 55 causal pairs * 1 ns * (1 + 2.5) + 10 tokens * 1 us * (1 + 2) + gradient sync.
  EXPECT_NEAR(estimate_plan_time_s(plan, cost), 192.5e-9 + 30e-6 + cost.gradient_sync_time_s(),
              1e-15);
}

TEST(Planners, GroupsWiderThanTheirTokensStayValid) {
  const FakeCostModel cost;
  const Plan ulysses = plan_with("static-ulysses", cost, {1}, 2);  // member 1 holds nothing
  EXPECT_EQ(ulysses.micro_batches[0].groups[0].sequences[0].chunks.size(), 1u);
  const Plan ring = plan_with("static-cp", cost, {1}, 4);  // padded to 8, one token per chunk
  EXPECT_EQ(ring.micro_batches[0].groups[0].sequences[0].padded_length_tokens, 8);
  const Plan ignored = plan_with("hybrid-dp", cost, {5, 6}, 4);  // per-sequence degrees
  EXPECT_EQ(ignored.micro_batches[0].groups[0].scheme, Scheme::local);
}

TEST(Planners, RejectEmptyBatches) {
  const FakeCostModel cost;
  Batch empty;
  for (const auto& planner : planners()) {
    EXPECT_THROW(planner->plan(empty, cost, {}, SimulatorEvaluator(cost)), InputError) << planner->name();
  }
}

}  // namespace
}  // namespace ballast::strategies
