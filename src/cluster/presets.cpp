// Cluster presets: the clusters of FlexSP and Zeppelin and DGX H100/H200 nodes, every
// constant with its source (SYSTEMS.md section 5, the papers, data/profiles).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ballast/cluster.hpp"
#include "ballast/error.hpp"
#include "ballast/text.hpp"

namespace ballast {

namespace {

constexpr double kGBPerS = 1e9;    // link bandwidths are decimal GB/s, as NCCL reports them
constexpr double kTFlops = 1e12;

/// Fields shared by every preset; each preset overrides the hardware-specific ones.
Cluster common_cluster() {
  Cluster cluster;
  cluster.nodes = 8;  // FlexSP and Zeppelin both evaluate 8 nodes x 8 GPUs (64 GPUs)
  cluster.gpus_per_node = 8;
  // Estimate: achieved / peak throughput of large BF16 GEMMs (ballast's choice).
  cluster.matmul_efficiency = 0.7;
  // data/profiles/h100_attention_latency_by_seqlen.csv: documents of 16..128 tokens cost
  // the same (0.011-0.013 ms), so kernels work in 128x128 tiles.
  cluster.attention_tile_tokens = 128;
  // Estimate: keep 10% for the framework, NCCL buffers and fragmentation.
  cluster.memory_usable_fraction = 0.9;
  // SYSTEMS.md section 5: ~10-30 us per intra-node collective, ~20-50 us inter-node.
  // Literals, not 10 * 1e-6: plan files print them exactly (3e-05, not 2.99...e-05).
  cluster.intra_node_latency_s = 10e-6;
  cluster.inter_node_latency_s = 30e-6;
  return cluster;
}

Cluster a100_ib400() {
  Cluster cluster = common_cluster();
  cluster.name = "a100-ib400";
  cluster.gpu_name = "A100-SXM4-40GB";
  cluster.gpu_memory_bytes = static_cast<Bytes>(40 * kGiB);  // SYSTEMS.md 5: A100 40 GB
  cluster.peak_flops_per_s = 312 * kTFlops;                   // SYSTEMS.md 5: dense BF16
  // FlashAttention-2 (Dao 2023): 50-73% of peak on A100.
  cluster.attention_efficiency = 0.6;
  cluster.memory_usable_fraction = 30.0 / 40.0;  // FlexSP's 30 GB memory limit (SYSTEMS.md 2)
  cluster.intra_node_bus_bw_bytes_per_s = 230 * kGBPerS;  // estimate: NVLink3 ring busbw
  cluster.intra_node_p2p_bw_bytes_per_s = 150 * kGBPerS;  // estimate: NVLink3 send/recv
  cluster.nics_per_node = 1;
  cluster.nic_bw_bytes_per_s = 46 * kGBPerS;  // SYSTEMS.md 5: NDR 400 Gb/s achieves 46-49 GB/s
  cluster.provenance =
      "FlexSP (ASPLOS'25) cluster, SYSTEMS.md sections 2 and 5: 8 nodes x 8 A100-40GB, "
      "312 TFLOP/s BF16; attention efficiency 0.6 from FlashAttention-2 (50-73% of peak on "
      "A100); memory limit 30 of 40 GB as in FlexSP. One 400 Gb/s NIC per node shared by "
      "its 8 GPUs (ballast's choice: it reproduces FlexSP's profiled all-to-all cliff, "
      "bw[16] = 10.33 GB/s per device; 46 GB/s / 4 = 11.5 GB/s), 46 GB/s achieved (NDR "
      "400 Gb/s achieves 46-49 GB/s). NVLink3 bus bandwidth 230 GB/s and P2P 150 GB/s are "
      "estimates. Latency 10 us intra / 30 us inter node (SYSTEMS.md 5 ranges). No "
      "nccl-tests measurements: collectives use the alpha-beta estimate.";
  return cluster;
}

Cluster a800_roce() {
  Cluster cluster = common_cluster();
  cluster.name = "a800-roce";
  cluster.gpu_name = "A800-SXM4-80GB";
  cluster.gpu_memory_bytes = static_cast<Bytes>(80 * kGiB);  // SYSTEMS.md 5: 80 GB
  cluster.peak_flops_per_s = 312 * kTFlops;                   // SYSTEMS.md 5: dense BF16
  cluster.attention_efficiency = 0.6;  // FlashAttention-2 (Dao 2023): 50-73% of A100 peak
  // Estimate: A800 NVLink is 400 GB/s total (2/3 of A100's 600 GB/s); 160 GB/s ring
  // busbw and 100 GB/s send/recv scale the A100 estimates by about 2/3.
  cluster.intra_node_bus_bw_bytes_per_s = 160 * kGBPerS;
  cluster.intra_node_p2p_bw_bytes_per_s = 100 * kGBPerS;
  cluster.nics_per_node = 4;                  // Zeppelin cluster A: 4 x 200 Gb/s RoCE
  cluster.nic_bw_bytes_per_s = 24 * kGBPerS;  // SYSTEMS.md 5: 200 Gb/s achieves ~24 GB/s
  cluster.provenance =
      "Zeppelin (EuroSys'26) cluster A, SYSTEMS.md sections 3 and 5: 8 nodes x 8 "
      "A800-80GB, 312 TFLOP/s BF16, 4 x 200 Gb/s RoCE NICs per node (2 GPUs per NIC), "
      "~24 GB/s achieved each; attention efficiency 0.6 from FlashAttention-2 (50-73% of "
      "peak on A100). NVLink (400 GB/s total on A800) bus bandwidth 160 GB/s and P2P "
      "100 GB/s are estimates. Latency 10 us intra / 30 us inter node (SYSTEMS.md 5). No "
      "nccl-tests measurements: collectives use the alpha-beta estimate.";
  return cluster;
}

/// NVLink4 / NVSwitch collectives inside one DGX node, fitted to
/// data/profiles/h200_8gpu_nccl_tests.csv (nccl-tests on one 8x H200 node, fp16, 8 MiB ..
/// 8 GiB; all_reduce on 8 GPUs shows NVLS) by least squares on the relative error.
/// Regenerate with:
///   ballast calibrate --nccl-tests data/profiles/h200_8gpu_nccl_tests.csv --cluster h200
/// Worst errors per (op, GPUs) are in docs/fidelity.md. No alltoall rows are bundled: the
/// all_to_all entries are the all_gather fits, an estimate (same bytes per GPU over the
/// same NVSwitch links).
CollectiveFitTable nvlink4_collectives() {
  const std::vector<CollectiveFit> all_gather = {
      {2, 24.643e-6, 351.8328e9}, {4, 33.208e-6, 369.3949e9}, {8, 51.429e-6, 374.2591e9}};
  return {
      {CollectiveOp::all_gather, all_gather},
      {CollectiveOp::reduce_scatter,
       {{2, 34.135e-6, 264.0987e9}, {4, 35.988e-6, 328.0188e9}, {8, 54.962e-6, 361.9209e9}}},
      {CollectiveOp::all_reduce,
       {{2, 26.948e-6, 358.4223e9}, {4, 37.938e-6, 373.5371e9}, {8, 67.206e-6, 466.1408e9}}},
      {CollectiveOp::all_to_all, all_gather},  // estimate: no alltoall measurements bundled
  };
}

Cluster h100() {
  Cluster cluster = common_cluster();
  cluster.name = "h100";
  cluster.gpu_name = "H100-SXM-80GB";
  cluster.gpu_memory_bytes = static_cast<Bytes>(80 * kGiB);  // SYSTEMS.md 5: 80 GB HBM
  cluster.peak_flops_per_s = 989 * kTFlops;                   // SYSTEMS.md 5: dense BF16
  // SYSTEMS.md 5: FlashAttention-3 causal ~680 TFLOP/s forward at 32K.
  cluster.attention_efficiency = 680.0 / 989.0;
  cluster.intra_node_bus_bw_bytes_per_s = 370 * kGBPerS;  // SYSTEMS.md 5: ~370 GB/s busbw
  // One GPU sending to one peer over NVSwitch: the 2-GPU all_gather's fitted bus bandwidth
  // (nvlink4_collectives; there each GPU sends its half to the other). It replaces a
  // 150 GB/s guess within SYSTEMS.md 5's 80-180 GB/s for NCCL send/recv.
  cluster.intra_node_p2p_bw_bytes_per_s = 351.8328e9;
  cluster.nics_per_node = 8;                  // SYSTEMS.md 5: DGX H100, one NIC per GPU
  cluster.nic_bw_bytes_per_s = 47 * kGBPerS;  // SYSTEMS.md 5: NDR 400 Gb/s, 46-49 GB/s
  cluster.intra_node_collectives = nvlink4_collectives();
  cluster.provenance =
      "DGX H100, SYSTEMS.md section 5: 8 nodes x 8 H100-SXM-80GB, 989 TFLOP/s BF16, "
      "attention efficiency 680/989 (FlashAttention-3 causal forward at 32K), NVLink "
      "busbw ~370 GB/s, 8 x 400 Gb/s NICs per node (one per GPU) achieving ~47 GB/s. "
      "Latency 10 us intra / 30 us inter. Collectives inside a node (all_gather, "
      "reduce_scatter, all_reduce on 2/4/8 GPUs) and P2P 351.8 GB/s (the 2-GPU all_gather "
      "fit) reuse the DGX H200 measurements of data/profiles/h200_8gpu_nccl_tests.csv (same "
      "NVLink4/NVSwitch generation): an estimate for H100; all_to_all takes the all_gather "
      "fits (estimate, no alltoall measurements).";
  return cluster;
}

Cluster h200() {
  Cluster cluster = h100();
  cluster.name = "h200";
  cluster.gpu_name = "H200-SXM-141GB";
  cluster.gpu_memory_bytes = static_cast<Bytes>(141 * kGiB);  // SYSTEMS.md 5: 141 GB HBM
  // data/profiles/h200_8gpu_nccl_tests.csv: all_gather on 8 GPUs, busbw 367 GB/s at 8 GiB.
  cluster.intra_node_bus_bw_bytes_per_s = 367 * kGBPerS;
  cluster.provenance =
      "DGX H200 (Zeppelin cluster C), SYSTEMS.md sections 3 and 5: as h100 with 141 GB "
      "HBM; NVLink busbw 367 GB/s from data/profiles/h200_8gpu_nccl_tests.csv (8-GPU "
      "all_gather at 8 GiB); 8 x 400 Gb/s ConnectX-7 NICs per node (~47 GB/s each). "
      "Collectives inside a node fitted to the same file (all_gather, reduce_scatter, "
      "all_reduce on 2/4/8 GPUs; `ballast calibrate --nccl-tests "
      "data/profiles/h200_8gpu_nccl_tests.csv --cluster h200`), P2P 351.8 GB/s from the "
      "2-GPU all_gather fit; all_to_all takes the all_gather fits (estimate, no alltoall "
      "measurements).";
  return cluster;
}

}  // namespace

std::vector<std::string> cluster_preset_names() {
  return {"a100-ib400", "a800-roce", "h100", "h200"};
}

Cluster cluster_preset(const std::string& name) {
  if (name == "a100-ib400") return a100_ib400();
  if (name == "a800-roce") return a800_roce();
  if (name == "h100") return h100();
  if (name == "h200") return h200();
  throw InputError(fmt::format("unknown cluster preset '{}'{}; known presets: {}", name,
                               did_you_mean(name, cluster_preset_names()),
                               fmt::join(cluster_preset_names(), ", ")));
}

}  // namespace ballast
