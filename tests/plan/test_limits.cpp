// The scale limits of limits.hpp: values at each limit are accepted, values just past it
// are rejected with a message naming the limit; lengths and token sums near the limits do
// not overflow; a 10^5-sequence batch on 4,096 GPUs plans and validates in seconds.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "ballast/cluster.hpp"
#include "ballast/cost_model.hpp"
#include "ballast/error.hpp"
#include "ballast/limits.hpp"
#include "ballast/model.hpp"
#include "ballast/plan.hpp"
#include "ballast/simulator.hpp"
#include "ballast/strategy.hpp"
#include "ballast/workload.hpp"
#include "plan/plan_fixtures.hpp"

namespace ballast {
namespace {

/// The InputError message of `action`, or "" when it does not throw.
template <typename Action>
std::string error_of(Action&& action) {
  try {
    action();
  } catch (const InputError& error) {
    return error.what();
  }
  return "";
}

#define EXPECT_MESSAGE(message, text) \
  EXPECT_NE((message).find(text), std::string::npos) << "message: " << (message)

std::unique_ptr<CostModel> analytical(const std::string& cluster, int nodes,
                                      const std::string& model = "llama-7b") {
  return make_cost_model(load_cost_model_spec("analytical"), load_cluster(cluster, nodes),
                         load_model(model));
}

// ---- batches ----------------------------------------------------------------------------

TEST(BatchLimits, SequenceLength) {
  EXPECT_EQ(make_batch({kMaxSequenceTokens}).max_length_tokens(), kMaxSequenceTokens);
  EXPECT_MESSAGE(error_of([] {
                   make_batch({1, kMaxSequenceTokens + 1});
                 }),
                 "sequence 1 of the batch has length 2147483649, over ballast's limit of 2^31");
}

TEST(BatchLimits, SequenceCount) {
  std::vector<Tokens> lengths(static_cast<std::size_t>(kMaxBatchSequences), 1);
  EXPECT_EQ(make_batch(lengths).lengths_tokens.size(), lengths.size());
  lengths.push_back(1);
  EXPECT_MESSAGE(error_of([&] { make_batch(lengths); }),
                 "the batch has 1,000,001 sequences, over ballast's limit of 1,000,000 per batch");
}

TEST(BatchLimits, TotalTokensAddUpIn64Bits) {
  // 512 sequences of 2^31 tokens: exactly 2^40 tokens, the limit.
  std::vector<Tokens> lengths(512, kMaxSequenceTokens);
  const Batch batch = make_batch(lengths);
  EXPECT_EQ(batch.total_tokens(), kMaxBatchTokens);
  lengths.push_back(1);
  EXPECT_MESSAGE(error_of([&] { make_batch(lengths); }),
                 "the batch holds 1,099,511,627,777 tokens, over ballast's limit of 2^40");
}

TEST(BatchLimits, SamplerOptions) {
  const Dataset dataset = load_dataset("wlbllm");
  SamplerOptions options;
  options.batch_size = kMaxBatchSequences;
  options.max_context_tokens = kMaxSequenceTokens;
  EXPECT_NO_THROW((BatchSampler{dataset, options}));
  options.max_context_tokens = kMaxSequenceTokens + 1;
  EXPECT_MESSAGE(error_of([&] {
                   BatchSampler{dataset, options};
                 }),
                 "--max-context 2147483649 is over ballast's sequence length limit of 2^31");
  options.max_context_tokens = 131072;
  options.batch_size = kMaxBatchSequences + 1;
  EXPECT_MESSAGE(error_of([&] {
                   BatchSampler{dataset, options};
                 }),
                 "--batch-size 1000001 is over ballast's limit of 1000000 sequences");
  options.batch_size.reset();
  options.tokens_per_step = kMaxBatchTokens;
  EXPECT_NO_THROW((BatchSampler{dataset, options}));
  options.tokens_per_step = kMaxBatchTokens + 1;
  EXPECT_MESSAGE(error_of([&] {
                   BatchSampler{dataset, options};
                 }),
                 "--tokens-per-step 1099511627777 is over ballast's limit of 2^40");
}

TEST(BatchLimits, PlannersCheckBatchesMadeWithoutMakeBatch) {
  const auto cost = analytical("h100", 1);
  Batch batch;
  batch.lengths_tokens = {100, kMaxSequenceTokens + 1};
  for (const auto& planner : planners()) {
    EXPECT_MESSAGE(error_of([&] { planner->plan(batch, *cost, {}, SimulatorEvaluator(*cost)); }),
                   "over ballast's limit of 2^31");
  }
}

TEST(BatchLimits, MaxLengthSequenceIsAPlanningErrorNotAnOverflow) {
  // 2^31 tokens hold 2^61 causal pairs: the cost model and the bound stay finite.
  const auto cost = analytical("h100", 1);
  const AttentionBlock block = whole_document(kMaxSequenceTokens);
  EXPECT_EQ(causal_pairs(block), kMaxSequenceTokens / 2 * (kMaxSequenceTokens + 1));
  const Seconds attention_s = cost->attention_time_s({&block, 1}, 1, Pass::forward);
  EXPECT_TRUE(std::isfinite(attention_s) && attention_s > 0);
  const Batch batch = make_batch({kMaxSequenceTokens, 1000});
  for (const auto& planner : planners()) {
    try {
      planner->plan(batch, *cost, {}, SimulatorEvaluator(*cost));
      ADD_FAILURE() << planner->name() << " planned 2^31 tokens on 8 GPUs";
    } catch (const PlanningError& error) {
      EXPECT_MESSAGE(std::string(error.what()), "sequence 0") << planner->name();
    }
  }
}

TEST(BatchLimits, LowerBoundOfTheLargestBatch) {
  // 512 sequences of 2^31 tokens (2^40 in all) on 65,536 GPUs: sums in 64 bits, pairs in
  // double, micro-batches = ceil(2^40 / (ranks x capacity)).
  const auto cost = analytical("h100", kMaxRanks / 8);
  const std::vector<Tokens> lengths(512, kMaxSequenceTokens);
  const LowerBound bound = lower_bound(lengths, *cost);
  const Tokens cluster_tokens = Tokens{kMaxRanks} * cost->token_capacity_per_rank();
  EXPECT_EQ(bound.min_micro_batches, (kMaxBatchTokens + cluster_tokens - 1) / cluster_tokens);
  EXPECT_TRUE(std::isfinite(bound.time_s) && bound.time_s > 0);
  EXPECT_GT(bound.compute_per_rank_s, 0);
  const std::vector<Tokens> too_long = {kMaxSequenceTokens + 1};
  EXPECT_MESSAGE(error_of([&] { lower_bound(too_long, *cost); }), "limit of 2^31");
  const std::vector<Tokens> too_many(static_cast<std::size_t>(kMaxBatchSequences) + 1, 1);
  EXPECT_MESSAGE(error_of([&] { lower_bound(too_many, *cost); }), "1000001 sequences");
}

TEST(BatchLimits, BatchesNeedingTooManyMicroBatchesAreRefusedBeforePlanning) {
  // 10^6 sequences of 2^20 tokens (2^40 in all) on 8 GPUs need millions of micro-batches.
  const auto cost = analytical("h100", 1);
  const Batch batch = make_batch(std::vector<Tokens>(1'000'000, Tokens{1} << 20));
  for (const auto& planner : planners()) {
    const auto start = std::chrono::steady_clock::now();
    try {
      planner->plan(batch, *cost, {}, SimulatorEvaluator(*cost));
      ADD_FAILURE() << planner->name() << " planned 2^40 tokens on 8 GPUs";
    } catch (const PlanningError& error) {
      // packed-dp and the fixed degrees name the sequence that fits no GPU; the rest the limit.
      const std::string message = error.what();
      EXPECT_TRUE(message.find("split the batch into several steps") != std::string::npos ||
                  message.find("sequence 0") != std::string::npos)
          << planner->name() << ": " << message;
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0)
        << planner->name();
  }
}

// ---- clusters ---------------------------------------------------------------------------

TEST(ClusterLimits, RanksAndNodesOverride) {
  EXPECT_EQ(load_cluster("h100", kMaxRanks / 8).ranks(), kMaxRanks);
  EXPECT_MESSAGE(error_of([] { load_cluster("h100", kMaxRanks / 8 + 1); }),
                 "--nodes 8193 gives 8193 x 8 = 65544 GPUs, over ballast's limit of 65536 GPUs "
                 "per cluster; use --nodes 8192 or fewer");
  nlohmann::json json = to_json(load_cluster("h100"));
  json["nodes"] = kMaxRanks / 8 + 1;
  EXPECT_MESSAGE(error_of([&] { cluster_from_json(json, "big.json"); }),
                 "big.json: cluster field 'nodes' (8193) x gpus_per_node (8) = 65544 GPUs, over "
                 "ballast's limit of 65536");
}

TEST(ClusterLimits, GpusPerNode) {
  Cluster cluster = testing::small_cluster(1, kMaxGpusPerNode);
  EXPECT_NO_THROW(validate_cluster(cluster, "wide"));
  cluster = testing::small_cluster(1, kMaxGpusPerNode + 1);
  cluster.nics_per_node = 1;
  EXPECT_MESSAGE(error_of([&] { validate_cluster(cluster, "wide"); }),
                 "wide: cluster field 'gpus_per_node' is 1025, over ballast's limit of 1024");
}

TEST(ClusterLimits, IntegerFieldsDoNotWrap) {
  // 2^32 + 8 used to be read as 8 nodes; 2.5 as 2.
  nlohmann::json json = to_json(load_cluster("h100"));
  json["nodes"] = (std::uint64_t{1} << 32) + 8;
  EXPECT_MESSAGE(
      error_of([&] { cluster_from_json(json, "c.json"); }),
      "c.json: field 'nodes' is 4294967304, outside the range [-2147483648, 2147483647]");
  json["nodes"] = 2.5;
  EXPECT_MESSAGE(error_of([&] { cluster_from_json(json, "c.json"); }),
                 "c.json: field 'nodes' must be an integer, got number 2.5");
  json["nodes"] = 4.0;  // an integral float is still an integer
  EXPECT_EQ(cluster_from_json(json, "c.json").nodes, 4);
  json["nodes"] = "4";
  EXPECT_MESSAGE(error_of([&] { cluster_from_json(json, "c.json"); }),
                 "field 'nodes' has the wrong type (string)");
}

// ---- plans ------------------------------------------------------------------------------

nlohmann::json plan_json() { return to_json(testing::base_plan()); }

TEST(PlanLimits, SequencesInAPlanFile) {
  nlohmann::json json = plan_json();
  json["sequence_lengths_tokens"] = std::vector<Tokens>(kMaxBatchSequences + 1, 1);
  EXPECT_MESSAGE(error_of([&] { plan_from_json(json, "p.json"); }),
                 "p.json: sequence_lengths_tokens: 1000001 sequences, over ballast's limit of "
                 "1000000 per plan");
}

TEST(PlanLimits, MicroBatchesInAPlanFile) {
  nlohmann::json json = plan_json();  // 8 GPUs: 2^22 / 8 = 2^19, so 65,536 binds
  json["micro_batches"] = nlohmann::json::array();
  for (std::int64_t m = 0; m <= kMaxMicroBatches; ++m) json["micro_batches"].push_back(nullptr);
  EXPECT_MESSAGE(error_of([&] { plan_from_json(json, "p.json"); }),
                 "p.json: micro_batches: 65537 micro-batches on 8 GPUs, over ballast's limits");
  // On 4,096 GPUs the product binds: 1,025 micro-batches x 4,096 GPUs > 2^22.
  json["cluster"]["nodes"] = 1024;
  json["cluster"]["gpus_per_node"] = 4;
  json["micro_batches"] = std::vector<std::nullptr_t>(1025, nullptr);
  EXPECT_MESSAGE(error_of([&] { plan_from_json(json, "p.json"); }),
                 "1025 micro-batches on 4096 GPUs, over ballast's limits");
  json["micro_batches"] = std::vector<std::nullptr_t>(1024, nullptr);  // at the limit: read on
  EXPECT_MESSAGE(error_of([&] { plan_from_json(json, "p.json"); }),
                 "p.json: micro_batches[0]: expected a JSON object");
}

/// Cases that build 0.25-1 GiB of data are too slow for every run (and for the sanitized
/// build): BALLAST_LIMITS_LARGE=1 runs them.
bool large_cases_enabled() { return std::getenv("BALLAST_LIMITS_LARGE") != nullptr; }

TEST(PlanLimits, ChunksInAPlanFileAreCountedBeforeTheyAreRead) {
  if (!large_cases_enabled()) GTEST_SKIP() << "set BALLAST_LIMITS_LARGE=1 (builds 2^24 chunks)";
  nlohmann::json json = plan_json();
  nlohmann::json& sequence = json["micro_batches"][0]["groups"][0]["sequences"][0];
  sequence["chunks"] = nlohmann::json::array_t(static_cast<std::size_t>(kMaxPlanChunks));
  EXPECT_MESSAGE(error_of([&] { plan_from_json(json, "p.json"); }),
                 ".chunks[0]: expected [rank, begin, end], got null");
  sequence["chunks"].push_back(nullptr);
  EXPECT_MESSAGE(error_of([&] { plan_from_json(json, "p.json"); }),
                 ".chunks: the plan holds more than 16777216 attention chunks and linear slices");
}

TEST(PlanLimits, ValidateChecksTheSizeFirst) {
  const auto cost = testing::fake_cost();
  Plan plan = testing::base_plan();
  plan.micro_batches.resize(static_cast<std::size_t>(kMaxMicroBatches) + 1);
  const ValidationResult result = validate(plan, cost);
  EXPECT_FALSE(result.ok);
  EXPECT_MESSAGE(result.message, "the plan has 65,537 micro-batches on 8 GPUs, over ballast's");
  plan.micro_batches.resize(static_cast<std::size_t>(kMaxMicroBatches));  // empty ones
  EXPECT_MESSAGE(validate(plan, cost).message, "has no groups");
}

TEST(PlanLimits, RingStepsOfAPlan) {
  // A ring of g GPUs is simulated as g^2 steps: one ring of 4,096 GPUs (2^24 steps) is over
  // the 2^23 limit, one of 2,048 (2^22) is not (the plan then fails a later check).
  const Cluster cluster = testing::small_cluster(512, 8);
  const testing::FakeCostModel cost(cluster, testing::small_model());
  Plan plan;
  plan.strategy = "rings";
  plan.cluster = cluster;
  plan.model = testing::small_model();
  plan.cost_model = cost.spec();
  plan.sequence_lengths_tokens = {1};
  std::vector<int> ranks(4096);
  for (int r = 0; r < 4096; ++r) ranks[static_cast<std::size_t>(r)] = r;
  plan.micro_batches = {MicroBatch{{AttentionGroup{Scheme::ring, ranks, {}, 1}}, {}, {}}};
  EXPECT_MESSAGE(validate(plan, cost).message,
                 "the plan's rings take 16,777,216 simulated steps (the sum of their sizes "
                 "squared), over ballast's limit of 8,388,608 per plan");
  ranks.resize(2048);
  plan.micro_batches = {MicroBatch{{AttentionGroup{Scheme::ring, ranks, {}, 1}}, {}, {}}};
  EXPECT_MESSAGE(validate(plan, cost).message, "the group has no sequences");
}

TEST(PlanLimits, StrategiesRefuseRingsTooLargeToSimulate) {
  // On 4,096 H100s a 35.5M-token sequence needs hybrid-dp's ring over all 4,096 GPUs.
  const auto cost = analytical("h100", 512);
  const Batch batch = make_batch({1000, 35'500'000});
  try {
    find_planner("hybrid-dp").plan(batch, *cost, {}, SimulatorEvaluator(*cost));
    ADD_FAILURE() << "hybrid-dp planned a ring of 4,096 GPUs";
  } catch (const PlanningError& error) {
    EXPECT_MESSAGE(std::string(error.what()),
                   "hybrid-dp would make a plan whose rings take 16,777,216 simulated steps");
  }
  PlannerOptions options;
  options.degree = 4096;
  try {
    find_planner("static-cp").plan(make_batch({1000, 2000}), *cost, options,
                                    SimulatorEvaluator(*cost));
    ADD_FAILURE() << "static-cp planned a ring of 4,096 GPUs";
  } catch (const PlanningError& error) {
    EXPECT_MESSAGE(std::string(error.what()), "(1 rings of 4096 GPUs; a ring of g GPUs takes g^2)");
  }
}

TEST(PlanLimits, StrategiesRefusePlansWithTooManyChunks) {
  // static-cp at degree 64 cuts each sequence into 128 chunks: 2^17 sequences make exactly
  // 2^24 chunks, one more sequence is over (refused before anything is built).
  const auto cost = analytical("h100", 8);
  PlannerOptions options;
  options.degree = 64;
  const Batch batch = make_batch(std::vector<Tokens>((std::size_t{1} << 17) + 1, 1));
  try {
    find_planner("static-cp").plan(batch, *cost, options, SimulatorEvaluator(*cost));
    ADD_FAILURE() << "static-cp planned 2^24 + 128 chunks";
  } catch (const PlanningError& error) {
    EXPECT_MESSAGE(std::string(error.what()),
                   "static-cp would make a plan of 16,777,344 attention chunks (131073 "
                   "sequences, each cut into 2 x 64 chunks), over ballast's limit of 16,777,216");
  }
}

TEST(PlanLimits, LargePlanFiles) {
  if (!large_cases_enabled()) GTEST_SKIP() << "set BALLAST_LIMITS_LARGE=1 (writes 1 GiB files)";
  const std::string path =
      (std::filesystem::temp_directory_path() / "ballast_test_limits_plan.json").string();
  {  // 2^27 + 1 values in under 1 GiB: a nested array of empty arrays
    std::ofstream out(path);
    out << "[";
    for (std::int64_t i = 0; i < kMaxPlanJsonValues; ++i) out << (i == 0 ? "[]" : ",[]");
    out << "]";
  }
  EXPECT_MESSAGE(error_of([&] { read_plan_file(path); }),
                 "holds more than 134217728 JSON values, ballast's limit for a plan file");
  std::filesystem::resize_file(path, kMaxInputFileBytes + 1);  // sparse: reads as zeros
  EXPECT_MESSAGE(error_of([&] { read_plan_file(path); }), "is larger than 1073741824 bytes");
  std::filesystem::remove(path);
}

// ---- scale ------------------------------------------------------------------------------

TEST(Scale, HundredThousandSequencesOn4096Gpus) {
  // packed-dp (the fastest planner) on 512 nodes x 8 H100: seeded lengths up to 16 Ki
  // tokens, ~8 x 10^8 tokens in all; the plan validates and simulates above the bound.
  const auto cost = analytical("h100", 512);
  ASSERT_EQ(cost->cluster().ranks(), 4096);
  std::uint64_t state = 42;
  std::vector<Tokens> lengths(100'000);
  for (Tokens& length : lengths) length = 1 + static_cast<Tokens>(uniform_below(state, 16'000));
  const Batch batch = make_batch(lengths);
  const auto start = std::chrono::steady_clock::now();
  const Plan plan = find_planner("packed-dp").plan(batch, *cost, {}, SimulatorEvaluator(*cost));
  const SimulationReport report = simulate(plan, *cost);  // validates first
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(report.step_time_s, report.lower_bound.time_s * (1 - 1e-9));
  EXPECT_EQ(report.ranks.size(), 4096u);
  std::printf(
      "packed-dp: 100,000 sequences on 4,096 GPUs, %zu micro-batches, planned and "
      "simulated in %.2f s\n",
      plan.micro_batches.size(), seconds);
}

}  // namespace
}  // namespace ballast
