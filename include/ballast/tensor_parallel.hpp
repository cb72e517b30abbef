// Tensor parallelism (Megatron-LM with sequence parallelism) as the planners see it: a
// cluster whose ranks are TP groups of N GPUs of one node (docs/cost-model.md, "Tensor
// parallelism"), the TP degrees a cluster and model allow, and the KV heads that limit the
// baselines' Ulysses degree on such a cluster.
#pragma once

#include <vector>

#include "ballast/cluster.hpp"
#include "ballast/model.hpp"

namespace ballast {

/// TP degrees N for `gpus` (a cluster of GPUs) and `model`: N divides the GPUs per node,
/// the attention heads and the KV heads, and a TP group either spans whole NICs or shares
/// one (N a multiple or a divisor of the GPUs per NIC). Ascending; 1 always.
std::vector<int> valid_tensor_parallel_degrees(const Cluster& gpus, const Model& model);

/// The cluster whose ranks are the TP groups of `tensor_parallel` consecutive GPUs of a
/// node (GPU i of a node in group i / N): per node gpus_per_node / N ranks; per rank N
/// times one GPU's peak FLOP/s, memory, NVLink p2p and bus bandwidth (each of the N GPUs
/// sends 1/N of a rank's bytes through its own NVLink port), every calibrated intra-node
/// fit's bus bandwidth x N at the same GPU count and latency (g ranks run N parallel
/// g-GPU collectives of 1/N the bytes); NICs: a rank spanning k NICs has one NIC of k
/// times the bandwidth, ranks sharing a NIC share it. Records N and the GPU-level
/// all-gather / reduce-scatter fits on N GPUs in cluster.tensor_parallel. N = 1 returns
/// `gpus` unchanged. Throws InputError naming --tp and the valid values when N is not in
/// valid_tensor_parallel_degrees(), and when `gpus` already is a cluster of TP groups.
Cluster tensor_parallel_units(const Cluster& gpus, const Model& model, int tensor_parallel);

/// The KV heads each rank's GPUs hold between them per head group: model.kv_heads /
/// cluster.tensor_parallel.gpus. The baseline strategies (DeepSpeed-Ulysses, FlexSP)
/// split them d ways in a Ulysses group of d ranks, so their d divides this; a plan may
/// also use a multiple of it, replicating KV heads (plan.hpp's ulysses_degree_allowed).
int ulysses_kv_heads(const Model& model, const Cluster& cluster);

}  // namespace ballast
