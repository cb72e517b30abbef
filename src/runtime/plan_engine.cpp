// PlanAttentionEngine: one micro-batch of a Plan's attention over MPI (plan_engine.hpp).
#include "ballast/runtime/plan_engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <ctime>
#include <limits>
#include <numeric>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "ballast/error.hpp"
#include "ballast/plan_layout.hpp"
#include "ballast/runtime/mpi.hpp"
#include "plan_schemes_internal.hpp"

namespace ballast::runtime {

namespace {

std::int64_t key_of(const TokenRef& token) {
  return token.sequence * (std::int64_t{1} << 32) + token.position;
}

}  // namespace

PlanAttentionEngine::PlanAttentionEngine(const Plan& plan, int micro_batch, MPI_Comm comm)
    : plan_(plan),
      micro_batch_(plan.micro_batches.at(static_cast<std::size_t>(micro_batch))),
      micro_batch_index_(micro_batch),
      comm_(comm) {
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &ranks_), "MPI_Comm_size");
  if (ranks_ != plan.cluster.ranks()) {
    throw InputError(fmt::format("the plan is for {} ranks but the job has {}; run with mpirun -np {}",
                                 plan.cluster.ranks(), ranks_, plan.cluster.ranks()));
  }
  // Token by token, the layouts plan_layout.hpp defines (the Python module packs the same).
  const auto expand = [](const std::vector<TokenRange>& ranges) {
    std::vector<TokenRef> tokens;
    for (const TokenRange& range : ranges) {
      for (Tokens p = range.begin_tokens; p < range.end_tokens; ++p) tokens.push_back({range.sequence_id, p});
    }
    return tokens;
  };
  attention_layout_.resize(static_cast<std::size_t>(ranks_));
  linear_layout_.resize(static_cast<std::size_t>(ranks_));
  for (int r = 0; r < ranks_; ++r) {
    const std::vector<TokenRange> ranges = attention_layout(plan, micro_batch, r);
    attention_layout_[static_cast<std::size_t>(r)] = expand(ranges);
    linear_layout_[static_cast<std::size_t>(r)] = expand(linear_layout(plan, micro_batch, r));
    if (r != rank_) continue;
    int offset = 0;
    const auto queues = effective_queues(micro_batch_, ranks_);
    for (int g : queues[static_cast<std::size_t>(r)]) {
      int count = 0;
      for (const TokenRange& range : ranges) {
        if (range.group == g) count += static_cast<int>(range.size());
      }
      my_groups_.push_back({g, offset, count});
      offset += count;
    }
  }
  group_states_.resize(my_groups_.size());
  has_layout_ = !micro_batch_.linear_layout.empty();
}

PlanAttentionEngine::~PlanAttentionEngine() = default;

std::vector<TokenRef> PlanAttentionEngine::group_tokens(const AttentionGroup& group, int rank) const {
  std::vector<TokenRef> tokens;
  for (const SequenceChunks& sequence : group.sequences) {
    const Tokens length = plan_.sequence_lengths_tokens[static_cast<std::size_t>(sequence.sequence_id)];
    for (const Chunk& chunk : sequence.chunks) {
      if (chunk.rank != rank) continue;
      for (Tokens p = chunk.begin_tokens; p < std::min(chunk.end_tokens, length); ++p) {
        tokens.push_back({sequence.sequence_id, p});  // padding tokens are dropped
      }
    }
  }
  return tokens;
}

TokenBatch PlanAttentionEngine::linear_batch(
    const std::vector<std::vector<std::int32_t>>& documents) const {
  TokenBatch batch;
  for (const TokenRef& t : linear_layout_[static_cast<std::size_t>(rank_)]) {
    const auto& document = documents.at(static_cast<std::size_t>(t.sequence));
    const auto p = static_cast<std::size_t>(t.position);
    batch.tokens.push_back(document.at(p));
    batch.targets.push_back(p + 1 < document.size() ? document[p + 1] : -1);
    batch.doc.push_back(t.sequence);
    batch.pos.push_back(t.position);
  }
  return batch;
}

double thread_cpu_s() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

