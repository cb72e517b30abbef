// The routing rule of plan_layout.hpp (parts per hop, proxy GPUs, the split of a transfer)
// by hand and against a byte-by-byte reference, validate()'s membership rule for routed
// rings, and the group rules of plan.hpp shared by simulator and runtime (trace category).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ballast/plan.hpp"
#include "ballast/plan_layout.hpp"
#include "plan/plan_fixtures.hpp"

namespace ballast {
namespace {

using testing::base_plan;
using testing::fake_cost;
using testing::small_cluster;
using testing::split_group;

/// 2 nodes x 8 GPUs with 4 NICs: 2 GPUs per NIC (as a800-roce).
Cluster two_gpus_per_nic() {
  Cluster cluster = small_cluster(2, 8);
  cluster.nics_per_node = 4;
  return cluster;
}

TEST(RoutingParts, DirectInsideANodeOrWithOneProxyOrOneNic) {
  const Cluster cluster = two_gpus_per_nic();
  EXPECT_EQ(routing_parts(cluster, 4, 0, 7), 1);   // same node
  EXPECT_EQ(routing_parts(cluster, 4, 3, 3), 1);   // same rank
  EXPECT_EQ(routing_parts(cluster, 1, 0, 8), 1);   // one proxy
  EXPECT_EQ(routing_parts(cluster, 2, 0, 8), 2);
  EXPECT_EQ(routing_parts(cluster, 3, 15, 0), 3);
  EXPECT_EQ(routing_parts(cluster, 8, 0, 8), 4);   // clamped to the NICs
  Cluster one_nic = cluster;
  one_nic.nics_per_node = 1;
  EXPECT_EQ(routing_parts(one_nic, 8, 0, 8), 1);
}

TEST(RoutingProxy, PartTSitsOnTheTthOtherNicOfTheNode) {
  const Cluster cluster = two_gpus_per_nic();  // local GPU i uses NIC i / 2
  EXPECT_EQ(routing_proxy(cluster, 0, 0), 0);
  EXPECT_EQ(routing_proxy(cluster, 0, 1), 2);
  EXPECT_EQ(routing_proxy(cluster, 0, 3), 6);
  EXPECT_EQ(routing_proxy(cluster, 7, 1), 1);   // wraps inside node 0
  EXPECT_EQ(routing_proxy(cluster, 13, 2), 9);  // node 1: local 5 + 4 = 9 mod 8 = 1
  for (int rank = 0; rank < cluster.ranks(); ++rank) {
    std::vector<int> nics;
    for (int part = 0; part < cluster.nics_per_node; ++part) {
      const int proxy = routing_proxy(cluster, rank, part);
      EXPECT_TRUE(cluster.same_node(rank, proxy));
      nics.push_back(cluster.nic_of(proxy));
    }
    std::sort(nics.begin(), nics.end());
    EXPECT_EQ(std::unique(nics.begin(), nics.end()), nics.end()) << "rank " << rank;
  }
}

TEST(RoutedPartRange, ByHand) {
  using Range = std::pair<std::int64_t, std::int64_t>;
  const auto range = [](std::int64_t total, int parts, int part) {
    const PartRange r = routed_part_range(total, parts, part);
    return Range{r.begin, r.end};
  };
  EXPECT_EQ(range(12, 3, 0), Range(0, 4));
  EXPECT_EQ(range(12, 3, 2), Range(8, 12));
  EXPECT_EQ(range(10, 4, 0), Range(0, 3));
  EXPECT_EQ(range(10, 4, 3), Range(9, 10));
  EXPECT_EQ(range(1, 4, 0), Range(0, 1));
  EXPECT_EQ(range(1, 4, 2), Range(1, 1));  // empty
  EXPECT_EQ(range(0, 2, 1), Range(0, 0));
  EXPECT_EQ(range(7, 1, 0), Range(0, 7));
}

TEST(RoutedPartRange, PartsTileTheTransferAsAReferenceDeals) {
  // Reference: element x belongs to part x / ceil(total / parts).
  std::mt19937_64 random(15);
  for (int trial = 0; trial < 500; ++trial) {
    const std::int64_t total = static_cast<std::int64_t>(random() % 200);
    const int parts = 1 + static_cast<int>(random() % 8);
    const std::int64_t share = (total + parts - 1) / parts;
    std::vector<int> owner(static_cast<std::size_t>(total), -1);
    for (int part = 0; part < parts; ++part) {
      const PartRange range = routed_part_range(total, parts, part);
      ASSERT_LE(range.begin, range.end);
      EXPECT_LE(range.size(), share);
      for (std::int64_t x = range.begin; x < range.end; ++x) {
        ASSERT_EQ(owner[static_cast<std::size_t>(x)], -1);
        owner[static_cast<std::size_t>(x)] = part;
      }
    }
    for (std::int64_t x = 0; x < total; ++x) {
      EXPECT_EQ(owner[static_cast<std::size_t>(x)], x / share) << total << " / " << parts;
    }
  }
}

/// small_cluster(): 2 nodes x 4 GPUs, 4 NICs per node (one per GPU).
Plan ring_plan(const std::vector<int>& ranks, int routing_proxies) {
  Plan plan = base_plan();
  plan.sequence_lengths_tokens = {4096};
  AttentionGroup ring = split_group(Scheme::ring, ranks, {{0, 4096}});
  ring.routing_proxies = routing_proxies;
  plan.micro_batches = {testing::micro_batch_of({ring})};
  return plan;
}

ValidationResult validated(const Plan& plan) { return validate(plan, fake_cost()); }

TEST(ValidateRouting, RoutedRingOverHalfOfTwoNodesIsRejected) {
  // Hop 1 -> 4 in 2 parts: part 1 goes through rank 2 (node 0) and rank 5 (node 1); rank
  // 2 is not in the ring, so it could not relay inside the ring's step.
  const ValidationResult result = validated(ring_plan({0, 1, 4, 5}, 2));
  EXPECT_FALSE(result.ok);
  EXPECT_EQ(result.message,
            "micro-batch 0, group 0 (ring): the hop from rank 1 to rank 4 is routed in 2 parts "
            "and part 1 goes through rank 2, which is not a member of the group; set "
            "routing_proxies to 1, or use a ring over whole nodes");
  // The destination side is checked too: ring 1, 0, 4, 7 routes 0 -> 4 through 1 (a
  // member) and 5 (not one).
  EXPECT_NE(validated(ring_plan({1, 0, 4, 7}, 2))
                .message.find("the hop from rank 0 to rank 4 is routed in 2 parts and part 1 "
                              "goes through rank 5"),
            std::string::npos);
}

TEST(ValidateRouting, RoutedRingOverWholeNodesIsValid) {
  for (int proxies : {1, 2, 3, 4}) {
    SCOPED_TRACE(proxies);
    const ValidationResult result = validated(ring_plan({0, 1, 2, 3, 4, 5, 6, 7}, proxies));
    EXPECT_TRUE(result.ok) << result.message;
  }
  // Any member order, as long as both nodes are whole.
  EXPECT_TRUE(validated(ring_plan({0, 4, 1, 5, 2, 6, 3, 7}, 4)).ok);
}

TEST(ValidateRouting, OnlyRoutedRingHopsNeedMemberProxies) {
  EXPECT_TRUE(validated(ring_plan({0, 1, 4, 5}, 1)).ok);  // direct
  Plan plan = ring_plan({0, 1, 2, 3}, 4);                 // inside one node: never routed
  EXPECT_TRUE(validated(plan).ok) << validated(plan).message;
  plan = ring_plan({0, 1, 4, 5}, 2);
  plan.micro_batches[0].groups[0].scheme = Scheme::all_gather;  // only rings route
  EXPECT_TRUE(validated(plan).ok) << validated(plan).message;
  Cluster one_nic = small_cluster();  // with one NIC per node nothing is routed
  one_nic.nics_per_node = 1;
  plan = ring_plan({0, 1, 4, 5}, 2);
  plan.cluster = one_nic;
  const ValidationResult result =
      validate(plan, testing::FakeCostModel(one_nic, testing::small_model()));
  EXPECT_TRUE(result.ok) << result.message;
}

TEST(GroupCategory, SchemeAndWhetherTheGroupSpansNodes) {
  const Cluster cluster = small_cluster();
  const auto category = [&](Scheme scheme, std::vector<int> ranks) {
    AttentionGroup group;
    group.scheme = scheme;
    group.ranks = std::move(ranks);
    return std::string(group_category(group, cluster));
  };
  EXPECT_EQ(category(Scheme::local, {3}), "local");
  EXPECT_EQ(category(Scheme::ring, {5}), "local");  // one rank, whatever its scheme
  EXPECT_EQ(category(Scheme::ring, {0, 1, 2}), "ring intra-node");
  EXPECT_EQ(category(Scheme::ring, {2, 3, 4}), "ring inter-node");
  EXPECT_EQ(category(Scheme::all_gather, {4, 5}), "all-gather intra-node");
  EXPECT_EQ(category(Scheme::all_gather, {0, 7}), "all-gather inter-node");
  EXPECT_EQ(category(Scheme::ulysses, {4, 5, 6, 7}), "ulysses intra-node");
  EXPECT_EQ(category(Scheme::ulysses, {6, 7, 0, 1}), "ulysses inter-node");
  EXPECT_EQ(category(Scheme::usp, {0, 1, 2, 3}), "usp intra-node");
  EXPECT_EQ(category(Scheme::usp, {0, 1, 4, 5}), "usp inter-node");
}

}  // namespace
}  // namespace ballast
