// tensor_parallel_units(): the cluster of TP groups the planners, the cost model and the
// simulator work on; the valid TP degrees; the KV heads a baseline's Ulysses degree divides.
#include "ballast/tensor_parallel.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ballast/collectives.hpp"
#include "ballast/error.hpp"

namespace ballast {

namespace {

bool valid_degree(const Cluster& gpus, const Model& model, int degree) {
  const int per_nic = gpus.gpus_per_nic();
  return gpus.gpus_per_node % degree == 0 && model.heads % degree == 0 &&
         model.kv_heads % degree == 0 && (degree % per_nic == 0 || per_nic % degree == 0);
}

/// Each fit of the table at its GPU count, bus bandwidth x tensor_parallel.
CollectiveFitTable scaled_fits(const CollectiveFitTable& table, int tensor_parallel) {
  CollectiveFitTable scaled = table;
  for (auto& [op, fits] : scaled) {
    for (CollectiveFit& fit : fits) fit.bus_bw_bytes_per_s *= tensor_parallel;
  }
  return scaled;
}

}  // namespace

std::vector<int> valid_tensor_parallel_degrees(const Cluster& gpus, const Model& model) {
  std::vector<int> degrees;
  for (int degree = 1; degree <= gpus.gpus_per_node; ++degree) {
    if (valid_degree(gpus, model, degree)) degrees.push_back(degree);
  }
  return degrees;
}

Cluster tensor_parallel_units(const Cluster& gpus, const Model& model, int tensor_parallel) {
  if (gpus.tensor_parallel.gpus > 1) {
    throw InputError(fmt::format(
        "cluster '{}' already has {}-way tensor parallelism; give the cluster of GPUs to {}",
        gpus.name, gpus.tensor_parallel.gpus, setting_name("--tp")));
  }
  if (tensor_parallel == 1) return gpus;
  if (tensor_parallel < 1 || !valid_degree(gpus, model, tensor_parallel)) {
    throw InputError(fmt::format(
        "{} {} is not valid for cluster '{}' ({} GPUs per node, {} per NIC) and model '{}' "
        "({} heads, {} KV heads): a TP group is GPUs of one node, so the degree must divide "
        "the GPUs per node, the heads and the KV heads, and span whole NICs or share one; "
        "valid values: {}",
        setting_name("--tp"), tensor_parallel, gpus.name, gpus.gpus_per_node,
        gpus.gpus_per_nic(), model.name, model.heads, model.kv_heads,
        fmt::join(valid_tensor_parallel_degrees(gpus, model), ", ")));
  }
  const int n = tensor_parallel;
  Cluster units = gpus;
  units.gpus_per_node = gpus.gpus_per_node / n;
  units.gpu_memory_bytes = saturating_multiply(gpus.gpu_memory_bytes, Bytes{n});
  units.peak_flops_per_s = gpus.peak_flops_per_s * n;
  units.intra_node_bus_bw_bytes_per_s = gpus.intra_node_bus_bw_bytes_per_s * n;
  units.intra_node_p2p_bw_bytes_per_s = gpus.intra_node_p2p_bw_bytes_per_s * n;
  units.intra_node_collectives = scaled_fits(gpus.intra_node_collectives, n);
  const int per_nic = gpus.gpus_per_nic();
  if (n % per_nic == 0) {  // a group spans n / per_nic NICs: one NIC of their bandwidth
    units.nics_per_node = units.gpus_per_node;
    units.nic_bw_bytes_per_s = gpus.nic_bw_bytes_per_s * (n / per_nic);
  }  // else per_nic / n groups share each NIC, as their GPUs do: NICs unchanged
  units.tensor_parallel = {n, intra_node_collective_fit(gpus, CollectiveOp::all_gather, n),
                           intra_node_collective_fit(gpus, CollectiveOp::reduce_scatter, n)};
  validate_cluster(units, fmt::format("cluster '{}' with {} {}", gpus.name, setting_name("--tp"), n));
  return units;
}

int ulysses_kv_heads(const Model& model, const Cluster& cluster) {
  return model.kv_heads / cluster.tensor_parallel.gpus;
}

}  // namespace ballast