void mpi_row_counts(std::span<const int> rows, int width, const char* what,
                    std::vector<int>& counts, std::vector<int>& displacements) {
  counts.assign(rows.size(), 0);
  displacements.assign(rows.size(), 0);
  long long offset = 0;
  for (std::size_t m = 0; m < rows.size(); ++m) {
    const long long floats = static_cast<long long>(rows[m]) * width;
    if (offset + floats > INT_MAX) {
      throw InputError(fmt::format("{} of {} rows of {} floats exceeds MPI's int counts ({}); "
                                   "plan fewer tokens per micro-batch or use a smaller --hidden",
                                   what, offset / width + rows[m], width, INT_MAX));
    }
    counts[m] = static_cast<int>(floats);
    displacements[m] = static_cast<int>(offset);
    offset += floats;
  }
}

void PlanAttentionEngine::timed_wait(const char* name, const std::function<void()>& wait) {
  const double start = MPI_Wtime();
  const double cpu_start = thread_cpu_s();
  end_segment(start);
  wait();
  const double duration = MPI_Wtime() - start;
  stats_.wait_s += duration;
  stats_.wait_cpu_s += thread_cpu_s() - cpu_start;
  if (recording_) {
    // A ring shift waits for its predecessor's block: the receive lane, as the simulator's.
    const char* lane = std::string_view(name) == "ring" ? "recv" : "collective";
    events_.push_back({rank_, lane, fmt::format("wait {}", name), micro_batch_index_, start - origin_s_,
                       duration, category_});
    segment_start_s_ = start + duration;
  }
}

const char* PlanAttentionEngine::category_of(int group) const {
  return group_category(micro_batch_.groups[static_cast<std::size_t>(group)], plan_.cluster);
}

void PlanAttentionEngine::record_trace(double origin_s) {
  recording_ = true;
  origin_s_ = origin_s;
}

void PlanAttentionEngine::begin_segment(const char* category, int group, const char* pass) {
  if (!recording_) return;
  category_ = category;
  segment_group_ = group;
  segment_pass_ = pass;
  segment_start_s_ = MPI_Wtime();
}

void PlanAttentionEngine::end_segment(double now_s) {
  if (!recording_ || segment_group_ < 0 || now_s <= segment_start_s_) return;
  const AttentionGroup& group = micro_batch_.groups[static_cast<std::size_t>(segment_group_)];
  const Scheme scheme = group.ranks.size() == 1 ? Scheme::local : group.scheme;
  events_.push_back({rank_, "compute",
                     fmt::format("attention {} {} g{}", segment_pass_, to_string(scheme), group.ranks.size()),
                     micro_batch_index_, segment_start_s_ - origin_s_, now_s - segment_start_s_, category_});
  segment_start_s_ = now_s;
}

void PlanAttentionEngine::run_fault_hook(const char* where) {
  if (fault_hook_) std::exchange(fault_hook_, nullptr)(where);
}

void PlanAttentionEngine::count_sent(int peer, std::int64_t bytes) {
  if (peer == rank_) return;
  (plan_.cluster.same_node(rank_, peer) ? stats_.intra_node_bytes_sent
                                        : stats_.inter_node_bytes_sent) += bytes;
}

