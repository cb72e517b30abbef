// Internal to the simulator: the task graph of one step (compute ops, transfers,
// collectives, joins) and the link ports they use, run by an event-driven simulation in
// which concurrent transfers share each port max-min fairly (flow-level, as the analytical
// network backends of ASTRA-sim and SimAI do).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ballast/cluster.hpp"
#include "ballast/units.hpp"

namespace ballast::sim {

/// Port indices of every link endpoint of a cluster: per rank an NVLink tx and rx port
/// (on NVSwitch machines a GPU sends to any peers at once, up to its aggregate NVLink
/// bandwidth: one port per direction, not one per peer), per NIC a tx and rx port (shared
/// by the GPUs that use the NIC). Every port of a kind has the same bandwidth, which is
/// also the rate one transfer alone reaches on it, so a port's capacity is 1 (one
/// transfer at full speed) and concurrent transfers split it max-min fairly.
class LinkPorts {
 public:
  explicit LinkPorts(const Cluster& cluster);
  int count() const { return 2 * ranks_ + 2 * nics_; }
  int nvlink_tx(int rank) const { return 2 * rank; }
  int nvlink_rx(int rank) const { return 2 * rank + 1; }
  int nic_tx(int nic) const { return 2 * ranks_ + 2 * nic; }
  int nic_rx(int nic) const { return 2 * ranks_ + 2 * nic + 1; }
  /// Inside a node: src NVLink-tx and dst NVLink-rx; across nodes: src NIC-tx, dst NIC-rx.
  /// A fixed pair (no allocation: a step builds one per transfer, tens of thousands).
  std::array<int, 2> transfer_ports(int src_rank, int dst_rank) const;
  /// Both NVLink ports of members sharing a node with another member, and both ports of
  /// every member's NIC when the members span nodes. Sorted, no duplicates.
  std::vector<int> collective_ports(std::span<const int> member_ranks) const;

 private:
  const Cluster& cluster_;
  int ranks_ = 0;
  int nics_ = 0;
};

/// Components of at most this many ports are filled by scanning their ports for the
/// bottleneck; larger ones by a heap (TaskGraph::set_scanned_component_ports). Measured by
/// callgrind on `ballast plan --strategy ballast` on defaults: 12% fewer instructions than
/// the heap alone (the components of its steps average about 12 ports).
constexpr std::size_t kScannedComponentPorts = 32;

/// Paths are summed in another order than a run sums the same times (a path of n tasks
/// may differ by n ulps, ~1e-12 relative): only a path past a stop by this share stops
/// anything, and what is answered is this share below the path.
constexpr double kPathMargin = 1e-9;
/// Whether a step known to last at least `path_s` (a path) certainly ends at or after
/// `stop_at_s`.
inline bool past_stop(Seconds path_s, Seconds stop_at_s) { return path_s >= stop_at_s * (1 + kPathMargin); }
/// What a run stopped by a path of `path_s` answers: a lower bound of the step that is at
/// least `stop_at_s`.
inline Seconds path_stop_answer_s(Seconds path_s, Seconds stop_at_s) {
  return std::max(stop_at_s, path_s * (1 - kPathMargin));
}

/// Bounded evaluations of this thread stopped by a path: a step build that stopped
/// (build_step_program) or a run_until() (TaskGraph::set_path_stop).
std::int64_t& path_stop_count();

/// Frees the buffers this thread keeps for its next simulations (timeline.cpp).
void release_spare_buffers();

enum class TaskKind : std::uint8_t { compute, transfer, collective, join };

/// `dependent` is ready no earlier than `delay_s` after `dependency` ends.
struct Edge {
  int dependency = 0;
  int dependent = 0;
  Seconds delay_s = 0;
};

struct Task {
  TaskKind kind = TaskKind::join;
  int micro_batch = -1;
  /// compute, collective: its time. transfer: its time alone on idle links, latency_s
  /// (which holds no port) then the data at full speed on its ports.
  Seconds duration_s = 0;
  Seconds latency_s = 0;  ///< transfer only
  int ports_begin = 0, ports_end = 0;  ///< range in the port pool
  int parties_begin = 0,
      parties_end = 0;  ///< compute: {rank}; transfer: {src, dst}; collective: members
  Seconds start_s = 0;  ///< filled by TaskGraph::run()
  Seconds end_s = 0;    ///< filled by TaskGraph::run()
};

/// Tasks are created in a topological order (a task depends only on earlier tasks), so
/// the graph is acyclic by construction. Dependency ids of -1 mean "none".
class TaskGraph {
 public:
  /// Takes its buffers from the thread's spares (SpareBuffers in timeline.cpp) and gives
  /// them back when destroyed, so consecutive simulations of one thread reuse memory.
  explicit TaskGraph(bool keep_names);
  ~TaskGraph();
  TaskGraph(const TaskGraph&) = default;  // a copy owns copies of the buffers
  TaskGraph& operator=(const TaskGraph&) = default;
  TaskGraph(TaskGraph&&) = default;
  TaskGraph& operator=(TaskGraph&&) = default;

