// Each rank's program for one step as tasks: per micro-batch overhead, linear layers (with
// their tensor-parallel collectives and an MoE model's expert all-to-alls), remaps and attention groups in queue order, forward
// then backward; then gradient sync.
#include "program.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <queue>

#include "ballast/error.hpp"
#include "ballast/trace.hpp"
#include "schemes.hpp"

namespace ballast::sim {

namespace {

/// Tokens of one sequence moving from `linear_rank` (linear layout) to `attention_rank`.
struct RemapFlow {
  int linear_rank = 0;
  int attention_rank = 0;
  Tokens tokens = 0;
};

/// What a micro-batch asks of each rank.
struct MicroBatchLayout {
  std::vector<Tokens> linear_tokens;  ///< per rank
  std::vector<bool> participates;     ///< holds tokens or is in a group
  std::vector<RemapFlow> flows;       ///< empty without a linear layout
  std::vector<int> group_order;       ///< an order of groups consistent with every queue
};

/// Groups in an order in which each is at the head of all its members' queues when
/// taken (smallest group index first among those ready).
std::vector<int> group_order(const MicroBatch& micro_batch, int index, int ranks) {
  const std::vector<std::vector<int>> queues = effective_queues(micro_batch, ranks);
  const auto& groups = micro_batch.groups;
  std::vector<std::size_t> head(queues.size(), 0);
  std::vector<std::size_t> members_at_head(groups.size(), 0);
  std::priority_queue<int, std::vector<int>, std::greater<>> ready;
  const auto arrive = [&](int group) {
    if (++members_at_head[group] == groups[group].ranks.size()) ready.push(group);
  };
  for (const auto& queue : queues) {
    if (!queue.empty()) arrive(queue.front());
  }
  std::vector<int> order;
  while (!ready.empty()) {
    const int group = ready.top();
    ready.pop();
    order.push_back(group);
    for (int rank : groups[group].ranks) {
      if (++head[rank] < queues[rank].size()) arrive(queues[rank][head[rank]]);
    }
  }
  if (order.size() != groups.size()) {
    throw InputError(fmt::format(
        "plan: the queues of micro-batch {} deadlock (no order runs every group); reorder "
        "the queues so that ranks sharing groups run them in the same relative order",
        index));
  }
  return order;
}

/// Overlaps of linear slices and attention chunks of each sequence, summed per
/// (linear rank, attention rank) pair, in rank order.
std::vector<RemapFlow> remap_flows(const MicroBatch& micro_batch) {
  std::map<std::int64_t, std::vector<LinearSlice>> slices_of;
  for (const LinearSlice& slice : micro_batch.linear_layout)
    slices_of[slice.sequence_id].push_back(slice);
  std::map<std::pair<int, int>, Tokens> moved;
  for (const AttentionGroup& group : micro_batch.groups) {
    for (const SequenceChunks& sequence : group.sequences) {
      auto slices = slices_of[sequence.sequence_id];
      auto chunks = sequence.chunks;
      std::sort(slices.begin(), slices.end(),
                [](auto& a, auto& b) { return a.begin_tokens < b.begin_tokens; });
      std::sort(chunks.begin(), chunks.end(),
                [](auto& a, auto& b) { return a.begin_tokens < b.begin_tokens; });
      for (std::size_t s = 0, c = 0; s < slices.size() && c < chunks.size();) {
        const Tokens overlap = std::min(slices[s].end_tokens, chunks[c].end_tokens) -
                               std::max(slices[s].begin_tokens, chunks[c].begin_tokens);
        if (overlap > 0) moved[{slices[s].rank, chunks[c].rank}] += overlap;
        if (slices[s].end_tokens < chunks[c].end_tokens)
          ++s;
        else
          ++c;
      }
    }
  }
  std::vector<RemapFlow> flows;
  for (const auto& [ranks, tokens] : moved) flows.push_back({ranks.first, ranks.second, tokens});
  return flows;
}

MicroBatchLayout layout_of(const MicroBatch& micro_batch, int index, int ranks) {
  MicroBatchLayout layout;
  layout.linear_tokens.assign(ranks, 0);
  layout.participates.assign(ranks, false);
  for (const AttentionGroup& group : micro_batch.groups) {
    for (int rank : group.ranks) layout.participates[rank] = true;
    for (const SequenceChunks& sequence : group.sequences) {
      for (const Chunk& chunk : sequence.chunks) {
        // Without a remap the linear modules run on the attention chunks, padding included.
        if (micro_batch.linear_layout.empty()) layout.linear_tokens[chunk.rank] += chunk.size();
      }
    }
  }
  for (const LinearSlice& slice : micro_batch.linear_layout) {
    layout.linear_tokens[slice.rank] += slice.end_tokens - slice.begin_tokens;
  }
  for (int rank = 0; rank < ranks; ++rank) {
    if (layout.linear_tokens[rank] > 0) layout.participates[rank] = true;
  }
  if (!micro_batch.linear_layout.empty()) layout.flows = remap_flows(micro_batch);
  layout.group_order = group_order(micro_batch, index, ranks);
  return layout;
}

class StepBuilder {
 public:
  StepBuilder(const Plan& plan, const CostModel& cost, const LinkPorts& ports, TaskGraph& graph)
      : plan_(plan),
        cost_(cost),
        ports_(ports),
        graph_(graph),
        cursor_(static_cast<std::size_t>(plan.cluster.ranks()), -1) {}