void PlanAttentionEngine::remap(const std::vector<std::vector<TokenRef>>& from,
                                const std::vector<std::vector<TokenRef>>& to, const float* in,
                                float* out, int width) {
  // Owner (rank, index) of every token in `to`, and the source order of what arrives.
  std::unordered_map<std::int64_t, std::pair<int, int>> to_owner, from_owner;
  for (int r = 0; r < ranks_; ++r) {
    const auto& tokens_to = to[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < tokens_to.size(); ++i) to_owner[key_of(tokens_to[i])] = {r, static_cast<int>(i)};
    const auto& tokens_from = from[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < tokens_from.size(); ++i) from_owner[key_of(tokens_from[i])] = {r, static_cast<int>(i)};
  }
  const auto& mine_from = from[static_cast<std::size_t>(rank_)];
  const auto& mine_to = to[static_cast<std::size_t>(rank_)];
  std::vector<int> send_counts(static_cast<std::size_t>(ranks_), 0), recv_counts = send_counts;
  std::vector<std::vector<int>> send_rows(static_cast<std::size_t>(ranks_));
  for (std::size_t i = 0; i < mine_from.size(); ++i) {
    send_rows[static_cast<std::size_t>(to_owner.at(key_of(mine_from[i])).first)].push_back(static_cast<int>(i));
  }
  // Rows arrive grouped by source, each source's rows in its `from` order.
  std::vector<std::vector<std::pair<int, int>>> arrivals(static_cast<std::size_t>(ranks_));
  for (std::size_t i = 0; i < mine_to.size(); ++i) {
    const auto [source, source_index] = from_owner.at(key_of(mine_to[i]));
    arrivals[static_cast<std::size_t>(source)].push_back({source_index, static_cast<int>(i)});
  }
  std::vector<float> send_buffer, recv_buffer(mine_to.size() * static_cast<std::size_t>(width));
  std::vector<int> send_displs, recv_displs;
  for (int r = 0; r < ranks_; ++r) {
    send_displs.push_back(static_cast<int>(send_buffer.size()));
    for (int row : send_rows[static_cast<std::size_t>(r)]) {
      send_buffer.insert(send_buffer.end(), in + static_cast<std::size_t>(row) * width,
                         in + static_cast<std::size_t>(row + 1) * width);
    }
    send_counts[static_cast<std::size_t>(r)] =
        static_cast<int>(send_rows[static_cast<std::size_t>(r)].size()) * width;
    count_sent(r, static_cast<std::int64_t>(send_counts[static_cast<std::size_t>(r)]) * 4);
    auto& from_r = arrivals[static_cast<std::size_t>(r)];
    std::sort(from_r.begin(), from_r.end());
    recv_counts[static_cast<std::size_t>(r)] = static_cast<int>(from_r.size()) * width;
  }
  std::exclusive_scan(recv_counts.begin(), recv_counts.end(), std::back_inserter(recv_displs), 0);
  timed_wait("remap", [&] {
    check_mpi(MPI_Alltoallv(send_buffer.data(), send_counts.data(), send_displs.data(), MPI_FLOAT,
                            recv_buffer.data(), recv_counts.data(), recv_displs.data(), MPI_FLOAT,
                            comm_),
              "MPI_Alltoallv (remap)");
  });
  for (int r = 0; r < ranks_; ++r) {
    const auto& from_r = arrivals[static_cast<std::size_t>(r)];
    for (std::size_t j = 0; j < from_r.size(); ++j) {
      const float* row = recv_buffer.data() + recv_displs[static_cast<std::size_t>(r)] + j * width;
      std::copy(row, row + width, out + static_cast<std::size_t>(from_r[j].second) * width);
    }
  }
}

void PlanAttentionEngine::post_receive(float* data, std::size_t floats, int peer, int tag,
                                       std::vector<MPI_Request>& requests) {
  requests.emplace_back();
  check_mpi(MPI_Irecv(data, static_cast<int>(floats), MPI_FLOAT, peer, tag, comm_,
                      &requests.back()),
            "MPI_Irecv");
}

void PlanAttentionEngine::post_send(const float* data, std::size_t floats, int peer, int tag,
                                    std::vector<MPI_Request>& requests) {
  requests.emplace_back();
  count_sent(peer, static_cast<std::int64_t>(floats) * 4);
  check_mpi(MPI_Isend(data, static_cast<int>(floats), MPI_FLOAT, peer, tag, comm_,
                      &requests.back()),
            "MPI_Isend");
}

void PlanAttentionEngine::wait_exchange(std::vector<MPI_Request>& requests) {
  run_fault_hook("in a group exchange, messages in flight");
  timed_wait("exchange", [&] {
    check_mpi(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
              "MPI_Waitall");
  });
  requests.clear();
}

