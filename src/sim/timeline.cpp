// The simulator's task graph and its event pump: link ports, dependencies, and the
// FIFO-by-ready-time list schedule that makes NIC sharing and contention visible.
#include "timeline.hpp"

#include <algorithm>
#include <functional>
#include <queue>
#include <set>

#include "ballast/error.hpp"

namespace ballast::sim {

LinkPorts::LinkPorts(const Cluster& cluster)
    : cluster_(cluster), ranks_(cluster.ranks()), nics_(cluster.nodes * cluster.nics_per_node) {}

std::vector<int> LinkPorts::transfer_ports(int src_rank, int dst_rank) const {
  if (cluster_.same_node(src_rank, dst_rank)) return {nvlink_tx(src_rank), nvlink_rx(dst_rank)};
  return {nic_tx(cluster_.nic_of(src_rank)), nic_rx(cluster_.nic_of(dst_rank))};
}

std::vector<int> LinkPorts::collective_ports(std::span<const int> member_ranks) const {
  std::set<int> nodes;
  std::vector<int> members_per_node(cluster_.nodes, 0);
  for (int rank : member_ranks) {
    nodes.insert(cluster_.node_of(rank));
    ++members_per_node[cluster_.node_of(rank)];
  }
  std::set<int> ports;
  for (int rank : member_ranks) {
    if (members_per_node[cluster_.node_of(rank)] >= 2) {
      ports.insert(nvlink_tx(rank));
      ports.insert(nvlink_rx(rank));
    }
    if (nodes.size() > 1) {
      ports.insert(nic_tx(cluster_.nic_of(rank)));
      ports.insert(nic_rx(cluster_.nic_of(rank)));
    }
  }
  return {ports.begin(), ports.end()};
}

int TaskGraph::add_task(TaskKind kind, int micro_batch, Seconds duration_s,
                        std::span<const int> ports, std::span<const int> parties,
                        std::initializer_list<int> deps) {
  BALLAST_CHECK(duration_s >= 0, "task durations are non-negative");
  Task task;
  task.kind = kind;
  task.micro_batch = micro_batch;
  task.duration_s = duration_s;
  task.ports_begin = static_cast<int>(port_pool_.size());
  port_pool_.insert(port_pool_.end(), ports.begin(), ports.end());
  task.ports_end = static_cast<int>(port_pool_.size());
  task.parties_begin = static_cast<int>(party_pool_.size());
  party_pool_.insert(party_pool_.end(), parties.begin(), parties.end());
  task.parties_end = static_cast<int>(party_pool_.size());
  const int id = static_cast<int>(tasks_.size());
  tasks_.push_back(task);
  for (int dep : deps) depend(id, dep);
  return id;
}

void TaskGraph::depend(int task_id, int dep_id) {
  if (dep_id < 0) return;
  BALLAST_CHECK(dep_id < task_id, "tasks depend only on earlier tasks");
  edges_.emplace_back(dep_id, task_id);
}

int TaskGraph::add_join(std::span<const int> deps) {
  std::vector<int> real;
  for (int dep : deps) {
    if (dep >= 0 && std::find(real.begin(), real.end(), dep) == real.end()) real.push_back(dep);
  }
  if (real.empty()) return -1;
  if (real.size() == 1) return real.front();
  const int id = add_task(TaskKind::join, -1, 0.0, {}, {}, {});
  for (int dep : real) depend(id, dep);
  if (keep_names_) {
    names_.emplace_back();
    categories_.push_back("");
  }
  return id;
}

std::span<const int> TaskGraph::parties(int id) const {
  const Task& t = task(id);
  return {party_pool_.data() + t.parties_begin, party_pool_.data() + t.parties_end};
}

const std::string& TaskGraph::name(int id) const {
  static const std::string kNoName;
  if (!keep_names_) return kNoName;
  return names_[id];
}

void TaskGraph::run(int port_count) {
  const int n = size();
  // Successor lists in compressed form: successors[offsets[id] .. offsets[id + 1]).
  std::vector<int> offsets(n + 1, 0);
  std::vector<int> pending(n, 0);
  for (const auto& [dep, dependent] : edges_) {
    ++offsets[dep + 1];
    ++pending[dependent];
  }
  for (int i = 0; i < n; ++i) offsets[i + 1] += offsets[i];
  std::vector<int> successors(edges_.size());
  std::vector<int> fill(offsets.begin(), offsets.end() - 1);
  for (const auto& [dep, dependent] : edges_) successors[fill[dep]++] = dependent;

  std::vector<Seconds> ready_s(n, 0.0);
  std::vector<Seconds> port_free_s(port_count, 0.0);
  using Event = std::pair<Seconds, int>;  // (ready time, task id): ties by task id
  std::priority_queue<Event, std::vector<Event>, std::greater<>> queue;
  for (int id = 0; id < n; ++id) {
    if (pending[id] == 0) queue.emplace(0.0, id);
  }
  int started = 0;
  while (!queue.empty()) {
    const auto [ready, id] = queue.top();
    queue.pop();
    Task& t = tasks_[id];
    // A zero-time task moves no data: it neither waits for nor holds a port.
    const bool holds_ports = t.duration_s > 0;
    t.start_s = ready;
    for (int p = t.ports_begin; holds_ports && p < t.ports_end; ++p) {
      t.start_s = std::max(t.start_s, port_free_s[port_pool_[p]]);
    }
    for (int p = t.ports_begin; holds_ports && p < t.ports_end; ++p) {
      port_free_s[port_pool_[p]] = t.end_s();
    }
    ++started;
    for (int s = offsets[id]; s < offsets[id + 1]; ++s) {
      const int next = successors[s];
      ready_s[next] = std::max(ready_s[next], t.end_s());
      if (--pending[next] == 0) queue.emplace(ready_s[next], next);
    }
  }
  BALLAST_CHECK(started == n, "every task of the step runs (the graph is acyclic)");
}

}  // namespace ballast::sim
