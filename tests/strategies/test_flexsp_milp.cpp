// FlexSP's CBC MILP: on seeded random small micro-batches the per-sequence MILP proves the
// optimum that exhaustive search finds (fake, profiled, analytical and GQA cost models);
// on realistic bucketed micro-batches of 64 GPUs it never loses to its greedy warm starts;
// infeasible input, determinism and idle GPUs. The oracle itself is checked against a
// brute force over set partitions.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "ballast/error.hpp"
#include "ballast/simulator.hpp"
#include "ballast/strategy.hpp"
#include "ballast/workload.hpp"
#include "fake_cost.hpp"
#include "flexsp.hpp"
#include "flexsp_oracle.hpp"
#include "flexsp_test_support.hpp"

namespace ballast::strategies::flexsp {
namespace {

using testing::preset_cost;
using testing::solve_exhaustive;
using testing::uniform01;

/// Fake model with 8 KV heads on 2 nodes x 4 GPUs: degrees 1..8, capacities 194 (local),
/// 124, 248 and 496 tokens, fixed costs 0, 80, 80 and 240 us.
std::unique_ptr<CostModel> fake_cost() {
  return std::make_unique<ballast::testing::FakeCostModel>(ballast::testing::tiny_cluster(2, 4),
                                                           ballast::testing::tiny_model(8));
}

/// Seeded small micro-batch: 1..max_sequences lengths, log-uniform over [M / 256, M]
/// where M is the largest group's capacity times 1/8, 1/4, 1/2 or 1 (so that some
/// batches are infeasible), a quarter of them repeats of earlier lengths.
std::vector<Tokens> random_lengths(std::uint64_t seed, const GroupCosts& costs, int max_sequences) {
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 7;
  const auto count = 1 + static_cast<int>(uniform_below(state, max_sequences));
  const double scales[] = {1.0 / 8, 1.0 / 4, 1.0 / 2, 1.0};
  const double max_tokens =
      static_cast<double>(costs.degrees().back().capacity_tokens) * scales[uniform_below(state, 4)];
  std::vector<Tokens> lengths;
  for (int i = 0; i < count; ++i) {
    if (!lengths.empty() && uniform_below(state, 4) == 0) {
      lengths.push_back(lengths[uniform_below(state, lengths.size())]);
      continue;
    }
    const double value = max_tokens * std::exp(-uniform01(state) * std::log(256.0));
    lengths.push_back(std::max<Tokens>(1, static_cast<Tokens>(value)));
  }
  std::sort(lengths.begin(), lengths.end());
  return lengths;
}

bool same_within(double a, double b, double relative) {
  return std::abs(a - b) <= relative * std::max(std::abs(a), std::abs(b));
}

/// Runs `instances` seeded micro-batches of up to 12 sequences through the per-sequence
/// MILP and the oracle. Every fourth seed solves without warm starts (CBC alone; these
/// take over 90% of the time), the others with the greedy plans as the planner does.
/// `min_heterogeneous_wins`: instances where the optimum must beat every greedy plan.
void check_against_oracle(const CostModel& cost, int instances, int min_heterogeneous_wins) {
  const GroupCosts costs(cost);
  int feasible = 0;
  int heterogeneous_wins = 0;
  for (std::uint64_t seed = 0; seed < static_cast<std::uint64_t>(instances); ++seed) {
    const std::vector<Tokens> lengths = random_lengths(seed, costs, 12);
    const Problem problem = exact_items(lengths).problem;
    SCOPED_TRACE(::testing::Message() << "seed " << seed << ", " << lengths.size()
                                      << " sequences, longest " << lengths.back());
    MilpOptions options;
    options.max_nodes = 1000000;
    const std::vector<Solution> greedy = homogeneous_solutions(costs, problem);
    if (seed % 4 != 0) options.warm_starts = greedy;
    const Solution exact = solve_exhaustive(costs, problem);
    const MilpResult milp = solve_milp(costs, problem, options);
    ASSERT_EQ(milp.solution.feasible(), exact.feasible());
    if (!exact.feasible()) continue;
    ++feasible;
    EXPECT_EQ(check_solution(costs, problem, exact), "");
    EXPECT_EQ(check_solution(costs, problem, milp.solution), "");
    EXPECT_TRUE(milp.proven_optimal);
    EXPECT_TRUE(same_within(milp.solution.makespan_s, exact.makespan_s, 1e-9))
        << milp.solution.makespan_s << " s vs the optimum " << exact.makespan_s << " s";
    EXPECT_LE(milp.best_bound_s, milp.solution.makespan_s * (1 + 1e-9));
    Seconds greedy_s = std::numeric_limits<Seconds>::infinity();
    for (const Solution& plan : greedy) greedy_s = std::min(greedy_s, plan.makespan_s);
    EXPECT_GE(greedy_s, exact.makespan_s * (1 - 1e-12));
    if (greedy_s > exact.makespan_s * (1 + 1e-6)) ++heterogeneous_wins;
  }
  // The instances exercise the solver: most are feasible, and on some the optimum beats
  // every homogeneous plan (heterogeneous groups matter).
  EXPECT_GE(feasible, instances / 2);
  EXPECT_GE(heterogeneous_wins, min_heterogeneous_wins);
}

TEST(FlexSpMilp, MatchesOracleOnFakeModel) { check_against_oracle(*fake_cost(), 40, 8); }

// On one node of real GPUs the best homogeneous plan is nearly always optimal for a dozen
// sequences (one bottleneck group sets the makespan), so these check exactness only.
TEST(FlexSpMilp, MatchesOracleOnProfiledGpt7bOneNode) {
  check_against_oracle(*preset_cost("flexsp-a100-192k", "a100-ib400", 1, "gpt-7b"), 30, 0);
}

TEST(FlexSpMilp, MatchesOracleOnAnalyticalLlama7b) {
  check_against_oracle(*preset_cost("analytical", "h100", 1, "llama-7b"), 30, 0);
}

TEST(FlexSpMilp, MatchesOracleOnGqaLlama3With16Gpus) {
  // 8 KV heads cap the degree at 8 on 16 GPUs: at most 2 groups of 8, and a single
  // sequence cannot use every GPU.
  check_against_oracle(*preset_cost("analytical", "h100", 2, "llama3-8b"), 24, 2);
}

// ---- bucketed micro-batches of 64 GPUs ----

/// FlexSP's setting: 7B at 192K on 8 nodes x 8 A100s with the profiled coefficients.
std::unique_ptr<CostModel> flexsp_7b_64_gpus() {
  return preset_cost("flexsp-a100-192k", "a100-ib400", 8, "gpt-7b");
}

const Dataset& wikipedia() {
  static const Dataset dataset = load_dataset("wikipedia");
  return dataset;
}

/// `sequences` consecutive Wikipedia documents from `offset` (longer than 192K - 128
/// dropped, as FlexSP does), ascending.
std::vector<Tokens> wikipedia_batch(std::uint64_t offset, std::int64_t sequences) {
  SamplerOptions options;
  options.batch_size = sequences;
  options.max_context_tokens = 192 * 1024 - 128;
  options.order = SamplingOrder::sequential;
  options.seed = offset;
  BatchSampler sampler(wikipedia(), options);
  std::vector<Tokens> lengths = sampler.next().lengths_tokens;
  std::sort(lengths.begin(), lengths.end());
  return lengths;
}

/// Sequence Blaster's M_min-way split of the batch, each micro-batch bucketed. The split is
/// by tokens over ascending lengths, so the first micro-batch holds many short sequences
/// and the last a few long ones.
std::vector<Problem> micro_batches(const GroupCosts& costs,
                                   std::span<const Tokens> sorted_lengths) {
  Tokens total = 0;
  for (Tokens length : sorted_lengths) total += length;
  const Tokens capacity = costs.cluster_capacity_tokens();
  const auto count = static_cast<std::size_t>((total + capacity - 1) / capacity);
  std::vector<std::size_t> starts = min_max_token_split(sorted_lengths, count);
  starts.push_back(sorted_lengths.size());
  std::vector<Problem> problems;
  for (std::size_t m = 0; m < count; ++m) {
    problems.push_back(
        bucketize(sorted_lengths.subspan(starts[m], starts[m + 1] - starts[m]), capacity).problem);
  }
  return problems;
}

Seconds best_makespan_s(std::span<const Solution> plans) {
  Seconds best_s = std::numeric_limits<Seconds>::infinity();
  for (const Solution& plan : plans) best_s = std::min(best_s, plan.makespan_s);
  return best_s;
}

TEST(FlexSpMilp, BucketedLongSequencesBeatGreedyOn64Gpus) {
  // The long-sequence micro-batch of 512 Wikipedia documents (36 sequences in 16 buckets):
  // the best homogeneous plan takes 2.38 s, heterogeneous groups 1.90 s, which CBC proves
  // optimal within the root node.
  const auto cost = flexsp_7b_64_gpus();
  const GroupCosts costs(*cost);
  const Problem problem = micro_batches(costs, wikipedia_batch(200000, 512)).back();
  ASSERT_EQ(problem.lengths_tokens.size(), 16u);
  MilpOptions options;
  options.max_nodes = 20;
  options.warm_starts = homogeneous_solutions(costs, problem);
  const Seconds greedy_s = best_makespan_s(options.warm_starts);
  const MilpResult milp = solve_milp(costs, problem, options);
  EXPECT_EQ(check_solution(costs, problem, milp.solution), "");
  EXPECT_TRUE(milp.proven_optimal);
  EXPECT_LT(milp.solution.makespan_s, 0.85 * greedy_s) << "greedy " << greedy_s << " s";
  EXPECT_NEAR(milp.objective_s, milp.solution.makespan_s, 1e-6 * milp.solution.makespan_s);
  EXPECT_LE(milp.best_bound_s, milp.solution.makespan_s * (1 + 1e-9));
  std::set<std::size_t> degrees;
  for (const SolvedGroup& group : milp.solution.groups) degrees.insert(group.degree_index);
  EXPECT_GE(degrees.size(), 2u) << "the optimum mixes degrees";
}

/// Solves `problem` warm-started with the greedy plans, as the planner does, and checks
/// that the result obeys the rules, is no worse than the best greedy plan and no better
/// than CBC's own bound.
void expect_warm_started_solve_sound(const GroupCosts& costs, const Problem& problem,
                                     int max_nodes) {
  MilpOptions options;
  options.max_nodes = max_nodes;
  options.warm_starts = homogeneous_solutions(costs, problem);
  ASSERT_FALSE(options.warm_starts.empty());
  const MilpResult milp = solve_milp(costs, problem, options);
  EXPECT_EQ(check_solution(costs, problem, milp.solution), "");
  EXPECT_LE(milp.solution.makespan_s, best_makespan_s(options.warm_starts));
  EXPECT_LE(milp.best_bound_s, milp.solution.makespan_s * (1 + 1e-9));
}

TEST(FlexSpMilp, BucketedNeverWorseThanGreedyOn64Gpus) {
  // Short sequences: 128 documents (one micro-batch) and the short half of 512.
  const auto cost = flexsp_7b_64_gpus();
  const GroupCosts costs(*cost);
  const Problem problems[] = {micro_batches(costs, wikipedia_batch(0, 128)).front(),
                              micro_batches(costs, wikipedia_batch(500000, 512)).front()};
  for (const Problem& problem : problems) {
    SCOPED_TRACE(::testing::Message() << problem.sequences() << " sequences");
    expect_warm_started_solve_sound(costs, problem, 20);
  }
}

TEST(FlexSpMilp, NoNodesStillNeverWorseThanValidWarmStarts) {
  // A hard micro-batch (256 documents, one very long) where CBC's root finds nothing
  // better than the greedy plans; the warm starts that break the rules are ignored, even
  // one claiming a zero makespan, and the makespan returned is recomputed.
  const auto cost = flexsp_7b_64_gpus();
  const GroupCosts costs(*cost);
  const Problem problem = micro_batches(costs, wikipedia_batch(300000, 256)).front();
  MilpOptions options;
  options.max_nodes = 0;
  options.warm_starts = homogeneous_solutions(costs, problem);
  const Seconds greedy_s = best_makespan_s(options.warm_starts);
  Solution lying = options.warm_starts.front();
  lying.makespan_s = 0;
  lying.groups.pop_back();  // some sequences unplaced
  options.warm_starts.push_back(lying);
  options.warm_starts.push_back(Solution{});
  const MilpResult milp = solve_milp(costs, problem, options);
  EXPECT_EQ(check_solution(costs, problem, milp.solution), "");
  EXPECT_EQ(milp.nodes, 0);
  EXPECT_LE(milp.solution.makespan_s, greedy_s);
  EXPECT_EQ(milp.solution.makespan_s, makespan_s(costs, problem, milp.solution.groups));
}

TEST(FlexSpMilp, DeterministicGroups) {
  // A micro-batch where CBC's own incumbent (not a warm start) is returned.
  const auto cost = flexsp_7b_64_gpus();
  const GroupCosts costs(*cost);
  const Problem problem = micro_batches(costs, wikipedia_batch(450000, 512)).back();
  MilpOptions options;
  options.max_nodes = 0;
  options.warm_starts = homogeneous_solutions(costs, problem);
  const MilpResult first = solve_milp(costs, problem, options);
  const MilpResult second = solve_milp(costs, problem, options);
  EXPECT_LT(first.solution.makespan_s, best_makespan_s(options.warm_starts));
  ASSERT_EQ(first.solution.groups.size(), second.solution.groups.size());
  for (std::size_t g = 0; g < first.solution.groups.size(); ++g) {
    EXPECT_EQ(first.solution.groups[g].degree_index, second.solution.groups[g].degree_index);
    EXPECT_EQ(first.solution.groups[g].items, second.solution.groups[g].items);
  }
  EXPECT_EQ(first.solution.makespan_s, second.solution.makespan_s);
  EXPECT_EQ(first.objective_s, second.objective_s);
  EXPECT_EQ(first.best_bound_s, second.best_bound_s);
  EXPECT_EQ(first.nodes, second.nodes);
}

/// OpenBLAS's thread count setter and getter in this process (nullptr when the LAPACK is
/// not OpenBLAS).
void (*const set_blas_threads)(int) =
    reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
int (*const blas_threads)() = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));

