// emulated_cluster (emulated_cluster.hpp): the cluster CPU processes emulate.
#include "ballast/emulated_cluster.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "ballast/cost_model.hpp"
#include "ballast/error.hpp"

namespace ballast {

Cluster emulated_cluster(const Model& model, int ranks, int gpus_per_node, Tokens rank_tokens) {
  Cluster cluster = load_cluster("h100", 1);
  const int per_node = std::max(1, std::min(gpus_per_node, ranks));
  if (ranks % per_node != 0) {
    throw InputError(fmt::format("{} {} does not divide the job's {} ranks; pick a divisor",
                                 setting_name("--gpus-per-node"), gpus_per_node, ranks));
  }
  cluster.name = fmt::format("emulated-{}x{}", ranks / per_node, per_node);
  cluster.gpu_name = "CPU core (one process)";
  // Fixed estimates, what ballast.torch's gloo processes plan with (`ballast run` replaces
  // them by this host's measurements: the overload below, `ballast calibrate --host`). Taken
  // from an earlier machine whose OpenBLAS fell back to SSE3 kernels (`OPENBLAS_NUM_THREADS=1
  // build/bench/bench_kernels`, docs/runtime.md): sgemm ~28 GFLOP/s is the peak; the blocked attention reaches ~80% of
  // it on long documents and works in 64-token tiles (64-token documents reach ~9 GFLOP/s);
  // the model's thin GEMMs (hidden 64) run at about half the ceiling (estimate). Links are
  // Open MPI's shared memory between processes of one machine (estimate: ~5 GB/s, 2 us),
  // the same for both classes: the emulated nodes only decide membership.
  cluster.peak_flops_per_s = 28e9;
  cluster.attention_efficiency = 0.8;
  cluster.matmul_efficiency = 0.5;
  cluster.attention_tile_tokens = 64;
  cluster.intra_node_bus_bw_bytes_per_s = 5e9;
  cluster.intra_node_p2p_bw_bytes_per_s = 5e9;
  cluster.nic_bw_bytes_per_s = 5e9;
  cluster.intra_node_latency_s = 2e-6;
  cluster.inter_node_latency_s = 2e-6;
  cluster.gpus_per_node = per_node;
  cluster.nics_per_node = per_node;
  cluster.nodes = ranks / per_node;
  // Memory for rank_tokens tokens of activations plus the model states (ZeRO-3, as the
  // cost model counts them), at 90% usable.
  const double states = kModelStateBytesPerParameter * model.parameters / ranks;
  cluster.memory_usable_fraction = 0.9;
  cluster.gpu_memory_bytes = static_cast<Bytes>(
      (states + model.stored_activation_bytes_per_token() * static_cast<double>(rank_tokens)) / 0.9) + 1;
  cluster.provenance = "emulated: one CPU process (an MPI rank of ballast run, a gloo process) per GPU";
  return cluster;
}

Cluster emulated_cluster(const Model& model, int ranks, int gpus_per_node, Tokens rank_tokens,
                         const Cluster& host) {
  const Cluster shape = emulated_cluster(model, ranks, gpus_per_node, rank_tokens);
  Cluster cluster = host;
  cluster.name = fmt::format("{} as {}", host.name, shape.name);
  cluster.nodes = shape.nodes;
  cluster.gpus_per_node = shape.gpus_per_node;
  cluster.nics_per_node = shape.nics_per_node;
  cluster.gpu_memory_bytes = shape.gpu_memory_bytes;
  cluster.memory_usable_fraction = shape.memory_usable_fraction;
  return cluster;
}

}  // namespace ballast
