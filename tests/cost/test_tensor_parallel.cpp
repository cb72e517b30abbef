// Tensor parallelism: the cluster of TP groups (compute, memory, NVLink, calibrated fits,
// NICs spanned or shared), the valid degrees and their errors, the TP collectives' price
// against collective_time_s on the GPU cluster, the profiled family's refusal, JSON.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ballast/cost_model.hpp"
#include "ballast/tensor_parallel.hpp"
#include "cost/input_errors.hpp"

namespace ballast {
namespace {

using testing::expect_input_error;

TEST(TensorParallelUnits, DegreeOneIsTheClusterItself) {
  const Cluster gpus = load_cluster("h100", 2);
  const Cluster units = tensor_parallel_units(gpus, load_model("llama3-8b"), 1);
  EXPECT_EQ(to_json(units), to_json(gpus));
  EXPECT_FALSE(to_json(units).contains("tensor_parallel"));  // old files keep their bytes
  EXPECT_EQ(units.gpus(), 16);
}

TEST(TensorParallelUnits, ComputeMemoryAndNvlinkScaleWithTheGroup) {
  const Cluster gpus = load_cluster("h100", 2);
  const Cluster units = tensor_parallel_units(gpus, load_model("llama3-8b"), 2);
  EXPECT_EQ(units.nodes, 2);
  EXPECT_EQ(units.gpus_per_node, 4);
  EXPECT_EQ(units.ranks(), 8);
  EXPECT_EQ(units.gpus(), 16);
  EXPECT_EQ(units.peak_flops_per_s, 2 * gpus.peak_flops_per_s);
  EXPECT_EQ(units.gpu_memory_bytes, 2 * gpus.gpu_memory_bytes);
  EXPECT_EQ(units.intra_node_p2p_bw_bytes_per_s, 2 * gpus.intra_node_p2p_bw_bytes_per_s);
  EXPECT_EQ(units.intra_node_bus_bw_bytes_per_s, 2 * gpus.intra_node_bus_bw_bytes_per_s);
  EXPECT_EQ(units.intra_node_latency_s, gpus.intra_node_latency_s);
  EXPECT_EQ(units.matmul_efficiency, gpus.matmul_efficiency);
  // g ranks = N parallel g-GPU collectives of 1/N the bytes: same GPU count and latency,
  // N x the bus bandwidth.
  for (const auto& [op, fits] : gpus.intra_node_collectives) {
    ASSERT_EQ(units.intra_node_collectives.at(op).size(), fits.size());
    for (std::size_t i = 0; i < fits.size(); ++i) {
      const CollectiveFit& unit = units.intra_node_collectives.at(op)[i];
      EXPECT_EQ(unit.gpus, fits[i].gpus);
      EXPECT_EQ(unit.latency_s, fits[i].latency_s);
      EXPECT_EQ(unit.bus_bw_bytes_per_s, 2 * fits[i].bus_bw_bytes_per_s);
    }
  }
  // The TP collectives themselves: the GPU cluster's own 2-GPU fits.
  EXPECT_EQ(units.tensor_parallel.gpus, 2);
  EXPECT_EQ(units.tensor_parallel.all_gather,
            intra_node_collective_fit(gpus, CollectiveOp::all_gather, 2));
  EXPECT_EQ(units.tensor_parallel.reduce_scatter,
            intra_node_collective_fit(gpus, CollectiveOp::reduce_scatter, 2));
}

TEST(TensorParallelUnits, AGroupSpanningNicsGetsTheirBandwidth) {
  // h100: one NIC per GPU. A TP-4 group holds 4 GPUs, so 4 NICs.
  const Cluster h100 = load_cluster("h100", 2);
  const Cluster units = tensor_parallel_units(h100, load_model("llama3-8b"), 4);
  EXPECT_EQ(units.nics_per_node, 2);
  EXPECT_EQ(units.gpus_per_nic(), 1);
  EXPECT_EQ(units.nic_bw_bytes_per_s, 4 * h100.nic_bw_bytes_per_s);
  // a800-roce: 2 GPUs per NIC. A TP-2 group is exactly one NIC's GPUs; TP-8 spans 4.
  const Cluster a800 = load_cluster("a800-roce", 2);
  const Cluster pairs = tensor_parallel_units(a800, load_model("llama-7b"), 2);
  EXPECT_EQ(pairs.nics_per_node, 4);
  EXPECT_EQ(pairs.gpus_per_nic(), 1);
  EXPECT_EQ(pairs.nic_bw_bytes_per_s, a800.nic_bw_bytes_per_s);
  const Cluster whole = tensor_parallel_units(a800, load_model("llama-7b"), 8);
  EXPECT_EQ(whole.nics_per_node, 1);
  EXPECT_EQ(whole.nic_bw_bytes_per_s, 4 * a800.nic_bw_bytes_per_s);
}

TEST(TensorParallelUnits, GroupsSharingANicShareIt) {
  // 8 GPUs behind 2 NICs (4 GPUs per NIC): TP-2 groups, two per NIC, as their GPUs.
  Cluster gpus = load_cluster("a800-roce", 2);
  gpus.nics_per_node = 2;
  const Cluster units = tensor_parallel_units(gpus, load_model("llama-7b"), 2);
  EXPECT_EQ(units.nics_per_node, 2);
  EXPECT_EQ(units.gpus_per_nic(), 2);
  EXPECT_EQ(units.nic_bw_bytes_per_s, gpus.nic_bw_bytes_per_s);
  EXPECT_EQ(units.nic_of(0), units.nic_of(1));
  EXPECT_NE(units.nic_of(1), units.nic_of(2));
  // The gradient sync leaves each node through both its NICs with or without TP: with TP
  // its 2 rings (one per TP rank) carry half of the gradients each, over 8 data-parallel
  // ranks instead of 16: 7/8 / (15/16) = 0.933 of the time without TP, latency aside
  // (the bytes a node sends, 2 (N-1)/N of the model's gradients, hardly change).
  const Model model = load_model("llama-7b");
  const auto gpu_cost = make_cost_model(load_cost_model_spec("analytical"), gpus, model);
  const auto unit_cost = make_cost_model(load_cost_model_spec("analytical"), units, model);
  EXPECT_NEAR(unit_cost->gradient_sync_time_s() / gpu_cost->gradient_sync_time_s(),
              7.0 / 8 / (15.0 / 16), 0.01);
}

TEST(TensorParallelUnits, TokenCapacityIsTheGroupsGpusTogether) {
  const Model model = load_model("llama-13b");
  const Cluster gpus = load_cluster("h200", 4);
  const auto gpu_cost = make_cost_model(load_cost_model_spec("analytical"), gpus, model);
  const auto unit_cost =
      make_cost_model(load_cost_model_spec("analytical"), tensor_parallel_units(gpus, model, 2), model);
  // Model states per GPU and activations per token both halve under TP with sequence
  // parallelism, so a TP group holds its two GPUs' tokens (up to the rounding of bytes).
  EXPECT_NEAR(static_cast<double>(unit_cost->token_capacity_per_rank()),
              2.0 * static_cast<double>(gpu_cost->token_capacity_per_rank()), 2.0);
  EXPECT_NEAR(unit_cost->linear_time_s(4096, Pass::forward),
              gpu_cost->linear_time_s(4096, Pass::forward) / 2, 1e-15);
}

TEST(TensorParallelUnits, InvalidDegreesNameTheFlagAndTheValidValues) {
  const Cluster h100 = load_cluster("h100", 1);
  EXPECT_EQ(valid_tensor_parallel_degrees(h100, load_model("llama3-8b")),
            (std::vector<int>{1, 2, 4, 8}));
  // 3 does not divide 8 GPUs per node.
  expect_input_error([&] { tensor_parallel_units(h100, load_model("llama3-8b"), 3); },
                     {"--tp 3", "GPUs per node", "valid values: 1, 2, 4, 8"});
  // llama-30b: 52 heads, so 8 is out.
  expect_input_error([&] { tensor_parallel_units(h100, load_model("llama-30b"), 8); },
                     {"--tp 8", "52 heads", "valid values: 1, 2, 4"});
  // 16 GPUs per node, 8 KV heads: 16 does not divide them.
  Cluster wide = h100;
  wide.gpus_per_node = 16;
  wide.nics_per_node = 16;
  expect_input_error([&] { tensor_parallel_units(wide, load_model("llama3-8b"), 16); },
                     {"--tp 16", "8 KV heads", "valid values: 1, 2, 4, 8"});
  // A group that would straddle NICs: 6 GPUs, 2 NICs (3 GPUs each), TP 2.
  Cluster six = h100;
  six.gpus_per_node = 6;
  six.nics_per_node = 2;
  expect_input_error([&] { tensor_parallel_units(six, load_model("llama3-8b"), 2); },
                     {"--tp 2", "NIC", "valid values: 1"});
  expect_input_error([&] { tensor_parallel_units(h100, load_model("llama3-8b"), 0); }, {"--tp 0"});
  // Twice: a cluster of TP groups is not a cluster of GPUs.
  const Cluster units = tensor_parallel_units(h100, load_model("llama3-8b"), 2);
  expect_input_error([&] { tensor_parallel_units(units, load_model("llama3-8b"), 2); },
                     {"already has 2-way tensor parallelism", "--tp"});
}

TEST(TensorParallelCost, CollectivesArePricedByTheGpuClustersFits) {
  const Model model = load_model("llama-13b");
  for (const char* preset : {"h200", "a800-roce"}) {  // calibrated fits, and alpha-beta
    const Cluster gpus = load_cluster(preset, 2);
    const auto gpu_cost = make_cost_model(load_cost_model_spec("analytical"), gpus, model);
    for (int tp : {2, 4, 8}) {
      const auto cost =
          make_cost_model(load_cost_model_spec("analytical"), tensor_parallel_units(gpus, model, tp), model);
      for (Tokens tokens : {Tokens{1}, Tokens{4096}, Tokens{100'000}}) {
        const Bytes bytes = tokens * model.hidden * model.bytes_per_element;  // n x hidden, bf16
        for (CollectiveOp op : {CollectiveOp::all_gather, CollectiveOp::reduce_scatter}) {
          const Seconds one_s = gpu_cost->collective_time_s(op, tp, bytes);
          EXPECT_NEAR(cost->tensor_parallel_collective_time_s(op, tokens), model.layers * one_s,
                      1e-12 * model.layers * one_s)
              << preset << " tp " << tp << " " << collective_op_name(op) << " " << tokens;
        }
        // 2 all-gathers + 2 reduce-scatters per layer and pass, forward and backward.
        const Seconds expected_s =
            2 * 2 * model.layers *
            (gpu_cost->collective_time_s(CollectiveOp::all_gather, tp, bytes) +
             gpu_cost->collective_time_s(CollectiveOp::reduce_scatter, tp, bytes));
        EXPECT_NEAR(cost->tensor_parallel_time_s(tokens), expected_s, 1e-12 * expected_s);
      }
      EXPECT_EQ(cost->tensor_parallel_time_s(0), 0.0);
      // The latency is the part that does not grow: time(n) - latency is linear in n.
      const Seconds latency_s = cost->tensor_parallel_latency_s();
      EXPECT_GT(latency_s, 0.0);
      EXPECT_NEAR((cost->tensor_parallel_time_s(2000) - latency_s) /
                      (cost->tensor_parallel_time_s(1000) - latency_s),
                  2.0, 1e-9);
    }
    EXPECT_EQ(gpu_cost->tensor_parallel_time_s(4096), 0.0);  // no TP, nothing
    EXPECT_EQ(gpu_cost->tensor_parallel_latency_s(), 0.0);
  }
}

TEST(TensorParallelCost, FullRecomputationGathersAndScattersTheForwardAgain) {
  Model model = load_model("llama-13b");
  const Cluster units = tensor_parallel_units(load_cluster("h200", 2), model, 2);
  const auto plain = make_cost_model(load_cost_model_spec("analytical"), units, model);
  model.recompute = Recompute::full;
  const auto recomputed = make_cost_model(load_cost_model_spec("analytical"), units, model);
  // 3 passes (forward, its rerun, backward) instead of 2.
  EXPECT_NEAR(recomputed->tensor_parallel_time_s(4096), 1.5 * plain->tensor_parallel_time_s(4096),
              1e-12);
  EXPECT_NEAR(recomputed->tensor_parallel_latency_s(), 1.5 * plain->tensor_parallel_latency_s(),
              1e-15);
}

TEST(TensorParallelCost, ProfiledCoefficientsAreRefused) {
  const Model model = load_model("gpt-7b");
  const Cluster units = tensor_parallel_units(load_cluster("a100-ib400", 2), model, 2);
  expect_input_error(
      [&] { make_cost_model(load_cost_model_spec("flexsp-a100-192k"), units, model); },
      {"--tp 2", "measured without tensor parallelism", "--cost-model analytical"});
}

TEST(TensorParallelJson, RoundTripsAndOldFilesReadAsNoTp) {
  const Model model = load_model("llama3-8b");
  const Cluster units = tensor_parallel_units(load_cluster("h100", 2), model, 4);
  const nlohmann::json json = to_json(units);
  ASSERT_TRUE(json.contains("tensor_parallel"));
  EXPECT_EQ(json["tensor_parallel"]["gpus"], 4);
  const Cluster back = cluster_from_json(json, "test");
  EXPECT_EQ(back.tensor_parallel, units.tensor_parallel);
  EXPECT_EQ(to_json(back), json);
  EXPECT_EQ(cluster_from_json(to_json(load_cluster("h100")), "old").tensor_parallel.gpus, 1);

  nlohmann::json bad = json;
  bad["tensor_parallel"]["all_gather"]["bus_bw_bytes_per_s"] = 0;
  expect_input_error([&] { cluster_from_json(bad, "bad.json"); },
                     {"bad.json", "tensor_parallel.all_gather.bus_bw_bytes_per_s", "> 0"});
  bad = json;
  bad["tensor_parallel"]["gpus"] = 0;
  expect_input_error([&] { cluster_from_json(bad, "bad.json"); }, {"tensor_parallel.gpus"});
  bad = json;
  bad["tensor_parallel"]["degree"] = 2;
  expect_input_error([&] { cluster_from_json(bad, "bad.json"); }, {"degree"});

  // --cluster takes GPUs: a file of TP groups (as a plan embeds it) is refused.
  const auto path = std::filesystem::temp_directory_path() / "ballast_tp_cluster.json";
  std::ofstream(path) << json.dump();
  expect_input_error([&] { load_cluster(path.string()); },
                     {path.string(), "TP groups", "--tp 4"});
  std::filesystem::remove(path);
}

TEST(TensorParallelHeads, UlyssesDegreesSplitTheKvHeadsLeftPerGpu) {
  const Model model = load_model("llama3-8b");  // 8 KV heads
  EXPECT_EQ(ulysses_kv_heads(model, load_cluster("h100")), 8);
  EXPECT_EQ(ulysses_kv_heads(model, tensor_parallel_units(load_cluster("h100", 2), model, 2)), 4);
  EXPECT_EQ(ulysses_kv_heads(model, tensor_parallel_units(load_cluster("h100", 2), model, 8)), 1);
}

TEST(ClusterDescription, NamesGpusAndTpGroups) {
  const Cluster h200 = load_cluster("h200", 2);
  EXPECT_EQ(describe_cluster(h200), "h200 (2 nodes x 8 H200-SXM-141GB, 16 GPUs)");
  EXPECT_EQ(describe_cluster(tensor_parallel_units(h200, load_model("llama-13b"), 2)),
            "h200 (2 nodes x 8 H200-SXM-141GB, 16 GPUs in 8 TP groups of 2)");
}

}  // namespace
}  // namespace ballast