  int build(GradientSync gradient_sync, Seconds stop_at_s) {
    stop_at_s_ = stop_at_s;
    std::vector<int> backward_start = cursor_;
    std::vector<Seconds> backward_compute_s(cursor_.size(), 0.0);
    for (std::size_t m = 0; m < plan_.micro_batches.size(); ++m) {
      const int index = static_cast<int>(m);
      const MicroBatchLayout layout = layout_of(plan_.micro_batches[m], index, ranks());
      if (!add_pass(index, layout, Pass::forward)) return kStepBuildStopped;
      backward_start = cursor_;
      const int first_backward_task = graph_.size();
      if (cost_.model().forward_passes() == 2) {
        // Full recomputation reruns the forward (its communication too) in the backward
        // pass, layer by layer; charged for all layers like every op, and counted as
        // backward time for the gradient buckets (gradients appear through both).
        graph_.set_name_suffix(" (recompute)");
        if (!add_pass(index, layout, Pass::forward)) return kStepBuildStopped;
        graph_.set_name_suffix("");
      }
      if (!add_pass(index, layout, Pass::backward)) return kStepBuildStopped;
      if (m + 1 < plan_.micro_batches.size()) continue;  // only the last one's matters
      for (int id = first_backward_task; id < graph_.size(); ++id) {
        const Task& task = graph_.task(id);
        if (task.kind == TaskKind::compute) {
          backward_compute_s[graph_.parties(id)[0]] += task.duration_s;
        }
      }
    }
    const int first_sync_task = graph_.size();
    if (gradient_sync == GradientSync::end) {
      add_gradient_sync_at_end();
    } else {
      add_overlapped_gradient_sync(backward_start, backward_compute_s);
    }
    return first_sync_task;
  }

 private:
  int ranks() const { return static_cast<int>(cursor_.size()); }
  BuildContext context(int micro_batch) {
    return {cost_, ports_, graph_, cursor_, micro_batch, plan_.sequence_lengths_tokens};
  }

  /// Whether the tasks so far already last past stop_at_s_ (their longest path).
  bool stopped() const { return past_stop(graph_.longest_path_s(), stop_at_s_); }

  /// Adds micro-batch m's pass; false when it stopped (stopped(), checked after each
  /// attention group and at the end) with the rest not added.
  bool add_pass(int m, const MicroBatchLayout& layout, Pass pass) {
    const double qkv_fraction = cost_.model().qkv_flops_fraction();
    const bool forward = pass == Pass::forward;
    if (forward) add_overhead(m, pass);
    // Per layer, Megatron-LM's sequence parallelism all-gathers before the QKV projection,
    // reduce-scatters after the output projection, all-gathers before the MLP and
    // reduce-scatters after it; backward swaps the two kinds. Charged for all layers, the
    // one before the first linear task and the three after the second (forward; the mirror
    // image backward).
    if (forward) {
      add_tensor_parallel(m, layout, 1, 0, "tensor parallel all-gather fwd");
    } else {
      add_tensor_parallel(m, layout, 2, 1, "tensor parallel all-gather, reduce-scatter, all-gather bwd");
      add_experts(m, layout, pass);
    }
    add_linear(m, layout, pass, forward ? "linear qkv" : "linear out+mlp",
               forward ? qkv_fraction : 1 - qkv_fraction);
    add_remap(m, layout, pass, /*to_attention=*/true);
    BuildContext ctx = context(m);
    for (int group : layout.group_order) {
      add_attention_group(ctx, plan_.micro_batches[m].groups[group], pass);
      if (stopped()) return false;
    }
    add_remap(m, layout, pass, /*to_attention=*/false);
    add_linear(m, layout, pass, forward ? "linear out+mlp" : "linear qkv",
               forward ? 1 - qkv_fraction : qkv_fraction);
    if (forward) add_experts(m, layout, pass);
    if (forward) {
      add_tensor_parallel(m, layout, 1, 2, "tensor parallel reduce-scatter, all-gather, reduce-scatter fwd");
    } else {
      add_tensor_parallel(m, layout, 0, 1, "tensor parallel reduce-scatter bwd");
      add_overhead(m, pass);
    }
    return !stopped();
  }

