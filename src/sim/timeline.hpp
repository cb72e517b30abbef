// Internal to the simulator: the task graph of one step (compute ops, transfers,
// collectives, joins) and the link ports they hold, run by a tiny explicit event pump.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ballast/cluster.hpp"
#include "ballast/units.hpp"

namespace ballast::sim {

/// Port indices of every link endpoint of a cluster: per rank an NVLink tx and rx port,
/// per NIC a tx and rx port. A port serves one task at a time.
class LinkPorts {
 public:
  explicit LinkPorts(const Cluster& cluster);
  int count() const { return 2 * ranks_ + 2 * nics_; }
  int nvlink_tx(int rank) const { return 2 * rank; }
  int nvlink_rx(int rank) const { return 2 * rank + 1; }
  int nic_tx(int nic) const { return 2 * ranks_ + 2 * nic; }
  int nic_rx(int nic) const { return 2 * ranks_ + 2 * nic + 1; }
  /// Inside a node: src NVLink-tx and dst NVLink-rx; across nodes: src NIC-tx, dst NIC-rx.
  std::vector<int> transfer_ports(int src_rank, int dst_rank) const;
  /// Both NVLink ports of members sharing a node with another member, and both ports of
  /// every member's NIC when the members span nodes. Sorted, no duplicates.
  std::vector<int> collective_ports(std::span<const int> member_ranks) const;

 private:
  const Cluster& cluster_;
  int ranks_ = 0;
  int nics_ = 0;
};

enum class TaskKind : std::uint8_t { compute, transfer, collective, join };

struct Task {
  TaskKind kind = TaskKind::join;
  int micro_batch = -1;
  Seconds duration_s = 0;
  int ports_begin = 0, ports_end = 0;  ///< range in the port pool
  int parties_begin = 0,
      parties_end = 0;  ///< compute: {rank}; transfer: {src, dst}; collective: members
  Seconds start_s = 0;  ///< filled by TaskGraph::run()
  Seconds end_s() const { return start_s + duration_s; }
};

/// Tasks are created in a topological order (a task depends only on earlier tasks), so
/// the graph is acyclic by construction. Dependency ids of -1 mean "none".
class TaskGraph {
 public:
  explicit TaskGraph(bool keep_names) : keep_names_(keep_names) {}

  template <typename NameFn>
  int add_compute(int rank, int micro_batch, Seconds duration_s, std::initializer_list<int> deps,
                  NameFn&& name) {
    const int parties[] = {rank};
    return named(add_task(TaskKind::compute, micro_batch, duration_s, {}, parties, deps), name);
  }
  template <typename NameFn>
  int add_transfer(int src_rank, int dst_rank, int micro_batch, Seconds duration_s,
                   std::span<const int> ports, std::initializer_list<int> deps, NameFn&& name) {
    const int parties[] = {src_rank, dst_rank};
    return named(add_task(TaskKind::transfer, micro_batch, duration_s, ports, parties, deps), name);
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

  /// Runs the event pump: every task starts at max(ready time, all its ports free), in
  /// order of ready time, ties by task id.
  void run(int port_count);

  int size() const { return static_cast<int>(tasks_.size()); }
  const Task& task(int id) const { return tasks_[id]; }
  std::span<const int> parties(int id) const;
  /// Empty unless the graph keeps names.
  const std::string& name(int id) const;
  /// What the tasks added from now on serve, for the trace (docs/simulator.md section 6:
  /// "linear", "remap", "ring inter-node", ...); a string literal. Kept with the names.
  void set_category(const char* category) { category_ = category; }
  /// "" unless the graph keeps names.
  const char* category(int id) const { return keep_names_ ? categories_[id] : ""; }

 private:
  int add_task(TaskKind kind, int micro_batch, Seconds duration_s, std::span<const int> ports,
               std::span<const int> parties, std::initializer_list<int> deps);
  void depend(int task_id, int dep_id);
  template <typename NameFn>
  int named(int id, NameFn&& name) {
    if (keep_names_) {
      names_.emplace_back(name());
      categories_.push_back(category_);
    }
    return id;
  }

  bool keep_names_;
  std::vector<Task> tasks_;
  std::vector<int> port_pool_;
  std::vector<int> party_pool_;
  std::vector<std::pair<int, int>> edges_;  ///< (dependency, dependent)
  std::vector<std::string> names_;          ///< names_[id] when keep_names_; joins get ""
  std::vector<const char*> categories_;     ///< categories_[id] when keep_names_
  const char* category_ = "";
};

}  // namespace ballast::sim