TEST(FlexSpMilp, SamePlanWhateverTheBlasThreads) {
  // The last micro-batch of step 1 of `ballast simulate --strategy flexsp --cluster
  // a100-ib400` (the default workload): with 4 OpenBLAS threads Clp's LAPACK summed in
  // another order and CBC returned the same groups in another order, on other ranks.
  if (set_blas_threads == nullptr || blas_threads == nullptr) GTEST_SKIP() << "LAPACK is not OpenBLAS";
  const auto cost = preset_cost("analytical", "a100-ib400", 8, "llama-7b");
  const Batch batch = make_batch({37027, 38740, 44755, 30658, 21807, 82886}, 0);
  const Planner& planner = find_planner("flexsp");
  const SimulatorEvaluator evaluator(*cost);
  const int before = blas_threads();
  set_blas_threads(4);
  const Plan threaded = planner.plan(batch, *cost, {}, evaluator);
  EXPECT_EQ(blas_threads(), 4);  // restored after each solve
  set_blas_threads(1);
  const Plan single = planner.plan(batch, *cost, {}, evaluator);
  set_blas_threads(before);
  EXPECT_TRUE(threaded.micro_batches == single.micro_batches);
}

TEST(FlexSpMilp, PerSequenceSixtyFourGpus) {
  // 111 distinct lengths on 64 GPUs: ~14,000 columns. Clp's automatic first LP (the
  // "idiot" crash) segfaulted in its crossover on exactly this model; the dual simplex
  // solves it.
  const auto cost = flexsp_7b_64_gpus();
  const GroupCosts costs(*cost);
  const Problem problem = exact_items(wikipedia_batch(0, 128)).problem;
  ASSERT_EQ(problem.lengths_tokens.size(), 111U);
  expect_warm_started_solve_sound(costs, problem, 0);
}

