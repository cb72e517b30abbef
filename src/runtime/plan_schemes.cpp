// The attention schemes of PlanAttentionEngine (plan_engine.hpp): local, ring, all_gather
// and ulysses, forward and backward, on this rank's tokens of one group.
#include <algorithm>
#include <span>
#include <utility>

#include "ballast/error.hpp"
#include "ballast/runtime/mpi.hpp"
#include "ballast/runtime/plan_engine.hpp"

namespace ballast::runtime {

namespace {

// Tag phases: a ring shift uses its phase for direct parts and phase + 1..3 for the
// stages of routed parts (dispatch, NIC, combine).
constexpr int kForward = 0, kBackward = 4, kBackwardReturn = 8, kForwardBack = 12,
              kBackwardBack = 13;
constexpr int kPhasesPerGroup = 16;

int tag_of(int group, int phase) {
  const int tag = kPhasesPerGroup * group + phase;
  BALLAST_CHECK(tag <= 32767, "too many groups in one micro-batch for MPI tags (at most 2047)");
  return tag;
}

struct Member {
  std::vector<std::int64_t> doc, pos;
  int size() const { return static_cast<int>(doc.size()); }
  TokenSpan span() const { return {doc.data(), pos.data(), size()}; }
};

/// Each member's tokens (document, position) in group order.
template <typename TokensOf>
std::vector<Member> members_of(const AttentionGroup& group, TokensOf tokens_of) {
  std::vector<Member> members(group.ranks.size());
  for (std::size_t m = 0; m < group.ranks.size(); ++m) {
    for (const TokenRef& t : tokens_of(group.ranks[m])) {
      members[m].doc.push_back(t.sequence);
      members[m].pos.push_back(t.position);
    }
  }
  return members;
}

std::size_t rows(int count, int width) {
  return static_cast<std::size_t>(count) * static_cast<std::size_t>(width);
}


/// The group's tokens in member order (what a Ulysses member computes its heads over).
Member concatenated(const std::vector<Member>& members) {
  Member all;
  for (const Member& member : members) {
    all.doc.insert(all.doc.end(), member.doc.begin(), member.doc.end());
    all.pos.insert(all.pos.end(), member.pos.begin(), member.pos.end());
  }
  return all;
}

std::vector<int> sizes_of(const std::vector<Member>& members) {
  std::vector<int> sizes;
  for (const Member& member : members) sizes.push_back(member.size());
  return sizes;
}

/// One head-sharded column of a token's row: Ulysses member m owns heads
/// [m * per_member, (m + 1) * per_member) of a [tokens, heads, head_dim] array (an lse
/// array is [tokens, heads] with head_dim 1).
template <typename Float>
struct HeadColumn {
  Float* data;
  int heads;
  int per_member;
  int head_dim;
  int width() const { return per_member * head_dim; }
  Float* at(int row, int member) const {
    return data + (rows(row, heads) + static_cast<std::size_t>(member) * per_member) * head_dim;
  }
};

template <typename Float>
int row_width(std::span<const HeadColumn<Float>> columns) {
  int width = 0;
  for (const auto& column : columns) width += column.width();
  return width;
}

/// For every member m: this rank's `count` tokens as rows of m's heads of each column.
std::vector<std::vector<float>> pack_heads(int g, int count,
                                           std::span<const HeadColumn<const float>> columns) {
  const int width = row_width(columns);
  std::vector<std::vector<float>> send(static_cast<std::size_t>(g),
                                       std::vector<float>(rows(count, width)));
  for (int m = 0; m < g; ++m) {
    for (int r = 0; r < count; ++r) {
      float* row = send[static_cast<std::size_t>(m)].data() + rows(r, width);
      for (const auto& column : columns) {
        row = std::copy_n(column.at(r, m), column.width(), row);
      }
    }
  }
  return send;
}

/// This rank's rows returned by every member m into m's heads of each target column:
/// copied, or added (gradients) when `add`.
void unpack_heads(const std::vector<std::vector<float>>& home, int count,
                  std::span<const HeadColumn<float>> targets, bool add) {
  const int width = row_width(targets);
  for (std::size_t m = 0; m < home.size(); ++m) {
    for (int r = 0; r < count; ++r) {
      const float* row = home[m].data() + rows(r, width);
      for (const auto& target : targets) {
        float* to = target.at(r, static_cast<int>(m));
        for (int x = 0; x < target.width(); ++x) to[x] = add ? to[x] + row[x] : row[x];
        row += target.width();
      }
    }
  }
}

/// Rows received from every member (member order) split into one array per column of
/// `widths` floats: [group tokens, width] each.
std::vector<std::vector<float>> split_columns(const std::vector<std::vector<float>>& received,
                                              std::span<const int> widths) {
  int width = 0;
  for (int w : widths) width += w;
  std::vector<std::vector<float>> columns(widths.size());
  for (const auto& buffer : received) {
    for (std::size_t row = 0; row < buffer.size(); row += static_cast<std::size_t>(width)) {
      const float* from = buffer.data() + row;
      for (std::size_t c = 0; c < widths.size(); ++c) {
        columns[c].insert(columns[c].end(), from, from + widths[c]);
        from += widths[c];
      }
    }
  }
  return columns;
}

/// The inverse of split_columns: for every member, the rows of `columns` (member order,
/// `widths` floats per token each) that belong to its tokens, concatenated per token.
std::vector<std::vector<float>> join_columns(const std::vector<Member>& members,
                                             std::span<const std::vector<float>* const> columns,
                                             std::span<const int> widths) {
  std::vector<std::vector<float>> per_member(members.size());
  int offset = 0;
  for (std::size_t m = 0; m < members.size(); ++m) {
    for (int r = offset; r < offset + members[m].size(); ++r) {
      for (std::size_t c = 0; c < widths.size(); ++c) {
        const auto begin = columns[c]->begin() + static_cast<std::ptrdiff_t>(rows(r, widths[c]));
        per_member[m].insert(per_member[m].end(), begin, begin + widths[c]);
      }
    }
    offset += members[m].size();
  }
  return per_member;
}

}  // namespace

std::vector<std::vector<float>> PlanAttentionEngine::exchange_rows(
    const std::vector<std::vector<float>>& send, const std::vector<int>& counts, int width,
    const std::vector<int>& peers, int self, int tag) {
  std::vector<std::vector<float>> received(peers.size());
  for (std::size_t m = 0; m < peers.size(); ++m) received[m].assign(rows(counts[m], width), 0);
  exchange(send, received, peers, tag);
  received[static_cast<std::size_t>(self)] = send[static_cast<std::size_t>(self)];
  return received;
}

void PlanAttentionEngine::ring_shift(const AttentionGroup& group, int group_index,
                                     const std::vector<std::size_t>& sizes, const float* send,
                                     float* recv, int phase, const std::function<void()>& compute) {
  const Cluster& cluster = plan_.cluster;
  const int g = static_cast<int>(group.ranks.size());
  const int i = static_cast<int>(std::find(group.ranks.begin(), group.ranks.end(), rank_) - group.ranks.begin());
  const int next = group.ranks[static_cast<std::size_t>((i + 1) % g)];
  const int prev = group.ranks[static_cast<std::size_t>((i - 1 + g) % g)];
  const int k = std::min(group.routing_proxies, cluster.nics_per_node);
  const int gpus = cluster.gpus_per_node;
  const auto proxy = [&](int rank, int t) {  // as the simulator: t-th other NIC of the node
    return cluster.node_of(rank) * gpus + (rank % gpus + t * cluster.gpus_per_nic()) % gpus;
  };
  const auto member = [&](int rank) {
    return std::find(group.ranks.begin(), group.ranks.end(), rank) != group.ranks.end();
  };
  const auto routed = [&](int m) {
    const int src = group.ranks[static_cast<std::size_t>(m)];
    const int dst = group.ranks[static_cast<std::size_t>((m + 1) % g)];
    if (k <= 1 || cluster.same_node(src, dst)) return false;
    for (int t = 1; t < k; ++t) {
      if (!member(proxy(src, t)) || !member(proxy(dst, t))) return false;
    }
    return true;
  };
  const auto part = [&](std::size_t total, int t) {
    const std::size_t share = (total + static_cast<std::size_t>(k) - 1) / static_cast<std::size_t>(k);
    const std::size_t begin = std::min(total, static_cast<std::size_t>(t) * share);
    return std::pair{begin, std::min(total, begin + share)};
  };
  const int tag = tag_of(group_index, phase);
  std::vector<MPI_Request> requests;
  const auto post_recv = [&](float* data, std::size_t count, int source, int t) {
    requests.emplace_back();
    check_mpi(MPI_Irecv(data, static_cast<int>(count), MPI_FLOAT, source, t, comm_, &requests.back()),
              "MPI_Irecv (ring)");
  };
  const auto post_send = [&](const float* data, std::size_t count, int dest, int t) {
    requests.emplace_back();
    count_sent(dest, static_cast<std::int64_t>(count) * 4);
    check_mpi(MPI_Isend(data, static_cast<int>(count), MPI_FLOAT, dest, t, comm_, &requests.back()),
              "MPI_Isend (ring)");
  };
  // This rank's incoming block.
  const int from = (i - 1 + g) % g;
  if (routed(from)) {
    for (int t = 0; t < k; ++t) {
      const auto [b, e] = part(sizes[static_cast<std::size_t>(from)], t);
      if (e > b) post_recv(recv + b, e - b, t == 0 ? prev : proxy(rank_, t), t == 0 ? tag : tag + 3);
    }
  } else {
    post_recv(recv, sizes[static_cast<std::size_t>(from)], prev, tag);
  }
  // Relays this rank does for routed hops of the ring (stage 1 as the source-side proxy,
  // stage 2 as the destination-side proxy).
  struct Relay {
    std::vector<float> data;
    int to = 0;
    int tag = 0;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  std::vector<Relay> relays;
  for (int m = 0; m < g; ++m) {
    if (!routed(m)) continue;
    const int src = group.ranks[static_cast<std::size_t>(m)];
    const int dst = group.ranks[static_cast<std::size_t>((m + 1) % g)];
    for (int t = 1; t < k; ++t) {
      const auto [b, e] = part(sizes[static_cast<std::size_t>(m)], t);
      if (e == b) continue;
      if (proxy(src, t) == rank_) relays.push_back({std::vector<float>(e - b), proxy(dst, t), tag + 2});
      if (proxy(dst, t) == rank_) relays.push_back({std::vector<float>(e - b), dst, tag + 3});
      Relay* relay = proxy(src, t) == rank_ || proxy(dst, t) == rank_ ? &relays.back() : nullptr;
      if (relay == nullptr) continue;
      const int source = proxy(src, t) == rank_ ? src : proxy(src, t);
      check_mpi(MPI_Irecv(relay->data.data(), static_cast<int>(relay->data.size()), MPI_FLOAT, source,
                          relay->tag - 1, comm_, &relay->request),
                "MPI_Irecv (relay)");
    }
  }
  // This rank's outgoing block.
  if (routed(i)) {
    for (int t = 0; t < k; ++t) {
      const auto [b, e] = part(sizes[static_cast<std::size_t>(i)], t);
      if (e > b) post_send(send + b, e - b, t == 0 ? next : proxy(rank_, t), t == 0 ? tag : tag + 1);
    }
  } else {
    post_send(send, sizes[static_cast<std::size_t>(i)], next, tag);
  }
  run_fault_hook("in a ring shift, messages in flight");
  compute();
  timed_wait("ring", [&] {
    std::vector<MPI_Request> relay_requests;
    for (const Relay& relay : relays) relay_requests.push_back(relay.request);
    for (std::size_t done = 0; done < relays.size(); ++done) {
      int index = MPI_UNDEFINED;
      check_mpi(MPI_Waitany(static_cast<int>(relay_requests.size()), relay_requests.data(), &index,
                            MPI_STATUS_IGNORE),
                "MPI_Waitany (relay)");
      const Relay& relay = relays[static_cast<std::size_t>(index)];
      post_send(relay.data.data(), relay.data.size(), relay.to, relay.tag);
    }
    check_mpi(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
              "MPI_Waitall (ring)");
  });
}

void PlanAttentionEngine::run_group_forward(const AttentionShape& shape, const GroupTokens& mine,
                                            Saved& saved) {
  const AttentionGroup& group = micro_batch_.groups[static_cast<std::size_t>(mine.group)];
  const int g = static_cast<int>(group.ranks.size());
  const int i = static_cast<int>(std::find(group.ranks.begin(), group.ranks.end(), rank_) - group.ranks.begin());
  const int hd = shape.head_dim, qw = shape.heads * hd, kw = shape.kv_heads * hd;
  const float* q = saved.q.data() + rows(mine.first, qw);
  const float* k = saved.k.data() + rows(mine.first, kw);
  const float* v = saved.v.data() + rows(mine.first, kw);
  float* out = saved.out.data() + rows(mine.first, qw);
  float* lse = saved.lse.data() + rows(mine.first, shape.heads);
  const std::vector<Member> members = members_of(group, [&](int r) { return group_tokens(group, r); });
  const Member& me = members[static_cast<std::size_t>(i)];
  BALLAST_CHECK(me.size() == mine.count, "group token counts must agree");
  AttentionAccumulator accumulator;
  const int tag = tag_of(mine.group, kForward);

  if (g == 1 || group.scheme == Scheme::local) {
    accumulator.reset(mine.count, shape);
    attention_forward_accumulate(shape, q, me.span(), k, v, me.span(), accumulator);
    attention_forward_finalize(shape, accumulator, out, lse);
    return;
  }
  if (group.scheme == Scheme::ring) {
    std::vector<float> current(2 * rows(mine.count, kw)), incoming;
    std::copy(k, k + rows(mine.count, kw), current.begin());
    std::copy(v, v + rows(mine.count, kw), current.begin() + static_cast<std::ptrdiff_t>(rows(mine.count, kw)));
    accumulator.reset(mine.count, shape);
    for (int j = 0; j < g; ++j) {
      const Member& owner = members[static_cast<std::size_t>((i - j + g) % g)];
      const auto compute = [&] {
        attention_forward_accumulate(shape, q, me.span(), current.data(),
                                     current.data() + rows(owner.size(), kw), owner.span(), accumulator);
      };
      if (j + 1 == g) {
        compute();
        break;
      }
      // Member m now holds owner (m - j)'s block and passes it on while computing on it.
      std::vector<std::size_t> sizes(static_cast<std::size_t>(g));
      for (int m = 0; m < g; ++m) {
        sizes[static_cast<std::size_t>(m)] = 2 * rows(members[static_cast<std::size_t>((m - j + g) % g)].size(), kw);
      }
      incoming.assign(sizes[static_cast<std::size_t>((i - 1 + g) % g)], 0);
      ring_shift(group, mine.group, sizes, current.data(), incoming.data(), kForward, compute);
      std::swap(current, incoming);
    }
    attention_forward_finalize(shape, accumulator, out, lse);
    return;
  }
  if (group.scheme == Scheme::all_gather) {
    std::vector<float> block(k, k + rows(mine.count, kw));
    block.insert(block.end(), v, v + rows(mine.count, kw));
    const auto recv = exchange_rows(std::vector(static_cast<std::size_t>(g), block), sizes_of(members),
                                    2 * kw, group.ranks, i, tag);
    accumulator.reset(mine.count, shape);
    for (int m = 0; m < g; ++m) {
      const auto& b = recv[static_cast<std::size_t>(m)];
      const Member& member = members[static_cast<std::size_t>(m)];
      attention_forward_accumulate(shape, q, me.span(), b.data(), b.data() + rows(member.size(), kw),
                                   member.span(), accumulator);
    }
    attention_forward_finalize(shape, accumulator, out, lse);
    return;
  }
  // Ulysses: member m computes heads [m * hs, (m + 1) * hs) (KV heads [m * ks, ...)) of
  // every token of the group, in member order.
  BALLAST_CHECK(shape.heads % g == 0 && shape.kv_heads % g == 0,
                "a validated plan's Ulysses degree divides the heads and KV heads");
  const int hs = shape.heads / g, ks = shape.kv_heads / g;
  const HeadColumn<const float> in[] = {{q, shape.heads, hs, hd}, {k, shape.kv_heads, ks, hd},
                                       {v, shape.kv_heads, ks, hd}};
  const int in_widths[] = {hs * hd, ks * hd, ks * hd};
  const auto columns = split_columns(
      exchange_rows(pack_heads(g, mine.count, in), sizes_of(members), row_width<const float>(in),
                    group.ranks, i, tag),
      in_widths);
  const Member all = concatenated(members);
  const AttentionShape part{hs, ks, hd};
  accumulator.reset(all.size(), part);
  attention_forward_accumulate(part, columns[0].data(), all.span(), columns[1].data(),
                               columns[2].data(), all.span(), accumulator);
  std::vector<float> out_h(rows(all.size(), hs * hd)), lse_h(rows(all.size(), hs));
  attention_forward_finalize(part, accumulator, out_h.data(), lse_h.data());
  // Back to the owners: each token's output and lse for this member's heads.
  const std::vector<float>* results[] = {&out_h, &lse_h};
  const int result_widths[] = {hs * hd, hs};
  const HeadColumn<float> targets[] = {{out, shape.heads, hs, hd}, {lse, shape.heads, hs, 1}};
  unpack_heads(exchange_rows(join_columns(members, results, result_widths),
                             std::vector(static_cast<std::size_t>(g), mine.count),
                             row_width<float>(targets), group.ranks, i,
                             tag_of(mine.group, kForwardBack)),
               mine.count, targets, false);
}

void PlanAttentionEngine::run_group_backward(const AttentionShape& shape, const GroupTokens& mine,
                                             const Saved& saved, const float* d_out_all,
                                             float* d_q_all, float* d_k_all, float* d_v_all) {
  const AttentionGroup& group = micro_batch_.groups[static_cast<std::size_t>(mine.group)];
  const int g = static_cast<int>(group.ranks.size());
  const int i = static_cast<int>(std::find(group.ranks.begin(), group.ranks.end(), rank_) - group.ranks.begin());
  const int hd = shape.head_dim, qw = shape.heads * hd, kw = shape.kv_heads * hd;
  const std::size_t q0 = rows(mine.first, qw), k0 = rows(mine.first, kw);
  const float* q = saved.q.data() + q0;
  const float* k = saved.k.data() + k0;
  const float* v = saved.v.data() + k0;
  const float* out = saved.out.data() + q0;
  const float* lse = saved.lse.data() + rows(mine.first, shape.heads);
  const float* d_out = d_out_all + q0;
  float* d_q = d_q_all + q0;
  float* d_k = d_k_all + k0;
  float* d_v = d_v_all + k0;
  const std::vector<Member> members = members_of(group, [&](int r) { return group_tokens(group, r); });
  const Member& me = members[static_cast<std::size_t>(i)];
  const int tag = tag_of(mine.group, kBackward);

  if (g == 1 || group.scheme == Scheme::local || group.scheme == Scheme::ring ||
      group.scheme == Scheme::all_gather) {
    std::vector<float> delta(rows(mine.count, shape.heads));
    attention_backward_delta(shape, mine.count, out, d_out, delta.data());
    if (g == 1 || group.scheme == Scheme::local) {
      attention_backward_accumulate(shape, q, d_out, lse, delta.data(), me.span(), k, v, me.span(),
                                    d_q, d_k, d_v);
      return;
    }
    if (group.scheme == Scheme::ring) {
      // The travelling buffer [k | v | dk | dv] of the block's owner; dK/dV accumulate as
      // the block goes round and a final send returns them to the owner.
      const std::size_t mine_rows = rows(mine.count, kw);
      std::vector<float> current(4 * mine_rows, 0), incoming;
      std::copy(k, k + mine_rows, current.begin());
      std::copy(v, v + mine_rows, current.begin() + static_cast<std::ptrdiff_t>(mine_rows));
      for (int j = 0; j < g; ++j) {
        const Member& owner = members[static_cast<std::size_t>((i - j + g) % g)];
        const std::size_t n = rows(owner.size(), kw);
        attention_backward_accumulate(shape, q, d_out, lse, delta.data(), me.span(), current.data(),
                                      current.data() + n, owner.span(), d_q, current.data() + 2 * n,
                                      current.data() + 3 * n);
        if (j + 1 == g) break;
        std::vector<std::size_t> sizes(static_cast<std::size_t>(g));
        for (int m = 0; m < g; ++m) {
          sizes[static_cast<std::size_t>(m)] = 4 * rows(members[static_cast<std::size_t>((m - j + g) % g)].size(), kw);
        }
        incoming.assign(sizes[static_cast<std::size_t>((i - 1 + g) % g)], 0);
        ring_shift(group, mine.group, sizes, current.data(), incoming.data(), kBackward, [] {});
        std::swap(current, incoming);
      }
      // Member m now holds owner (m + 1)'s block: one more shift returns each block's
      // dK/dV to its owner.
      std::vector<std::size_t> sizes(static_cast<std::size_t>(g));
      for (int m = 0; m < g; ++m) {
        sizes[static_cast<std::size_t>(m)] = 2 * rows(members[static_cast<std::size_t>((m + 1) % g)].size(), kw);
      }
      const std::size_t n_next = rows(members[static_cast<std::size_t>((i + 1) % g)].size(), kw);
      const std::vector<float> returning(current.begin() + static_cast<std::ptrdiff_t>(2 * n_next), current.end());
      std::vector<float> own(2 * mine_rows, 0);
      ring_shift(group, mine.group, sizes, returning.data(), own.data(), kBackwardReturn, [] {});
      for (std::size_t x = 0; x < mine_rows; ++x) {
        d_k[x] += own[x];
        d_v[x] += own[mine_rows + x];
      }
      return;
    }
    // all_gather: gather KV again (as LLaMA-3 CP does), dK/dV partials back to their owners.
    std::vector<float> block(k, k + rows(mine.count, kw));
    block.insert(block.end(), v, v + rows(mine.count, kw));
    const auto recv = exchange_rows(std::vector(static_cast<std::size_t>(g), block), sizes_of(members),
                                    2 * kw, group.ranks, i, tag);
    std::vector<std::vector<float>> partial(static_cast<std::size_t>(g));
    for (int m = 0; m < g; ++m) {
      const Member& member = members[static_cast<std::size_t>(m)];
      const auto& b = recv[static_cast<std::size_t>(m)];
      const std::size_t n = rows(member.size(), kw);
      auto& p = partial[static_cast<std::size_t>(m)];
      p.assign(2 * n, 0);
      attention_backward_accumulate(shape, q, d_out, lse, delta.data(), me.span(), b.data(),
                                    b.data() + n, member.span(), d_q, p.data(), p.data() + n);
    }
    const auto mine_parts = exchange_rows(partial, std::vector(static_cast<std::size_t>(g), mine.count),
                                          2 * kw, group.ranks, i, tag_of(mine.group, kBackwardBack));
    const std::size_t mine_rows = rows(mine.count, kw);
    for (int m = 0; m < g; ++m) {  // fixed member order: the same sum on every run
      const auto& p = mine_parts[static_cast<std::size_t>(m)];
      for (std::size_t x = 0; x < mine_rows; ++x) {
        d_k[x] += p[x];
        d_v[x] += p[mine_rows + x];
      }
    }
    return;
  }
  // Ulysses backward: the same head exchange with out, dO and lse, then dQ/dK/dV back.
  const int hs = shape.heads / g, ks = shape.kv_heads / g;
  const HeadColumn<const float> in[] = {{q, shape.heads, hs, hd},     {k, shape.kv_heads, ks, hd},
                                       {v, shape.kv_heads, ks, hd},  {out, shape.heads, hs, hd},
                                       {d_out, shape.heads, hs, hd}, {lse, shape.heads, hs, 1}};
  const int in_widths[] = {hs * hd, ks * hd, ks * hd, hs * hd, hs * hd, hs};
  const auto c = split_columns(
      exchange_rows(pack_heads(g, mine.count, in), sizes_of(members), row_width<const float>(in),
                    group.ranks, i, tag),
      in_widths);  // q, k, v, out, dO, lse of this member's heads for every group token
  const Member all = concatenated(members);
  const AttentionShape part{hs, ks, hd};
  const int n_all = all.size();
  std::vector<float> delta(rows(n_all, hs)), dqh(rows(n_all, hs * hd), 0), dkh(rows(n_all, ks * hd), 0),
      dvh(rows(n_all, ks * hd), 0);
  attention_backward_delta(part, n_all, c[3].data(), c[4].data(), delta.data());
  attention_backward_accumulate(part, c[0].data(), c[4].data(), c[5].data(), delta.data(), all.span(),
                                c[1].data(), c[2].data(), all.span(), dqh.data(), dkh.data(), dvh.data());
  const std::vector<float>* results[] = {&dqh, &dkh, &dvh};
  const int result_widths[] = {hs * hd, ks * hd, ks * hd};
  const HeadColumn<float> targets[] = {{d_q, shape.heads, hs, hd}, {d_k, shape.kv_heads, ks, hd},
                                       {d_v, shape.kv_heads, ks, hd}};
  unpack_heads(exchange_rows(join_columns(members, results, result_widths),
                             std::vector(static_cast<std::size_t>(g), mine.count),
                             row_width<float>(targets), group.ranks, i,
                             tag_of(mine.group, kBackwardBack)),
               mine.count, targets, true);
}

}  // namespace ballast::runtime
