// Zeppelin's routing rule (plan_layout.hpp): parts per hop, the proxy GPU of each part and
// the part's elements; the one copy the simulator, the MPI runtime and validate() call.
#include <algorithm>

#include "ballast/error.hpp"
#include "ballast/plan_layout.hpp"

namespace ballast {

int routing_parts(const Cluster& cluster, int routing_proxies, int src_rank, int dst_rank) {
  const int parts = std::min(routing_proxies, cluster.nics_per_node);
  if (parts <= 1 || cluster.same_node(src_rank, dst_rank)) return 1;
  return parts;
}

int routing_proxy(const Cluster& cluster, int rank, int part) {
  BALLAST_CHECK(part >= 0 && part < cluster.nics_per_node, "a routed part has a NIC of its own");
  const int gpus = cluster.gpus_per_node;
  return cluster.node_of(rank) * gpus + (rank % gpus + part * cluster.gpus_per_nic()) % gpus;
}

PartRange routed_part_range(std::int64_t total, int parts, int part) {
  BALLAST_CHECK(total >= 0 && parts >= 1 && part >= 0 && part < parts,
                "a routed part lies inside its transfer");
  const std::int64_t share = ceil_div(total, parts);
  return {std::min(total, saturating_multiply(part, share)),
          std::min(total, saturating_multiply(part + 1, share))};
}

}  // namespace ballast
