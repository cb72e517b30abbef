// Zeppelin routing in the simulator: isolated_transfer_time_s() equals the transfer inside
// a simulated step, and properties of pipelined routed transfers on random byte counts
// and clusters under the analytical cost model (lower limit, chunks pay for large
// transfers, one proxy is the direct transfer, routing pays only when bandwidth-bound).
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>

#include "ballast/error.hpp"
#include "ballast/simulator.hpp"
#include "sim/sim_fixtures.hpp"

namespace ballast {
namespace {

/// Two nodes of a preset, so that rank 0 and rank gpus_per_node are on different nodes.
Cluster two_nodes(const std::string& preset) {
  Cluster cluster = cluster_preset(preset);
  cluster.nodes = 2;
  return cluster;
}

/// a100-ib400 with one NIC per GPU (the preset shares one NIC per node, where routing
/// cannot help: proxies are clamped to the NICs).
Cluster a100_one_nic_per_gpu() {
  Cluster cluster = two_nodes("a100-ib400");
  cluster.nics_per_node = cluster.gpus_per_node;
  return cluster;
}

/// Arrival minus start of the transfer `name` from src to dst in the trace: from its
/// first send on src to its last receive on dst, routed parts included.
Seconds traced_transfer_s(const SimulationReport& report, const std::string& name, int src_rank,
                          int dst_rank) {
  Seconds start_s = std::numeric_limits<Seconds>::infinity();
  Seconds arrival_s = -1;
  for (const TraceEvent& event : report.trace) {
    if (event.name != name && !event.name.starts_with(name + " (")) continue;
    if (event.rank == src_rank && event.lane == "send") start_s = std::min(start_s, event.start_s);
    if (event.rank == dst_rank && event.lane == "recv") {
      arrival_s = std::max(arrival_s, event.start_s + event.duration_s);
    }
  }
  return arrival_s - start_s;
}

/// A ring that starts src -> dst, holding one sequence of `tokens` tokens on src alone,
/// so that its step-0 transfer src -> dst is the only one carrying bytes until that block
/// has arrived. Across nodes the ring spans both nodes whole (validate() admits routing
/// only through members): src, dst, the rest of dst's node, the rest of src's node.
AttentionGroup ring_from(const Cluster& cluster, int src, int dst, Tokens tokens) {
  std::vector<int> ranks = {src, dst};
  if (!cluster.same_node(src, dst)) {
    for (const int anchor : {dst, src}) {
      const int first = cluster.node_of(anchor) * cluster.gpus_per_node;
      for (int rank = first; rank < first + cluster.gpus_per_node; ++rank) {
        if (rank != src && rank != dst) ranks.push_back(rank);
      }
    }
  }
  return testing::make_group(Scheme::ring, ranks, {{0, {{src, 0, tokens}}}});
}

/// The trace name of a ring's step-0 forward transfer.
std::string first_ring_transfer(const AttentionGroup& ring) {
  return "ring kv fwd g" + std::to_string(ring.ranks.size()) + " step 0";
}

TEST(IsolatedTransfer, EqualsTheTransferInASimulatedStep) {
  const Cluster cluster = two_nodes("a800-roce");  // 4 NICs, 2 GPUs per NIC
  const AnalyticalCostModel cost(cluster, model_preset("llama-7b"));
  const int remote = cluster.gpus_per_node;  // rank 0's peer on the other node
  for (int proxies : {1, 2, 3, 4, 8}) {
    for (int chunks : {1, 3, 8}) {
      SCOPED_TRACE(::testing::Message() << "k " << proxies << ", c " << chunks);
      Plan plan = testing::empty_plan(cost, {2048});
      AttentionGroup ring = ring_from(cluster, 0, remote, 2048);
      ring.routing_proxies = proxies;
      ring.routing_chunks = chunks;
      plan.micro_batches.push_back({{ring}, {}, {}});
      const SimulationReport report = simulate(plan, cost, {.record_trace = true});
      const Bytes block_bytes = cost.model().kv_bytes_per_token() * 2048;
      const Seconds alone_s =
          isolated_transfer_time_s(cost, block_bytes, 0, remote, proxies, chunks);
      EXPECT_GT(alone_s, 0);
      EXPECT_NEAR(traced_transfer_s(report, first_ring_transfer(ring), 0, remote), alone_s,
                  1e-12 * alone_s);
    }
  }
}

TEST(IsolatedTransfer, EqualsTheTransferInALargeClustersStep) {
  // isolated_transfer_time_s builds the transfer on a copy of the cluster holding only the
  // two nodes involved; the same transfer inside a step on all 8 nodes is the reference.
  Cluster cluster = cluster_preset("a800-roce");  // 8 nodes, 4 NICs, 2 GPUs per NIC
  const AnalyticalCostModel cost(cluster, model_preset("llama-7b"));
  const std::pair<int, int> pairs[] = {{13, 50}, {63, 0}, {21, 22}, {40, 47}, {7, 8}};
  for (const auto& [src, dst] : pairs) {
    for (int proxies : {1, 3, 4}) {
      for (int chunks : {1, 4}) {
        SCOPED_TRACE(::testing::Message() << src << " -> " << dst << ", k " << proxies << ", c "
                                          << chunks);
        Plan plan = testing::empty_plan(cost, {2048});
        AttentionGroup ring = ring_from(cluster, src, dst, 2048);
        ring.routing_proxies = proxies;
        ring.routing_chunks = chunks;
        plan.micro_batches.push_back({{ring}, {}, {}});
        const SimulationReport report = simulate(plan, cost, {.record_trace = true});
        const Bytes block_bytes = cost.model().kv_bytes_per_token() * 2048;
        const Seconds alone_s =
            isolated_transfer_time_s(cost, block_bytes, src, dst, proxies, chunks);
        EXPECT_GT(alone_s, 0);
        EXPECT_NEAR(traced_transfer_s(report, first_ring_transfer(ring), src, dst), alone_s,
                    1e-12 * alone_s);
      }
    }
  }
}

TEST(IsolatedTransfer, RefusesArgumentsAPlanCouldNotHold) {
  const AnalyticalCostModel cost(two_nodes("a800-roce"), model_preset("llama-7b"));
  EXPECT_THROW(isolated_transfer_time_s(cost, 100, 0, 16, 1, 1), InputError);
  EXPECT_THROW(isolated_transfer_time_s(cost, 100, -1, 8, 1, 1), InputError);
  EXPECT_THROW(isolated_transfer_time_s(cost, 100, 0, 8, 0, 1), InputError);
  EXPECT_THROW(isolated_transfer_time_s(cost, 100, 0, 8, 9, 1), InputError);
  EXPECT_THROW(isolated_transfer_time_s(cost, 100, 0, 8, 2, 0), InputError);
  EXPECT_THROW(isolated_transfer_time_s(cost, 100, 0, 8, 2, kMaxRoutingChunks + 1), InputError);
  EXPECT_EQ(isolated_transfer_time_s(cost, 0, 0, 8, 4, 4), 0);
  EXPECT_EQ(isolated_transfer_time_s(cost, 100, 3, 3, 4, 4), 0);
  EXPECT_THROW(isolated_transfer_floor_s(cost, 100, 0, 16, 1, 1), InputError);
  EXPECT_THROW(isolated_transfer_floor_s(cost, 100, 0, 8, 9, 1), InputError);
  EXPECT_THROW(isolated_transfer_floor_s(cost, 100, 0, 8, 2, kMaxRoutingChunks + 1), InputError);
  EXPECT_EQ(isolated_transfer_floor_s(cost, 0, 0, 8, 4, 4), 0);
  EXPECT_EQ(isolated_transfer_floor_s(cost, 100, 3, 3, 4, 4), 0);
}

/// A cluster of `base` with link numbers drawn around realistic values.
Cluster random_links(Cluster cluster, std::mt19937& random) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  cluster.intra_node_latency_s = (2 + 18 * unit(random)) * 1e-6;
  cluster.inter_node_latency_s = (5 + 45 * unit(random)) * 1e-6;
  cluster.nic_bw_bytes_per_s = (10 + 40 * unit(random)) * 1e9;
  cluster.intra_node_p2p_bw_bytes_per_s = (80 + 220 * unit(random)) * 1e9;
  return cluster;
}

struct Choice {
  int proxies = 1;
  int chunks = 1;
  Seconds time_s = 0;
};

/// The fastest (k, c) over k in {1, 2, 4, ..., nics_per_node}, c in {1, 2, 4, 8}; ties go
/// to fewer proxies, then fewer chunks.
Choice best_routing(const CostModel& cost, Bytes bytes, int src_rank, int dst_rank) {
  Choice best{1, 1, isolated_transfer_time_s(cost, bytes, src_rank, dst_rank, 1, 1)};
  for (int proxies = 1; proxies <= cost.cluster().nics_per_node; proxies *= 2) {
    for (int chunks : {1, 2, 4, 8}) {
      const Seconds time_s =
          isolated_transfer_time_s(cost, bytes, src_rank, dst_rank, proxies, chunks);
      if (time_s < best.time_s) best = {proxies, chunks, time_s};
    }
  }
  return best;
}

class RoutingProperties : public ::testing::TestWithParam<const char*> {
 protected:
  Cluster base() const {
    return std::string(GetParam()) == "a800-roce" ? two_nodes("a800-roce") : a100_one_nic_per_gpu();
  }
};

TEST_P(RoutingProperties, HoldOnRandomBytesAndLinks) {
  std::mt19937 random(7);
  const Model model = model_preset("llama-7b");
  std::uniform_int_distribution<Bytes> any_bytes(1, Bytes{1} << 30);
  for (int trial = 0; trial < 30; ++trial) {
    const AnalyticalCostModel cost(random_links(base(), random), model);
    const Cluster& cluster = cost.cluster();
    const int gpus = cluster.gpus_per_node;
    const int src = static_cast<int>(random() % static_cast<unsigned>(gpus));
    const int dst = gpus + static_cast<int>(random() % static_cast<unsigned>(gpus));
    const Bytes bytes = any_bytes(random);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << ": " << bytes << " bytes " << src << " -> " << dst);
    const Seconds direct_s = cost.p2p_time_s(bytes, src, dst);
    for (int proxies = 1; proxies <= cluster.nics_per_node; proxies *= 2) {
      for (int chunks : {1, 2, 4, 8, kMaxRoutingChunks}) {
        const Seconds routed_s = isolated_transfer_time_s(cost, bytes, src, dst, proxies, chunks);
        // Part 0 carries ceil(B / k) >= B / k bytes through one NIC.
        EXPECT_GE(routed_s * (1 + 1e-12), model.layers * static_cast<double>(bytes) /
                                              (proxies * cluster.nic_bw_bytes_per_s));
        if (proxies == 1) {
          EXPECT_EQ(routed_s, direct_s);
        }
      }
    }
    // Inside a node a transfer is never routed.
    EXPECT_EQ(isolated_transfer_time_s(cost, bytes, src, (src + 1) % gpus, 4, 8),
              cost.p2p_time_s(bytes, src, (src + 1) % gpus));
    EXPECT_LE(best_routing(cost, bytes, src, dst).time_s, direct_s);

    // Bandwidth-bound (each part's NIC time over 100 x the inter-node latency): pipelining
    // in 4 chunks beats one piece per part.
    const Bytes large =
        static_cast<Bytes>((100 + 900 * (random() % 1000) / 1000.0) * cluster.nic_bw_bytes_per_s *
                           cluster.inter_node_latency_s) *
        cluster.nics_per_node;
    for (int proxies = 2; proxies <= cluster.nics_per_node; proxies *= 2) {
      SCOPED_TRACE(::testing::Message() << large << " bytes, k " << proxies);
      EXPECT_LT(isolated_transfer_time_s(cost, large, src, dst, proxies, 4),
                isolated_transfer_time_s(cost, large, src, dst, proxies, 1));
    }
  }
}

