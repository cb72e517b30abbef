// Internal to the simulator: how each attention scheme (local, ring, all-gather,
// Ulysses) and each point-to-point transfer (direct or routed) becomes tasks.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ballast/cost_model.hpp"
#include "ballast/plan.hpp"
#include "timeline.hpp"

namespace ballast::sim {

/// What a scheme builder needs: the cost model, the ports, the graph being built and,
/// per rank, the task its program waits for before its next op (-1: nothing yet).
struct BuildContext {
  const CostModel& cost;
  const LinkPorts& ports;
  TaskGraph& graph;
  std::vector<int>& cursor;
  int micro_batch = 0;
  /// The plan's sequence lengths (padding is not computed on a packed cluster); only
  /// attention groups read them.
  std::span<const Tokens> sequence_lengths_tokens = {};
};

const char* pass_name(Pass pass);  ///< "fwd" or "bwd"

/// Adds one group's attention for `pass`, each member starting at its cursor, and moves
/// the members' cursors to where the group ends on them.
void add_attention_group(BuildContext& ctx, const AttentionGroup& group, Pass pass);

/// A transfer of bytes_per_layer from src to dst that can start once `dep` ended; split
/// into routing_parts() parts over proxy GPUs (Zeppelin's routing, plan_layout.hpp) when
/// that is > 1, each routed part pipelined in routing_chunks pieces. Returns the task at
/// whose end the data has arrived (`dep` itself for a same-rank or empty transfer, which
/// is free).
int add_p2p(BuildContext& ctx, int src_rank, int dst_rank, Bytes bytes_per_layer, int dep,
            int routing_proxies, int routing_chunks, const std::function<std::string()>& name);

/// A time the transfer add_p2p builds (same arguments, on idle links from time 0) never
/// ends before: its longest chain of tasks (the direct transfer; or part 0's, and for each
/// other part its first piece's dispatch, every piece's NIC hop in turn and its last
/// piece's combine), each at its p2p_time_s (a task never runs faster than alone).
Seconds p2p_floor_s(const CostModel& cost, int src_rank, int dst_rank, Bytes bytes_per_layer,
                    int routing_proxies, int routing_chunks);

}  // namespace ballast::sim
