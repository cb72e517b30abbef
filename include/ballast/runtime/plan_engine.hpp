// Executes the attention of one micro-batch of a Plan over MPI: the remap between the
// linear layout and the attention layout (all-to-allv), then each of this rank's groups in
// its queue order with the group's scheme: local (varlen), ring (zigzag chunks, KV blocks
// passed with non-blocking point-to-point overlapped with the block's compute; backward,
// each block's dK/dV partial follows one step behind it, overlapped with the next step's
// compute, and the last step returns it to its owner), all_gather (KV of every member;
// dK/dV reduced back to the owner), ulysses (all-to-all from sequence to head sharding,
// GQA-aware) and usp (Ulysses inside each stage, ring attention between the stages' members
// of the same heads). Every rank of the engine's communicator is plan rank = its rank there (the
// job's ranks, or under tensor parallelism the ranks of one member index, tensor_parallel.hpp);
// all ranks call forward/backward for every layer of every micro-batch (the remap is
// collective).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include <mpi.h>

#include "ballast/plan.hpp"
#include "ballast/runtime/model.hpp"
#include "ballast/trace.hpp"

namespace ballast::runtime {

/// Bytes and time this rank spent communicating, per link class.
struct CommunicationStats {
  std::int64_t intra_node_bytes_sent = 0;
  std::int64_t inter_node_bytes_sent = 0;
  double wait_s = 0;      ///< wall time blocked in MPI waits and collectives
  double wait_cpu_s = 0;  ///< thread CPU time spent inside them (MPI polls while it waits)
};

/// A span of wall time: start (an MPI_Wtime) and duration, in seconds.
struct WallInterval {
  double start_s = 0;
  double duration_s = 0;
};

/// This thread's CPU time in seconds (CLOCK_THREAD_CPUTIME_ID): what "busy" counts, so it
/// stays meaningful when ranks share cores.
double thread_cpu_s();

/// Runs `collective` (blocking MPI calls), adding its wall time and this thread's CPU time
/// to `stats` and its interval to `calls` (the TP and EP groups' timing).
template <typename Collective>
void timed_collective(CommunicationStats& stats, std::vector<WallInterval>& calls,
                      Collective&& collective) {
  const double start = MPI_Wtime();
  const double cpu_start = thread_cpu_s();
  collective();
  const double duration = MPI_Wtime() - start;
  stats.wait_s += duration;
  stats.wait_cpu_s += thread_cpu_s() - cpu_start;
  calls.push_back({start, duration});
}

/// MPI's int counts and displacements, in floats, of rows[m] rows of `width` floats per
/// member, in member order. Throws InputError naming `what` (e.g. "a tensor-parallel
/// collective") and the fix when the floats exceed MPI's int counts.
void mpi_row_counts(std::span<const int> rows, int width, const char* what,
                    std::vector<int>& counts, std::vector<int>& displacements);

/// One token of a layout: sequence id and position inside the sequence.
struct TokenRef {
  std::int64_t sequence = 0;
  std::int64_t position = 0;
};

class PlanAttentionEngine final : public AttentionEngine {
 public:
  /// `plan` must outlive the engine; `rank` = this process's MPI rank in `comm`.
  PlanAttentionEngine(const Plan& plan, int micro_batch, MPI_Comm comm);
  ~PlanAttentionEngine() override;
  PlanAttentionEngine(const PlanAttentionEngine&) = delete;
  PlanAttentionEngine& operator=(const PlanAttentionEngine&) = delete;

  /// This rank's tokens for the per-token ops: the micro-batch's linear layout (its
  /// slices in layout order) or, without one, its attention chunks in queue order
  /// (padding dropped). Targets come from `documents` (document i = sequence i).
  TokenBatch linear_batch(const std::vector<std::vector<std::int32_t>>& documents) const;

  void forward(int layer, const AttentionShape& shape, const TokenBatch& batch, const float* q,
               const float* k, const float* v, float* out) override;
  void backward(int layer, const AttentionShape& shape, const TokenBatch& batch,
                const float* d_out, float* d_q, float* d_k, float* d_v) override;

