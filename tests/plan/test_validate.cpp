// validate() and require_valid(): a valid plan of every scheme passes; each invariant,
// broken once by hand, is reported with its location in plain words.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ballast/error.hpp"
#include "ballast/plan.hpp"
#include "ballast/tensor_parallel.hpp"
#include "plan/plan_fixtures.hpp"

namespace ballast {
namespace {

using testing::base_plan;
using testing::fake_cost;
using testing::local_group;
using testing::split_group;

std::string violation(const Plan& plan) {
  const auto cost = fake_cost();
  const ValidationResult result = validate(plan, cost);
  EXPECT_FALSE(result.ok) << "the plan should be invalid";
  return result.message;
}

void expect_valid(const Plan& plan) {
  const auto cost = fake_cost();
  const ValidationResult result = validate(plan, cost);
  EXPECT_TRUE(result.ok) << result.message;
}

TEST(Validate, BasePlanWithEverySchemeIsValid) { expect_valid(base_plan()); }

TEST(Validate, EachSchemeAloneIsValid) {
  for (Scheme scheme : {Scheme::ring, Scheme::all_gather, Scheme::ulysses}) {
    Plan plan = base_plan();
    plan.sequence_lengths_tokens = {4096, 1024};
    plan.micro_batches = {
        testing::micro_batch_of({split_group(scheme, {0, 1, 2, 3}, {{0, 4096}}),
                                 split_group(scheme, {7, 6, 5, 4}, {{1, 1024}})})};
    expect_valid(plan);
  }
  Plan local = base_plan();
  local.sequence_lengths_tokens = {10, 20};
  local.micro_batches = {testing::micro_batch_of({local_group(5, {{0, 10}, {1, 20}})})};
  expect_valid(local);
}

TEST(Validate, WrongVersion) {
  Plan plan = base_plan();
  plan.version = 2;
  EXPECT_EQ(violation(plan),
            "plan format version 2 is not supported; this ballast supports version 1");
}

TEST(Validate, ClusterOrModelDiffersFromCostModel) {
  Plan plan = base_plan();
  plan.cluster.nodes = 4;
  EXPECT_EQ(violation(plan),
            "the plan's cluster differs from the cost model's: 'nodes' is 4 in the plan but 2 "
            "in the cost model");
  plan = base_plan();
  plan.model.layers = 5;
  EXPECT_EQ(violation(plan),
            "the plan's model differs from the cost model's: 'layers' is 5 in the plan but 4 "
            "in the cost model");
  // Fields deep in the cluster and model (validate compares their JSON only when a field
  // differs): still found and named.
  plan = base_plan();
  plan.cluster.attention_forward_curve.push_back({1 << 20, 0.5, "a point the cost model lacks"});
  EXPECT_NE(violation(plan).find("the plan's cluster differs from the cost model's: "
                                 "'attention_efficiency_curve' is"),
            std::string::npos)
      << violation(plan);
  plan = base_plan();
  plan.model.provenance += " (edited)";
  EXPECT_NE(violation(plan).find("the plan's model differs from the cost model's: 'provenance' is"),
            std::string::npos)
      << violation(plan);
  // A copy of the cost model's own cluster and model is no difference.
  plan = base_plan();
  plan.cluster = Cluster(plan.cluster);
  plan.model = Model(plan.model);
  expect_valid(plan);
}

TEST(Validate, RankOutOfRangeAndRepeated) {
  Plan plan = base_plan();
  plan.micro_batches[1].groups[1].ranks = {4, 8};
  EXPECT_EQ(violation(plan),
            "micro-batch 1, group 1 (ulysses): rank 8 is outside the cluster's ranks [0, 8)");
  plan = base_plan();
  plan.micro_batches[1].groups[1].ranks = {4, 4};
  EXPECT_EQ(violation(plan), "micro-batch 1, group 1 (ulysses): rank 4 is listed twice");
}

TEST(Validate, EmptyGroupsAndMicroBatches) {
  Plan plan = base_plan();
  plan.micro_batches[0].groups[2].sequences.clear();
  EXPECT_EQ(violation(plan),
            "micro-batch 0, group 2 (ring): the group has no sequences; remove it");
  plan = base_plan();
  plan.micro_batches[0].groups[2].ranks.clear();
  EXPECT_EQ(violation(plan), "micro-batch 0, group 2 (ring): the group has no ranks");
  plan = base_plan();
  plan.micro_batches.emplace_back();
  EXPECT_EQ(violation(plan), "micro-batch 2 has no groups; remove the empty micro-batch");
}

TEST(Validate, LocalGroupWithTwoRanks) {
  Plan plan = base_plan();
  plan.micro_batches[0].groups[0].ranks = {0, 1};
  EXPECT_EQ(violation(plan),
            "micro-batch 0, group 0 (local): a local group needs exactly one rank but has 2 "
            "(ranks 0, 1)");
}

TEST(Validate, UlyssesDegreeMustDivideTheHeads) {
  Plan plan = base_plan();
  plan.micro_batches[1].groups[1] = split_group(Scheme::ulysses, {4, 5, 6}, {{5, 6000}});
  EXPECT_EQ(violation(plan),
            "micro-batch 1, group 1 (ulysses): Ulysses degree 3 cannot shard the model's 8 "
            "heads and 4 KV heads: the degree must divide the heads and either divide the KV "
            "heads or be a multiple of them (KV heads replicated); use one of the degrees 1, 2, "
            "4, 8 (or another scheme for this group)");
}

TEST(Validate, UlyssesBeyondTheKvHeadsReplicatesThem) {
  // 8 divides the 8 query heads and is a multiple of the 4 KV heads: each KV head is held
  // by 2 members (DeepSpeed-Ulysses' and USP's GQA layout).
  Plan plan = base_plan();
  plan.sequence_lengths_tokens = {8000};
  plan.micro_batches = {testing::micro_batch_of(
      {split_group(Scheme::ulysses, {0, 1, 2, 3, 4, 5, 6, 7}, {{0, 8000}})})};
  expect_valid(plan);
}

TEST(Validate, UlyssesDegreeNeitherDividingNorAMultipleOfTheKvHeadsIsRejected) {
  // 12 heads, 4 KV heads: 6 divides the heads but 6 and 4 do not divide each other, so a
  // member's 2 query heads would read parts of two KV heads.
  Model model = testing::small_model();
  model.heads = 12;
  model.hidden = 1536;
  const testing::FakeCostModel cost(testing::small_cluster(2, 4), model);
  Plan plan = base_plan();
  plan.model = model;
  plan.sequence_lengths_tokens = {6000, 64, 64};
  plan.micro_batches = {testing::micro_batch_of(
      {split_group(Scheme::ulysses, {0, 1, 2, 3, 4, 5}, {{0, 6000}}), local_group(6, {{1, 64}}),
       local_group(7, {{2, 64}})})};
  const ValidationResult result = validate(plan, cost);
  EXPECT_FALSE(result.ok);
  EXPECT_EQ(result.message,
            "micro-batch 0, group 0 (ulysses): Ulysses degree 6 cannot shard the model's 12 "
            "heads and 4 KV heads: the degree must divide the heads and either divide the KV "
            "heads or be a multiple of them (KV heads replicated); use one of the degrees 1, 2, "
            "4, 12 (or another scheme for this group)");
  // 3 divides 12 but neither divides 4 nor is a multiple of it; 4 = the KV heads is fine.
  plan.micro_batches[0].groups[0] = split_group(Scheme::ulysses, {0, 1, 2}, {{0, 6000}});
  EXPECT_FALSE(validate(plan, cost).ok);
  plan.micro_batches[0].groups[0] = split_group(Scheme::ulysses, {0, 1, 2, 3}, {{0, 6000}});
  EXPECT_TRUE(validate(plan, cost).ok) << validate(plan, cost).message;
}

/// A usp group of `ranks` in stages of `degree`, zigzag chunks over its ranks.
AttentionGroup usp_group(std::vector<int> ranks, int degree, const testing::Placed& sequences) {
  AttentionGroup group = split_group(Scheme::usp, std::move(ranks), sequences);
  group.ulysses_degree = degree;
  return group;
}

Plan usp_plan(AttentionGroup group) {
  Plan plan = base_plan();
  plan.sequence_lengths_tokens = {4096};
  plan.micro_batches = {testing::micro_batch_of({std::move(group)})};
  return plan;
}

TEST(Validate, UspStagesOfAnAllowedUlyssesDegree) {
  // 8 heads, 4 KV heads: stages of 2 (4 stages) or 4 (2 stages) on 8 ranks, of 2 on 4.
  expect_valid(usp_plan(usp_group({0, 1, 2, 3, 4, 5, 6, 7}, 2, {{0, 4096}})));
  expect_valid(usp_plan(usp_group({0, 1, 2, 3, 4, 5, 6, 7}, 4, {{0, 4096}})));
  expect_valid(usp_plan(usp_group({0, 4, 1, 5}, 2, {{0, 4096}})));
  Plan padded = usp_plan(usp_group({0, 1, 2, 3}, 2, {{0, 4104}}));  // 8 = 2 x 4 tokens: too many
  EXPECT_EQ(violation(padded),
            "micro-batch 0, group 0 (usp): sequence 0 is padded from 4096 to 4104 tokens; "
            "padding must stay below 2 x group size = 8 tokens");
}

TEST(Validate, UspNeedsTwoStagesOfTwoRanksOrMore) {
  const std::string shape =
      "micro-batch 0, group 0 (usp): a usp group of 4 ranks needs a ulysses_degree (ranks per "
      "stage) of at least 2 that divides 4 and leaves at least 2 stages, not {}; write a group "
      "of one stage as ulysses and a group with ulysses_degree 1 as ring";
  for (int degree : {1, 3, 4, 0}) {
    EXPECT_EQ(violation(usp_plan(usp_group({0, 1, 2, 3}, degree, {{0, 4096}}))),
              fmt::format(fmt::runtime(shape), degree));
  }
  // 6 ranks in stages of 3: 3 does not divide the 8 heads.
  EXPECT_EQ(
      violation(usp_plan(usp_group({0, 1, 2, 3, 4, 5}, 3, {{0, 4104}}))),
      "micro-batch 0, group 0 (usp): Ulysses degree 3 cannot shard the model's 8 heads and 4 KV "
      "heads: the degree must divide the heads and either divide the KV heads or be a multiple "
      "of them (KV heads replicated); use one of the degrees 1, 2, 4, 8 (or another scheme for "
      "this group)");
  AttentionGroup routed = usp_group({0, 1, 4, 5}, 2, {{0, 4096}});
  routed.routing_proxies = 2;
  EXPECT_EQ(violation(usp_plan(routed)),
            "micro-batch 0, group 0 (usp): usp groups do not route their ring hops through "
            "proxies (routing_proxies 2); set routing_proxies to 1");
  AttentionGroup ring = split_group(Scheme::ring, {0, 1, 2, 3}, {{0, 4096}});
  ring.ulysses_degree = 2;
  EXPECT_EQ(violation(usp_plan(ring)),
            "micro-batch 0, group 0 (ring): ulysses_degree 2 is only for usp groups; remove it "
            "(or make the group usp)");
}

TEST(UlyssesRule, DegreesByHand) {
  Model model = testing::small_model();  // 8 heads, 4 KV heads
  EXPECT_EQ(allowed_ulysses_degrees(model, 1, 64), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(allowed_ulysses_degrees(model, 2, 64), (std::vector<int>{1, 2, 4}));  // h 4, k 2
  EXPECT_EQ(allowed_ulysses_degrees(model, 4, 64), (std::vector<int>{1, 2}));     // h 2, k 1
  EXPECT_EQ(allowed_ulysses_degrees(model, 1, 4), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(ulysses_kv_replication(model, 1, 4), 1);
  EXPECT_EQ(ulysses_kv_replication(model, 1, 8), 2);
  EXPECT_EQ(ulysses_kv_replication(model, 2, 4), 2);
  EXPECT_EQ(ulysses_kv_replication(model, 4, 2), 2);
  EXPECT_FALSE(ulysses_degree_allowed(model, 1, 0));
  EXPECT_FALSE(ulysses_degree_allowed(model, 3, 1));  // 3 does not divide the heads
  // 4,096 QKV bytes per token; at degree 8 each KV head (2,048 K and V bytes per token
  // over the 4 heads) travels twice: 4,096 + 2,048.
  EXPECT_EQ(ulysses_qkv_bytes_per_token(model, 1, 4), 4096);
  EXPECT_EQ(ulysses_qkv_bytes_per_token(model, 1, 8), 6144);
  EXPECT_EQ(ulysses_qkv_bytes_per_token(model, 4, 2), 6144);
  // 40 heads, 40 KV heads (Llama-2-13B): every divisor of 40, powers of two or not.
  model.heads = 40;
  model.kv_heads = 40;
  model.hidden = 5120;
  EXPECT_EQ(allowed_ulysses_degrees(model, 1, 64), (std::vector<int>{1, 2, 4, 5, 8, 10, 20, 40}));
  // 12 heads, 4 KV heads: 3 and 6 split a KV head's query heads across members.
  model.heads = 12;
  model.kv_heads = 4;
  EXPECT_EQ(allowed_ulysses_degrees(model, 1, 64), (std::vector<int>{1, 2, 4, 12}));
  // Multi-query attention (1 KV head): every divisor of the heads, each member holding it.
  model.kv_heads = 1;
  EXPECT_EQ(allowed_ulysses_degrees(model, 1, 64), (std::vector<int>{1, 2, 3, 4, 6, 12}));
  EXPECT_EQ(ulysses_kv_replication(model, 1, 6), 6);
}

TEST(Validate, TensorParallelMustMatchTheCostModelAndLimitsUlysses) {
  // 2 nodes x 8 GPUs as 2 x 4 TP groups of 2; the model's 4 KV heads leave 2 per GPU.
  const Cluster units = tensor_parallel_units(testing::small_cluster(2, 8), testing::small_model(), 2);
  const testing::FakeCostModel cost(units, testing::small_model());
  Plan plan = base_plan();
  plan.cluster = units;
  plan.sequence_lengths_tokens = {4096, 1024};
  plan.micro_batches = {testing::micro_batch_of({split_group(Scheme::ulysses, {0, 1}, {{0, 4096}}),
                                                 local_group(4, {{1, 1024}})})};
  const ValidationResult valid = validate(plan, cost);
  EXPECT_TRUE(valid.ok) << valid.message;
  // Degree 4 at TP 2 splits each GPU's 4 heads 4 ways, replicating its 2 KV heads twice.
  plan.micro_batches[0].groups[0] = split_group(Scheme::ulysses, {0, 1, 2, 3}, {{0, 4096}});
  const ValidationResult replicated = validate(plan, cost);
  EXPECT_TRUE(replicated.ok) << replicated.message;
  // Degree 3 does not divide a GPU's 4 heads.
  plan.micro_batches[0].groups[0] = split_group(Scheme::ulysses, {0, 1, 2}, {{0, 4096}});
  const ValidationResult ulysses = validate(plan, cost);
  EXPECT_FALSE(ulysses.ok);
  EXPECT_EQ(ulysses.message,
            "micro-batch 0, group 0 (ulysses): Ulysses degree 3 cannot shard the 4 heads and 2 "
            "KV heads of each GPU at tensor parallelism 2: the degree must divide the heads and "
            "either divide the KV heads or be a multiple of them (KV heads replicated); use one "
            "of the degrees 1, 2, 4 (or another scheme for this group)");
  // Memory per GPU, as simulate reports it: a TP group's bytes are shared by its GPUs.
  plan.sequence_lengths_tokens[1] = 400000;
  plan.micro_batches[0].groups = {split_group(Scheme::ulysses, {0, 1}, {{0, 4096}}),
                                  local_group(4, {{1, 400000}})};
  const ValidationResult overflow = validate(plan, cost);
  EXPECT_FALSE(overflow.ok);
  EXPECT_TRUE(overflow.message.starts_with("rank 4 (a TP group of 2 GPUs) needs ")) << overflow.message;
  EXPECT_NE(overflow.message.find(" GiB per GPU in micro-batch 0 but the limit is 72.0 GiB per GPU ("),
            std::string::npos)
      << overflow.message;
  plan.sequence_lengths_tokens[1] = 1024;
  plan.micro_batches[0].groups = {split_group(Scheme::ulysses, {0, 1}, {{0, 4096}}),
                                  local_group(4, {{1, 1024}})};
  // A plan of TP groups against a cost model without TP (and back).
  const testing::FakeCostModel plain(testing::small_cluster(2, 8), testing::small_model());
  const ValidationResult mismatch = validate(plan, plain);
  EXPECT_FALSE(mismatch.ok);
  EXPECT_EQ(mismatch.message,
            "the plan is for tensor parallelism 2 (cluster field tensor_parallel.gpus) but the "
            "cost model's cluster has 1; plan and simulate with the same --tp");
}

TEST(Validate, RoutingProxiesInRange) {
  Plan plan = base_plan();
  plan.micro_batches[0].groups[2].routing_proxies = 5;
  EXPECT_EQ(violation(plan),
            "micro-batch 0, group 2 (ring): routing_proxies 5 is outside [1, 4] (at least 1, at "
            "most the GPUs per node)");
  plan.micro_batches[0].groups[2].routing_proxies = 4;
  expect_valid(plan);
  plan.micro_batches[0].groups[2].routing_proxies = 0;
  EXPECT_NE(violation(plan).find("routing_proxies 0 is outside"), std::string::npos);
}

TEST(Validate, RoutingChunksInRange) {
  Plan plan = base_plan();
  plan.micro_batches[0].groups[2].routing_chunks = kMaxRoutingChunks + 1;
  EXPECT_EQ(violation(plan),
            "micro-batch 0, group 2 (ring): routing_chunks 65 is outside [1, 64] (at least 1; "
            "beyond 64 chunks the per-chunk latency dominates)");
  plan.micro_batches[0].groups[2].routing_chunks = kMaxRoutingChunks;
  expect_valid(plan);
  plan.micro_batches[0].groups[2].routing_chunks = 0;
  EXPECT_NE(violation(plan).find("routing_chunks 0 is outside"), std::string::npos);
  // Checked with routing_proxies, group by group, proxies first.
  plan.micro_batches[0].groups[2].routing_proxies = 5;
  EXPECT_NE(violation(plan).find("routing_proxies 5 is outside"), std::string::npos);
}

TEST(Validate, NonPositiveLength) {
  Plan plan = base_plan();
  plan.sequence_lengths_tokens[6] = 0;
  EXPECT_EQ(violation(plan), "sequence 6 has length 0 tokens; lengths must be positive");
}

TEST(Validate, SequenceIdOutOfRange) {
  Plan plan = base_plan();
  plan.micro_batches[0].groups[0].sequences[0].sequence_id = 8;
  EXPECT_EQ(violation(plan),
            "micro-batch 0, group 0 (local): sequence id 8 is out of range; the plan has 8 "
            "sequences");
}

TEST(Validate, SequenceInTwoGroups) {
  Plan plan = base_plan();
  plan.micro_batches[1].groups[2].sequences.push_back({0, 1000, {{6, 0, 1000}}});
  EXPECT_EQ(violation(plan),
            "sequence 0 appears in two groups: micro-batch 0, group 0 (local) and micro-batch 1, "
            "group 2 (local)");
}

TEST(Validate, SequenceTwiceInOneGroup) {
  Plan plan = base_plan();
  plan.micro_batches[0].groups[1].sequences.push_back({6, 800, {{1, 0, 800}}});
  EXPECT_EQ(violation(plan),
            "micro-batch 0, group 1 (local): sequence 6 appears twice in this group");
}

TEST(Validate, SequenceMissing) {
  Plan plan = base_plan();
  plan.micro_batches[0].groups[1].sequences.pop_back();  // sequence 6
  EXPECT_EQ(violation(plan), "sequence 6 (800 tokens) appears in no group");
}

TEST(Validate, MissingTokens) {
  Plan plan = base_plan();
  // The ring's zigzag chunk [750, 1500) of sequence 2 shrinks to [750, 1400).
  auto& chunks = plan.micro_batches[0].groups[2].sequences[0].chunks;
  ASSERT_EQ(chunks[2].begin_tokens, 750);
  chunks[2].end_tokens = 1400;
  EXPECT_EQ(violation(plan),
            "micro-batch 0, group 2 (ring): sequence 2 is missing tokens [1400, 1500)");
  plan = base_plan();
  plan.micro_batches[0].groups[0].sequences[0].chunks[0].end_tokens = 900;
  EXPECT_EQ(violation(plan),
            "micro-batch 0, group 0 (local): sequence 0 is missing tokens [900, 1000)");
}

TEST(Validate, OverlappingChunks) {
  Plan plan = base_plan();
  auto& chunks = plan.micro_batches[0].groups[3].sequences[0].chunks;  // ulysses, 4 x 1000
  chunks[1].begin_tokens = 900;
  EXPECT_EQ(violation(plan),
            "micro-batch 0, group 3 (ulysses): sequence 3 has tokens [900, 1000) in more than "
            "one chunk");
}

TEST(Validate, ChunkBounds) {
  Plan plan = base_plan();
  plan.micro_batches[0].groups[0].sequences[0].chunks[0].end_tokens = 1001;
  EXPECT_EQ(violation(plan),
            "micro-batch 0, group 0 (local): chunk 0 of sequence 0 [0, 1001) lies outside its "
            "padded length [0, 1000)");
  plan = base_plan();
  plan.micro_batches[0].groups[0].sequences[0].chunks.push_back({0, 500, 500});
  EXPECT_EQ(violation(plan),
            "micro-batch 0, group 0 (local): chunk 1 of sequence 0 is empty or reversed: "
            "[500, 500)");
  plan = base_plan();
  plan.micro_batches[0].groups[0].sequences[0].chunks.clear();
  EXPECT_EQ(violation(plan), "micro-batch 0, group 0 (local): sequence 0 has no chunks");
}

TEST(Validate, ChunkOnForeignRank) {
  Plan plan = base_plan();
  plan.micro_batches[0].groups[2].sequences[0].chunks[1].rank = 5;
  EXPECT_EQ(violation(plan),
            "micro-batch 0, group 2 (ring): chunk 1 of sequence 2 is on rank 5, which is not in "
            "the group (ranks 2, 3)");
}

TEST(Validate, DataPaddingOnLocalAndUlyssesGroupsBelowTheLimit) {
  // Padding to a multiple (static-ulysses:pad=N) is allowed below kMaxPadMultipleTokens.
  Plan plan = base_plan();
  plan.micro_batches[0].groups[0] = local_group(0, {{0, 1000 + kMaxPadMultipleTokens - 1}});
  expect_valid(plan);
  plan.micro_batches[0].groups[0] = local_group(0, {{0, 1000 + kMaxPadMultipleTokens}});
  EXPECT_EQ(violation(plan),
            "micro-batch 0, group 0 (local): sequence 0 is padded from 1000 to 2024 tokens; "
            "padding in local groups must stay below 1024 tokens");
  plan = base_plan();
  plan.micro_batches[0].groups[3] = split_group(Scheme::ulysses, {4, 5, 6, 7}, {{3, 4004}});
  expect_valid(plan);
  plan.micro_batches[0].groups[3] = split_group(Scheme::ulysses, {4, 5, 6, 7}, {{3, 5024}});
  EXPECT_NE(violation(plan).find("padding in ulysses groups must stay below 1024 tokens"),
            std::string::npos);
}

TEST(Validate, PaddingBelowTwiceTheGroupSize) {
  Plan plan = base_plan();
  plan.sequence_lengths_tokens[2] = 2997;  // padded to 3000 on a ring of 2: 3 < 4, fine
  expect_valid(plan);
  plan.sequence_lengths_tokens[2] = 2996;  // 4 padding tokens: too many
  EXPECT_EQ(violation(plan),
            "micro-batch 0, group 2 (ring): sequence 2 is padded from 2996 to 3000 tokens; "
            "padding must stay below 2 x group size = 4 tokens");
  plan = base_plan();
  plan.sequence_lengths_tokens[2] = 3001;
  EXPECT_EQ(violation(plan),
            "micro-batch 0, group 2 (ring): sequence 2 has padded length 3000 tokens, less than "
            "its length 3001");
}

TEST(Validate, ExplicitQueuesEqualToTheDefaultAreValid) {
  Plan plan = base_plan();
  for (auto& micro_batch : plan.micro_batches) {
    micro_batch.queues = effective_queues(micro_batch, plan.cluster.ranks());
  }
  expect_valid(plan);
}

TEST(Validate, QueueMissesOrAddsAGroup) {
  Plan plan = base_plan();
  auto& micro_batch = plan.micro_batches[0];
  micro_batch.queues = effective_queues(micro_batch, 8);
  micro_batch.queues[3].clear();
  EXPECT_EQ(violation(plan),
            "micro-batch 0: the queue of rank 3 misses group 2, which contains rank 3");
  micro_batch.queues[3] = {2, 3};
  EXPECT_EQ(violation(plan),
            "micro-batch 0: the queue of rank 3 lists group 3, which does not contain rank 3");
  micro_batch.queues[3] = {2, 2};
  EXPECT_EQ(violation(plan), "micro-batch 0: the queue of rank 3 lists group 2 twice");
  micro_batch.queues[3] = {9};
  EXPECT_EQ(violation(plan),
            "micro-batch 0: the queue of rank 3 names group 9, but the micro-batch has 4 groups");
  micro_batch.queues.pop_back();
  EXPECT_EQ(violation(plan),
            "micro-batch 0: queues has 7 entries but the cluster has 8 ranks; give one queue per "
            "rank, or none");
}

/// Overlapping groups (Zeppelin): sequence 0 on a ring over ranks {0, 1}, sequence 1 on a
/// ring over {1, 2}, sequence 2 on a ring over {2, 0}, each rank also running a local group.
Plan overlapping_plan() {
  Plan plan = base_plan();
  plan.sequence_lengths_tokens = {400, 400, 400, 100};
  MicroBatch micro_batch;
  micro_batch.groups = {split_group(Scheme::ring, {0, 1}, {{0, 400}}),
                        split_group(Scheme::ring, {1, 2}, {{1, 400}}),
                        split_group(Scheme::ring, {2, 0}, {{2, 400}}), local_group(0, {{3, 100}})};
  plan.micro_batches = {micro_batch};
  return plan;
}

TEST(Validate, QueueCycleOfTwoGroups) {
  Plan plan = overlapping_plan();
  auto& micro_batch = plan.micro_batches[0];
  micro_batch.queues = effective_queues(micro_batch, 8);  // rank 0: 0, 2, 3; rank 1: 0, 1
  expect_valid(plan);
  micro_batch.queues[1] = {1, 0};  // rank 2 runs 1 before 2, rank 0 runs 0 before 2: fine
  expect_valid(plan);
  micro_batch.queues[2] = {2, 1};  // 1 -> 0 (rank 1) -> 2 (rank 0) -> 1 (rank 2)
  EXPECT_EQ(violation(plan),
            "micro-batch 0: queues deadlock: rank 0 runs group 0 before group 2, rank 2 runs "
            "group 2 before group 1, and rank 1 runs group 1 before group 0");
  micro_batch.queues.clear();
  micro_batch.groups[1].ranks = {0, 1, 2};
  micro_batch.queues = effective_queues(micro_batch, 8);  // rank 0: 0, 1, 2, 3
  micro_batch.queues[1] = {1, 0};
  EXPECT_EQ(violation(plan),
            "micro-batch 0: queues deadlock: rank 0 runs group 0 before group 1 but rank 1 runs "
            "1 before 0");
}

TEST(Validate, LinearLayoutBalancesTokens) {
  Plan plan = base_plan();
  // Micro-batch 0 holds 1000 + 2800 + 3000 + 4000 tokens; move 1000 of sequence 1 to rank 0.
  auto& layout = plan.micro_batches[0].linear_layout;
  layout = {{0, 0, 0, 1000},    {0, 1, 0, 1000},    {1, 1, 1000, 2000}, {1, 6, 0, 800},
            {2, 2, 0, 1500},    {3, 2, 1500, 3000}, {4, 3, 0, 1000},    {5, 3, 1000, 2000},
            {6, 3, 2000, 3000}, {7, 3, 3000, 4000}};
  expect_valid(plan);
  layout[1].end_tokens = 900;
  EXPECT_EQ(violation(plan),
            "micro-batch 0: the linear layout of sequence 1 is missing tokens [900, 1000)");
  layout[1].end_tokens = 1100;
  EXPECT_EQ(violation(plan),
            "micro-batch 0: the linear layout of sequence 1 has tokens [1000, 1100) in more "
            "than one slice");
  layout[1].end_tokens = 1000;
  layout.pop_back();
  EXPECT_EQ(violation(plan),
            "micro-batch 0: the linear layout of sequence 3 is missing tokens [3000, 4000)");
  layout.push_back({7, 4, 0, 5000});
  EXPECT_EQ(violation(plan),
            "micro-batch 0: linear slice 9 holds sequence 4, which is not in this micro-batch's "
            "groups");
}

TEST(Validate, LinearLayoutExcludesPadding) {
  Plan plan = base_plan();
  plan.sequence_lengths_tokens[4] = 4998;  // padded to 5000 in the all_gather group
  expect_valid(plan);
  plan.micro_batches[1].linear_layout = {
      {0, 4, 0, 5000}, {4, 5, 0, 3000}, {5, 5, 3000, 6000}, {6, 7, 0, 64}};
  EXPECT_EQ(violation(plan),
            "micro-batch 1: linear slice 0 [0, 5000) lies outside sequence 4's 4998 tokens "
            "(padding is not part of the linear layout)");
  plan.micro_batches[1].linear_layout[0].end_tokens = 4998;
  expect_valid(plan);
}

TEST(Validate, MemoryOverflowNamesTheNumbers) {
  Plan plan = base_plan();
  plan.sequence_lengths_tokens[0] = 80000;
  plan.micro_batches[0].groups[0] = local_group(0, {{0, 80000}});
  // 2e9 bytes of model states (1e9 parameters x 16 B / 8 ranks) + 80,000 x 1 MiB.
  EXPECT_EQ(violation(plan),
            "rank 0 needs 80.0 GiB in micro-batch 0 but the limit is 72.0 GiB (model states "
            "1.9 GiB + 80,000 activation tokens)");
  // Split over a ring of ranks 0..3 it fits; the message names the ring's KV buffers when
  // it does not.
  plan.micro_batches[0].groups = {split_group(Scheme::ring, {0, 1, 2, 3}, {{0, 80000}}),
                                  split_group(Scheme::ring, {4, 5, 6, 7}, {{1, 2000}}),
                                  split_group(Scheme::ring, {4, 5, 6, 7}, {{2, 3000}}),
                                  split_group(Scheme::ulysses, {4, 5, 6, 7}, {{3, 4000}}),
                                  local_group(7, {{6, 800}})};
  expect_valid(plan);
}

TEST(Validate, MemoryOverflowWithBuffers) {
  Plan plan = base_plan();
  plan.sequence_lengths_tokens = {288000};
  plan.micro_batches = {
      testing::micro_batch_of({split_group(Scheme::all_gather, {0, 1, 2, 3}, {{0, 288000}})})};
  // 2e9 B of model states + 72,000 tokens x 1 MiB + the all-gathered KV of 288,000 tokens
  // x 2,048 B (589,824,000 B) = 78,087,296,000 B.
  EXPECT_EQ(violation(plan),
            "rank 0 needs 72.7 GiB in micro-batch 0 but the limit is 72.0 GiB (model states "
            "1.9 GiB + 72,000 activation tokens + 0.55 GiB attention buffers)");
}

TEST(Validate, RealPresetsWithTheAnalyticalCostModel) {
  Plan plan = base_plan();
  plan.cluster = cluster_preset("h200");
  plan.cluster.nodes = 1;  // the base plan uses 8 ranks
  plan.model = model_preset("llama-7b");
  const AnalyticalCostModel cost(plan.cluster, plan.model);
  const ValidationResult result = validate(plan, cost);
  EXPECT_TRUE(result.ok) << result.message;
  const AnalyticalCostModel other_cluster(cluster_preset("h200"), plan.model);
  EXPECT_EQ(validate(plan, other_cluster).message,
            "the plan's cluster differs from the cost model's: 'nodes' is 1 in the plan but 8 in "
            "the cost model");
}

TEST(Validate, RequireValidThrowsWithTheSource) {
  Plan plan = base_plan();
  const auto cost = fake_cost();
  EXPECT_NO_THROW(require_valid(plan, cost, "p.json"));
  plan.micro_batches[0].groups[1].sequences.pop_back();
  try {
    require_valid(plan, cost, "p.json");
    FAIL() << "expected InputError";
  } catch (const InputError& error) {
    EXPECT_STREQ(error.what(),
                 "plan p.json is invalid: sequence 6 (800 tokens) appears in no group");
  }
}

TEST(Validate, EffectiveQueuesDefaultToGroupOrder) {
  const Plan plan = overlapping_plan();
  const auto queues = effective_queues(plan.micro_batches[0], 8);
  ASSERT_EQ(queues.size(), 8u);
  EXPECT_EQ(queues[0], (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(queues[1], (std::vector<int>{0, 1}));
  EXPECT_EQ(queues[2], (std::vector<int>{1, 2}));
  EXPECT_TRUE(queues[3].empty());
  MicroBatch explicit_order = plan.micro_batches[0];
  explicit_order.queues = {{3, 2, 0}, {1, 0}, {2, 1}, {}, {}, {}, {}, {}};
  EXPECT_EQ(effective_queues(explicit_order, 8), explicit_order.queues);
}

}  // namespace
}  // namespace ballast