void PlanAttentionEngine::forward(int layer, const AttentionShape& shape, const TokenBatch& batch,
                                  const float* q, const float* k, const float* v, float* out) {
  const auto n = attention_layout_[static_cast<std::size_t>(rank_)].size();
  BALLAST_CHECK(static_cast<std::size_t>(batch.size()) ==
                    linear_layout_[static_cast<std::size_t>(rank_)].size(),
                "the batch must be this engine's linear_batch()");
  const double call_start_s = MPI_Wtime();
  const int qw = shape.heads * shape.head_dim, kw = shape.kv_heads * shape.head_dim;
  if (saved_.size() <= static_cast<std::size_t>(layer)) saved_.resize(static_cast<std::size_t>(layer) + 1);
  Saved& saved = saved_[static_cast<std::size_t>(layer)];
  saved.q.assign(n * qw, 0);
  saved.k.assign(n * kw, 0);
  saved.v.assign(n * kw, 0);
  if (has_layout_) {
    begin_segment(trace_category::kRemap, -1, "fwd");
    remap(linear_layout_, attention_layout_, q, saved.q.data(), qw);
    remap(linear_layout_, attention_layout_, k, saved.k.data(), kw);
    remap(linear_layout_, attention_layout_, v, saved.v.data(), kw);
  } else {
    std::copy(q, q + n * qw, saved.q.begin());
    std::copy(k, k + n * kw, saved.k.begin());
    std::copy(v, v + n * kw, saved.v.begin());
  }
  saved.out.assign(n * qw, 0);
  saved.lse.assign(n * static_cast<std::size_t>(shape.heads), -std::numeric_limits<float>::infinity());
  for (std::size_t index = 0; index < my_groups_.size(); ++index) {
    begin_segment(category_of(my_groups_[index].group), my_groups_[index].group, "fwd");
    run_group_forward(shape, index, saved);
    end_segment(MPI_Wtime());
  }
  if (has_layout_) {
    begin_segment(trace_category::kRemap, -1, "fwd");
    remap(attention_layout_, linear_layout_, saved.out.data(), out, qw);
  } else {
    std::copy(saved.out.begin(), saved.out.end(), out);
  }
  run_fault_hook("after an attention forward that posted no messages");
  if (recording_) attention_calls_.push_back({call_start_s, MPI_Wtime() - call_start_s});
}

void PlanAttentionEngine::backward(int layer, const AttentionShape& shape, const TokenBatch& batch,
                                   const float* d_out, float* d_q, float* d_k, float* d_v) {
  const double call_start_s = MPI_Wtime();
  const Saved& saved = saved_.at(static_cast<std::size_t>(layer));
  const auto n = attention_layout_[static_cast<std::size_t>(rank_)].size();
  BALLAST_CHECK(static_cast<std::size_t>(batch.size()) ==
                    linear_layout_[static_cast<std::size_t>(rank_)].size(),
                "the batch must be this engine's linear_batch()");
  const int qw = shape.heads * shape.head_dim, kw = shape.kv_heads * shape.head_dim;
  // dO and the gradients in the attention layout: without a remap, the caller's arrays.
  const float* dout_att = d_out;
  float* dq = d_q;
  float* dk = d_k;
  float* dv = d_v;
  if (has_layout_) {
    d_out_attention_.resize(n * qw);
    d_q_attention_.resize(n * qw);
    d_k_attention_.resize(n * kw);
    d_v_attention_.resize(n * kw);
    begin_segment(trace_category::kRemap, -1, "bwd");
    remap(linear_layout_, attention_layout_, d_out, d_out_attention_.data(), qw);
    dout_att = d_out_attention_.data();
    dq = d_q_attention_.data();
    dk = d_k_attention_.data();
    dv = d_v_attention_.data();
  }
  std::fill_n(dq, n * qw, 0.0f);  // the groups add their gradients
  std::fill_n(dk, n * kw, 0.0f);
  std::fill_n(dv, n * kw, 0.0f);
  for (std::size_t index = 0; index < my_groups_.size(); ++index) {
    begin_segment(category_of(my_groups_[index].group), my_groups_[index].group, "bwd");
    run_group_backward(shape, index, saved, dout_att, dq, dk, dv);
    end_segment(MPI_Wtime());
  }
  if (has_layout_) {
    begin_segment(trace_category::kRemap, -1, "bwd");
    remap(attention_layout_, linear_layout_, dq, d_q, qw);
    remap(attention_layout_, linear_layout_, dk, d_k, kw);
    remap(attention_layout_, linear_layout_, dv, d_v, kw);
  }
  if (recording_) attention_calls_.push_back({call_start_s, MPI_Wtime() - call_start_s});
}

}  // namespace ballast::runtime
