// The simulator's task graph and its event-driven run: link ports, dependencies, and
// flow-level max-min fair sharing of every port by the transfers on it.
#include "timeline.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>

#include "ballast/error.hpp"

namespace ballast::sim {

namespace {

/// Each thread keeps the buffers of its last simulations (cleared, capacity kept) for the
/// next: a simulation of 1,024 GPUs builds vectors of tens of MB, which the allocator maps
/// fresh and the kernel zeroes page by page on every simulation, and planners simulate
/// many (zeppelin at 1,024 GPUs / 8,192 sequences spent 29% of its time there). What a
/// thread keeps is capped at kSpareBytesPerThread; a buffer that does not fit is freed.
constexpr std::size_t kSpareBytesPerThread = std::size_t{256} << 20;
constexpr std::size_t kSparesPerType = 8;

std::size_t& spare_bytes() {
  thread_local std::size_t bytes = 0;
  return bytes;
}

template <typename T>
std::vector<std::vector<T>>& spares_of() {
  thread_local std::vector<std::vector<T>> spares;
  return spares;
}

/// An empty vector, with the capacity of a spare when the thread has one.
template <typename T>
std::vector<T> take_spare() {
  auto& spares = spares_of<T>();
  if (spares.empty()) return {};
  std::vector<T> out = std::move(spares.back());
  spares.pop_back();
  spare_bytes() -= out.capacity() * sizeof(T);
  return out;
}

/// Clears `buffer` and keeps it for the thread's next take_spare<T>() if it fits.
template <typename T>
void give_spare(std::vector<T>& buffer) {
  buffer.clear();
  const std::size_t bytes = buffer.capacity() * sizeof(T);
  auto& spares = spares_of<T>();
  if (bytes == 0 || spares.size() >= kSparesPerType ||
      spare_bytes() + bytes > kSpareBytesPerThread) {
    return;  // freed with `buffer`
  }
  spare_bytes() += bytes;
  spares.push_back(std::move(buffer));
}

template <typename T>
void release_spares() {
  std::vector<std::vector<T>>().swap(spares_of<T>());
}

}  // namespace

LinkPorts::LinkPorts(const Cluster& cluster)
    : cluster_(cluster), ranks_(cluster.ranks()), nics_(cluster.nodes * cluster.nics_per_node) {}

std::array<int, 2> LinkPorts::transfer_ports(int src_rank, int dst_rank) const {
  if (cluster_.same_node(src_rank, dst_rank)) return {nvlink_tx(src_rank), nvlink_rx(dst_rank)};
  return {nic_tx(cluster_.nic_of(src_rank)), nic_rx(cluster_.nic_of(dst_rank))};
}

std::vector<int> LinkPorts::collective_ports(std::span<const int> member_ranks) const {
  std::vector<int> members_per_node(cluster_.nodes, 0);
  bool spans_nodes = false;
  for (int rank : member_ranks) {
    ++members_per_node[cluster_.node_of(rank)];
    spans_nodes = spans_nodes || !cluster_.same_node(rank, member_ranks.front());
  }
  std::vector<int> ports;
  for (int rank : member_ranks) {
    if (members_per_node[cluster_.node_of(rank)] >= 2) {
      ports.push_back(nvlink_tx(rank));
      ports.push_back(nvlink_rx(rank));
    }
    if (spans_nodes) {
      ports.push_back(nic_tx(cluster_.nic_of(rank)));
      ports.push_back(nic_rx(cluster_.nic_of(rank)));
    }
  }
  std::sort(ports.begin(), ports.end());
  ports.erase(std::unique(ports.begin(), ports.end()), ports.end());
  return ports;
}

TaskGraph::TaskGraph(bool keep_names)
    : keep_names_(keep_names),
      tasks_(take_spare<Task>()),
      port_pool_(take_spare<int>()),
      party_pool_(take_spare<int>()),
      edges_(take_spare<Edge>()),
      path_end_s_(take_spare<Seconds>()) {}

TaskGraph::~TaskGraph() {
  give_spare(tasks_);
  give_spare(port_pool_);
  give_spare(party_pool_);
  give_spare(edges_);
  give_spare(path_end_s_);
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
  for (int port : ports) port_pool_.push_back(port);  // few: cheaper than insert()'s range path
  task.ports_end = static_cast<int>(port_pool_.size());
  task.parties_begin = static_cast<int>(party_pool_.size());
  for (int party : parties) party_pool_.push_back(party);
  task.parties_end = static_cast<int>(party_pool_.size());
  const int id = static_cast<int>(tasks_.size());
  tasks_.push_back(task);
  path_end_s_.push_back(duration_s);
  longest_path_s_ = std::max(longest_path_s_, duration_s);
  for (int dep : deps) depend(id, dep);
  return id;
}

void TaskGraph::depend(int task_id, int dep_id, Seconds delay_s) {
  if (dep_id < 0) return;
  BALLAST_CHECK(dep_id < task_id, "tasks depend only on earlier tasks");
  BALLAST_CHECK(delay_s >= 0, "dependency delays are non-negative");
  edges_.push_back({dep_id, task_id, delay_s});
  // The task starts no earlier than this dependency's path end plus the delay (tasks that
  // already depend on it keep their ends: a lower bound still).
  const Seconds end_s = path_end_s_[dep_id] + delay_s + tasks_[task_id].duration_s;
  if (end_s > path_end_s_[task_id]) {
    path_end_s_[task_id] = end_s;
    longest_path_s_ = std::max(longest_path_s_, end_s);
  }
}

int TaskGraph::add_join(std::span<const int> deps) {
  std::vector<int>& real = join_scratch_;  // reused: a step adds tens of thousands of joins
  real.clear();
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

namespace {

/// What happens at an event's time.
enum class EventKind : std::uint8_t {
  ready,       ///< a task whose last dependency asked for a delay is ready
  activate,    ///< a transfer's latency is over: its data starts to flow
  take_ports,  ///< a collective starts: transfers on its ports pause
  finish,      ///< a task ends (a transfer's only if `version` is still current)
};

struct Event {
  Seconds time_s = 0;
  std::int64_t order = 0;  ///< scheduling order: ties at equal times run in this order
  EventKind kind = EventKind::finish;
  int task = 0;
  int version = 0;
  bool operator>(const Event& other) const {
    return time_s != other.time_s ? time_s > other.time_s : order > other.order;
  }
};

/// A transfer's data phase.
struct Flow {
  Seconds remaining_s = 0;  ///< time left at full speed
  double rate = 0;          ///< fraction of full speed now
  Seconds updated_s = 0;    ///< when remaining_s was last brought up to date
  Seconds predicted_s = 0;  ///< its finish at the current rate (infinity at rate 0)
  /// The time of its finish event in the heap (infinity: none). A slower rate leaves the
  /// event where it is (it is moved on when it fires early); a faster one schedules a new
  /// event and retires the old one by bumping `version`.
  Seconds scheduled_s = std::numeric_limits<Seconds>::infinity();
  int version = 0;
  bool active = false;
  bool collected = false;  ///< scratch: in the component being rebalanced
  bool fixed = false;      ///< scratch: its rate is settled in this rebalance
};

}  // namespace

/// The event-driven run of one TaskGraph (see TaskGraph::run). Events of one time are
/// handled together and the transfers' rates recomputed once after them, for the
/// transfers sharing ports with what changed.
class FlowSimulation {
 public:
  FlowSimulation(std::vector<Task>& tasks, const std::vector<int>& port_pool,
                 const std::vector<Edge>& edges, int port_count, std::size_t scanned_component_ports)
      : scanned_component_ports_(scanned_component_ports),
        tasks_(tasks),
        port_pool_(port_pool),
        port_flows_(static_cast<std::size_t>(port_count)),
        port_frozen_(static_cast<std::size_t>(port_count), 0),
        port_collective_free_s_(static_cast<std::size_t>(port_count), 0.0),
        port_mark_(static_cast<std::size_t>(port_count), -1),
        port_slot_(static_cast<std::size_t>(port_count), 0) {
    flow_slot_ = take_spare<int>();
    flow_slot_.assign(tasks.size(), -1);
    offsets_ = take_spare<int>();
    pending_ = take_spare<int>();
    successors_ = take_spare<Edge>();
    ready_s_ = take_spare<Seconds>();
    flows_ = take_spare<Flow>();
    const int n = static_cast<int>(tasks_.size());
    offsets_.assign(n + 1, 0);
    pending_.assign(n, 0);
    for (const Edge& edge : edges) {
      ++offsets_[edge.dependency + 1];
      ++pending_[edge.dependent];
    }
    for (int i = 0; i < n; ++i) offsets_[i + 1] += offsets_[i];
    successors_.resize(edges.size());
    std::vector<int> fill = take_spare<int>();
    fill.assign(offsets_.begin(), offsets_.end() - 1);
    for (const Edge& edge : edges) successors_[fill[edge.dependency]++] = edge;
    give_spare(fill);
    ready_s_.assign(n, 0.0);
    int transfers = 0;
    for (int id = 0; id < n; ++id) {
      if (tasks_[id].kind == TaskKind::transfer) flow_slot_[id] = transfers++;
    }
    flows_.resize(static_cast<std::size_t>(transfers));
  }

  /// Returns the number of tasks that ran: all of them (the graph is acyclic), unless the
  /// clock reached `stop_at_s` with tasks still to finish: it stops there, and every task
  /// not finished ends at now_s() or later.
  int run(Seconds stop_at_s) {
    const int task_count = static_cast<int>(tasks_.size());
    for (int id = 0; id < task_count; ++id) {
      if (pending_[id] == 0) start(id, 0.0);
    }
    while (!events_.empty() || !immediate_.empty()) {
      now_s_ = immediate_.empty() ? events_.top().time_s : now_s_;
      // Every unfinished task ends at an event of this time or later (the clock never goes
      // back), so the step lasts at least now_s_.
      if (now_s_ >= stop_at_s && finished_ < task_count) return finished_;
      // Every event of this time, those it schedules for the same time included (in a FIFO
      // beside the heap: most events of a step are zero-time joins and latency-free starts).
      for (;;) {
        if (path_reached_s_ > 0) return finished_;  // a started task's path reaches the stop
        if (next_immediate_ < immediate_.size()) {
          handle(immediate_[next_immediate_++]);
        } else if (!events_.empty() && events_.top().time_s == now_s_) {
          const Event event = events_.top();
          events_.pop();
          handle(event);
        } else {
          break;
        }
      }
      immediate_.clear();
      next_immediate_ = 0;
      rebalance(now_s_);
    }
    return finished_;
  }

  Seconds now_s() const { return now_s_; }

  /// For run(stop_at_s): each task's tail (the longest path from its start to the end of
  /// the step, every task alone on idle links: a collective without waiting for its ports,
  /// a transfer at full speed; each edge its delay). Contention only delays tasks (a
  /// transfer's rate is at most 1, a collective starts no earlier than it is ready), so a
  /// task started at t ends the step no sooner than t + its tail, and the run stops as
  /// soon as one is past_stop() of `stop_at_s` (path_reached_s()). O(tasks + edges): the
  /// tasks are in a topological order.
  void bound_paths(Seconds stop_at_s) {
    const int n = static_cast<int>(tasks_.size());
    tail_s_ = take_spare<Seconds>();
    tail_s_.assign(static_cast<std::size_t>(n), 0.0);
    for (int id = n; id-- > 0;) {
      Seconds after_s = 0;
      for (int e = offsets_[id]; e < offsets_[id + 1]; ++e) {
        const Edge& edge = successors_[e];
        after_s = std::max(after_s, edge.delay_s + tail_s_[edge.dependent]);
      }
      tail_s_[id] = tasks_[id].duration_s + after_s;  // durations are >= 0 (add_task)
    }
    path_stop_s_ = stop_at_s;
  }
  /// Once a started task's start + tail is past the stop of bound_paths(): that sum (a
  /// lower bound of the step); 0 before.
  Seconds path_reached_s() const { return path_reached_s_; }

  ~FlowSimulation() {
    give_spare(flow_slot_);
    give_spare(offsets_);
    give_spare(pending_);
    give_spare(successors_);
    give_spare(ready_s_);
    give_spare(flows_);
    give_spare(tail_s_);
  }
  FlowSimulation(const FlowSimulation&) = delete;
  FlowSimulation& operator=(const FlowSimulation&) = delete;

 private:

  void schedule(Seconds time_s, EventKind kind, int task, int version = 0) {
    const Event event{time_s, next_order_++, kind, task, version};
    if (time_s == now_s_) {
      immediate_.push_back(event);
    } else {
      events_.push(event);
    }
  }

  std::span<const int> ports_of(int id) const {
    const Task& t = tasks_[id];
    return {port_pool_.data() + t.ports_begin, port_pool_.data() + t.ports_end};
  }

  void touch(int id) {
    for (int port : ports_of(id)) dirty_ports_.push_back(port);
  }

  void handle(const Event& event) {
    const int id = event.task;
    switch (event.kind) {
      case EventKind::ready:
        start(id, event.time_s);
        return;
      case EventKind::activate: {
        Flow& flow = flow_of(id);
        const Task& t = tasks_[id];
        flow.remaining_s = t.duration_s - t.latency_s;
        flow.updated_s = event.time_s;
        if (flow.remaining_s <= 0 || t.ports_end == t.ports_begin) {
          schedule(event.time_s + std::max(0.0, flow.remaining_s), EventKind::finish, id,
                   flow.version);
          return;
        }
        flow.active = true;
        for (int port : ports_of(id)) port_flows_[port].push_back(id);
        touch(id);
        return;
      }
      case EventKind::take_ports:
        for (int port : ports_of(id)) ++port_frozen_[port];
        touch(id);
        schedule(tasks_[id].start_s + tasks_[id].duration_s, EventKind::finish, id);
        return;
      case EventKind::finish:
        if (tasks_[id].kind == TaskKind::transfer) {
          Flow& flow = flow_of(id);
          if (event.version != flow.version) return;  // retired by a faster rate
          if (flow.active && flow.predicted_s > event.time_s) {  // slowed down: not done yet
            flow.scheduled_s = flow.predicted_s;
            if (flow.predicted_s < std::numeric_limits<Seconds>::infinity()) {
              schedule(flow.predicted_s, EventKind::finish, id, flow.version);
            }
            return;
          }
        }
        finish(id, event.time_s);
        return;
    }
  }

  void start(int id, Seconds now_s) {
    Task& t = tasks_[id];
    t.start_s = now_s;
    if (!tail_s_.empty() && past_stop(now_s + tail_s_[id], path_stop_s_)) {
      path_reached_s_ = std::max(path_reached_s_, now_s + tail_s_[id]);
    }
    // A zero-time task moves no data: it neither waits for nor holds a port.
    if (t.duration_s <= 0 || t.kind == TaskKind::compute || t.kind == TaskKind::join) {
      schedule(now_s + std::max(0.0, t.duration_s), EventKind::finish, id);
      return;
    }
    if (t.kind == TaskKind::collective) {
      for (int port : ports_of(id)) t.start_s = std::max(t.start_s, port_collective_free_s_[port]);
      for (int port : ports_of(id)) port_collective_free_s_[port] = t.start_s + t.duration_s;
      schedule(t.start_s, EventKind::take_ports, id);
      return;
    }
    schedule(now_s + t.latency_s, EventKind::activate, id);  // a transfer
  }

  void finish(int id, Seconds now_s) {
    Task& t = tasks_[id];
    t.end_s = now_s;
    if (t.kind == TaskKind::collective && t.duration_s > 0) {
      for (int port : ports_of(id)) --port_frozen_[port];
      touch(id);
    }
    if (t.kind == TaskKind::transfer && flow_of(id).active) {
      flow_of(id).active = false;
      for (int port : ports_of(id)) {
        auto& flows = port_flows_[port];
        flows.erase(std::find(flows.begin(), flows.end(), id));
      }
      touch(id);
    }
    ++finished_;
    for (int e = offsets_[id]; e < offsets_[id + 1]; ++e) {
      const Edge& edge = successors_[e];
      const int next = edge.dependent;
      ready_s_[next] = std::max(ready_s_[next], now_s + edge.delay_s);
      if (--pending_[next] != 0) continue;
      if (ready_s_[next] > now_s) {
        schedule(ready_s_[next], EventKind::ready, next);
      } else {
        start(next, now_s);
      }
    }
  }

  /// Recomputes the max-min fair rates of every transfer connected through shared ports
  /// to the ports touched since the last call, and their predicted finishes.
  void rebalance(Seconds now_s) {
    if (dirty_ports_.empty()) return;
    ++mark_;
    component_ports_.clear();
    component_flows_.clear();
    for (int port : dirty_ports_) visit_port(port);
    dirty_ports_.clear();
    for (std::size_t i = 0; i < component_ports_.size(); ++i) {
      for (int id : port_flows_[component_ports_[i]]) {
        Flow& flow = flow_of(id);
        if (flow.collected) continue;
        flow.collected = true;
        component_flows_.push_back(id);
        for (int port : ports_of(id)) visit_port(port);
      }
    }
    for (int id : component_flows_) {
      Flow& flow = flow_of(id);
      flow.remaining_s = std::max(0.0, flow.remaining_s - flow.rate * (now_s - flow.updated_s));
      flow.updated_s = now_s;
      flow.collected = false;
    }
    fill_progressively(now_s);
  }

  /// Progressive filling over the component (every port capacity 1, 0 while a collective
  /// holds it): the port with the smallest fair share (capacity left / transfers not yet
  /// fixed) fixes its transfers at that share. Fixing a transfer never lowers another
  /// port's share, so a min-heap with stale entries skipped finds the bottlenecks in
  /// O((ports + transfers) log ports) (fill_by_heap); a component of at most
  /// scanned_component_ports_ ports scans for them instead (fill_by_scanning).
  void fill_progressively(Seconds now_s) {
    if (component_flows_.size() == 1) {  // alone: full speed unless a collective holds a port
      const int id = component_flows_.front();
      double share = 1.0;
      for (int port : ports_of(id)) {
        if (port_frozen_[port] > 0) share = 0.0;
      }
      set_rate(id, share, now_s);
      return;
    }
    const std::size_t ports = component_ports_.size();
    capacity_.assign(ports, 0.0);
    unfixed_.assign(ports, 0);
    for (std::size_t i = 0; i < ports; ++i) {
      const int port = component_ports_[i];
      capacity_[i] = port_frozen_[port] > 0 ? 0.0 : 1.0;
      unfixed_[i] = static_cast<int>(port_flows_[port].size());
    }
    if (ports <= scanned_component_ports_) {
      fill_by_scanning(now_s);
    } else {
      fill_by_heap(now_s);
    }
    for (int id : component_flows_) flow_of(id).fixed = false;
  }

  /// The bottlenecks from a min-heap of (fair share, slot) in a reused vector, ties by
  /// slot, stale entries skipped.
  void fill_by_heap(Seconds now_s) {
    auto& shares = shares_;
    shares.clear();
    const auto push = [&shares](double share, int slot) {
      shares.emplace_back(share, slot);
      std::push_heap(shares.begin(), shares.end(), std::greater<>());
    };
    for (std::size_t i = 0; i < component_ports_.size(); ++i) {
      if (unfixed_[i] > 0) push(capacity_[i] / unfixed_[i], static_cast<int>(i));
    }
    while (!shares.empty()) {
      std::pop_heap(shares.begin(), shares.end(), std::greater<>());
      const auto [share, slot] = shares.back();
      shares.pop_back();
      if (unfixed_[slot] == 0 || share != std::max(0.0, capacity_[slot]) / unfixed_[slot]) {
        continue;  // stale: the port's share grew since this entry, or it is done
      }
      fix_flows_at(slot, share, now_s, [&](int other) {
        if (unfixed_[other] > 0) push(std::max(0.0, capacity_[other]) / unfixed_[other], other);
      });
    }
  }

  /// The bottlenecks by a scan over the ports instead of a heap (fewer instructions on a
  /// few ports): the same ports in the same order (the smallest share, ties: the lower
  /// slot), so the same rates to the bit.
  void fill_by_scanning(Seconds now_s) {
    const std::size_t ports = component_ports_.size();
    for (;;) {
      int slot = -1;
      double share = 0;
      for (std::size_t i = 0; i < ports; ++i) {
        if (unfixed_[i] == 0) continue;
        const double candidate = std::max(0.0, capacity_[i]) / unfixed_[i];
        if (slot < 0 || candidate < share) {
          slot = static_cast<int>(i);
          share = candidate;
        }
      }
      if (slot < 0) break;
      fix_flows_at(slot, share, now_s, [](int /*other*/) {});
    }
  }

  /// Fixes every transfer of component port `slot` not fixed yet at `share`, taking the
  /// share off each of its ports; `changed(other)` is told each other port it took it off.
  template <typename Changed>
  void fix_flows_at(int slot, double share, Seconds now_s, Changed&& changed) {
    for (int id : port_flows_[component_ports_[static_cast<std::size_t>(slot)]]) {
      Flow& flow = flow_of(id);
      if (flow.fixed) continue;
      flow.fixed = true;
      for (int port : ports_of(id)) {
        const int other = port_slot_[port];
        capacity_[other] -= share;
        --unfixed_[other];
        if (other != slot) changed(other);
      }
      set_rate(id, share, now_s);
    }
  }

  /// A transfer's new rate and predicted finish; a finish event only when it comes earlier
  /// than the one already scheduled.
  void set_rate(int id, double rate, Seconds now_s) {
    Flow& flow = flow_of(id);
    if (flow.rate == rate && flow.scheduled_s < std::numeric_limits<Seconds>::infinity()) return;
    flow.rate = rate;
    flow.predicted_s =
        rate > 0 ? now_s + flow.remaining_s / rate : std::numeric_limits<Seconds>::infinity();
    if (flow.predicted_s < flow.scheduled_s) {
      ++flow.version;
      flow.scheduled_s = flow.predicted_s;
      schedule(flow.predicted_s, EventKind::finish, id, flow.version);
    }
  }

  void visit_port(int port) {
    if (port_mark_[port] == mark_) return;
    port_mark_[port] = mark_;
    port_slot_[port] = static_cast<int>(component_ports_.size());
    component_ports_.push_back(port);
  }

  std::size_t scanned_component_ports_;
  std::vector<Task>& tasks_;
  const std::vector<int>& port_pool_;
  std::vector<int> offsets_, pending_;
  std::vector<Edge> successors_;  ///< by dependency: successors_[offsets_[id] .. offsets_[id+1])
  std::vector<Seconds> ready_s_;
  std::vector<Seconds> tail_s_;  ///< bound_paths(): per task, its tail (empty: not bounded)
  Seconds path_stop_s_ = std::numeric_limits<Seconds>::infinity();
  Seconds path_reached_s_ = 0;
  Flow& flow_of(int transfer_id) { return flows_[flow_slot_[transfer_id]]; }

  std::vector<int> flow_slot_;  ///< per task: its index in flows_ (-1: not a transfer)
  std::vector<Flow> flows_;     ///< one per transfer
  std::vector<std::vector<int>> port_flows_;   ///< active transfers on each port
  std::vector<int> port_frozen_;               ///< collectives holding each port now
  std::vector<Seconds> port_collective_free_s_;
  std::vector<int> port_mark_;  ///< == mark_ when the port is in the current component
  std::vector<int> port_slot_;  ///< its index in component_ports_ then
  int mark_ = 0;
  std::vector<int> dirty_ports_;  ///< touched since the last rebalance
  std::vector<int> component_ports_, component_flows_;
  std::vector<double> capacity_;
  std::vector<int> unfixed_;
  std::vector<std::pair<double, int>> shares_;  ///< fill_progressively's heap
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::vector<Event> immediate_;  ///< events scheduled for now_s_, in order
  std::size_t next_immediate_ = 0;
  Seconds now_s_ = 0;
  std::int64_t next_order_ = 0;
  int finished_ = 0;
};

void TaskGraph::run(int port_count) {
  FlowSimulation simulation(tasks_, port_pool_, edges_, port_count, scanned_component_ports_);
  const int finished = simulation.run(std::numeric_limits<Seconds>::infinity());
  BALLAST_CHECK(finished == size(), "every task of the step runs (the graph is acyclic)");
}

Seconds TaskGraph::run_until(int port_count, Seconds stop_at_s) {
  const bool bounded = path_stop_ && stop_at_s < std::numeric_limits<Seconds>::infinity();
  if (bounded && past_stop(longest_path_s_, stop_at_s)) {
    ++path_stop_count();
    return path_stop_answer_s(longest_path_s_, stop_at_s);
  }
  FlowSimulation simulation(tasks_, port_pool_, edges_, port_count, scanned_component_ports_);
  if (bounded) simulation.bound_paths(stop_at_s);
  const int finished = simulation.run(stop_at_s);
  if (finished < size()) {
    if (simulation.path_reached_s() > 0) ++path_stop_count();
    return std::max(simulation.now_s(), path_stop_answer_s(simulation.path_reached_s(), stop_at_s));
  }
  Seconds end_s = 0;
  for (const Task& task : tasks_) end_s = std::max(end_s, task.end_s);
  return end_s;
}

std::int64_t& path_stop_count() {
  thread_local std::int64_t count = 0;
  return count;
}

void release_spare_buffers() {
  release_spares<Task>();
  release_spares<int>();
  release_spares<Edge>();
  release_spares<Seconds>();
  release_spares<Flow>();
  spare_bytes() = 0;
}

}  // namespace ballast::sim
