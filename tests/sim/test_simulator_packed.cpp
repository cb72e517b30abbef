// The simulator on a cluster whose attention kernel tiles packed spans
// (Cluster::attention_tiles_packed, ballast's CPU runtime): every attention task is the
// cost of the calls the runtime makes (plan_schemes.cpp), written out here by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ballast/simulator.hpp"
#include "sim/sim_fixtures.hpp"

namespace ballast {
namespace {

using Ranges = std::vector<DocumentRange>;

/// Durations of `rank`'s compute events named `name`, in start order.
std::vector<Seconds> durations(const SimulationReport& report, int rank, const std::string& name) {
  std::vector<std::pair<Seconds, Seconds>> events;
  for (const TraceEvent& event : report.trace) {
    if (event.rank == rank && event.name == name && event.lane == "compute") {
      events.emplace_back(event.start_s, event.duration_s);
    }
  }
  std::sort(events.begin(), events.end());
  std::vector<Seconds> out;
  for (const auto& event : events) out.push_back(event.second);
  return out;
}

/// Trace times are differences of task ends: equal up to rounding.
void expect_near(const std::vector<Seconds>& actual, const std::vector<Seconds>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-12 * expected[i]) << i;
  }
}

Cluster packed_cluster() {
  Cluster cluster = cluster_preset("h100");
  cluster.nodes = 1;
  cluster.attention_tile_tokens = 64;
  cluster.attention_tiles_packed = true;
  return cluster;
}

/// One group of each scheme. The first local group's sequence ids 0, 9, 5 are not in
/// group order: the runtime numbers a group's documents by their index in it (0, 1, 2).
/// The ring's sequence is padded (37 tokens to 40).
Plan one_group_per_scheme(const CostModel& cost) {
  Plan plan = testing::empty_plan(cost, {60, 37, 90, 50, 70, 100, 30, 20, 12, 8});
  MicroBatch micro_batch;
  micro_batch.groups.push_back(testing::make_group(
      Scheme::local, {0}, {{0, {{0, 0, 60}}}, {9, {{0, 0, 8}}}, {5, {{0, 0, 100}}}}));
  micro_batch.groups.push_back(testing::make_group(
      Scheme::ring, {1, 2}, {{1, {{1, 0, 10}, {2, 10, 20}, {2, 20, 30}, {1, 30, 40}}}}));
  micro_batch.groups.push_back(testing::make_group(
      Scheme::ulysses, {3, 4}, {{2, {{3, 0, 45}, {4, 45, 90}}}, {3, {{3, 0, 20}, {4, 20, 50}}}}));
  micro_batch.groups.push_back(
      testing::make_group(Scheme::all_gather, {5, 6},
                          {{4, {{5, 0, 35}, {6, 35, 70}}}, {6, {{5, 0, 15}, {6, 15, 30}}}}));
  micro_batch.groups.push_back(
      testing::make_group(Scheme::local, {7}, {{8, {{7, 0, 12}}}, {7, {{7, 0, 20}}}}));
  plan.micro_batches.push_back(micro_batch);
  return plan;
}

TEST(SimulatorPacked, AttentionTasksAreTheRuntimesCalls) {
  const AnalyticalCostModel cost(packed_cluster(), model_preset("llama-7b"));
  const SimulationReport report =
      simulate(one_group_per_scheme(cost), cost, {.record_trace = true});
  EXPECT_LE(report.lower_bound.time_s, report.step_time_s);
  const auto call = [&](const Ranges& queries, const Ranges& keys, int head_split, Pass pass) {
    return cost.attention_call_time_s({queries, keys}, head_split, pass);
  };
  for (Pass pass : {Pass::forward, Pass::backward}) {
    const std::string p = pass == Pass::forward ? "fwd" : "bwd";
    SCOPED_TRACE(p);
    // Local: the rank's sequences in group order, one call. Named by sequence id, tile 2
    // (id 5) would meet tile 0 (ids 0 and 9) and be computed: the labels matter.
    const Ranges local = {{0, 0, 60}, {1, 0, 8}, {2, 0, 100}};
    const Ranges by_sequence_id = {{0, 0, 60}, {9, 0, 8}, {5, 0, 100}};
    expect_near(durations(report, 0, "attention " + p + " local"),
                std::vector<Seconds>{call(local, local, 1, pass)});
    EXPECT_LT(call(local, local, 1, pass), call(by_sequence_id, by_sequence_id, 1, pass));
    // Ring: own chunks against the visiting owner's, padding (37..40) dropped.
    const Ranges rank1 = {{0, 0, 10}, {0, 30, 37}}, rank2 = {{0, 10, 20}, {0, 20, 30}};
    expect_near(durations(report, 1, "attention " + p + " ring g2 step 0"),
                std::vector<Seconds>{call(rank1, rank1, 1, pass)});
    expect_near(durations(report, 1, "attention " + p + " ring g2 step 1"),
                std::vector<Seconds>{call(rank1, rank2, 1, pass)});
    expect_near(durations(report, 2, "attention " + p + " ring g2 step 1"),
                std::vector<Seconds>{call(rank2, rank1, 1, pass)});
    // Ulysses: all the group's tokens in member order, half the heads on each member.
    const Ranges all = {{0, 0, 45}, {1, 0, 20}, {0, 45, 90}, {1, 20, 50}};
    for (int rank : {3, 4}) {
      expect_near(durations(report, rank, "attention " + p + " ulysses g2"),
                  std::vector<Seconds>{call(all, all, 2, pass)});
    }
    // All-gather: own tokens against each member's, one call per member.
    const Ranges rank5 = {{0, 0, 35}, {1, 0, 15}}, rank6 = {{0, 35, 70}, {1, 15, 30}};
    expect_near(durations(report, 6, "attention " + p + " all-gather g2"),
                std::vector<Seconds>{call(rank6, rank5, 1, pass) + call(rank6, rank6, 1, pass)});
  }
}

TEST(SimulatorPacked, PerBlockClusterIsUnchanged) {
  // The same plan on a per-block cluster prices whole (padded) documents and chunk blocks.
  Cluster cluster = packed_cluster();
  cluster.attention_tiles_packed = false;
  const AnalyticalCostModel cost(cluster, model_preset("llama-7b"));
  const SimulationReport report =
      simulate(one_group_per_scheme(cost), cost, {.record_trace = true});
  const std::vector<AttentionBlock> local = {whole_document(60), whole_document(8),
                                             whole_document(100)};
  expect_near(durations(report, 0, "attention fwd local"),
              std::vector<Seconds>{cost.attention_time_s(local, 1, Pass::forward)});
  const std::vector<AttentionBlock> ulysses = {whole_document(90), whole_document(50)};
  expect_near(durations(report, 3, "attention fwd ulysses g2"),
              std::vector<Seconds>{cost.attention_time_s(ulysses, 2, Pass::forward)});
  const std::vector<AttentionBlock> ring_step = {{0, 10, 0, 10}, {30, 40, 0, 10},
                                                 {30, 40, 30, 40}};
  expect_near(durations(report, 1, "attention fwd ring g2 step 0"),
              std::vector<Seconds>{cost.attention_time_s(ring_step, 1, Pass::forward)});
}

}  // namespace
}  // namespace ballast
