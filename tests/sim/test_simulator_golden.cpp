// Golden timelines: small hand-made plans under FakeCostModel (sim_fixtures.hpp) whose
// step time and per-rank busy / exposed / idle times are computed by hand in comments.
// Units in comments are ms; f = qkv_flops_fraction() = 1/4, so a linear pass over n tokens
// splits into "qkv" f * n * 0.01 ms and "out+mlp" (1 - f) * n * 0.01 ms (x2 backward).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ballast/simulator.hpp"
#include "sim/sim_fixtures.hpp"

namespace ballast {
namespace {

using testing::fake_cluster;
using testing::fake_model;
using testing::FakeCostModel;

constexpr double kTolerance_s = 1e-12;
constexpr double ms(double milliseconds) { return milliseconds * 1e-3; }

void expect_rank(const SimulationReport& report, int rank, double busy_ms, double exposed_ms,
                 double idle_ms) {
  SCOPED_TRACE("rank " + std::to_string(rank));
  const RankTimes& times = report.ranks.at(static_cast<std::size_t>(rank));
  EXPECT_NEAR(times.busy_s, ms(busy_ms), kTolerance_s);
  EXPECT_NEAR(times.exposed_communication_s, ms(exposed_ms), kTolerance_s);
  EXPECT_NEAR(times.idle_s, ms(idle_ms), kTolerance_s);
}

/// Start of the first trace event of `rank` whose name is `name`; -1 if none.
double start_of(const SimulationReport& report, int rank, const std::string& name,
                const std::string& lane = "") {
  for (const TraceEvent& event : report.trace) {
    if (event.rank == rank && event.name == name && (lane.empty() || event.lane == lane)) {
      return event.start_s;
    }
  }
  return -1;
}

/// The goldens price the gradient sync at the end (GradientSync::end) unless they test the
/// overlapped buckets: one 5 ms collective after every rank is done.
SimulationReport run(const Plan& plan, const CostModel& cost,
                     GradientSync gradient_sync = GradientSync::end) {
  const SimulationReport report =
      simulate(plan, cost, {.record_trace = true, .gradient_sync = gradient_sync});
  // The lower bound holds on every golden plan.
  EXPECT_LE(report.lower_bound.time_s, report.step_time_s + kTolerance_s);
  return report;
}

/// [start, end) in ms of `rank`'s trace events named `name` on `lane`, by start.
std::vector<std::pair<double, double>> intervals_ms(const SimulationReport& report, int rank,
                                                    const std::string& name,
                                                    const std::string& lane) {
  std::vector<std::pair<double, double>> out;
  for (const TraceEvent& event : report.trace) {
    if (event.rank == rank && event.name == name && event.lane == lane) {
      out.emplace_back(event.start_s * 1e3, (event.start_s + event.duration_s) * 1e3);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

void expect_intervals(const std::vector<std::pair<double, double>>& actual_ms,
                      const std::vector<std::pair<double, double>>& expected_ms) {
  ASSERT_EQ(actual_ms.size(), expected_ms.size());
  for (std::size_t i = 0; i < expected_ms.size(); ++i) {
    SCOPED_TRACE("interval " + std::to_string(i));
    EXPECT_NEAR(actual_ms[i].first, expected_ms[i].first, 1e-9);
    EXPECT_NEAR(actual_ms[i].second, expected_ms[i].second, 1e-9);
  }
}

class SimulatorGolden : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_DOUBLE_EQ(fake_model().qkv_flops_fraction(), 0.25); }
};

TEST_F(SimulatorGolden, TwoLocalGroupsWithUnequalWorkShowImbalanceAndIdle) {
  FakeCostModel cost(fake_cluster(1, 2, 1), fake_model());
  Plan plan = testing::empty_plan(cost, {100, 50});
  plan.micro_batches.push_back(
      {{testing::local_group(0, 0, 100), testing::local_group(1, 1, 50)}, {}, {}});
  const SimulationReport report = run(plan, cost);
  // rank 0: linear 100 tokens 1 + 2, attention 5050 pairs 5.05 + 10.1 -> busy 18.15
  // rank 1: linear 50 tokens 0.5 + 1, attention 1275 pairs 1.275 + 2.55 -> busy 5.325
  // the gradient sync (5) starts when rank 0 is done: step = 18.15 + 5 = 23.15
  EXPECT_NEAR(report.step_time_s, ms(23.15), kTolerance_s);
  expect_rank(report, 0, 18.15, 5, 0);
  expect_rank(report, 1, 5.325, 5, 23.15 - 5.325 - 5);
  EXPECT_NEAR(report.imbalance, 18.15 / ((18.15 + 5.325) / 2), 1e-12);
  EXPECT_NEAR(report.exposed_communication_fraction, 10 / (2 * 23.15), 1e-12);
  EXPECT_EQ(report.micro_batches, 1);
  EXPECT_NEAR(report.gradient_sync_s, ms(5), kTolerance_s);
  EXPECT_EQ(report.strategy, "hand");
}

/// One sequence of `length` zigzag-split over ring [0, 1]: rank 0 holds quarters 0 and 3.
Plan two_rank_ring(const CostModel& cost, Tokens length) {
  const Tokens q = length / 4;
  Plan plan = testing::empty_plan(cost, {length});
  plan.micro_batches.push_back(
      {{testing::make_group(
           Scheme::ring, {0, 1},
           {{0, {{0, 0, q}, {1, q, 2 * q}, {1, 2 * q, 3 * q}, {0, 3 * q, 4 * q}}}})},
       {},
       {}});
  return plan;
}

// The ring goldens follow TransformerEngine's schedule (schemes.cpp add_ring): the next KV
// block travels during a step's compute; backward, the dKV of step j leaves after step j's
// compute and during step j + 1's, and a last hop takes each dKV home.
TEST_F(SimulatorGolden, RingHidesForwardCommunicationBehindLongSteps) {
  FakeCostModel cost(fake_cluster(1, 2, 1), fake_model());
  const SimulationReport report = run(two_rank_ring(cost, 400), cost);
  // Quarters A=[0,100) D=[300,400) on rank 0, B, C on rank 1. Step 0 (own KV):
  // A.A 5050 + D.A 10000 + D.D 5050 = 20100 pairs (rank 1 alike); step 1: D.B + D.C (rank 1:
  // B.A + C.A) = 20000 pairs. Linear 200 tokens per rank: 2 fwd, 4 bwd.
  // fwd: qkv 0.5; sends [0.5, 2.5] hidden under step 0 [0.5, 20.6]; step 1 [20.6, 40.6];
  //      out 1.5 -> 42.1
  // bwd: out 3 -> 45.1; kv send [45.1, 47.1] under step 0 [45.1, 85.3]; dkv of step 0
  //      [85.3, 87.3] under step 1 [85.3, 125.3]; dkv home [125.3, 127.3] exposed;
  //      qkv 1 -> 128.3; sync -> 133.3
  EXPECT_NEAR(report.step_time_s, ms(133.3), kTolerance_s);
  // busy 6 + 40.1 + 80.2 = 126.3; exposed 2 (dkv home) + 5 (sync); idle 0
  expect_rank(report, 0, 126.3, 7, 0);
  expect_rank(report, 1, 126.3, 7, 0);
  EXPECT_NEAR(report.ranks[0].communication_s, ms(13), kTolerance_s);
  EXPECT_NEAR(start_of(report, 1, "ring kv fwd g2 step 0", "recv"), ms(0.5), kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "attention fwd ring g2 step 1"), ms(20.6), kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "ring kv bwd g2 step 0", "send"), ms(45.1), kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "ring dkv bwd g2 step 0", "send"), ms(85.3), kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "attention bwd ring g2 step 1"), ms(85.3), kTolerance_s);
  EXPECT_NEAR(start_of(report, 1, "ring dkv home bwd g2", "recv"), ms(125.3), kTolerance_s);
  EXPECT_NEAR(report.gradient_sync_exposed_s, ms(5), kTolerance_s);
}