// ---- infeasible input and idle GPUs ----

TEST(FlexSpMilp, ItemLongerThanEveryGroupIsInfeasible) {
  const auto cost = fake_cost();
  const GroupCosts costs(*cost);
  // 497 tokens exceed the 8-way group's 496.
  const Problem problem{{100, 497}, {2, 1}};
  MilpResult milp;
  ASSERT_NO_THROW(milp = solve_milp(costs, problem, {}));
  EXPECT_FALSE(milp.solution.feasible());
  EXPECT_FALSE(solve_exhaustive(costs, problem).feasible());
}

TEST(FlexSpMilp, TooManyTokensForTheClusterIsInfeasible) {
  const auto cost = fake_cost();
  const GroupCosts costs(*cost);
  // Each fits an 8-way group alone, but two 300-token sequences need 600 > 496 tokens in
  // one group or two groups of 8 on 8 GPUs.
  const Problem problem{{300}, {2}};
  MilpResult milp;
  ASSERT_NO_THROW(milp = solve_milp(costs, problem, {}));
  EXPECT_FALSE(milp.solution.feasible());
  EXPECT_FALSE(solve_exhaustive(costs, problem).feasible());
}

TEST(FlexSpMilp, FewSequencesWithGqaLeaveGpusIdle) {
  // Llama-3-8B has 8 KV heads, so on 32 GPUs the largest group is 8-way: three sequences
  // make at most three groups and cannot use every GPU (every_gpu_used is false).
  const auto cost = preset_cost("analytical", "h100", 4, "llama3-8b");
  const GroupCosts costs(*cost);
  ASSERT_EQ(costs.degrees().back().degree, 8);
  const Problem problem{{100000, 60000, 30000}, {1, 1, 1}};
  ASSERT_FALSE(every_gpu_used(costs, problem));
  // Three sequences: CBC may need nodes beyond the root to prove the optimum (with h100's
  // attention efficiency curves its root bound stops short of it).
  MilpOptions options;
  options.max_nodes = 1000;
  const MilpResult milp = solve_milp(costs, problem, options);
  EXPECT_EQ(check_solution(costs, problem, milp.solution), "");
  EXPECT_TRUE(milp.proven_optimal);
  int gpus = 0;
  for (const SolvedGroup& group : milp.solution.groups) gpus += costs.at(group.degree_index).degree;
  EXPECT_LT(gpus, 32);
  // No plan beats every sequence alone in its fastest group, and 3 groups of at most 8
  // GPUs fit: that is the optimum.
  Seconds bound_s = 0;
  for (Tokens length : problem.lengths_tokens) {
    Seconds alone_s = std::numeric_limits<Seconds>::infinity();
    for (std::size_t k = costs.min_degree_index(length); k < costs.degree_count(); ++k) {
      if (length <= costs.at(k).capacity_tokens) {
        alone_s = std::min(alone_s, costs.at(k).fixed_s + costs.sequence_s(length, k));
      }
    }
    bound_s = std::max(bound_s, alone_s);
  }
  EXPECT_TRUE(same_within(milp.solution.makespan_s, bound_s, 1e-9))
      << milp.solution.makespan_s << " s vs " << bound_s << " s";
  EXPECT_EQ(milp.solution.groups.size(), 3u);
}

