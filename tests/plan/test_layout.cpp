// Per-rank layouts and the remap's transfers against a token-by-token reference.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "ballast/error.hpp"
#include "ballast/plan_layout.hpp"
#include "plan_fixtures.hpp"

namespace ballast {
namespace {

using testing::base_plan;
using Token = std::pair<std::int64_t, Tokens>;  // (sequence id, position)

std::vector<Token> expand(const std::vector<TokenRange>& ranges) {
  std::vector<Token> tokens;
  for (const TokenRange& r : ranges) {
    EXPECT_LT(r.begin_tokens, r.end_tokens);
    for (Tokens p = r.begin_tokens; p < r.end_tokens; ++p) tokens.emplace_back(r.sequence_id, p);
  }
  return tokens;
}

/// Reference: per token, the rank holding it in the linear layout; each destination's
/// attention tokens in order, tagged with their source, merged into maximal runs.
std::vector<LayoutTransfer> reference_transfers(const Plan& plan, int micro_batch) {
  std::map<Token, int> owner;
  for (int r = 0; r < plan.cluster.ranks(); ++r) {
    for (const Token& t : expand(linear_layout(plan, micro_batch, r))) owner[t] = r;
  }
  std::vector<LayoutTransfer> transfers;
  for (int dst = 0; dst < plan.cluster.ranks(); ++dst) {
    for (const TokenRange& range : attention_layout(plan, micro_batch, dst)) {
      for (Tokens p = range.begin_tokens; p < range.end_tokens; ++p) {
        const int src = owner.at({range.sequence_id, p});
        if (!transfers.empty() && p != range.begin_tokens && transfers.back().src_rank == src &&
            transfers.back().end_tokens == p) {
          ++transfers.back().end_tokens;
        } else {
          transfers.push_back({src, dst, range.sequence_id, p, p + 1});
        }
      }
    }
  }
  return transfers;
}

auto as_tuple(const LayoutTransfer& t) {
  return std::tuple(t.src_rank, t.dst_rank, t.sequence_id, t.begin_tokens, t.end_tokens);
}

void expect_same(const std::vector<LayoutTransfer>& got, const std::vector<LayoutTransfer>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(as_tuple(got[i]), as_tuple(want[i])) << i;
}

TEST(PlanLayout, AttentionLayoutFollowsQueuesAndDropsPadding) {
  Plan plan = base_plan();
  // Rank 1 in micro-batch 0: local group g1 with sequences 1 then 6.
  const auto r1 = attention_layout(plan, 0, 1);
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_EQ(std::tuple(r1[0].sequence_id, r1[0].begin_tokens, r1[0].end_tokens, r1[0].group),
            std::tuple(std::int64_t{1}, Tokens{0}, Tokens{2000}, 1));
  EXPECT_EQ(std::tuple(r1[1].sequence_id, r1[1].end_tokens), std::tuple(std::int64_t{6}, Tokens{800}));
  // Ring [2, 3] over 3,000 tokens: zigzag chunks 0 and 3 on rank 2.
  const auto r2 = attention_layout(plan, 0, 2);
  ASSERT_EQ(r2.size(), 2u);
  EXPECT_EQ(std::pair(r2[0].begin_tokens, r2[0].end_tokens), std::pair(Tokens{0}, Tokens{750}));
  EXPECT_EQ(std::pair(r2[1].begin_tokens, r2[1].end_tokens), std::pair(Tokens{2250}, Tokens{3000}));
  // Padding: sequence 2 padded to 3,004 carries only 3,000 real tokens; the chunk past the
  // end is dropped and the last is clipped.
  plan.sequence_lengths_tokens[2] = 2999;
  const auto clipped = attention_layout(plan, 0, 2);
  EXPECT_EQ(clipped.back().end_tokens, 2999);
  // Without a remap the linear layout is the attention layout.
  EXPECT_EQ(expand(linear_layout(plan, 1, 0)), expand(attention_layout(plan, 1, 0)));
}

TEST(PlanLayout, WithoutRemapEveryPieceStays) {
  const Plan plan = base_plan();
  for (int m = 0; m < 2; ++m) {
    const auto transfers = remap_transfers(plan, m);
    for (const LayoutTransfer& t : transfers) EXPECT_EQ(t.src_rank, t.dst_rank);
    expect_same(transfers, reference_transfers(plan, m));
  }
}

TEST(PlanLayout, RandomLinearLayoutsMatchTheTokenReference) {
  std::mt19937_64 random(7);
  for (int trial = 0; trial < 200; ++trial) {
    Plan plan = base_plan();
    for (std::size_t m = 0; m < plan.micro_batches.size(); ++m) {
      MicroBatch& batch = plan.micro_batches[m];
      // Cut every sequence of the micro-batch at random points and deal the pieces to random ranks.
      for (const AttentionGroup& group : batch.groups) {
        for (const SequenceChunks& sequence : group.sequences) {
          const Tokens length = plan.sequence_lengths_tokens[static_cast<std::size_t>(sequence.sequence_id)];
          Tokens begin = 0;
          while (begin < length) {
            const Tokens end = std::min(length, begin + 1 + static_cast<Tokens>(random() % 1500));
            batch.linear_layout.push_back(
                {static_cast<int>(random() % 8), sequence.sequence_id, begin, end});
            begin = end;
          }
        }
      }
      std::shuffle(batch.linear_layout.begin(), batch.linear_layout.end(), random);
      const auto got = remap_transfers(plan, static_cast<int>(m));
      expect_same(got, reference_transfers(plan, static_cast<int>(m)));
      // Each rank's linear tokens are its slices in plan order.
      for (int r = 0; r < 8; ++r) {
        Tokens expected = 0;
        for (const LinearSlice& s : batch.linear_layout) {
          if (s.rank == r) expected += s.end_tokens - s.begin_tokens;
        }
        EXPECT_EQ(static_cast<Tokens>(expand(linear_layout(plan, static_cast<int>(m), r)).size()), expected);
      }
    }
  }
}

TEST(PlanLayout, BadIndicesAndUncoveredTokensAreInputErrors) {
  Plan plan = base_plan();
  EXPECT_THROW(attention_layout(plan, 2, 0), InputError);
  EXPECT_THROW(attention_layout(plan, -1, 0), InputError);
  EXPECT_THROW(linear_layout(plan, 0, 8), InputError);
  plan.micro_batches[0].linear_layout.push_back({0, 0, 0, 10});  // covers only sequence 0's start
  EXPECT_THROW(remap_transfers(plan, 0), InputError);
}

}  // namespace
}  // namespace ballast