TEST_F(SimulatorGolden, RingExposesCommunicationWhenStepsAreShort) {
  FakeCostModel cost(fake_cluster(1, 2, 1), fake_model());
  const SimulationReport report = run(two_rank_ring(cost, 40), cost);
  // Quarters of 10 tokens: step 0 55 + 100 + 55 = 210 pairs (0.21), step 1 200 pairs (0.2).
  // Linear 20 tokens: 0.2 fwd, 0.4 bwd.
  // fwd: qkv 0.05; send [0.05, 2.05]; step 0 [0.05, 0.26]; step 1 waits for the block:
  //      [2.05, 2.25]; out 0.15 -> 2.4 (exposed 2.05 - 0.26 = 1.79)
  // bwd: out 0.3 -> 2.7; kv send from 2.7 alone until step 0 ends (0.42 -> 3.12), when
  //      the dkv of step 0 joins it on the same link (same peer): 1.58 left at half speed
  //      -> 6.28; the dkv then has 0.42 left at full speed -> 6.7. Step 1 waits for the kv
  //      block: [6.28, 6.68]; dkv home waits for the incoming dkv and its own send:
  //      [6.7, 8.7]; qkv 0.1 -> 8.8; sync -> 13.8
  EXPECT_NEAR(report.step_time_s, ms(13.8), kTolerance_s);
  // busy 0.6 + 0.41 + 0.82 = 1.83; communication [0.05, 2.05] + [2.7, 8.7] + 5 = 13,
  // under compute [0.05, 0.26], [2.7, 3.12], [6.28, 6.68] = 1.03 -> exposed 11.97; idle 0
  expect_rank(report, 0, 1.83, 11.97, 0);
  expect_rank(report, 1, 1.83, 11.97, 0);
  EXPECT_NEAR(start_of(report, 0, "attention fwd ring g2 step 1"), ms(2.05), kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "attention bwd ring g2 step 1"), ms(6.28), kTolerance_s);
  expect_intervals(intervals_ms(report, 0, "ring kv bwd g2 step 0", "send"), {{2.7, 6.28}});
  expect_intervals(intervals_ms(report, 0, "ring dkv bwd g2 step 0", "send"), {{3.12, 6.7}});
  expect_intervals(intervals_ms(report, 0, "ring dkv home bwd g2", "send"), {{6.7, 8.7}});
}

