// Internal to the simulator: how each attention scheme (local, ring, all-gather,
// Ulysses) and each point-to-point transfer (direct or routed) becomes tasks.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
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

/// How many ring and USP groups took their step times from this thread's cache
/// (open_simulation_cache), for tests: the cached path must actually run.
std::int64_t& step_time_cache_hit_count();

/// A task's name, made on demand (only a graph that keeps names asks): a reference to a
/// callable returning std::string that outlives the call, like the builders' lambdas. A
/// std::function would copy each lambda, on the heap when it captures more than two
/// references: tens of thousands of allocations a step at 1,024 GPUs.
class NameRef {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, NameRef>>>
  NameRef(const F& name)  // NOLINT(google-explicit-constructor): lambdas convert in calls
      : object_(&name), call_(&call<F>) {}
  std::string operator()() const { return call_(object_); }

 private:
  template <typename F>
  static std::string call(const void* object) {
    return (*static_cast<const F*>(object))();
  }
  const void* object_;
  std::string (*call_)(const void*);
};

/// Adds one group's attention for `pass`, each member starting at its cursor, and moves
/// the members' cursors to where the group ends on them.
void add_attention_group(BuildContext& ctx, const AttentionGroup& group, Pass pass);

/// A transfer of bytes_per_layer from src to dst that can start once `dep` ended; split
/// into routing_parts() parts over proxy GPUs (Zeppelin's routing, plan_layout.hpp) when
/// that is > 1, each routed part pipelined in routing_chunks pieces. Returns the task at
/// whose end the data has arrived (`dep` itself for a same-rank or empty transfer, which
/// is free).
int add_p2p(BuildContext& ctx, int src_rank, int dst_rank, Bytes bytes_per_layer, int dep,
            int routing_proxies, int routing_chunks, NameRef name);

/// A time the transfer add_p2p builds (same arguments, on idle links from time 0) never
/// ends before: its longest chain of tasks (the direct transfer; or part 0's, and for each
/// other part its first piece's dispatch, every piece's NIC hop in turn and its last
/// piece's combine), each at its p2p_time_s (a task never runs faster than alone).
Seconds p2p_floor_s(const CostModel& cost, int src_rank, int dst_rank, Bytes bytes_per_layer,
                    int routing_proxies, int routing_chunks);

}  // namespace ballast::sim
