// A plan the size of a real step (100,000 sequences on 4,096 ranks, overlapping ring and
// local groups with explicit queues) validates; no timing assertion (docs/DESIGN.md).
#include <gtest/gtest.h>

#include "ballast/plan.hpp"
#include "plan/plan_fixtures.hpp"

namespace ballast {
namespace {

using testing::FakeCostModel;
using testing::small_cluster;
using testing::small_model;

constexpr int kNodes = 512;
constexpr int kGpusPerNode = 8;
constexpr int kRanks = kNodes * kGpusPerNode;
constexpr std::int64_t kSequences = 100'000;

/// Every 8th sequence on its node's 8-rank ring (zigzag, padded to a multiple of 16), the
/// others round-robin over local groups; each rank runs its local group, then its ring.
Plan large_plan() {
  Plan plan;
  plan.strategy = "large";
  plan.cluster = small_cluster(kNodes, kGpusPerNode);
  plan.model = small_model();
  plan.cost_model = {{"family", "fake"}};
  MicroBatch micro_batch;
  for (int node = 0; node < kNodes; ++node) {
    std::vector<int> ranks;
    for (int gpu = 0; gpu < kGpusPerNode; ++gpu) ranks.push_back(node * kGpusPerNode + gpu);
    micro_batch.groups.push_back({Scheme::ring, ranks, {}, 1});
  }
  for (int rank = 0; rank < kRanks; ++rank)
    micro_batch.groups.push_back({Scheme::local, {rank}, {}, 1});
  std::int64_t local_count = 0;
  for (std::int64_t id = 0; id < kSequences; ++id) {
    const Tokens length = 64 + (id * 7919) % 2000;
    plan.sequence_lengths_tokens.push_back(length);
    if (id % 8 == 0) {
      auto& ring = micro_batch.groups[static_cast<std::size_t>((id / 8) % kNodes)];
      const Tokens padded = (length + 15) / 16 * 16;
      ring.sequences.push_back(testing::zigzag(id, padded, ring.ranks));
    } else {
      const int rank = static_cast<int>(local_count++ % kRanks);
      micro_batch.groups[static_cast<std::size_t>(kNodes + rank)].sequences.push_back(
          {id, length, {{rank, 0, length}}});
    }
  }
  for (int rank = 0; rank < kRanks; ++rank) {
    micro_batch.queues.push_back({kNodes + rank, rank / kGpusPerNode});
  }
  plan.micro_batches = {std::move(micro_batch)};
  return plan;
}

TEST(LargePlan, ValidatesAndMeasuresMemory) {
  Plan plan = large_plan();
  const FakeCostModel cost(small_cluster(kNodes, kGpusPerNode), small_model());
  const ValidationResult result = validate(plan, cost);
  EXPECT_TRUE(result.ok) << result.message;
  EXPECT_EQ(peak_memory_bytes_per_rank(plan, cost).size(), static_cast<std::size_t>(kRanks));
  // One broken chunk among millions of tokens is still found and located.
  plan.micro_batches[0].groups[kNodes - 1].sequences.back().chunks.back().end_tokens -= 1;
  const ValidationResult broken = validate(plan, cost);
  EXPECT_FALSE(broken.ok);
  EXPECT_NE(broken.message.find("micro-batch 0, group 511 (ring): sequence"), std::string::npos)
      << broken.message;
}

}  // namespace
}  // namespace ballast