TEST_F(SimulatorGolden, FourRankRingFollowsTransformerEngineSchedule) {
  FakeCostModel cost(fake_cluster(1, 4, 1), fake_model());
  // One 400-token document in contiguous quarters: rank i holds [100 i, 100 i + 100). At
  // step j rank i attends to the quarter of rank i - j: its own (5050 pairs, 5.05 fwd /
  // 10.1 bwd) at step 0, a full earlier quarter (10000 pairs, 10 / 20) when i - j >= 0,
  // nothing (a zero-time step) when the keys lie in its future. Linear 100 tokens per rank:
  // qkv 0.25 / out 0.75 fwd, out 1.5 / qkv 0.5 bwd. Transfers 2 each.
  Plan plan = testing::empty_plan(cost, {400});
  plan.micro_batches.push_back(
      {{testing::make_group(
           Scheme::ring, {0, 1, 2, 3},
           {{0, {{0, 0, 100}, {1, 100, 200}, {2, 200, 300}, {3, 300, 400}}}})},
       {},
       {}});
  const SimulationReport report = run(plan, cost);
  // fwd: kv sends step 0 [0.25, 2.25], step 1 [2.25, 4.25], step 2 [4.25, 6.25] on every
  //      rank. Step 0 [0.25, 5.3]; then rank 0 waits only for blocks (6.25) -> out 7.0;
  //      rank 1 step 1 [5.3, 15.3] -> 16.05; rank 2 steps 1, 2 -> 25.3 -> 26.05;
  //      rank 3 steps 1..3 -> 35.3 -> 36.05
  // bwd (out 1.5): ranks enter the ring at 8.5, 17.55, 27.55, 37.55.
  //   kv step 0 at entry (+2); step 0 compute 10.1: r0 [8.5, 18.6], r1 [17.55, 27.65],
  //     r2 [27.55, 37.65], r3 [37.55, 47.65]; dkv of step 0 right after it (+2).
  //   kv step 1 once held and the previous send is done: r0 [39.55, 41.55] (block from r3),
  //     r1 [19.55, 21.55], r2 [29.55, 31.55], r3 [39.55, 41.55]
  //   step 1 (r0 empty): r0 at 39.55, r1 [27.65, 47.65], r2 [37.65, 57.65],
  //     r3 [47.65, 67.65]; its dkv waits for the incoming one: r0 [49.65, 51.65],
  //     r1 [47.65, 49.65], r2 [57.65, 59.65], r3 [67.65, 69.65]
  //   kv step 2: r0, r1, r3 [41.55, 43.55], r2 [31.55, 33.55]
  //   step 2 (r2, r3 only): r2 [57.65, 77.65], r3 [67.65, 87.65]; dkv: r0 [69.65, 71.65],
  //     r1 [51.65, 53.65], r2 [77.65, 79.65], r3 [87.65, 89.65]
  //   step 3 (r3 only): [87.65, 107.65]; dkv home: r0 [89.65, 91.65], r1 [71.65, 73.65],
  //     r2 [79.65, 81.65], r3 [107.65, 109.65]
  //   each rank ends when its own dkv is home: r0 109.65, r1 91.65, r2 77.65, r3 107.65;
  //   qkv 0.5 -> r0 110.15 (the last); sync -> 115.15
  EXPECT_NEAR(report.step_time_s, ms(115.15), kTolerance_s);
  EXPECT_NEAR(start_of(report, 1, "attention fwd ring g4 step 1"), ms(5.3), kTolerance_s);
  EXPECT_NEAR(start_of(report, 3, "attention fwd ring g4 step 3"), ms(25.3), kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "ring kv bwd g4 step 1", "send"), ms(39.55), kTolerance_s);
  EXPECT_NEAR(start_of(report, 1, "ring kv bwd g4 step 1", "send"), ms(19.55), kTolerance_s);
  EXPECT_NEAR(start_of(report, 2, "attention bwd ring g4 step 1"), ms(37.65), kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "ring dkv bwd g4 step 1", "send"), ms(49.65), kTolerance_s);
  EXPECT_NEAR(start_of(report, 2, "ring kv bwd g4 step 2", "send"), ms(31.55), kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "ring dkv bwd g4 step 2", "send"), ms(69.65), kTolerance_s);
  EXPECT_NEAR(start_of(report, 3, "attention bwd ring g4 step 3"), ms(87.65), kTolerance_s);
  EXPECT_NEAR(start_of(report, 1, "ring dkv home bwd g4", "send"), ms(71.65), kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "ring dkv home bwd g4", "recv"), ms(107.65), kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "linear qkv bwd"), ms(109.65), kTolerance_s);
  EXPECT_NEAR(start_of(report, 2, "linear qkv bwd"), ms(77.65), kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "gradient sync", "collective"), ms(110.15), kTolerance_s);
}

TEST_F(SimulatorGolden, RingMemberForwardsBlocksOnlyAfterReachingTheRing) {
  FakeCostModel cost(fake_cluster(1, 3, 1), fake_model());
  // Ring [0, 1, 2] over sequence 0 (60 tokens, zigzag chunks of 10: rank i holds i, 5-i);
  // rank 1 first runs a local group over sequence 1 (100 tokens).
  Plan plan = testing::empty_plan(cost, {60, 100});
  std::vector<Chunk> chunks;
  for (int c = 0; c < 6; ++c) chunks.push_back({c < 3 ? c : 5 - c, 10 * c, 10 * c + 10});
  MicroBatch micro_batch{{testing::make_group(Scheme::ring, {0, 1, 2}, {{0, chunks}}),
                          testing::local_group(1, 1, 100)},
                         {{0}, {1, 0}, {0}},
                         {}};
  plan.micro_batches.push_back(micro_batch);
  const SimulationReport report = run(plan, cost);
  // Rank 1 reaches the ring at 0.3 (linear qkv, 120 tokens) + 5.05 (local attention, 5050
  // pairs) = 5.35. Its step-0 send (own KV) holds its NVLink port [5.35, 7.35]; the block
  // it received from rank 0 at 2.05 is forwarded only once rank 1 is in the ring, after
  // its own send: [7.35, 9.35] (an eager forward at 2.05 would need a posted receive
  // buffer the rank has not set up yet).
  EXPECT_NEAR(start_of(report, 1, "ring kv fwd g3 step 0", "send"), ms(5.35), kTolerance_s);
  EXPECT_NEAR(start_of(report, 1, "ring kv fwd g3 step 1", "send"), ms(7.35), kTolerance_s);
  EXPECT_NEAR(start_of(report, 2, "ring kv fwd g3 step 1", "recv"), ms(7.35), kTolerance_s);
}

TEST_F(SimulatorGolden, UlyssesGroupRunsTwoAllToAllsPerPass) {
  FakeCostModel cost(fake_cluster(1, 2, 1), fake_model());
  Plan plan = testing::empty_plan(cost, {100, 20});
  plan.micro_batches.push_back(
      {{testing::make_group(Scheme::ulysses, {0, 1},
                            {{0, {{0, 0, 50}, {1, 50, 100}}}, {1, {{0, 0, 20}}}})},
       {},
       {}});
  const SimulationReport report = run(plan, cost);
  // rank 0 holds 70 tokens (linear 0.7 fwd, 1.4 bwd), rank 1 50 (0.5, 1.0). Attention on
  // both: (5050 + 210) pairs / 2 heads-split = 2.63 fwd, 5.26 bwd.
  // fwd: a2a qkv starts when rank 0 is there (0.175): [0.175, 3.175]; attention -> 5.805;
  //      a2a out [5.805, 8.805]; out: rank 0 0.525 -> 9.33, rank 1 0.375 -> 9.18
  // bwd: out rank 0 1.05 -> 10.38 (rank 1 0.75 -> 9.93); a2a dout [10.38, 13.38];
  //      attention 5.26 -> 18.64; a2a dqkv [18.64, 21.64]; qkv rank 0 0.35 -> 21.99
  //      (rank 1 0.25 -> 21.89); sync [21.99, 26.99]
  EXPECT_NEAR(report.step_time_s, ms(26.99), kTolerance_s);
  // rank 0: busy 2.1 + 7.89 = 9.99, exposed 4 x 3 + 5 = 17, idle 0
  // rank 1: busy 1.5 + 7.89 = 9.39, exposed 17, idle 26.99 - 9.39 - 17 = 0.6
  expect_rank(report, 0, 9.99, 17, 0);
  expect_rank(report, 1, 9.39, 17, 0.6);
  EXPECT_NEAR(start_of(report, 1, "all-to-all qkv fwd"), ms(0.175), kTolerance_s);
}

