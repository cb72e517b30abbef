// The attention schemes of PlanAttentionEngine (plan_engine.hpp): local, ring, all_gather
// and ulysses, forward and backward, on this rank's tokens of one group.
#include <algorithm>
#include <span>
#include <unordered_map>
#include <utility>

#include "ballast/error.hpp"
#include "ballast/plan_layout.hpp"
#include "ballast/runtime/mpi.hpp"
#include "ballast/runtime/plan_engine.hpp"

namespace ballast::runtime {

namespace {

// MPI tags. Each group of a micro-batch owns kTagsPerGroup consecutive tags, starting at
// kTagsPerGroup * group; a phase is an offset among them. A ring shift sends direct parts
// on its phase's tag and the three stages of a routed part on the next three tags, so
// ring phases lie kTagsPerRingPhase apart; the other exchanges use one tag each.
constexpr int kRoutedDispatch = 1;  ///< routed part: source -> its proxy (NVLink)
constexpr int kRoutedCrossing = 2;  ///< routed part: proxy -> destination's proxy (NIC)
constexpr int kRoutedCombine = 3;   ///< routed part: destination's proxy -> destination (NVLink)
constexpr int kTagsPerRingPhase = 4;
/// Phases: ring shifts, all-gathers and all-to-alls of the forward and the backward pass;
/// the ring's final dK/dV shift; the exchanges that send results home (Ulysses outputs;
/// all-gather dK/dV and Ulysses gradients).
constexpr int kForward = 0;
constexpr int kBackward = kForward + kTagsPerRingPhase;
constexpr int kBackwardReturn = kBackward + kTagsPerRingPhase;
constexpr int kForwardBack = kBackwardReturn + kTagsPerRingPhase;
constexpr int kBackwardBack = kForwardBack + 1;
constexpr int kTagsPerGroup = 16;
static_assert(kForwardBack == 12 && kBackwardBack == 13 && kBackwardBack < kTagsPerGroup,
              "the tag scheme of docs/runtime.md");
constexpr int kLargestTag = 32767;  // the smallest MPI_TAG_UB the MPI standard guarantees

int tag_of(int group, int phase) {
  const int tag = kTagsPerGroup * group + phase;
  BALLAST_CHECK(tag <= kLargestTag,
                "too many groups in one micro-batch for MPI tags (at most 2048)");
  return tag;
}

/// A member's tokens: document (sequence id) and position inside it, in layout order.
struct Member {
  std::vector<std::int64_t> documents, positions;
  int size() const { return static_cast<int>(documents.size()); }
  TokenSpan span() const { return {documents.data(), positions.data(), size()}; }
};

/// This rank's position in the group's rank list (ring order for a ring).
int position_of(const AttentionGroup& group, int rank) {
  const auto it = std::find(group.ranks.begin(), group.ranks.end(), rank);
  BALLAST_CHECK(it != group.ranks.end(), "a rank runs only the groups it belongs to");
  return static_cast<int>(it - group.ranks.begin());
}

/// Each member's tokens (document, position) in group order. The document of a token is
/// its sequence's index in group.sequences, not its sequence id: every member lays its
/// tokens out in that order, so documents increase along each member's span, which is
/// what lets the kernel skip tile pairs whose document ranges do not meet (with sequence
/// ids in a planner's order, tiles of unrelated documents overlap in id range and are
/// computed masked: 3x the attention of the default `ballast run` step).
template <typename TokensOf>
std::vector<Member> members_of(const AttentionGroup& group, TokensOf tokens_of) {
  std::unordered_map<std::int64_t, std::int64_t> index_of;
  for (std::size_t i = 0; i < group.sequences.size(); ++i) {
    index_of.emplace(group.sequences[i].sequence_id, static_cast<std::int64_t>(i));
  }
  std::vector<Member> members(group.ranks.size());
  for (std::size_t member = 0; member < group.ranks.size(); ++member) {
    for (const TokenRef& token : tokens_of(group.ranks[member])) {
      members[member].documents.push_back(index_of.at(token.sequence));
      members[member].positions.push_back(token.position);
    }
  }
  return members;
}

std::size_t rows(int count, int width) {
  return static_cast<std::size_t>(count) * static_cast<std::size_t>(width);
}

/// The member at `position` of a list of `size` (positions wrap around: -1 is the last).
template <typename T>
const T& at_position(const std::vector<T>& list, int position) {
  const int size = static_cast<int>(list.size());
  return list[static_cast<std::size_t>((position % size + size) % size)];
}

/// The group's tokens in member order (what a Ulysses member computes its heads over).
Member concatenated(const std::vector<Member>& members) {
  Member all;
  for (const Member& member : members) {
    all.documents.insert(all.documents.end(), member.documents.begin(), member.documents.end());
    all.positions.insert(all.positions.end(), member.positions.begin(), member.positions.end());
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
std::vector<std::vector<float>> pack_heads(int group_size, int count,
                                           std::span<const HeadColumn<const float>> columns) {
  const int width = row_width(columns);
  std::vector<std::vector<float>> send(static_cast<std::size_t>(group_size),
                                       std::vector<float>(rows(count, width)));
  for (int member = 0; member < group_size; ++member) {
    for (int row_index = 0; row_index < count; ++row_index) {
      float* row = send[static_cast<std::size_t>(member)].data() + rows(row_index, width);
      for (const auto& column : columns) {
        row = std::copy_n(column.at(row_index, member), column.width(), row);
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
  for (std::size_t member = 0; member < home.size(); ++member) {
    for (int row_index = 0; row_index < count; ++row_index) {
      const float* row = home[member].data() + rows(row_index, width);
      for (const auto& target : targets) {
        float* to = target.at(row_index, static_cast<int>(member));
        for (int element = 0; element < target.width(); ++element) {
          to[element] = add ? to[element] + row[element] : row[element];
        }
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
  for (int column_width : widths) width += column_width;
  std::vector<std::vector<float>> columns(widths.size());
  for (const auto& buffer : received) {
    for (std::size_t row = 0; row < buffer.size(); row += static_cast<std::size_t>(width)) {
      const float* from = buffer.data() + row;
      for (std::size_t column = 0; column < widths.size(); ++column) {
        columns[column].insert(columns[column].end(), from, from + widths[column]);
        from += widths[column];
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
  int first_row = 0;
  for (std::size_t member = 0; member < members.size(); ++member) {
    for (int row = first_row; row < first_row + members[member].size(); ++row) {
      for (std::size_t column = 0; column < widths.size(); ++column) {
        const auto begin =
            columns[column]->begin() + static_cast<std::ptrdiff_t>(rows(row, widths[column]));
        per_member[member].insert(per_member[member].end(), begin, begin + widths[column]);
      }
    }
    first_row += members[member].size();
  }
  return per_member;
}

}  // namespace

std::vector<std::vector<float>> PlanAttentionEngine::exchange_rows(
    const std::vector<std::vector<float>>& send, const std::vector<int>& counts, int width,
    const std::vector<int>& peers, int self, int tag) {
  std::vector<std::vector<float>> received(peers.size());
  for (std::size_t member = 0; member < peers.size(); ++member) {
    received[member].assign(rows(counts[member], width), 0);
  }
  exchange(send, received, peers, tag);
  received[static_cast<std::size_t>(self)] = send[static_cast<std::size_t>(self)];
  return received;
}

void PlanAttentionEngine::ring_shift(const AttentionGroup& group, int group_index,
                                     const std::vector<std::size_t>& sizes, const float* send,
                                     float* recv, int phase, const std::function<void()>& compute) {
  const Cluster& cluster = plan_.cluster;
  const int group_size = static_cast<int>(group.ranks.size());
  const int position = position_of(group, rank_);
  // Hop h carries sizes[h] floats from the member at position h to the one at h + 1, in
  // routing_parts() parts (plan_layout.hpp, as the simulator routes it).
  const auto source_of = [&](int hop) { return at_position(group.ranks, hop); };
  const auto destination_of = [&](int hop) { return at_position(group.ranks, hop + 1); };
  const auto parts_of = [&](int hop) {
    return routing_parts(cluster, group.routing_proxies, source_of(hop), destination_of(hop));
  };
  const auto part_range = [&](int hop, int parts, int part) {
    return routed_part_range(static_cast<std::int64_t>(at_position(sizes, hop)), parts, part);
  };
  const auto is_member = [&](int rank) {
    return std::find(group.ranks.begin(), group.ranks.end(), rank) != group.ranks.end();
  };
  const int tag = tag_of(group_index, phase);
  std::vector<MPI_Request> requests;
  const auto post_recv = [&](float* data, std::int64_t count, int source, int message_tag) {
    requests.emplace_back();
    check_mpi(MPI_Irecv(data, static_cast<int>(count), MPI_FLOAT, source, message_tag, comm_,
                        &requests.back()),
              "MPI_Irecv (ring)");
  };
  const auto post_send = [&](const float* data, std::int64_t count, int destination,
                             int message_tag) {
    requests.emplace_back();
    count_sent(destination, count * 4);
    check_mpi(MPI_Isend(data, static_cast<int>(count), MPI_FLOAT, destination, message_tag, comm_,
                        &requests.back()),
              "MPI_Isend (ring)");
  };
  // This rank's incoming block: part 0 straight from the predecessor, part t >= 1 combined
  // from this rank's t-th proxy. Empty routed parts are skipped on both ends (a direct
  // hop always posts its message, empty or not).
  const int incoming_hop = position - 1;
  const int incoming_parts = parts_of(incoming_hop);
  for (int part = 0; part < incoming_parts; ++part) {
    const PartRange range = part_range(incoming_hop, incoming_parts, part);
    if (range.size() == 0 && incoming_parts > 1) continue;
    if (part == 0) {
      post_recv(recv + range.begin, range.size(), source_of(incoming_hop), tag);
    } else {
      post_recv(recv + range.begin, range.size(), routing_proxy(cluster, rank_, part),
                tag + kRoutedCombine);
    }
  }
  // The relays this rank does for routed hops of the ring: as the source-side proxy of
  // a part it forwards the dispatch over its NIC; as the destination-side proxy it
  // forwards the crossing to the destination. validate() admits routing only through
  // group members, so every proxy runs this shift too.
  struct Relay {
    std::vector<float> data;
    int to = 0;
    int send_tag = 0;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  std::vector<Relay> relays;
  for (int hop = 0; hop < group_size; ++hop) {
    const int parts = parts_of(hop);
    const int source = source_of(hop);
    const int destination = destination_of(hop);
    for (int part = 1; part < parts; ++part) {
      const int source_proxy = routing_proxy(cluster, source, part);
      const int destination_proxy = routing_proxy(cluster, destination, part);
      BALLAST_CHECK(is_member(source_proxy) && is_member(destination_proxy),
                    "a validated plan routes only through members of the group");
      const PartRange range = part_range(hop, parts, part);
      if (range.size() == 0) continue;
      int from = -1;
      int receive_tag = 0;
      if (source_proxy == rank_) {
        relays.push_back({std::vector<float>(static_cast<std::size_t>(range.size())),
                          destination_proxy, tag + kRoutedCrossing});
        from = source;
        receive_tag = tag + kRoutedDispatch;
      } else if (destination_proxy == rank_) {
        relays.push_back({std::vector<float>(static_cast<std::size_t>(range.size())), destination,
                          tag + kRoutedCombine});
        from = source_proxy;
        receive_tag = tag + kRoutedCrossing;
      } else {
        continue;
      }
      Relay& relay = relays.back();
      check_mpi(MPI_Irecv(relay.data.data(), static_cast<int>(relay.data.size()), MPI_FLOAT, from,
                          receive_tag, comm_, &relay.request),
                "MPI_Irecv (relay)");
    }
  }
  // This rank's outgoing block: part 0 straight to the successor, part t >= 1 dispatched
  // to this rank's t-th proxy.
  const int outgoing_hop = position;
  const int outgoing_parts = parts_of(outgoing_hop);
  for (int part = 0; part < outgoing_parts; ++part) {
    const PartRange range = part_range(outgoing_hop, outgoing_parts, part);
    if (range.size() == 0 && outgoing_parts > 1) continue;
    if (part == 0) {
      post_send(send + range.begin, range.size(), destination_of(outgoing_hop), tag);
    } else {
      post_send(send + range.begin, range.size(), routing_proxy(cluster, rank_, part),
                tag + kRoutedDispatch);
    }
  }
  run_fault_hook("in a ring shift, messages in flight");
  compute();
  timed_wait("ring", [&] {
    // Relays forward in arrival order: a fixed order could wait on a part whose sender
    // itself waits on this rank's other relay.
    std::vector<MPI_Request> relay_requests;
    for (const Relay& relay : relays) relay_requests.push_back(relay.request);
    for (std::size_t done = 0; done < relays.size(); ++done) {
      int index = MPI_UNDEFINED;
      check_mpi(MPI_Waitany(static_cast<int>(relay_requests.size()), relay_requests.data(), &index,
                            MPI_STATUS_IGNORE),
                "MPI_Waitany (relay)");
      const Relay& relay = relays[static_cast<std::size_t>(index)];
      post_send(relay.data.data(), static_cast<std::int64_t>(relay.data.size()), relay.to,
                relay.send_tag);
    }
    check_mpi(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
              "MPI_Waitall (ring)");
  });
}

void PlanAttentionEngine::run_group_forward(const AttentionShape& shape, const GroupTokens& mine,
                                            Saved& saved) {
  const AttentionGroup& group = micro_batch_.groups[static_cast<std::size_t>(mine.group)];
  const int group_size = static_cast<int>(group.ranks.size());
  const int position = position_of(group, rank_);
  // Row widths in floats: a token's queries, and its keys (or values).
  const int head_dim = shape.head_dim;
  const int q_width = shape.heads * head_dim;
  const int kv_width = shape.kv_heads * head_dim;
  const float* q = saved.q.data() + rows(mine.first, q_width);
  const float* k = saved.k.data() + rows(mine.first, kv_width);
  const float* v = saved.v.data() + rows(mine.first, kv_width);
  float* out = saved.out.data() + rows(mine.first, q_width);
  float* lse = saved.lse.data() + rows(mine.first, shape.heads);
  const std::vector<Member> members =
      members_of(group, [&](int member_rank) { return group_tokens(group, member_rank); });
  const Member& own = members[static_cast<std::size_t>(position)];
  BALLAST_CHECK(own.size() == mine.count, "group token counts must agree");
  const std::size_t own_kv_floats = rows(mine.count, kv_width);
  AttentionAccumulator accumulator;
  const int tag = tag_of(mine.group, kForward);

  if (group_size == 1 || group.scheme == Scheme::local) {
    accumulator.reset(mine.count, shape);
    attention_forward_accumulate(shape, q, own.span(), k, v, own.span(), accumulator);
    attention_forward_finalize(shape, accumulator, out, lse);
    return;
  }
  if (group.scheme == Scheme::ring) {
    // The travelling block [k | v] of its owner.
    std::vector<float> current(2 * own_kv_floats), incoming;
    std::copy(k, k + own_kv_floats, current.begin());
    std::copy(v, v + own_kv_floats, current.begin() + static_cast<std::ptrdiff_t>(own_kv_floats));
    accumulator.reset(mine.count, shape);
    for (int step = 0; step < group_size; ++step) {
      const Member& owner = at_position(members, position - step);
      const auto compute = [&] {
        attention_forward_accumulate(shape, q, own.span(), current.data(),
                                     current.data() + rows(owner.size(), kv_width), owner.span(),
                                     accumulator);
      };
      if (step + 1 == group_size) {
        compute();
        break;
      }
      // Member m now holds owner (m - step)'s block and passes it on while computing on it.
      std::vector<std::size_t> sizes(static_cast<std::size_t>(group_size));
      for (int member = 0; member < group_size; ++member) {
        sizes[static_cast<std::size_t>(member)] =
            2 * rows(at_position(members, member - step).size(), kv_width);
      }
      incoming.assign(at_position(sizes, position - 1), 0);
      ring_shift(group, mine.group, sizes, current.data(), incoming.data(), kForward, compute);
      std::swap(current, incoming);
    }
    attention_forward_finalize(shape, accumulator, out, lse);
    return;
  }
  if (group.scheme == Scheme::all_gather) {
    std::vector<float> block(k, k + own_kv_floats);
    block.insert(block.end(), v, v + own_kv_floats);
    const auto gathered =
        exchange_rows(std::vector(static_cast<std::size_t>(group_size), block), sizes_of(members),
                      2 * kv_width, group.ranks, position, tag);
    accumulator.reset(mine.count, shape);
    for (int member = 0; member < group_size; ++member) {
      const auto& kv = gathered[static_cast<std::size_t>(member)];
      const Member& holder = members[static_cast<std::size_t>(member)];
      attention_forward_accumulate(shape, q, own.span(), kv.data(),
                                   kv.data() + rows(holder.size(), kv_width), holder.span(),
                                   accumulator);
    }
    attention_forward_finalize(shape, accumulator, out, lse);
    return;
  }
  // Ulysses: member m computes heads [m * heads_per_member, (m + 1) * heads_per_member)
  // (KV heads [m * kv_heads_per_member, ...)) of every token of the group, in member order.
  BALLAST_CHECK(shape.heads % group_size == 0 && shape.kv_heads % group_size == 0,
                "a validated plan's Ulysses degree divides the heads and KV heads");
  const int heads_per_member = shape.heads / group_size;
  const int kv_heads_per_member = shape.kv_heads / group_size;
  const HeadColumn<const float> in[] = {{q, shape.heads, heads_per_member, head_dim},
                                       {k, shape.kv_heads, kv_heads_per_member, head_dim},
                                       {v, shape.kv_heads, kv_heads_per_member, head_dim}};
  const int in_widths[] = {heads_per_member * head_dim, kv_heads_per_member * head_dim,
                           kv_heads_per_member * head_dim};
  const auto columns = split_columns(  // q, k, v of this member's heads for every group token
      exchange_rows(pack_heads(group_size, mine.count, in), sizes_of(members),
                    row_width<const float>(in), group.ranks, position, tag),
      in_widths);
  const Member all = concatenated(members);
  const AttentionShape member_shape{heads_per_member, kv_heads_per_member, head_dim};
  accumulator.reset(all.size(), member_shape);
  attention_forward_accumulate(member_shape, columns[0].data(), all.span(), columns[1].data(),
                               columns[2].data(), all.span(), accumulator);
  std::vector<float> out_heads(rows(all.size(), heads_per_member * head_dim));
  std::vector<float> lse_heads(rows(all.size(), heads_per_member));
  attention_forward_finalize(member_shape, accumulator, out_heads.data(), lse_heads.data());
  // Back to the owners: each token's output and lse for this member's heads.
  const std::vector<float>* results[] = {&out_heads, &lse_heads};
  const int result_widths[] = {heads_per_member * head_dim, heads_per_member};
  const HeadColumn<float> targets[] = {{out, shape.heads, heads_per_member, head_dim},
                                       {lse, shape.heads, heads_per_member, 1}};
  unpack_heads(exchange_rows(join_columns(members, results, result_widths),
                             std::vector(static_cast<std::size_t>(group_size), mine.count),
                             row_width<float>(targets), group.ranks, position,
                             tag_of(mine.group, kForwardBack)),
               mine.count, targets, false);
}

void PlanAttentionEngine::run_group_backward(const AttentionShape& shape, const GroupTokens& mine,
                                             const Saved& saved, const float* d_out_all,
                                             float* d_q_all, float* d_k_all, float* d_v_all) {
  const AttentionGroup& group = micro_batch_.groups[static_cast<std::size_t>(mine.group)];
  const int group_size = static_cast<int>(group.ranks.size());
  const int position = position_of(group, rank_);
  const int head_dim = shape.head_dim;
  const int q_width = shape.heads * head_dim;
  const int kv_width = shape.kv_heads * head_dim;
  const std::size_t q_offset = rows(mine.first, q_width);
  const std::size_t kv_offset = rows(mine.first, kv_width);
  const float* q = saved.q.data() + q_offset;
  const float* k = saved.k.data() + kv_offset;
  const float* v = saved.v.data() + kv_offset;
  const float* out = saved.out.data() + q_offset;
  const float* lse = saved.lse.data() + rows(mine.first, shape.heads);
  const float* d_out = d_out_all + q_offset;
  float* d_q = d_q_all + q_offset;
  float* d_k = d_k_all + kv_offset;
  float* d_v = d_v_all + kv_offset;
  const std::vector<Member> members =
      members_of(group, [&](int member_rank) { return group_tokens(group, member_rank); });
  const Member& own = members[static_cast<std::size_t>(position)];
  const std::size_t own_kv_floats = rows(mine.count, kv_width);
  const int tag = tag_of(mine.group, kBackward);

  if (group_size == 1 || group.scheme == Scheme::local || group.scheme == Scheme::ring ||
      group.scheme == Scheme::all_gather) {
    std::vector<float> delta(rows(mine.count, shape.heads));
    attention_backward_delta(shape, mine.count, out, d_out, delta.data());
    if (group_size == 1 || group.scheme == Scheme::local) {
      attention_backward_accumulate(shape, q, d_out, lse, delta.data(), own.span(), k, v,
                                    own.span(), d_q, d_k, d_v);
      return;
    }
    if (group.scheme == Scheme::ring) {
      // The travelling buffer [k | v | dk | dv] of the block's owner; dK/dV accumulate as
      // the block goes round and a final send returns them to the owner.
      std::vector<float> current(4 * own_kv_floats, 0), incoming;
      std::copy(k, k + own_kv_floats, current.begin());
      std::copy(v, v + own_kv_floats, current.begin() + static_cast<std::ptrdiff_t>(own_kv_floats));
      for (int step = 0; step < group_size; ++step) {
        const Member& owner = at_position(members, position - step);
        const std::size_t owner_kv_floats = rows(owner.size(), kv_width);
        attention_backward_accumulate(shape, q, d_out, lse, delta.data(), own.span(),
                                      current.data(), current.data() + owner_kv_floats,
                                      owner.span(), d_q, current.data() + 2 * owner_kv_floats,
                                      current.data() + 3 * owner_kv_floats);
        if (step + 1 == group_size) break;
        std::vector<std::size_t> sizes(static_cast<std::size_t>(group_size));
        for (int member = 0; member < group_size; ++member) {
          sizes[static_cast<std::size_t>(member)] =
              4 * rows(at_position(members, member - step).size(), kv_width);
        }
        incoming.assign(at_position(sizes, position - 1), 0);
        ring_shift(group, mine.group, sizes, current.data(), incoming.data(), kBackward, [] {});
        std::swap(current, incoming);
      }
      // Member m now holds owner (m + 1)'s block: one more shift returns each block's
      // dK/dV to its owner.
      std::vector<std::size_t> sizes(static_cast<std::size_t>(group_size));
      for (int member = 0; member < group_size; ++member) {
        sizes[static_cast<std::size_t>(member)] =
            2 * rows(at_position(members, member + 1).size(), kv_width);
      }
      const std::size_t next_kv_floats = rows(at_position(members, position + 1).size(), kv_width);
      const std::vector<float> returning(
          current.begin() + static_cast<std::ptrdiff_t>(2 * next_kv_floats), current.end());
      std::vector<float> own_gradients(2 * own_kv_floats, 0);  // [dk | dv] of own tokens
      ring_shift(group, mine.group, sizes, returning.data(), own_gradients.data(), kBackwardReturn,
                 [] {});
      for (std::size_t element = 0; element < own_kv_floats; ++element) {
        d_k[element] += own_gradients[element];
        d_v[element] += own_gradients[own_kv_floats + element];
      }
      return;
    }
    // all_gather: gather KV again (as LLaMA-3 CP does), dK/dV partials back to their owners.
    std::vector<float> block(k, k + own_kv_floats);
    block.insert(block.end(), v, v + own_kv_floats);
    const auto gathered =
        exchange_rows(std::vector(static_cast<std::size_t>(group_size), block), sizes_of(members),
                      2 * kv_width, group.ranks, position, tag);
    // partial[m] = [dk | dv] of member m's tokens from this rank's queries.
    std::vector<std::vector<float>> partial(static_cast<std::size_t>(group_size));
    for (int member = 0; member < group_size; ++member) {
      const Member& holder = members[static_cast<std::size_t>(member)];
      const auto& kv = gathered[static_cast<std::size_t>(member)];
      const std::size_t holder_kv_floats = rows(holder.size(), kv_width);
      auto& gradients = partial[static_cast<std::size_t>(member)];
      gradients.assign(2 * holder_kv_floats, 0);
      attention_backward_accumulate(shape, q, d_out, lse, delta.data(), own.span(), kv.data(),
                                    kv.data() + holder_kv_floats, holder.span(), d_q,
                                    gradients.data(), gradients.data() + holder_kv_floats);
    }
    const auto returned =
        exchange_rows(partial, std::vector(static_cast<std::size_t>(group_size), mine.count),
                      2 * kv_width, group.ranks, position, tag_of(mine.group, kBackwardBack));
    for (int member = 0; member < group_size; ++member) {  // fixed order: the same sum every run
      const auto& gradients = returned[static_cast<std::size_t>(member)];
      for (std::size_t element = 0; element < own_kv_floats; ++element) {
        d_k[element] += gradients[element];
        d_v[element] += gradients[own_kv_floats + element];
      }
    }
    return;
  }
  // Ulysses backward: the same head exchange with out, dO and lse, then dQ/dK/dV back.
  const int heads_per_member = shape.heads / group_size;
  const int kv_heads_per_member = shape.kv_heads / group_size;
  const HeadColumn<const float> in[] = {{q, shape.heads, heads_per_member, head_dim},
                                       {k, shape.kv_heads, kv_heads_per_member, head_dim},
                                       {v, shape.kv_heads, kv_heads_per_member, head_dim},
                                       {out, shape.heads, heads_per_member, head_dim},
                                       {d_out, shape.heads, heads_per_member, head_dim},
                                       {lse, shape.heads, heads_per_member, 1}};
  const int q_heads_width = heads_per_member * head_dim;
  const int kv_heads_width = kv_heads_per_member * head_dim;
  const int in_widths[] = {q_heads_width, kv_heads_width, kv_heads_width,
                           q_heads_width, q_heads_width,  heads_per_member};
  // q, k, v, out, dO, lse of this member's heads for every group token.
  const auto columns = split_columns(
      exchange_rows(pack_heads(group_size, mine.count, in), sizes_of(members),
                    row_width<const float>(in), group.ranks, position, tag),
      in_widths);
  const Member all = concatenated(members);
  const AttentionShape member_shape{heads_per_member, kv_heads_per_member, head_dim};
  const int group_tokens_count = all.size();
  std::vector<float> delta(rows(group_tokens_count, heads_per_member));
  std::vector<float> d_q_heads(rows(group_tokens_count, q_heads_width), 0);
  std::vector<float> d_k_heads(rows(group_tokens_count, kv_heads_width), 0);
  std::vector<float> d_v_heads(rows(group_tokens_count, kv_heads_width), 0);
  attention_backward_delta(member_shape, group_tokens_count, columns[3].data(), columns[4].data(),
                           delta.data());
  attention_backward_accumulate(member_shape, columns[0].data(), columns[4].data(),
                                columns[5].data(), delta.data(), all.span(), columns[1].data(),
                                columns[2].data(), all.span(), d_q_heads.data(), d_k_heads.data(),
                                d_v_heads.data());
  const std::vector<float>* results[] = {&d_q_heads, &d_k_heads, &d_v_heads};
  const int result_widths[] = {q_heads_width, kv_heads_width, kv_heads_width};
  const HeadColumn<float> targets[] = {{d_q, shape.heads, heads_per_member, head_dim},
                                       {d_k, shape.kv_heads, kv_heads_per_member, head_dim},
                                       {d_v, shape.kv_heads, kv_heads_per_member, head_dim}};
  unpack_heads(exchange_rows(join_columns(members, results, result_widths),
                             std::vector(static_cast<std::size_t>(group_size), mine.count),
                             row_width<float>(targets), group.ranks, position,
                             tag_of(mine.group, kBackwardBack)),
               mine.count, targets, true);
}

}  // namespace ballast::runtime