// ---- the oracle ----

/// The optimum by brute force over every set partition of the sequences and every degree
/// of every block, without the oracle's structure enumeration or subset DP.
Seconds brute_force_makespan_s(const GroupCosts& costs, const Problem& problem) {
  std::vector<std::size_t> sequences;
  for (std::size_t item = 0; item < problem.counts.size(); ++item) {
    sequences.insert(sequences.end(), static_cast<std::size_t>(problem.counts[item]), item);
  }
  Seconds best_s = std::numeric_limits<Seconds>::infinity();
  std::vector<std::size_t> block_of(sequences.size(), 0);
  // Restricted growth strings enumerate set partitions; each block then tries every degree.
  std::function<void(std::size_t, std::size_t)> partition = [&](std::size_t i, std::size_t blocks) {
    if (i < sequences.size()) {
      for (std::size_t b = 0; b <= blocks; ++b) {
        block_of[i] = b;
        partition(i + 1, std::max(blocks, b + 1));
      }
      return;
    }
    std::vector<SolvedGroup> groups(blocks);
    for (std::size_t s = 0; s < sequences.size(); ++s)
      groups[block_of[s]].items.push_back(sequences[s]);
    std::function<void(std::size_t)> assign = [&](std::size_t g) {
      if (g < groups.size()) {
        for (std::size_t k = 0; k < costs.degree_count(); ++k) {
          groups[g].degree_index = k;
          assign(g + 1);
        }
        return;
      }
      Solution solution{groups, makespan_s(costs, problem, groups)};
      if (check_solution(costs, problem, solution).empty()) {
        best_s = std::min(best_s, solution.makespan_s);
      }
    };
    assign(0);
  };
  partition(0, 0);
  return best_s;
}