TEST_F(SimulatorGolden, UspRunsStageAllToAllsAroundRingsOfStagePeers) {
  // 2 nodes x 2 GPUs (one NIC per GPU), one 400-token document, u = 2, r = 2: stage 0 =
  // ranks {0, 1} holds [0, 200) (rank 0 [0, 100), rank 1 [100, 200)), stage 1 = {2, 3}
  // [200, 400). Rings of stage peers: {0, 2} and {1, 3}, each member with 1 of the 2
  // heads (head split 2). Linear per rank (100 tokens): qkv 0.25 / out 0.75 fwd, out 1.5 /
  // qkv 0.5 bwd. Attention of a stage against itself 20100 pairs / 2 = 10.05 fwd, 20.1 bwd;
  // stage 1 against stage 0 40000 / 2 = 20 fwd, 40 bwd; stage 0 against stage 1 nothing.
  FakeCostModel cost(fake_cluster(2, 2, 2), fake_model());
  Plan plan = testing::empty_plan(cost, {400});
  AttentionGroup group = testing::make_group(
      Scheme::usp, {0, 1, 2, 3}, {{0, {{0, 0, 100}, {1, 100, 200}, {2, 200, 300}, {3, 300, 400}}}});
  group.ulysses_degree = 2;
  plan.micro_batches.push_back({{group}, {}, {}});
  const SimulationReport report = run(plan, cost);
  // fwd: stage a2a qkv [0.25, 3.25] (both stages at once); ring kv step 0 [3.25, 5.25];
  //      step 0 [3.25, 13.3]; stage 0's step 1 is empty (13.3), stage 1's [13.3, 33.3];
  //      a2a out: stage 0 [13.3, 16.3] -> out 17.05; stage 1 [33.3, 36.3] -> 37.05.
  // bwd: out 1.5 -> stage 0 18.55, stage 1 38.55; a2a dout -> 21.55, 41.55.
  //   ring {0, 2}: rank 0 kv [21.55, 23.55], step 0 [21.55, 41.65], dkv [41.65, 43.65];
  //   rank 2 kv [41.55, 43.55], step 0 [41.55, 61.65], dkv [61.65, 63.65];
  //   step 1: rank 0 empty at 43.55 (its block's kv), dkv home once rank 2's dkv is in:
  //   [63.65, 65.65]; rank 2 [61.65, 101.65], dkv home [101.65, 103.65].
  //   a2a dqkv: stage 0 at 103.65 (rank 0's own dkv home) -> 106.65 -> qkv 107.15; stage 1
  //   [101.65, 104.65] -> 105.15; sync 5 -> 112.15.
  EXPECT_NEAR(report.step_time_s, ms(112.15), kTolerance_s);
  EXPECT_STREQ(group_category(group, cost.cluster()), "usp inter-node");
  EXPECT_NEAR(start_of(report, 2, "usp all-to-all qkv fwd"), ms(0.25), kTolerance_s);
  EXPECT_NEAR(start_of(report, 3, "attention fwd usp u2 r2 step 1"), ms(13.3), kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "usp all-to-all out fwd"), ms(13.3), kTolerance_s);
  EXPECT_NEAR(start_of(report, 2, "usp all-to-all out fwd"), ms(33.3), kTolerance_s);
  EXPECT_NEAR(start_of(report, 1, "usp kv bwd u2 r2 step 0", "send"), ms(21.55), kTolerance_s);
  EXPECT_NEAR(start_of(report, 2, "attention bwd usp u2 r2 step 1"), ms(61.65), kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "usp dkv home bwd u2 r2", "send"), ms(63.65), kTolerance_s);
  EXPECT_NEAR(start_of(report, 3, "usp dkv home bwd u2 r2", "send"), ms(101.65), kTolerance_s);
  EXPECT_NEAR(start_of(report, 1, "usp all-to-all dqkv bwd"), ms(103.65), kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "gradient sync", "collective"), ms(107.15), kTolerance_s);
  // Bytes: QKV 36 B and O 12 B per token (hidden 6, 2 KV heads of 3, 2 B): each stage's
  // all-to-all in both passes carries {100, 100} tokens' worth; the lower bound's USP floor
  // asks once for the same (ceil(400 / 4) tokens per member), hence 4 + 1. A ring block is
  // a stage's K, V of the member's one KV head: 12 B per token.
  const auto calls_with = [&](const std::vector<Bytes>& bytes) {
    return std::count(cost.all_to_all_bytes.begin(), cost.all_to_all_bytes.end(), bytes);
  };
  EXPECT_EQ(calls_with({3600, 3600}), 5);
  EXPECT_EQ(calls_with({1200, 1200}), 5);
  EXPECT_EQ(usp_kv_bytes_per_token(cost.model(), 1, 2), 12);
}

