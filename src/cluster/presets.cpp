// Cluster presets: the clusters of FlexSP and Zeppelin (A800, H800, H200) and DGX H100/H200 nodes, every
// constant with its source (SYSTEMS.md section 5, the papers, data/profiles).
#include <array>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ballast/cluster.hpp"
#include "ballast/error.hpp"
#include "ballast/text.hpp"

namespace ballast {

namespace {

constexpr double kGBPerS = 1e9;    // link bandwidths are decimal GB/s, as NCCL reports them
constexpr double kTFlops = 1e12;

/// The sequence lengths of FlashAttention-2's and -3's benchmark charts (batch x length =
/// 16K tokens, hidden 2048, head dim 128, BF16).
constexpr std::array<Tokens, 6> kChartLengths = {512, 1024, 2048, 4096, 8192, 16384};

/// One curve point per chart length: efficiency = TFLOP/s / peak TFLOP/s (FlashAttention's
/// causal FLOP count, 4 * head_dim * heads * L^2 / 2, is within 0.2% of ballast's
/// L(L+1)/2 at 512 tokens), each point's source naming the figure and the value.
std::vector<EfficiencyPoint> chart_curve(const std::array<double, 6>& tflops, double peak_tflops,
                                         const std::string& figure) {
  std::vector<EfficiencyPoint> curve;
  for (std::size_t i = 0; i < kChartLengths.size(); ++i) {
    curve.push_back({kChartLengths[i], tflops[i] / peak_tflops,
                     fmt::format("{}: {} TFLOP/s at {} tokens", figure, tflops[i],
                                 kChartLengths[i])});
  }
  return curve;
}

/// H100 SXM5, FlashAttention-3. Forward: SYSTEMS.md section 5 (FA3 paper, arXiv 2407.08608,
/// Figure 5 "with causal mask, head dim 128", values as SYSTEMS.md quotes them). Backward:
/// the paper's backward chart (head dim 128) is without causal mask (316, 424, 501, 542,
/// 559, 561 TFLOP/s); causal is an estimate: those values x the forward causal / non-causal
/// ratio at the same length (forward non-causal 467, 565, 625, 638, 646, 648 TFLOP/s).
void set_fa3_h100_curves(Cluster& cluster) {
  constexpr double kPeakTflops = 989;
  cluster.attention_forward_curve =
      chart_curve({290, 420, 520, 580, 600, 616}, kPeakTflops,
                  "FlashAttention-3 paper (arXiv 2407.08608) Fig. 5, H100 SXM5, BF16, causal, "
                  "head dim 128, forward (SYSTEMS.md 5)");
  cluster.attention_backward_curve =
      chart_curve({196, 315, 417, 493, 519, 533}, kPeakTflops,
                  "estimate: FlashAttention-3 paper backward chart (H100 SXM5, head dim 128, "
                  "without causal mask: 316..561 TFLOP/s) x forward causal/non-causal ratio");
}

/// A100 SXM4, FlashAttention-2 (arXiv 2307.08691), causal, head dim 128. Estimates built on
/// three figures of the paper as a summary of it reports them: forward+backward 99 TFLOP/s
/// at 512 and 189 at 16K (Fig. 4d), forward up to ~200 (Fig. 5d). Backward at 16K follows
/// (3.5 / (1/200 + 2.5/b) = 189: b = 185); forward/backward at 512 keep 16K's ratio
/// (105 / 97, giving 99 combined); lengths between take FA3's causal forward shape.
void set_fa2_a100_curves(Cluster& cluster) {
  constexpr double kPeakTflops = 312;
  cluster.attention_forward_curve =
      chart_curve({105, 143, 172, 190, 195, 200}, kPeakTflops,
                  "estimate from FlashAttention-2 paper (arXiv 2307.08691) Figs. 4d/5d, A100 "
                  "SXM4, causal, head dim 128, forward");
  cluster.attention_backward_curve =
      chart_curve({97, 132, 159, 175, 181, 185}, kPeakTflops,
                  "estimate from FlashAttention-2 paper (arXiv 2307.08691) Figs. 4d/5d, A100 "
                  "SXM4, causal, head dim 128, backward");
}

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
  // Fallback only (the curves below): FlashAttention-2 (Dao 2023): 50-73% of peak on A100.
  cluster.attention_efficiency = 0.6;
  cluster.memory_usable_fraction = 30.0 / 40.0;  // FlexSP's 30 GB memory limit (SYSTEMS.md 2)
  cluster.intra_node_bus_bw_bytes_per_s = 230 * kGBPerS;  // estimate: NVLink3 ring busbw
  cluster.intra_node_p2p_bw_bytes_per_s = 150 * kGBPerS;  // estimate: NVLink3 send/recv
  cluster.nics_per_node = 1;
  cluster.nic_bw_bytes_per_s = 46 * kGBPerS;  // SYSTEMS.md 5: NDR 400 Gb/s achieves 46-49 GB/s
  set_fa2_a100_curves(cluster);
  cluster.provenance =
      "FlexSP (ASPLOS'25) cluster, SYSTEMS.md sections 2 and 5: 8 nodes x 8 A100-40GB, "
      "312 TFLOP/s BF16; attention efficiency curves (forward, backward) estimated from "
      "FlashAttention-2's A100 causal head-dim-128 figures (arXiv 2307.08691 Figs. 4d, 5d; "
      "docs/fidelity.md), flat fallback 0.6 (50-73% of peak); memory limit 30 of 40 GB as in FlexSP. One 400 Gb/s NIC per node shared by "
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
  // Fallback only (the curves below): FlashAttention-2 (Dao 2023): 50-73% of A100 peak.
  cluster.attention_efficiency = 0.6;
  // Estimate: A800 NVLink is 400 GB/s total (2/3 of A100's 600 GB/s); 160 GB/s ring
  // busbw and 100 GB/s send/recv scale the A100 estimates by about 2/3.
  cluster.intra_node_bus_bw_bytes_per_s = 160 * kGBPerS;
  cluster.intra_node_p2p_bw_bytes_per_s = 100 * kGBPerS;
  cluster.nics_per_node = 4;                  // Zeppelin cluster A: 4 x 200 Gb/s RoCE
  cluster.nic_bw_bytes_per_s = 24 * kGBPerS;  // SYSTEMS.md 5: 200 Gb/s achieves ~24 GB/s
  set_fa2_a100_curves(cluster);  // estimate: A800 has A100's SMs and clock
  cluster.provenance =
      "Zeppelin (EuroSys'26) cluster A, SYSTEMS.md sections 3 and 5: 8 nodes x 8 "
      "A800-80GB, 312 TFLOP/s BF16, 4 x 200 Gb/s RoCE NICs per node (2 GPUs per NIC), "
      "~24 GB/s achieved each; attention efficiency curves as a100-ib400 (A800 has A100's "
      "SMs and clock: an estimate), from FlashAttention-2's A100 figures, flat fallback 0.6. "
      "NVLink (400 GB/s total on A800) bus bandwidth 160 GB/s and P2P "
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
  // Fallback only (the curves below): SYSTEMS.md 5, FlashAttention-3 causal forward ~616
  // TFLOP/s at 16K, its longest published point.
  cluster.attention_efficiency = 616.0 / 989.0;
  cluster.intra_node_bus_bw_bytes_per_s = 370 * kGBPerS;  // SYSTEMS.md 5: ~370 GB/s busbw
  // One GPU sending to one peer over NVSwitch: the 2-GPU all_gather's fitted bus bandwidth
  // (nvlink4_collectives; there each GPU sends its half to the other). It replaces a
  // 150 GB/s guess within SYSTEMS.md 5's 80-180 GB/s for NCCL send/recv.
  cluster.intra_node_p2p_bw_bytes_per_s = 351.8328e9;
  cluster.nics_per_node = 8;                  // SYSTEMS.md 5: DGX H100, one NIC per GPU
  cluster.nic_bw_bytes_per_s = 47 * kGBPerS;  // SYSTEMS.md 5: NDR 400 Gb/s, 46-49 GB/s
  cluster.intra_node_collectives = nvlink4_collectives();
  set_fa3_h100_curves(cluster);
  cluster.provenance =
      "DGX H100, SYSTEMS.md section 5: 8 nodes x 8 H100-SXM-80GB, 989 TFLOP/s BF16, "
      "attention efficiency curves from FlashAttention-3 (arXiv 2407.08608): causal forward "
      "290..616 TFLOP/s at 512..16K tokens, backward estimated (docs/fidelity.md), flat "
      "fallback 616/989; NVLink busbw ~370 GB/s, 8 x 400 Gb/s NICs per node (one per GPU) "
      "achieving ~47 GB/s. Latency 10 us intra / 30 us inter. Collectives inside a node "
      "(all_gather, reduce_scatter, all_reduce on 2/4/8 GPUs) and P2P 351.8 GB/s (the 2-GPU "
      "all_gather fit) reuse the DGX H200 measurements of "
      "data/profiles/h200_8gpu_nccl_tests.csv (same NVLink4/NVSwitch generation): an "
      "estimate for H100; all_to_all takes the all_gather fits (estimate, no alltoall "
      "measurements).";
  return cluster;
}

Cluster h200() {
  Cluster cluster = h100();
  cluster.name = "h200";
  cluster.gpu_name = "H200-SXM-141GB";
  cluster.gpu_memory_bytes = static_cast<Bytes>(141 * kGiB);  // SYSTEMS.md 5: 141 GB HBM
  // data/profiles/h200_8gpu_nccl_tests.csv: all_gather on 8 GPUs, busbw 367 GB/s at 8 GiB.
  cluster.intra_node_bus_bw_bytes_per_s = 367 * kGBPerS;
  // Attention curves stay h100's: H200 has H100 SXM's SM count and clock (an estimate; its
  // faster HBM matters little to compute-bound attention).
  cluster.provenance =
      "DGX H200 (Zeppelin cluster C), SYSTEMS.md sections 3 and 5: as h100 with 141 GB "
      "HBM and H100's attention curves (same SM count and clock: an estimate); NVLink "
      "busbw 367 GB/s from data/profiles/h200_8gpu_nccl_tests.csv (8-GPU all_gather at "
      "8 GiB); 8 x 400 Gb/s ConnectX-7 NICs per node (~47 GB/s each). Collectives inside a "
      "node fitted to the same file (all_gather, reduce_scatter, all_reduce on 2/4/8 GPUs; "
      "`ballast calibrate --nccl-tests data/profiles/h200_8gpu_nccl_tests.csv --cluster "
      "h200`), P2P 351.8 GB/s from the 2-GPU all_gather fit; all_to_all takes the "
      "all_gather fits (estimate, no alltoall measurements).";
  return cluster;
}

/// H800 SXM (Zeppelin's cluster B): H100 SXM's compute with NVLink cut to 400 GB/s
/// aggregate (NVIDIA's H800 datasheet: 400 GB/s NVLink; H100 SXM: 900 GB/s).
Cluster h800() {
  Cluster cluster = h100();
  cluster.name = "h800";
  cluster.gpu_name = "H800-SXM-80GB";
  // H800 datasheet: 80 GB HBM3 and H100 SXM's 989 TFLOP/s dense BF16 (h100's value kept).
  cluster.gpu_memory_bytes = static_cast<Bytes>(80 * kGiB);
  // Estimate: NVLink at 400 of H100's 900 GB/s aggregate, so h100's busbw (370 GB/s) and
  // P2P (351.8 GB/s) x 400/900. No H800 nccl-tests measurements: the node's collectives
  // use the alpha-beta estimate (H100's NVLink fits do not apply).
  constexpr double kNvlinkRatio = 400.0 / 900.0;
  cluster.intra_node_bus_bw_bytes_per_s = 370 * kGBPerS * kNvlinkRatio;
  cluster.intra_node_p2p_bw_bytes_per_s = 351.8328e9 * kNvlinkRatio;
  cluster.intra_node_collectives = {};
  // SYSTEMS.md 3: 8 NICs per node. Their speed is not published: 400 Gb/s (DGX H100's
  // ConnectX-7, the common configuration) is an estimate, ~47 GB/s achieved (SYSTEMS.md 5).
  cluster.nics_per_node = 8;
  cluster.nic_bw_bytes_per_s = 47 * kGBPerS;
  cluster.provenance =
      "Zeppelin (EuroSys'26) cluster B, SYSTEMS.md sections 3 and 5: 8 nodes x 8 "
      "H800-SXM-80GB, H100 SXM's compute (989 TFLOP/s BF16, FlashAttention-3 H100 attention "
      "curves as h100), NVLink 400 GB/s aggregate (H800 datasheet; H100: 900), so NVLink "
      "busbw 164 GB/s and P2P 156 GB/s are h100's x 400/900 (estimates; no H800 nccl-tests "
      "measurements, collectives use the alpha-beta estimate). 8 NICs per node, one per "
      "GPU; their speed is not published: 400 Gb/s (~47 GB/s achieved) is an estimate, the "
      "common configuration. Latency 10 us intra / 30 us inter node (SYSTEMS.md 5).";
  return cluster;
}

}  // namespace

std::vector<std::string> cluster_preset_names() {
  return {"a100-ib400", "a800-roce", "h100", "h200", "h800"};
}

Cluster cluster_preset(const std::string& name) {
  if (name == "a100-ib400") return a100_ib400();
  if (name == "a800-roce") return a800_roce();
  if (name == "h100") return h100();
  if (name == "h200") return h200();
  if (name == "h800") return h800();
  throw InputError(fmt::format("unknown cluster preset '{}'{}; known presets: {}", name,
                               did_you_mean(name, cluster_preset_names()),
                               fmt::join(cluster_preset_names(), ", ")));
}

}  // namespace ballast