TEST(FlexSpOracle, MatchesBruteForceOnTinyInstances) {
  const auto fake = fake_cost();
  const auto gqa = preset_cost("analytical", "h100", 2, "llama3-8b");
  for (const CostModel* cost : {fake.get(), gqa.get()}) {
    const GroupCosts costs(*cost);
    for (std::uint64_t seed = 0; seed < 30; ++seed) {
      const std::vector<Tokens> lengths = random_lengths(seed, costs, 6);
      const Problem problem = exact_items(lengths).problem;
      SCOPED_TRACE(::testing::Message() << cost->name() << " seed " << seed);
      const Solution exact = solve_exhaustive(costs, problem);
      const Seconds brute_s = brute_force_makespan_s(costs, problem);
      ASSERT_EQ(exact.feasible(), std::isfinite(brute_s));
      if (!exact.feasible()) continue;
      EXPECT_EQ(check_solution(costs, problem, exact), "");
      EXPECT_EQ(exact.makespan_s, brute_s);
    }
  }
}

TEST(FlexSpOracle, HandCheckedProfiledGpt7bOneNode) {
  // FlexSP's 7B coefficients (SYSTEMS.md section 2) on 8 GPUs: a1 = 5.128e-6 ms/token^2,
  // a2 = 0.1839576 ms/token, b1 = 629.3563 ms; all-to-all 2.5907 ms per 1,000 tokens at
  // d = 8 (8 * 32 * 4096 * 2 bytes per token / 8 / 96.5 GB/s) and 25.1 ms at d = 2.
  const auto cost = preset_cost("flexsp-a100-192k", "a100-ib400", 1, "gpt-7b");
  const GroupCosts costs(*cost);
  {
    // A 20,000-token sequence needs all 8 GPUs (a 4-way group holds 14,336 tokens), so
    // everything shares one group: 629.36 + 4 * 26.23 (1,000 tokens: (5.13 + 183.96) / 8
    // + 2.59) + 768.11 (20,000 tokens: (2051.2 + 3679.15) / 8 + 51.81) = 1502.37 ms.
    const Problem problem{{1000, 20000}, {4, 1}};
    const Solution exact = solve_exhaustive(costs, problem);
    ASSERT_EQ(exact.groups.size(), 1u);
    EXPECT_EQ(costs.at(exact.groups[0].degree_index).degree, 8);
    EXPECT_EQ(exact.groups[0].items, (std::vector<std::size_t>{0, 0, 0, 0, 1}));
    EXPECT_NEAR(exact.makespan_s * 1e3, 1502.37, 0.05);
  }
  {
    // Eight 3,000-token sequences: one per GPU costs 629.36 + 46.15 + 551.87 = 1227.38
    // ms; pairs on 2-way groups 629.36 + 2 * (299.01 + 25.1) = 1277.6 ms; all on one
    // 8-way group 629.36 + 8 * 82.5 = 1289.4 ms.
    const Problem problem{{3000}, {8}};
    const Solution exact = solve_exhaustive(costs, problem);
    ASSERT_EQ(exact.groups.size(), 8u);
    for (const SolvedGroup& group : exact.groups) EXPECT_EQ(group.degree_index, 0u);
    EXPECT_NEAR(exact.makespan_s * 1e3, 1227.38, 0.05);
  }
  EXPECT_THROW(solve_exhaustive(costs, Problem{{10}, {13}}), InternalError);
}

}  // namespace
}  // namespace ballast::strategies::flexsp