TEST_F(SimulatorGolden, UlyssesBeyondTheKvHeadsSendsEachKvHeadToItsReplicas) {
  // 4 heads, 2 KV heads, head dim 2, 2 bytes per element: per token Q 16 B, K + V 16 B,
  // QKV 32 B, output 16 B. A Ulysses group of 4 gives each member 1 query head, which
  // reads KV head m / 2: KV head 0 is held by members 0 and 1, KV head 1 by 2 and 3.
  Model model = fake_model();
  model.hidden = 8;
  model.heads = 4;
  model.kv_heads = 2;
  FakeCostModel cost(fake_cluster(1, 4, 1), model);
  Plan plan = testing::empty_plan(cost, {100});
  plan.micro_batches.push_back(
      {{testing::make_group(Scheme::ulysses, {0, 1, 2, 3},
                            {{0, {{0, 0, 40}, {1, 40, 70}, {2, 70, 90}, {3, 90, 100}}}})},
       {},
       {}});
  run(plan, cost);
  // A member sends every member (itself included) per token of its own: that member's
  // query head, 2 x 2 B = 4 B, and K and V of the KV head it reads, 2 x 4 B = 8 B: 12 B,
  // 4 x 12 = 48 B per token held (32 B without replication, + 16 B for the second copy
  // of K and V). The dQ, dK, dV all-to-all back carries the same; O and dO 16 B.
  EXPECT_EQ(ulysses_qkv_bytes_per_token(model, 1, 4), 48);
  const std::vector<Bytes> qkv = {40 * 48, 30 * 48, 20 * 48, 10 * 48};
  const std::vector<Bytes> hidden = {40 * 16, 30 * 16, 20 * 16, 10 * 16};
  // fwd: qkv in, out back; bwd: dout in, dqkv back (the lower bound's own all-to-all
  // floors ask for equal bytes per member, so they are told apart from the group's).
  const auto calls_with = [&](const std::vector<Bytes>& bytes) {
    return std::count(cost.all_to_all_bytes.begin(), cost.all_to_all_bytes.end(), bytes);
  };
  EXPECT_EQ(calls_with(qkv), 2);
  EXPECT_EQ(calls_with(hidden), 2);
  EXPECT_EQ(calls_with({40 * 32, 30 * 32, 20 * 32, 10 * 32}), 0);  // not unreplicated
  // At degree 2 (= the KV heads) nothing is replicated: 32 B per token.
  cost.all_to_all_bytes.clear();
  plan.micro_batches[0].groups[0] =
      testing::make_group(Scheme::ulysses, {0, 1}, {{0, {{0, 0, 40}, {1, 40, 100}}}});
  run(plan, cost);
  EXPECT_EQ(calls_with({40 * 32, 60 * 32}), 2);
}

TEST_F(SimulatorGolden, AllGatherGroupGathersKvTwiceAndReduceScatters) {
  FakeCostModel cost(fake_cluster(1, 2, 1), fake_model());
  Plan plan = testing::empty_plan(cost, {100});
  plan.micro_batches.push_back(
      {{testing::make_group(Scheme::all_gather, {0, 1},
                            {{0, {{0, 0, 25}, {1, 25, 75}, {0, 75, 100}}}})},
       {},
       {}});
  const SimulationReport report = run(plan, cost);
  // Head-tail chunks, 50 tokens each (linear 0.5 fwd, 1 bwd). Attention rank 0:
  // [0,25)x[0,25) 325 + [75,100)x[0,100) 2200 = 2525 pairs; rank 1: [25,75)x[0,75) 2525.
  // fwd: qkv 0.125; all-gather [0.125, 4.125]; attention 2.525 -> 6.65; out 0.375 -> 7.025
  // bwd: out 0.75 -> 7.775; all-gather [7.775, 11.775]; attention 5.05 -> 16.825;
  //      reduce-scatter [16.825, 20.825]; qkv 0.25 -> 21.075; sync -> 26.075
  EXPECT_NEAR(report.step_time_s, ms(26.075), kTolerance_s);
  // busy 1.5 + 7.575 = 9.075; exposed 4 + 4 + 4 + 5 = 17; idle 0
  expect_rank(report, 0, 9.075, 17, 0);
  expect_rank(report, 1, 9.075, 17, 0);
  EXPECT_NEAR(start_of(report, 0, "reduce-scatter dkv bwd"), ms(16.825), kTolerance_s);
}

TEST_F(SimulatorGolden, MicroBatchesAreNoGlobalBarrier) {
  FakeCostModel cost(fake_cluster(1, 2, 1), fake_model());
  cost.overhead_forward_s = ms(0.1);
  Plan plan = testing::empty_plan(cost, {10, 100, 10});
  plan.micro_batches.push_back(
      {{testing::local_group(0, 0, 10), testing::local_group(1, 1, 100)}, {}, {}});
  plan.micro_batches.push_back({{testing::local_group(0, 2, 10)}, {}, {}});
  const SimulationReport report = run(plan, cost);
  // rank 0, per micro-batch: overhead 0.1 + 0.2, linear 0.1 + 0.2, attention 0.055 + 0.11
  //   = 0.765; it starts micro-batch 1 at 0.765 and ends at 1.53
  // rank 1, micro-batch 0: overhead 0.3, linear 1 + 2, attention 5.05 + 10.1 = 18.45;
  //   micro-batch 1 holds none of its tokens, but every rank pays every micro-batch's
  //   overhead (FlexSP's b1 holds ZeRO-3's collectives over all ranks): 0.1 + 0.2, ends 18.75
  // sync [18.75, 23.75] (a barrier after micro-batch 0 would give 18.45 + 0.765 + 5)
  EXPECT_NEAR(report.step_time_s, ms(23.75), kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "overhead fwd"), 0, kTolerance_s);
  double second_overhead_s = -1;
  std::vector<std::string> rank1_second;
  for (const TraceEvent& event : report.trace) {
    if (event.rank == 0 && event.name == "overhead fwd" && event.micro_batch == 1) {
      second_overhead_s = event.start_s;
    }
    if (event.rank == 1 && event.micro_batch == 1) {
      rank1_second.push_back(event.name);
      if (event.name == "overhead fwd") EXPECT_NEAR(event.start_s, ms(18.45), kTolerance_s);
    }
  }
  EXPECT_NEAR(second_overhead_s, ms(0.765), kTolerance_s);
  EXPECT_EQ(rank1_second, (std::vector<std::string>{"overhead fwd", "overhead bwd"}));
  expect_rank(report, 0, 1.53, 5, 23.75 - 1.53 - 5);
  expect_rank(report, 1, 18.75, 5, 0);
  EXPECT_EQ(report.micro_batches, 2);
}

/// Rings [0, 2] and [1, 3] across two nodes of two GPUs, one sequence of 40 tokens each,
/// halves [0, 20) on the first rank and [20, 40) on the second.
Plan two_cross_node_rings(const CostModel& cost) {
  Plan plan = testing::empty_plan(cost, {40, 40});
  plan.micro_batches.push_back(
      {{testing::make_group(Scheme::ring, {0, 2}, {{0, {{0, 0, 20}, {2, 20, 40}}}}),
        testing::make_group(Scheme::ring, {1, 3}, {{1, {{1, 0, 20}, {3, 20, 40}}}})},
       {},
       {}});
  return plan;
}