  template <typename NameFn>
  int add_compute(int rank, int micro_batch, Seconds duration_s, std::initializer_list<int> deps,
                  NameFn&& name) {
    const int parties[] = {rank};
    return named(add_task(TaskKind::compute, micro_batch, duration_s, {}, parties, deps), name);
  }
  /// A transfer taking `duration_s` alone on idle links, the first `latency_s` of which
  /// hold no port; the rest is shared with the other transfers on its ports.
  template <typename NameFn>
  int add_transfer(int src_rank, int dst_rank, int micro_batch, Seconds duration_s,
                   Seconds latency_s, std::span<const int> ports, std::initializer_list<int> deps,
                   NameFn&& name) {
    const int parties[] = {src_rank, dst_rank};
    const int id = add_task(TaskKind::transfer, micro_batch, duration_s, ports, parties, deps);
    tasks_[id].latency_s = std::clamp(latency_s, 0.0, duration_s);
    return named(id, name);
  }
  template <typename NameFn>
  int add_collective(std::span<const int> member_ranks, int micro_batch, Seconds duration_s,
                     std::span<const int> ports, std::span<const int> deps, NameFn&& name) {
    const int id = add_task(TaskKind::collective, micro_batch, duration_s, ports, member_ranks, {});
    for (int dep : deps) depend(id, dep);
    return named(id, name);
  }
  /// A zero-time task that ends when all `deps` end; returns the single dep itself when
  /// there is only one, and -1 when there is none.
  int add_join(std::span<const int> deps);
  /// `task_id` becomes ready no earlier than `delay_s` after `dep_id` ends (dep_id < task_id;
  /// -1: nothing).
  void depend(int task_id, int dep_id, Seconds delay_s = 0);

  /// Runs the step as an event-driven simulation (docs/simulator.md section 3):
  /// - a compute or join task starts when its dependencies have ended;
  /// - a collective (closed-form time) starts at max(ready, its ports free of earlier
  ///   collectives), collectives served in order of ready time; while it runs it has its
  ///   ports to itself: transfers on them pause;
  /// - a transfer waits its latency, then moves its data at a rate that is the max-min
  ///   fair share of its ports (capacity 1 each), recomputed whenever a transfer starts or
  ///   ends or a collective takes or frees a port, for the transfers sharing ports with
  ///   the change (transitively).
  /// Simultaneous events are handled in the order they were scheduled, so a run is
  /// deterministic.
  void run(int port_count);
  /// run(), but stops once the step is known to end at `stop_at_s` or later: the clock
  /// reached it with tasks still to finish, or a path did (set_path_stop). The tasks'
  /// times are then partial or unset. Returns the last task's end (the step, as run()
  /// gives it) when every task finished before `stop_at_s`; otherwise a lower bound of
  /// that end, >= stop_at_s.
  Seconds run_until(int port_count, Seconds stop_at_s);
  /// Whether run_until() stops on the tasks' paths (each task alone on idle links): with
  /// no run when the whole graph's longest path already reaches stop_at_s, and as soon as
  /// a started task's start plus its longest path to the end does. Tests turn it off to
  /// compare. Default: on.
  void set_path_stop(bool on) { path_stop_ = on; }
  /// Transfers sharing ports are rated by progressive filling over their component: up to
  /// this many ports by a scan for the bottleneck, beyond it by a heap (the two give the
  /// same rates to the bit; tests compare them with 0 and SIZE_MAX). Default:
  /// kScannedComponentPorts.
  void set_scanned_component_ports(std::size_t ports) { scanned_component_ports_ = ports; }

  int size() const { return static_cast<int>(tasks_.size()); }
  /// The longest path through the tasks added so far, every task alone on idle links
  /// (its duration) and every edge its delay: a lower bound of any run's step (contention
  /// only delays tasks), kept as tasks and edges are added (exact when every edge into a
  /// task is added before any edge out of it, as the step builder does).
  Seconds longest_path_s() const { return longest_path_s_; }
  const Task& task(int id) const { return tasks_[id]; }
  std::span<const int> parties(int id) const;
  /// Empty unless the graph keeps names.
  const std::string& name(int id) const;
  /// What the tasks added from now on serve, for the trace (docs/simulator.md section 6:
  /// "linear", "remap", "ring inter-node", ...); a string literal. Kept with the names.
  void set_category(const char* category) { category_ = category; }
  /// "" unless the graph keeps names.
  const char* category(int id) const { return keep_names_ ? categories_[id] : ""; }
  /// Appended to the names of the tasks added from now on ("" for none; a string literal):
  /// " (recompute)" marks the forward pass full recomputation reruns.
  void set_name_suffix(const char* suffix) { name_suffix_ = suffix; }

 private:
  int add_task(TaskKind kind, int micro_batch, Seconds duration_s, std::span<const int> ports,
               std::span<const int> parties, std::initializer_list<int> deps);
  template <typename NameFn>
  int named(int id, NameFn&& name) {
    if (keep_names_) {
      names_.emplace_back(name());
      if (*name_suffix_ != '\0') names_.back() += name_suffix_;
      categories_.push_back(category_);
    }
    return id;
  }

  bool keep_names_;
  std::size_t scanned_component_ports_ = kScannedComponentPorts;
  bool path_stop_ = true;
  std::vector<Task> tasks_;
  std::vector<int> port_pool_;
  std::vector<int> party_pool_;
  std::vector<Edge> edges_;
  std::vector<Seconds> path_end_s_;  ///< per task: its end on the longest path to it
  Seconds longest_path_s_ = 0;
  std::vector<int> join_scratch_;  ///< add_join's distinct dependencies
  std::vector<std::string> names_;          ///< names_[id] when keep_names_; joins get ""
  std::vector<const char*> categories_;     ///< categories_[id] when keep_names_
  const char* category_ = "";
  const char* name_suffix_ = "";
};

}  // namespace ballast::sim