  const CommunicationStats& stats() const { return stats_; }

  /// Records this rank's timeline from now on: events() gets the attention compute of each
  /// group (category group_category(), cut where the rank blocks) and every blocking wait
  /// (category "remap" or the group's), times in seconds from `origin_s` (an MPI_Wtime);
  /// attention_calls() gets every forward/backward call (the linear modules run between).
  void record_trace(double origin_s);
  const std::vector<TraceEvent>& events() const { return events_; }
  const std::vector<WallInterval>& attention_calls() const { return attention_calls_; }

  /// Test-only (BALLAST_FAULT, fault.hpp): `hook` runs once, at the first point of this
  /// micro-batch where this rank has point-to-point messages in flight (a ring shift or a
  /// group exchange, after posting and before waiting), or at the end of its first
  /// forward() when its groups post none; its argument says which.
  void set_fault_hook(std::function<void(const char* where)> hook) { fault_hook_ = std::move(hook); }

 private:
  struct GroupTokens {
    int group = 0;          ///< index in the micro-batch
    int first = 0;          ///< this rank's tokens of the group start here in its attention layout
    int count = 0;
  };
  /// Ulysses: this member's heads of every token of its group (member order), kept from the
  /// forward for the backward, which then exchanges only dO.
  struct HeadShard {
    std::vector<float> q, k, v, out, lse;
  };
  struct Saved {  ///< per layer, attention layout of this rank
    std::vector<float> q, k, v, out, lse;
    std::vector<HeadShard> head_shards;  ///< per entry of my_groups_ (empty unless Ulysses)
  };
  /// A group's members, their tokens' tiles and the buffers its scheme reuses, built at the
  /// group's first call and kept for every layer and pass (plan_schemes_internal.hpp).
  struct GroupState;