TEST_F(SimulatorGolden, TransfersSharingOneNicShareItsBandwidth) {
  FakeCostModel cost(fake_cluster(2, 2, 1), fake_model());  // 2 GPUs per NIC
  const SimulationReport report = run(two_cross_node_rings(cost), cost);
  // Per rank: linear 20 tokens (qkv 0.05 / out 0.15 fwd, out 0.3 / qkv 0.1 bwd). First
  // ring rank: step 0 210 pairs (0.21 fwd, 0.42 bwd), step 1 none; second: 0.21/0.42 and
  // 400 pairs (0.4, 0.8). Node 0's NIC carries 0->2 and 1->3, node 1's 2->0 and 3->1; a
  // transfer alone takes 2, two at once on a NIC share it (half speed each).
  // fwd: all four sends [0.05, 4.05] at half speed; r0, r1 step 1 (empty) at 4.05 -> 4.2;
  //      r2, r3 step 1 [4.05, 4.45] -> 4.6
  // bwd: r0, r1 out -> 4.5: kv 0->2, 1->3 from 4.5; step 0 -> 4.92, then their dkv join:
  //      four transfers on node 0's NIC from 4.92 at a quarter speed each. The kv sends
  //      had 2 - 0.21 = 1.79 left: done at 4.92 + 4 x 1.79 = 12.08; the dkv ones then have
  //      0.21 left at half speed: 12.5. Node 1's NIC alike 0.4 later: kv 12.48, dkv 12.9.
  //      r2, r3 step 1 [12.08, 12.88]; dkv home for everyone at 12.9 (the incoming dkv),
  //      two per NIC: [12.9, 16.9]; qkv 0.1 -> 17.0; sync -> 22.0
  EXPECT_NEAR(report.step_time_s, ms(22.0), kTolerance_s);
  expect_intervals(intervals_ms(report, 1, "ring kv fwd g2 step 0", "send"), {{0.05, 4.05}});
  expect_intervals(intervals_ms(report, 0, "ring kv bwd g2 step 0", "send"), {{4.5, 12.08}});
  expect_intervals(intervals_ms(report, 1, "ring dkv bwd g2 step 0", "send"), {{4.92, 12.5}});
  expect_intervals(intervals_ms(report, 3, "ring kv bwd g2 step 0", "send"), {{4.9, 12.48}});
  expect_intervals(intervals_ms(report, 2, "ring dkv home bwd g2", "send"), {{12.9, 16.9}});
  // r1: busy 0.6 + 0.21 + 0.42 = 1.23 (computes [0, 0.26], [4.05, 4.92], [16.9, 17.0]);
  //     comm [0.05, 4.05], [4.5, 16.9], sync 5 = 21.4, under compute [0.05, 0.26] and
  //     [4.5, 4.92] -> exposed 20.77; idle 22.0 - 1.23 - 20.77 = 0
  expect_rank(report, 1, 1.23, 20.77, 0);
}

TEST_F(SimulatorGolden, TransfersOnSeparateNicsOverlap) {
  FakeCostModel cost(fake_cluster(2, 2, 2), fake_model());  // one NIC per GPU
  const SimulationReport report = run(two_cross_node_rings(cost), cost);
  // Rings [0, 2] and [1, 3] share no port; ring [0, 2]:
  // fwd: sends [0.05, 2.05]; r0 step 1 (empty) at 2.05 -> 2.2; r2 [2.05, 2.45] -> 2.6
  // bwd: r0 kv 0->2 from 2.5, alone until its dkv starts at 2.92 (step 0 0.42), then both
  //      at half speed: kv done 2.92 + 2 x 1.58 = 6.08, dkv 6.5. r2 alike 0.4 later: kv
  //      6.48, dkv 6.9. r2 step 1 [6.08, 6.88]; dkv home both ways at 6.9: [6.9, 8.9];
  //      qkv 0.1 -> 9.0; ring [1, 3] alike; sync -> 14.0
  EXPECT_NEAR(report.step_time_s, ms(14.0), kTolerance_s);
  EXPECT_NEAR(start_of(report, 1, "ring kv fwd g2 step 0", "send"), ms(0.05), kTolerance_s);
  expect_intervals(intervals_ms(report, 0, "ring kv bwd g2 step 0", "send"), {{2.5, 6.08}});
  expect_intervals(intervals_ms(report, 2, "ring dkv bwd g2 step 0", "send"), {{3.32, 6.9}});
  // r0: busy 1.23; comm [0.05, 2.05] and [2.5, 8.9] + sync 5 = 13.4, under compute
  //     [0.05, 0.26] and [2.5, 2.92] -> exposed 12.77; idle 14.0 - 1.23 - 12.77 = 0
  expect_rank(report, 0, 1.23, 12.77, 0);
}

