// peak_memory_bytes_per_rank(): model states + activations of max(attention, linear)
// tokens + the largest one-layer attention buffer, per rank, maximised over micro-batches.
#include <gtest/gtest.h>

#include <limits>

#include "ballast/plan.hpp"
#include "plan/plan_fixtures.hpp"

namespace ballast {
namespace {

using testing::base_plan;
using testing::fake_cost;
using testing::local_group;
using testing::split_group;

constexpr Bytes kActivation = 1 << 20;         // small_model(): 1 MiB per token
constexpr Bytes kModelStates = 2'000'000'000;  // 1e9 parameters x 16 B / 8 ranks

TEST(Memory, FixtureConstants) {
  const auto cost = fake_cost();
  EXPECT_EQ(cost.activation_bytes_per_token(), kActivation);
  EXPECT_EQ(cost.model_state_bytes_per_rank(), kModelStates);
}

TEST(Memory, AttentionBufferPerSchemeByHand) {
  const Model model = testing::small_model();  // 2,048 KV and 4,096 QKV bytes per token
  EXPECT_EQ(attention_buffer_bytes(model, 1, Scheme::local, 1, 10, 10), 0);
  EXPECT_EQ(attention_buffer_bytes(model, 1, Scheme::ring, 4, 10, 30), 2 * 2048 * 10);
  EXPECT_EQ(attention_buffer_bytes(model, 1, Scheme::all_gather, 4, 10, 30), 2048 * 30);
  EXPECT_EQ(attention_buffer_bytes(model, 1, Scheme::ulysses, 4, 10, 30), 4096 * 8);  // ceil(30/4)
  EXPECT_EQ(attention_buffer_bytes(model, 1, Scheme::ring, 2, std::numeric_limits<Tokens>::max(), 1),
            std::numeric_limits<Bytes>::max());
}

TEST(Memory, UlyssesBeyondTheKvHeadsHoldsReplicatedKv) {
  const Model model = testing::small_model();  // 8 heads, 4 KV heads: Q 2,048, KV 2,048 B
  // Degree 8: each member holds 1 query head (256 B per token) and a whole KV head (K and
  // V, 512 B) of every group token: 768 B = 6,144 / 8 per token, sized as the rule does
  // for ceil(30 / 8) = 4 tokens per member: 6,144 x 4 (not 4,096 x 4).
  EXPECT_EQ(attention_buffer_bytes(model, 1, Scheme::ulysses, 8, 4, 30), 6144 * 4);
  // TP 2 leaves 4 heads and 2 KV heads per GPU: degree 4 replicates them twice too.
  EXPECT_EQ(attention_buffer_bytes(model, 2, Scheme::ulysses, 4, 10, 30), 6144 * 8);
  EXPECT_EQ(attention_buffer_bytes(model, 2, Scheme::ulysses, 2, 10, 30), 4096 * 15);
}

TEST(Memory, UspHoldsItsStagesUlyssesBufferAndTwoRingBlocks) {
  const Model model = testing::small_model();  // 8 heads, 4 KV heads: QKV 4,096, KV 2,048 B
  // u = 2: the stage all-to-all leaves a member 4,096 B per token of its 10 (no replica),
  // and each ring block is a stage's KV for its 2 KV heads, 1,024 B per token of the
  // stage's at most 2 x 10 tokens: 40,960 + 2 x 20,480.
  EXPECT_EQ(usp_kv_bytes_per_token(model, 1, 2), 1024);
  EXPECT_EQ(attention_buffer_bytes(model, 1, Scheme::usp, 8, 10, 80, 2), 4096 * 10 + 2 * 1024 * 20);
  // A group of 15 tokens has no stage above 15.
  EXPECT_EQ(attention_buffer_bytes(model, 1, Scheme::usp, 8, 10, 15, 2), 4096 * 10 + 2 * 1024 * 15);
  // u = 8 beyond the 4 KV heads: 6,144 B all-to-all per token, a ring block of one KV head
  // (K, V: 512 B per token).
  EXPECT_EQ(usp_kv_bytes_per_token(model, 1, 8), 512);
  EXPECT_EQ(attention_buffer_bytes(model, 1, Scheme::usp, 16, 10, 1000, 8),
            6144 * 10 + 2 * 512 * 80);
}

TEST(Memory, BasePlanByHand) {
  const auto cost = fake_cost();
  const Bytes kv = cost.model().kv_bytes_per_token();
  const Bytes qkv = cost.model().qkv_bytes_per_token();
  const auto peak = peak_memory_bytes_per_rank(base_plan(), cost);
  ASSERT_EQ(peak.size(), 8u);
  // Rank 0: 1,000 local tokens in micro-batch 0; 1,250 tokens of the all-gather group
  // plus its whole KV (5,000 tokens) in micro-batch 1.
  EXPECT_EQ(peak[0], kModelStates + 1250 * kActivation + 5000 * kv);
  EXPECT_EQ(peak[1], kModelStates + 2800 * kActivation);  // sequences 1 and 6, local
  // Ring of 2 over 3,000 tokens: 1,500 each, two KV blocks of 1,500 tokens.
  EXPECT_EQ(peak[2], kModelStates + 1500 * kActivation + 2 * 1500 * kv);
  EXPECT_EQ(peak[3], peak[2]);
  // Ulysses of 2 over 6,000 tokens: QKV of 3,000 tokens after the all-to-all.
  EXPECT_EQ(peak[4], kModelStates + 3000 * kActivation + 3000 * qkv);
  EXPECT_EQ(peak[5], peak[4]);
  // Ulysses of 4 over 4,000 tokens in micro-batch 0 beats 64 local tokens in micro-batch 1.
  EXPECT_EQ(peak[6], kModelStates + 1000 * kActivation + 1000 * qkv);
  EXPECT_EQ(peak[7], peak[6]);
}

TEST(Memory, IdleRanksHoldModelStatesOnly) {
  Plan plan = base_plan();
  plan.sequence_lengths_tokens = {100};
  plan.micro_batches = {testing::micro_batch_of({local_group(3, {{0, 100}})})};
  const auto peak = peak_memory_bytes_per_rank(plan, fake_cost());
  for (int rank = 0; rank < 8; ++rank) {
    EXPECT_EQ(peak[rank], kModelStates + (rank == 3 ? 100 * kActivation : 0)) << rank;
  }
}

TEST(Memory, RingBufferFollowsTheLargestMember) {
  Plan plan = base_plan();
  plan.micro_batches[0].groups[2].sequences[0].chunks = {{2, 0, 2000}, {3, 2000, 3000}};
  const auto cost = fake_cost();
  const Bytes kv = cost.model().kv_bytes_per_token();
  const auto peak = peak_memory_bytes_per_rank(plan, cost);
  EXPECT_EQ(peak[2], kModelStates + 2000 * kActivation + 2 * 2000 * kv);
  // Rank 3's ring step (1,000 tokens + 2 x 2,000 KV) is below its all-gather step.
  EXPECT_EQ(peak[3], kModelStates + 1250 * kActivation + 5000 * kv);
}

TEST(Memory, UlyssesBufferRoundsUp) {
  Plan plan = base_plan();
  plan.sequence_lengths_tokens[3] = 4001;
  plan.micro_batches[0].groups[3].sequences[0].chunks = {
      {4, 0, 1001}, {5, 1001, 2001}, {6, 2001, 3001}, {7, 3001, 4001}};
  const auto cost = fake_cost();
  const Bytes qkv = cost.model().qkv_bytes_per_token();
  const auto peak = peak_memory_bytes_per_rank(plan, cost);
  EXPECT_EQ(peak[6], kModelStates + 1000 * kActivation + 1001 * qkv);  // ceil(4001 / 4)
}

TEST(Memory, LinearLayoutCountsWhenLarger) {
  Plan plan = base_plan();
  plan.micro_batches[0].linear_layout = {{0, 0, 0, 1000},   {0, 1, 0, 1000},    {1, 1, 1000, 2000},
                                         {1, 6, 0, 800},    {2, 2, 0, 1500},    {3, 2, 1500, 3000},
                                         {4, 3, 0, 1000},   {5, 3, 1000, 2000}, {6, 3, 2000, 3000},
                                         {7, 3, 3000, 4000}};
  const auto peak = peak_memory_bytes_per_rank(plan, fake_cost());
  EXPECT_EQ(peak[0], kModelStates + 2000 * kActivation);  // linear 2,000 > attention 1,000
  EXPECT_EQ(peak[1], kModelStates + 2800 * kActivation);  // attention 2,800 > linear 1,800
}

TEST(Memory, PaddingTokensCount) {
  Plan plan = base_plan();
  plan.sequence_lengths_tokens = {4001};
  plan.micro_batches = {
      testing::micro_batch_of({split_group(Scheme::ring, {0, 1, 2, 3}, {{0, 4008}})})};
  const auto cost = fake_cost();
  ASSERT_TRUE(validate(plan, cost).ok) << validate(plan, cost).message;
  const Bytes kv = cost.model().kv_bytes_per_token();
  const auto peak = peak_memory_bytes_per_rank(plan, cost);
  EXPECT_EQ(peak[0], kModelStates + 1002 * kActivation + 2 * 1002 * kv);
}

TEST(Memory, SaturatesInsteadOfWrappingOnAbsurdPlans) {
  // 5,000 local sequences of 2^31 tokens on rank 0: 2^43.3 tokens x 1 MiB per token does
  // not fit in 64 bits. The peak must saturate, never wrap around; validate() stops
  // earlier, at the batch's token limit (2^40, limits.hpp).
  const auto cost = fake_cost();
  Plan plan = base_plan();
  plan.sequence_lengths_tokens.assign(5'000, kMaxSequenceTokens);
  testing::Placed placed;
  for (std::int64_t id = 0; id < 5'000; ++id) placed.push_back({id, kMaxSequenceTokens});
  plan.micro_batches = {testing::micro_batch_of({testing::local_group(0, placed)})};
  const auto peak = peak_memory_bytes_per_rank(plan, cost);
  EXPECT_EQ(peak[0], std::numeric_limits<Bytes>::max());
  const ValidationResult result = validate(plan, cost);
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.message.find("over ballast's limit of 2^40"), std::string::npos)
      << result.message;
  // At the token limit (512 x 2^31 = 2^40 tokens) the memory check itself reports it.
  plan.sequence_lengths_tokens.resize(512);
  placed.resize(512);
  plan.micro_batches = {testing::micro_batch_of({testing::local_group(0, placed)})};
  const ValidationResult at_limit = validate(plan, cost);
  EXPECT_FALSE(at_limit.ok);
  EXPECT_NE(at_limit.message.find("rank 0 needs 1073741825"), std::string::npos)
      << at_limit.message;
}

TEST(Memory, LengthsOverTheLimitAreRejected) {
  const auto cost = fake_cost();
  Plan plan = base_plan();
  plan.sequence_lengths_tokens[0] = kMaxSequenceTokens + 1;
  const ValidationResult result = validate(plan, cost);
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.message.find("over ballast's limit of 2^31"), std::string::npos)
      << result.message;
}

}  // namespace
}  // namespace ballast