  /// The TP collectives of each rank with linear tokens (`all_gathers` and
  /// `reduce_scatters` per layer over its linear tokens) as one collective on the rank's
  /// NVLink ports: its N GPUs' links, which its ring, Ulysses and remap transfers use too.
  /// Not overlapped with compute (Megatron-LM's default). Nothing without TP.
  void add_tensor_parallel(int m, const MicroBatchLayout& layout, int all_gathers,
                           int reduce_scatters, const char* what) {
    if (cost_.cluster().tensor_parallel.gpus <= 1) return;
    graph_.set_category(trace_category::kTensorParallel);
    for (int rank = 0; rank < ranks(); ++rank) {
      const Tokens tokens = layout.linear_tokens[rank];
      const Seconds duration_s =
          all_gathers * cost_.tensor_parallel_collective_time_s(CollectiveOp::all_gather, tokens) +
          reduce_scatters *
              cost_.tensor_parallel_collective_time_s(CollectiveOp::reduce_scatter, tokens);
      if (duration_s <= 0) continue;
      const int member[] = {rank};
      const int ports[] = {ports_.nvlink_tx(rank), ports_.nvlink_rx(rank)};
      const int deps[] = {cursor_[rank]};
      cursor_[rank] = graph_.add_collective(member, m, duration_s, ports, deps,
                                            [&] { return std::string(what); });
    }
  }

  /// An MoE model's routed experts beyond balanced routing on each rank with linear
  /// tokens: the expert-parallel all-to-alls (dispatch and combine per layer, charged for
  /// all layers) as one collective on the rank's NVLink ports (and its NIC's when the
  /// expert-parallel group spans nodes), then the load imbalance of micro-batch m
  /// (expert_imbalance_time_s) as compute. After the MLP forward, before it backward.
  /// Nothing for a dense model.
  void add_experts(int m, const MicroBatchLayout& layout, Pass pass) {
    const Model& model = cost_.model();
    if (!model.is_moe()) return;
    const Cluster& cluster = plan_.cluster;
    const bool spans_nodes = model.expert_parallel > cluster.gpus_per_node;
    for (int rank = 0; rank < ranks(); ++rank) {
      const Tokens tokens = layout.linear_tokens[rank];
      const Seconds all_to_all_s = 2 * cost_.expert_parallel_all_to_all_time_s(tokens);
      if (all_to_all_s > 0) {
        graph_.set_category(trace_category::kExpertParallel);
        std::vector<int> ports = {ports_.nvlink_tx(rank), ports_.nvlink_rx(rank)};
        if (spans_nodes) {
          ports.push_back(ports_.nic_tx(cluster.nic_of(rank)));
          ports.push_back(ports_.nic_rx(cluster.nic_of(rank)));
        }
        const int member[] = {rank};
        const int deps[] = {cursor_[rank]};
        cursor_[rank] = graph_.add_collective(member, m, all_to_all_s, ports, deps, [&] {
          return fmt::format("expert all-to-all dispatch+combine {}", pass_name(pass));
        });
      }
      const Seconds imbalance_s = cost_.expert_imbalance_time_s(tokens, pass, m);
      if (imbalance_s > 0) {
        graph_.set_category(trace_category::kLinear);
        cursor_[rank] = graph_.add_compute(rank, m, imbalance_s, {cursor_[rank]}, [&] {
          return fmt::format("expert load imbalance {}", pass_name(pass));
        });
      }
    }
  }

  /// Every rank pays every micro-batch's overhead, tokens or not: the overhead is FlexSP's
  /// profiled b1, which holds ZeRO-3's parameter all-gathers, collectives over all ranks,
  /// and a data-parallel step runs the same number of micro-batches on every rank.
  void add_overhead(int m, Pass pass) {
    const Seconds overhead_s = cost_.micro_batch_overhead_s(pass);
    if (overhead_s <= 0) return;
    graph_.set_category(trace_category::kOverhead);
    for (int rank = 0; rank < ranks(); ++rank) {
      cursor_[rank] = graph_.add_compute(rank, m, overhead_s, {cursor_[rank]}, [&] {
        return fmt::format("overhead {}", pass_name(pass));
      });
    }
  }