TEST_F(SimulatorGolden, PipelinedRoutedTransferOverlapsDispatchNicAndCombine) {
  // 2 nodes x 4 GPUs, one NIC per GPU. Transfers cost latency + bytes / bandwidth (the
  // fake model has 1 layer): NVLink 0.1 ms + 0.01 ms per byte, NIC 0.2 ms + 0.02 ms per byte.
  Cluster cluster = fake_cluster(2, 4, 4);
  cluster.intra_node_latency_s = ms(0.1);
  cluster.intra_node_p2p_bw_bytes_per_s = 1e5;
  cluster.inter_node_latency_s = ms(0.2);
  cluster.nic_bw_bytes_per_s = 5e4;
  FakeCostModel cost(cluster, fake_model());
  cost.p2p_from_links = true;
  Plan plan = testing::empty_plan(cost, {40});
  // The ring spans both nodes whole (routing relays only through members); only 0 and 4
  // hold tokens, so at step 0 only 0 -> 4 and 4 -> 5 (NVLink ports of its own) carry bytes.
  AttentionGroup ring = testing::make_group(Scheme::ring, {0, 4, 5, 6, 7, 1, 2, 3},
                                            {{0, {{0, 0, 20}, {4, 20, 40}}}});
  ring.routing_proxies = 3;
  ring.routing_chunks = 3;
  plan.micro_batches.push_back({{ring}, {}, {}});
  const SimulationReport report = run(plan, cost);
  // Forward step 0: 0 -> 4 carries rank 0's KV, 20 tokens x 24 bytes = 480 bytes, from
  // 0.05 (qkv linear of 20 tokens). k = 3 parts of 160 bytes; proxies 1, 2 on node 0 and
  // 5, 6 on node 1. Part 0 goes 0 -> 4 directly over rank 0's NIC: 0.2 + 3.2 -> 3.45.
  // Parts 1, 2 in 3 pieces of ceil(160 / 3) = 54, 54, 52 bytes; each stage sends a part's
  // pieces one after another. Dispatch and combine: latency 0.1, then 0.54 (54) / 0.52
  // (52) at full speed; NIC: 0.2, then 1.08 / 1.04.
  // The two parts' dispatches share rank 0's NVLink tx (half speed each):
  //   q0 [0.05, 1.23] (0.1 + 2 x 0.54), q1 [1.23, 2.41], q2 [2.41, 3.55]
  // NIC 1 -> 5 and NIC 2 -> 6 (one part each): q0 [1.23, 2.51], q1 [2.51, 3.79],
  //   q2 [3.79, 5.03]
  // Combines share rank 4's NVLink rx: q0 [2.51, 3.69], q1 [3.79, 4.97], q2 [5.03, 6.17]
  // The block has arrived at 6.17.
  const std::string send = "ring kv fwd g8 step 0";
  expect_intervals(intervals_ms(report, 0, send + " (nic)", "send"), {{0.05, 3.45}});
  expect_intervals(
      intervals_ms(report, 0, send + " (dispatch)", "send"),
      {{0.05, 1.23}, {0.05, 1.23}, {1.23, 2.41}, {1.23, 2.41}, {2.41, 3.55}, {2.41, 3.55}});
  expect_intervals(intervals_ms(report, 1, send + " (nic)", "send"),
                   {{1.23, 2.51}, {2.51, 3.79}, {3.79, 5.03}});
  expect_intervals(intervals_ms(report, 2, send + " (nic)", "send"),
                   {{1.23, 2.51}, {2.51, 3.79}, {3.79, 5.03}});
  expect_intervals(
      intervals_ms(report, 4, send + " (combine)", "recv"),
      {{2.51, 3.69}, {2.51, 3.69}, {3.79, 4.97}, {3.79, 4.97}, {5.03, 6.17}, {5.03, 6.17}});
  // Rank 4's step 0 (210 pairs) ends at 0.26; step 1 waits for the block.
  EXPECT_NEAR(start_of(report, 4, "attention fwd ring g8 step 1"), ms(6.17), kTolerance_s);

  // The same transfer alone: 6.12 pipelined. Unpipelined (k = 3, c = 1): dispatches of
  // 160 bytes share rank 0's NVLink tx: [0, 3.3] (0.1 + 2 x 1.6); NICs [3.3, 6.7];
  // combines share rank 4's NVLink rx: [6.7, 10.0]. Direct: 0.2 + 9.6 = 9.8. Inside a
  // node never routed: 0.1 + 4.8.
  EXPECT_NEAR(isolated_transfer_time_s(cost, 480, 0, 4, 3, 3), ms(6.12), kTolerance_s);
  EXPECT_NEAR(isolated_transfer_time_s(cost, 480, 0, 4, 3, 1), ms(10.0), kTolerance_s);
  EXPECT_NEAR(isolated_transfer_time_s(cost, 480, 0, 4, 1, 3), ms(9.8), kTolerance_s);
  EXPECT_NEAR(isolated_transfer_time_s(cost, 480, 0, 1, 3, 3), ms(4.9), kTolerance_s);
}

TEST_F(SimulatorGolden, GradientSyncWaitsForTheSlowestRank) {
  FakeCostModel cost(fake_cluster(1, 4, 1), fake_model());
  Plan plan = testing::empty_plan(cost, {10, 30, 20});
  plan.micro_batches.push_back({{testing::local_group(0, 0, 10), testing::local_group(1, 1, 30),
                                 testing::local_group(2, 2, 20)},
                                {},
                                {}});
  const SimulationReport report = run(plan, cost);
  // rank 1 is slowest: linear 0.3 + 0.6, attention 465 pairs 0.465 + 0.93 -> 2.295
  // rank 3 holds nothing and only joins the sync [2.295, 7.295]
  EXPECT_NEAR(report.step_time_s, ms(7.295), kTolerance_s);
  EXPECT_NEAR(start_of(report, 3, "gradient sync", "collective"), ms(2.295), kTolerance_s);
  expect_rank(report, 1, 2.295, 5, 0);
  expect_rank(report, 3, 0, 5, 2.295);
  // rank 0: linear 0.1 + 0.2, attention 55 pairs 0.055 + 0.11 -> 0.465
  expect_rank(report, 0, 0.465, 5, 2.295 - 0.465);
}

TEST_F(SimulatorGolden, OverlappedGradientSyncRunsInBucketsDuringTheLastBackwardPass) {
  Model model = fake_model();
  model.layers = 4;  // 4 buckets of 5 / 4 = 1.25 (the fake costs ignore the layer count)
  FakeCostModel cost(fake_cluster(1, 2, 1), model);
  Plan plan = testing::empty_plan(cost, {100, 50});
  plan.micro_batches.push_back(
      {{testing::local_group(0, 0, 100), testing::local_group(1, 1, 50)}, {}, {}});
  const SimulationReport report = run(plan, cost, GradientSync::overlap);
  // rank 0: fwd 0.25 + 5.05 + 0.75 -> 6.05; bwd 1.5 + 10.1 + 0.5 = 12.1 -> 18.15
  // rank 1: fwd 0.125 + 1.275 + 0.375 -> 1.775; bwd 0.75 + 2.55 + 0.25 = 3.55 -> 5.325
  // bucket b < 4 is ready when every rank has done b / 4 of its backward compute, rank 0
  // last: 6.05 + b x 3.025 = 9.075, 12.1, 15.125; bucket 4 waits for the end, 18.15.
  EXPECT_NEAR(start_of(report, 1, "gradient sync bucket 1", "collective"), ms(9.075),
              kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "gradient sync bucket 2", "collective"), ms(12.1), kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "gradient sync bucket 3", "collective"), ms(15.125),
              kTolerance_s);
  EXPECT_NEAR(start_of(report, 0, "gradient sync bucket 4", "collective"), ms(18.15),
              kTolerance_s);
  EXPECT_NEAR(report.step_time_s, ms(19.4), kTolerance_s);
  EXPECT_NEAR(report.gradient_sync_s, ms(5), kTolerance_s);
  EXPECT_NEAR(report.gradient_sync_exposed_s, ms(1.25), kTolerance_s);
  EXPECT_NEAR(report.lower_bound.gradient_sync_s, ms(1.25), kTolerance_s);
  // rank 0 hides buckets 1-3 under its backward pass; rank 1 is done before any starts
  expect_rank(report, 0, 18.15, 1.25, 0);
  expect_rank(report, 1, 5.325, 5, 19.4 - 5.325 - 5);
  // At the end, the same step pays the whole sync after rank 0: 18.15 + 5.
  const SimulationReport at_end = run(plan, cost, GradientSync::end);
  EXPECT_NEAR(at_end.step_time_s, ms(23.15), kTolerance_s);
  EXPECT_NEAR(at_end.gradient_sync_exposed_s, ms(5), kTolerance_s);
}