TEST_P(RoutingProperties, FloorIsNeverAboveTheSimulatedTransfer) {
  // isolated_transfer_floor_s() lets choose_routing skip choices unpriced: it must stay at
  // or below the simulated time for every choice, latency-bound to bandwidth-bound, and
  // equal it where nothing shares a link (one direct transfer).
  std::mt19937 random(11);
  std::uniform_int_distribution<int> log2_bytes(0, 34);
  for (int trial = 0; trial < 40; ++trial) {
    const AnalyticalCostModel cost(random_links(base(), random), model_preset("llama-7b"));
    const int gpus = cost.cluster().gpus_per_node;
    const int src = static_cast<int>(random() % static_cast<unsigned>(gpus));
    const int dst = gpus + static_cast<int>(random() % static_cast<unsigned>(gpus));
    const Bytes bytes = (Bytes{1} << log2_bytes(random)) + static_cast<Bytes>(random() % 4096);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << ": " << bytes << " bytes " << src << " -> " << dst);
    for (int proxies = 1; proxies <= gpus; ++proxies) {
      for (int chunks : {1, 2, 3, 4, 8, kMaxRoutingChunks}) {
        const Seconds time_s = isolated_transfer_time_s(cost, bytes, src, dst, proxies, chunks);
        const Seconds floor_s = isolated_transfer_floor_s(cost, bytes, src, dst, proxies, chunks);
        EXPECT_LE(floor_s, time_s * (1 + 1e-12)) << proxies << " proxies, " << chunks << " chunks";
        EXPECT_GT(floor_s, 0.0);
      }
    }
    EXPECT_EQ(isolated_transfer_floor_s(cost, bytes, src, dst, 1, 1),
              isolated_transfer_time_s(cost, bytes, src, dst, 1, 1));
    EXPECT_EQ(isolated_transfer_floor_s(cost, bytes, src, (src + 1) % gpus, 4, 8),
              cost.p2p_time_s(bytes, src, (src + 1) % gpus));
  }
}

TEST_P(RoutingProperties, RoutingPaysForLargeTransfersOnly) {
  const AnalyticalCostModel cost(base(), model_preset("llama-7b"));
  const int remote = cost.cluster().gpus_per_node;
  // 64 MiB per layer: bandwidth-bound, routing over several NICs pays.
  const Choice large = best_routing(cost, Bytes{64} << 20, 0, remote);
  EXPECT_GT(large.proxies, 1);
  EXPECT_LT(large.time_s, cost.p2p_time_s(Bytes{64} << 20, 0, remote));
  // 256 bytes per layer: latency-bound, every extra hop and piece costs its latency.
  const Choice tiny = best_routing(cost, 256, 0, remote);
  EXPECT_EQ(tiny.proxies, 1);
  EXPECT_EQ(tiny.time_s, cost.p2p_time_s(256, 0, remote));
}

INSTANTIATE_TEST_SUITE_P(Clusters, RoutingProperties,
                         ::testing::Values("a800-roce", "a100-one-nic-per-gpu"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace ballast