  void add_linear(int m, const MicroBatchLayout& layout, Pass pass, const char* what,
                  double fraction) {
    graph_.set_category(trace_category::kLinear);
    for (int rank = 0; rank < ranks(); ++rank) {
      const Seconds duration_s = cost_.linear_time_s(layout.linear_tokens[rank], pass) * fraction;
      if (!layout.participates[rank] || duration_s <= 0) continue;
      cursor_[rank] = graph_.add_compute(rank, m, duration_s, {cursor_[rank]}, [&] {
        return fmt::format("{} {}", what, pass_name(pass));
      });
    }
  }

  /// Hidden states move between the layouts; a rank's next op waits for its incoming
  /// transfers, its outgoing ones start when it reaches the remap.
  void add_remap(int m, const MicroBatchLayout& layout, Pass pass, bool to_attention) {
    if (layout.flows.empty()) return;
    graph_.set_category(trace_category::kRemap);
    BuildContext ctx = context(m);
    const Bytes bytes_per_token = cost_.model().hidden_bytes_per_token();
    std::map<int, std::vector<int>> incoming;
    for (const RemapFlow& flow : layout.flows) {
      const int src = to_attention ? flow.linear_rank : flow.attention_rank;
      const int dst = to_attention ? flow.attention_rank : flow.linear_rank;
      if (src == dst) continue;
      incoming[dst].push_back(
          add_p2p(ctx, src, dst, bytes_per_token * flow.tokens, cursor_[src], 1, 1, [&] {
            return fmt::format("remap {} to {}", pass_name(pass),
                               to_attention ? "attention" : "linear");
          }));
    }
    for (auto& [rank, arrivals] : incoming) {
      arrivals.push_back(cursor_[rank]);
      cursor_[rank] = graph_.add_join(arrivals);
    }
  }

  std::vector<int> everyone() const {
    std::vector<int> all(cursor_.size());
    for (int rank = 0; rank < ranks(); ++rank) all[rank] = rank;
    return all;
  }

  void add_gradient_sync_at_end() {
    const std::vector<int> all = everyone();
    graph_.set_category(trace_category::kGradientSync);
    graph_.add_collective(all, -1, cost_.gradient_sync_time_s(), ports_.collective_ports(all),
                          cursor_, [] { return std::string("gradient sync"); });
  }

  /// Bucket b of B is ready on a rank once the rank's last backward pass has done b / B of
  /// its compute (gradients appear at a steady rate through the backward pass: every op is
  /// charged for all layers) and starts when every rank has it ready and the previous
  /// bucket is done; the last bucket waits for the end of every rank's program.
  void add_overlapped_gradient_sync(const std::vector<int>& backward_start,
                                    const std::vector<Seconds>& backward_compute_s) {
    const std::vector<int> all = everyone();
    const std::vector<int> ports = ports_.collective_ports(all);
    const int buckets = gradient_sync_buckets(cost_.model());
    const Seconds bucket_s = cost_.gradient_bucket_sync_time_s(buckets);
    graph_.set_category(trace_category::kGradientSync);
    int previous = -1;
    for (int b = 1; b <= buckets; ++b) {
      const bool last = b == buckets;
      const std::span<const int> deps = last ? std::span<const int>(cursor_) : std::span<const int>();
      const int bucket = graph_.add_collective(all, -1, bucket_s, ports, deps, [&] {
        return buckets == 1 ? std::string("gradient sync")
                            : fmt::format("gradient sync bucket {}", b);
      });
      graph_.depend(bucket, previous);
      if (!last) {
        const double done = static_cast<double>(b) / buckets;
        for (int rank = 0; rank < ranks(); ++rank) {
          graph_.depend(bucket, backward_start[rank], done * backward_compute_s[rank]);
        }
      }
      previous = bucket;
    }
  }

  const Plan& plan_;
  const CostModel& cost_;
  const LinkPorts& ports_;
  TaskGraph& graph_;
  std::vector<int> cursor_;  ///< per rank: the task its next op waits for (-1: none)
  Seconds stop_at_s_ = std::numeric_limits<Seconds>::infinity();  ///< build()'s stop
};

}  // namespace

int build_step_program(const Plan& plan, const CostModel& cost, const LinkPorts& ports,
                       GradientSync gradient_sync, TaskGraph& graph, Seconds stop_at_s) {
  return StepBuilder(plan, cost, ports, graph).build(gradient_sync, stop_at_s);
}

}  // namespace ballast::sim