TEST_F(SimulatorGolden, RemapMovesTokensAndChargesTransfers) {
  FakeCostModel cost(fake_cluster(1, 2, 1), fake_model());
  Plan plan = testing::empty_plan(cost, {100});
  MicroBatch micro_batch{{testing::local_group(0, 0, 100)}, {}, {}};
  micro_batch.linear_layout = {{0, 0, 0, 50}, {1, 0, 50, 100}};
  plan.micro_batches.push_back(micro_batch);
  const SimulationReport report = run(plan, cost);
  // Linear 50 tokens per rank (0.5 fwd, 1 bwd); attention of 100 tokens on rank 0.
  // fwd: qkv 0.125; remap 1->0 [0.125, 2.125]; attention [2.125, 7.175]; remap 0->1
  //      [7.175, 9.175]; out r0 [7.175, 7.55], r1 waits: [9.175, 9.55]
  // bwd: out r0 [7.55, 8.3], r1 [9.55, 10.3]; remap 1->0 [10.3, 12.3]; attention
  //      [12.3, 22.4]; remap 0->1 [22.4, 24.4]; qkv r0 [22.4, 22.65], r1 [24.4, 24.65]
  //      sync [24.65, 29.65]
  EXPECT_NEAR(report.step_time_s, ms(29.65), kTolerance_s);
  // r0: busy 1.5 + 15.15 = 16.65; comm 4 x 2 + 5 = 13, hidden by out/out-bwd
  //     [7.175, 8.3] 1.125 and qkv bwd 0.25 -> exposed 11.625; idle 1.375
  // r1: busy 1.5; exposed 13; idle 29.65 - 1.5 - 13 = 15.15
  expect_rank(report, 0, 16.65, 11.625, 1.375);
  expect_rank(report, 1, 1.5, 13, 15.15);
  EXPECT_NEAR(start_of(report, 0, "remap fwd to attention", "recv"), ms(0.125), kTolerance_s);
}

TEST_F(SimulatorGolden, TensorParallelCollectivesRunBetweenTheLinearTasks) {
  // Ranks are TP groups of 2 GPUs: per token and layer an all-gather costs 0.01 ms
  // (12 bytes x 1/2 / 6e5 B/s) + 0.1 ms latency, a reduce-scatter 0.02 ms + 0.2 ms.
  Cluster cluster = fake_cluster(1, 2, 1);
  cluster.tensor_parallel = {2, {2, ms(0.1), 6e5}, {2, ms(0.2), 3e5}};
  FakeCostModel cost(cluster, fake_model());
  Plan plan = testing::empty_plan(cost, {100, 50});
  plan.micro_batches.push_back(
      {{testing::local_group(0, 0, 100), testing::local_group(1, 1, 50)}, {}, {}});
  const SimulationReport report = run(plan, cost);
  // rank 0, 100 tokens: all-gather 1.1, reduce-scatter 2.2.
  //   fwd: ag [0, 1.1]; qkv 0.25; attention 5.05; out+mlp 0.75 -> 7.15; rs+ag+rs 5.5 -> 12.65
  //   bwd: ag+rs+ag 4.4 -> 17.05; out+mlp 1.5; attention 10.1; qkv 0.5 -> 29.15; rs 2.2
  //   -> 31.35; sync [31.35, 36.35]
  // Compute as without TP (18.15); TP 2 x (2 x 1.1 + 2 x 2.2) = 13.2 exposed, + sync 5.
  // rank 1, 50 tokens: all-gather 0.6, reduce-scatter 1.2: TP 7.2, compute 5.325.
  EXPECT_NEAR(report.step_time_s, ms(36.35), kTolerance_s);
  expect_rank(report, 0, 18.15, 18.2, 0);
  expect_rank(report, 1, 5.325, 12.2, 36.35 - 5.325 - 12.2);
  EXPECT_NEAR(start_of(report, 0, "linear qkv fwd"), ms(1.1), kTolerance_s);
  expect_intervals(
      intervals_ms(report, 0, "tensor parallel reduce-scatter, all-gather, reduce-scatter fwd",
                   "collective"),
      {{7.15, 12.65}});
  expect_intervals(
      intervals_ms(report, 0, "tensor parallel all-gather, reduce-scatter, all-gather bwd",
                   "collective"),
      {{12.65, 17.05}});
  expect_intervals(intervals_ms(report, 0, "tensor parallel reduce-scatter bwd", "collective"),
                   {{29.15, 31.35}});
  for (const TraceEvent& event : report.trace) {
    if (event.name.rfind("tensor parallel", 0) == 0) {
      EXPECT_EQ(event.category, "tensor parallel");
    }
  }
  EXPECT_EQ(report.tensor_parallel, 2);
  // The cost model's figure for a micro-batch, both passes (what planners and the lower
  // bound use), is what the simulator runs.
  EXPECT_NEAR(cost.tensor_parallel_time_s(100), ms(13.2), kTolerance_s);
  EXPECT_NEAR(cost.tensor_parallel_latency_s(), ms(2 * (2 * 0.1 + 2 * 0.2)), kTolerance_s);
}

}  // namespace
}  // namespace ballast