  /// Moves rows of `width` floats from one layout to the other (all-to-allv).
  void remap(const std::vector<std::vector<TokenRef>>& from,
             const std::vector<std::vector<TokenRef>>& to, const float* in, float* out,
             int width);
  std::vector<TokenRef> group_tokens(const AttentionGroup& group, int rank) const;
  /// The state of my_groups_[index], built at its first call.
  GroupState& group_state(std::size_t index);
  /// Ulysses: every token of the state's members in member order (all, first_row, all_tiles).
  static void gather_members(GroupState& state);
  /// USP: the state's stage and ring sub-states (stage_group, ring_group, stage, ring).
  static void split_usp(GroupState& state);
  /// my_groups_[index] on the attention layout: forward fills saved.out and saved.lse (and
  /// a Ulysses group's head shard); backward adds to d_q, d_k, d_v.
  void run_group_forward(const AttentionShape& shape, std::size_t index, Saved& saved);
  void run_group_backward(const AttentionShape& shape, std::size_t index, const Saved& saved,
                          const float* d_out, float* d_q, float* d_k, float* d_v);
  void ring_forward(const AttentionShape& shape, GroupState& state, const float* q,
                    const float* k, const float* v, float* out, float* lse);
  void ring_backward(const AttentionShape& shape, GroupState& state, const float* q,
                     const float* k, const float* v, const float* d_out, const float* lse,
                     const float* delta, float* d_q, float* d_k, float* d_v);
  /// An all-gather group's KV exchange of `phase` posted (this rank's block copied into
  /// state.gathered, every other member's block received into its place); returns the
  /// gathered floats. The caller computes, then waits on state.requests.
  std::size_t post_kv_gather(const AttentionShape& shape, GroupState& state, const float* k,
                             const float* v, int phase);
  void all_gather_forward(const AttentionShape& shape, GroupState& state, const float* q,
                          const float* k, const float* v, float* out, float* lse);
  void all_gather_backward(const AttentionShape& shape, GroupState& state, const float* q,
                           const float* k, const float* v, const float* d_out, const float* lse,
                           const float* delta, float* d_q, float* d_k, float* d_v);
  /// Ulysses over state's group; with `ring` (USP: state is this rank's stage) the head
  /// shard's attention runs as ring attention over the stages (ring_forward on `ring`).
  void ulysses_forward(const AttentionShape& shape, GroupState& state, const float* q,
                       const float* k, const float* v, float* out, float* lse, HeadShard& shard,
                       GroupState* ring);
  void ulysses_backward(const AttentionShape& shape, GroupState& state, const HeadShard& shard,
                        const float* d_out, float* d_q, float* d_k, float* d_v,
                        GroupState* ring);
  /// Non-blocking point-to-point of a group exchange, appended to `requests` (the send
  /// counts its bytes); wait_exchange() completes them.
  void post_receive(float* data, std::size_t floats, int peer, int tag,
                    std::vector<MPI_Request>& requests);
  void post_send(const float* data, std::size_t floats, int peer, int tag,
                 std::vector<MPI_Request>& requests);
  /// Runs the fault hook (messages are in flight), then waits for every request and clears
  /// the list.
  void wait_exchange(std::vector<MPI_Request>& requests);
  void count_sent(int peer, std::int64_t bytes);
  /// Runs and clears fault_hook_ if one is set.
  void run_fault_hook(const char* where);
  /// Runs a blocking MPI wait, adding its wall and CPU time to stats_ (and, recording, an
  /// event in the current category, after closing the compute segment before it).
  void timed_wait(const char* name, const std::function<void()>& wait);
  /// Recording: the attention work that follows serves `category` ("remap" or a group's),
  /// in pass `pass` ("fwd" or "bwd") of `group` (-1: none, no compute segment is kept).
  void begin_segment(const char* category, int group, const char* pass);
  /// Recording: closes the current compute segment at `now_s` (a group's compute).
  void end_segment(double now_s);
  /// group_category() of the micro-batch's group `group`.
  const char* category_of(int group) const;
  /// Posts one ring shift of the state's group: member m sends sizes[m] floats to member
  /// m + 1 (this rank sends `send`, receives its predecessor's into `recv`). A hop is split
  /// into routing_parts() parts (plan_layout.hpp, the rule the simulator uses): part 0
  /// straight to the successor, part t through routing_proxy() GPUs of both nodes, which
  /// validate() guarantees are members of the group and relay inside the same step. The
  /// messages and relays join the state's transfers in flight; several shifts (of
  /// different phases) may be in flight at once.
  void post_ring_shift(GroupState& state, std::span<const std::size_t> sizes, const float* send,
                       float* recv, int phase);
  /// Waits until every ring shift in flight is done: this rank's receives, sends and the
  /// relays it forwards (in arrival order).
  void wait_ring_shifts(GroupState& state);

  const Plan& plan_;
  const MicroBatch& micro_batch_;
  int micro_batch_index_;
  MPI_Comm comm_;
  int rank_ = 0;
  int ranks_ = 0;
  bool has_layout_ = false;
  std::vector<std::vector<TokenRef>> attention_layout_;  ///< per rank, queue order
  std::vector<std::vector<TokenRef>> linear_layout_;     ///< per rank
  std::vector<GroupTokens> my_groups_;                   ///< queue order
  std::vector<std::unique_ptr<GroupState>> group_states_;  ///< per entry of my_groups_
  std::vector<Saved> saved_;
  /// Backward with a remap: dO and the gradients in the attention layout (reused by every
  /// layer).
  std::vector<float> d_out_attention_, d_q_attention_, d_k_attention_, d_v_attention_;
  CommunicationStats stats_;
  std::function<void(const char* where)> fault_hook_;
  // Recording (record_trace): the current segment's category, group, pass and start.
  bool recording_ = false;
  double origin_s_ = 0;
  const char* category_ = "";
  int segment_group_ = -1;
  const char* segment_pass_ = "";
  double segment_start_s_ = 0;
  std::vector<TraceEvent> events_;
  std::vector<WallInterval> attention_calls_;
};

}  // namespace ballast::runtime
