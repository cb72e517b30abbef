// Ring attention of PlanAttentionEngine (plan_engine.hpp): the ring shifts (direct or
// routed through proxies) and the forward and backward passes, scheduled as
// TransformerEngine does: each step's transfers fly while the step computes.
#include <algorithm>
#include <span>
#include <utility>

#include "ballast/error.hpp"
#include "ballast/plan_layout.hpp"
#include "ballast/runtime/mpi.hpp"
#include "ballast/runtime/plan_engine.hpp"
#include "plan_schemes_internal.hpp"

namespace ballast::runtime {

using namespace schemes_detail;

namespace {

int largest_member(const std::vector<Member>& members) {
  int largest = 0;
  for (const Member& member : members) largest = std::max(largest, member.size());
  return largest;
}

/// The floats each hop of a ring shift carries at `step`, into `sizes`: member m then holds
/// the block of member m - step, `blocks` arrays of `width` floats per token of it.
std::span<const std::size_t> ring_step_sizes(const std::vector<Member>& members, int step,
                                             int width, int blocks,
                                             std::vector<std::size_t>& sizes) {
  const int group_size = static_cast<int>(members.size());
  sizes.resize(members.size());
  for (int member = 0; member < group_size; ++member) {
    sizes[static_cast<std::size_t>(member)] =
        static_cast<std::size_t>(blocks) * rows(at_position(members, member - step).size(), width);
  }
  return sizes;
}

}  // namespace

void PlanAttentionEngine::post_ring_shift(GroupState& state, std::span<const std::size_t> sizes,
                                          const float* send, float* recv, int phase) {
  const AttentionGroup& group = *state.group;
  const Cluster& cluster = plan_.cluster;
  const int group_size = static_cast<int>(group.ranks.size());
  const int position = state.position;
  // Hop h carries sizes[h] floats from the member at position h to the one at h + 1, in
  // routing_parts() parts (plan_layout.hpp, as the simulator routes it).
  const auto source_of = [&](int hop) { return at_position(group.ranks, hop); };
  const auto destination_of = [&](int hop) { return at_position(group.ranks, hop + 1); };
  const auto parts_of = [&](int hop) {
    return routing_parts(cluster, group.routing_proxies, source_of(hop), destination_of(hop));
  };
  const auto part_range = [&](int hop, int parts, int part) {
    const auto size = sizes[static_cast<std::size_t>(wrapped(hop, group_size))];
    return routed_part_range(static_cast<std::int64_t>(size), parts, part);
  };
  const auto is_member = [&](int rank) {
    return std::find(group.ranks.begin(), group.ranks.end(), rank) != group.ranks.end();
  };
  const int tag = tag_of(state.group_index, phase);
  const auto post_recv = [&](float* data, std::int64_t count, int source, int message_tag) {
    post_receive(data, static_cast<std::size_t>(count), source, message_tag, state.requests);
  };
  const auto post = [&](const float* data, std::int64_t count, int destination, int message_tag) {
    post_send(data, static_cast<std::size_t>(count), destination, message_tag, state.requests);
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
      int from = -1, to = -1, receive_tag = 0, send_tag = 0;
      if (source_proxy == rank_) {
        from = source;
        to = destination_proxy;
        receive_tag = tag + kRoutedDispatch;
        send_tag = tag + kRoutedCrossing;
      } else if (destination_proxy == rank_) {
        from = source_proxy;
        to = destination;
        receive_tag = tag + kRoutedCrossing;
        send_tag = tag + kRoutedCombine;
      } else {
        continue;
      }
      if (state.relay_count == state.relays.size()) state.relays.emplace_back();
      Relay& relay = state.relays[state.relay_count++];
      relay.data.resize(static_cast<std::size_t>(range.size()));
      relay.to = to;
      relay.send_tag = send_tag;
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
      post(send + range.begin, range.size(), destination_of(outgoing_hop), tag);
    } else {
      post(send + range.begin, range.size(), routing_proxy(cluster, rank_, part),
           tag + kRoutedDispatch);
    }
  }
  run_fault_hook("in a ring shift, messages in flight");
}

void PlanAttentionEngine::wait_ring_shifts(GroupState& state) {
  timed_wait("ring", [&] {
    // Relays forward in arrival order: a fixed order could wait on a part whose sender
    // itself waits on this rank's other relay.
    std::vector<MPI_Request> relay_requests;
    for (std::size_t r = 0; r < state.relay_count; ++r) {
      relay_requests.push_back(state.relays[r].request);
    }
    for (std::size_t done = 0; done < state.relay_count; ++done) {
      int index = MPI_UNDEFINED;
      check_mpi(MPI_Waitany(static_cast<int>(relay_requests.size()), relay_requests.data(), &index,
                            MPI_STATUS_IGNORE),
                "MPI_Waitany (relay)");
      const Relay& relay = state.relays[static_cast<std::size_t>(index)];
      post_send(relay.data.data(), relay.data.size(), relay.to, relay.send_tag, state.requests);
    }
    check_mpi(MPI_Waitall(static_cast<int>(state.requests.size()), state.requests.data(),
                          MPI_STATUSES_IGNORE),
              "MPI_Waitall (ring)");
  });
  state.requests.clear();
  state.relay_count = 0;
}

void PlanAttentionEngine::ring_forward(const AttentionShape& shape, GroupState& state,
                                       const float* q, const float* k, const float* v, float* out,
                                       float* lse) {
  const int group_size = static_cast<int>(state.members.size());
  const int kv_width = shape.kv_heads * shape.head_dim;
  const std::size_t own_kv_floats = rows(state.count, kv_width);
  const std::size_t largest_block = 2 * rows(largest_member(state.members), kv_width);
  // The travelling block [k | v] of its owner, and the next one arriving.
  state.kv_current.resize(largest_block);
  state.kv_incoming.resize(largest_block);
  copy_kv_block(k, v, own_kv_floats, state.kv_current.data());
  const TokenTiles& own = at_position(state.tiles, state.position);
  state.accumulator.reset(state.count, shape);
  for (int step = 0; step < group_size; ++step) {
    // Member m holds owner (m - step)'s block and passes it on while computing on it.
    const int owner = state.position - step;
    const std::size_t owner_kv_floats = rows(at_position(state.members, owner).size(), kv_width);
    const bool shift = step + 1 < group_size;
    if (shift) {
      post_ring_shift(state, ring_step_sizes(state.members, step, kv_width, 2, state.sizes),
                      state.kv_current.data(), state.kv_incoming.data(), kForward);
    }
    attention_forward_accumulate(shape, q, own, state.kv_current.data(),
                                 state.kv_current.data() + owner_kv_floats,
                                 at_position(state.tiles, owner), state.accumulator);
    if (shift) {
      wait_ring_shifts(state);
      std::swap(state.kv_current, state.kv_incoming);
    }
  }
  attention_forward_finalize(shape, state.accumulator, out, lse);
}

void PlanAttentionEngine::ring_backward(const AttentionShape& shape, GroupState& state,
                                        const float* q, const float* k, const float* v,
                                        const float* d_out, const float* lse, const float* delta,
                                        float* d_q, float* d_k, float* d_v) {
  const int group_size = static_cast<int>(state.members.size());
  const int kv_width = shape.kv_heads * shape.head_dim;
  const std::size_t own_kv_floats = rows(state.count, kv_width);
  const std::size_t largest_block = 2 * rows(largest_member(state.members), kv_width);
  for (auto* buffer : {&state.kv_current, &state.kv_incoming, &state.dkv_partial,
                       &state.dkv_outgoing, &state.dkv_incoming}) {
    buffer->resize(largest_block);
  }
  copy_kv_block(k, v, own_kv_floats, state.kv_current.data());
  const TokenTiles& own = at_position(state.tiles, state.position);
  for (int step = 0; step < group_size; ++step) {
    const int owner = state.position - step;
    const std::size_t owner_kv_floats = rows(at_position(state.members, owner).size(), kv_width);
    const std::span<const std::size_t> sizes =
        ring_step_sizes(state.members, step, kv_width, 2, state.sizes);
    const bool shift = step + 1 < group_size;
    if (shift) {  // the next step's block travels while this one computes
      post_ring_shift(state, sizes, state.kv_current.data(), state.kv_incoming.data(), kBackward);
    }
    // This rank's part of the block's dK/dV; meanwhile the block's dK/dV accumulated by the
    // members before this one arrives (sent at their previous step). At step 0 the block is
    // this rank's own and its part starts the accumulation.
    float* part = (step == 0 ? state.dkv_outgoing : state.dkv_partial).data();
    std::fill_n(part, 2 * owner_kv_floats, 0.0f);
    attention_backward_accumulate(shape, q, d_out, lse, delta, own, state.kv_current.data(),
                                  state.kv_current.data() + owner_kv_floats,
                                  at_position(state.tiles, owner), d_q, part,
                                  part + owner_kv_floats);
    wait_ring_shifts(state);  // this step's block shift and the previous step's dK/dV
    if (step > 0) {
      add_to(state.dkv_incoming.data(), part, 2 * owner_kv_floats);
      std::swap(state.dkv_incoming, state.dkv_outgoing);
    }
    // The block's dK/dV goes on one step behind the block; at the last step it goes to the
    // successor, the block's owner.
    post_ring_shift(state, sizes, state.dkv_outgoing.data(), state.dkv_incoming.data(),
                    kBackwardGradients);
    if (shift) std::swap(state.kv_current, state.kv_incoming);
  }
  wait_ring_shifts(state);
  // This rank's own block, with the part of every member.
  add_to(d_k, state.dkv_incoming.data(), own_kv_floats);
  add_to(d_v, state.dkv_incoming.data() + own_kv_floats, own_kv_floats);
}

}  // namespace ballast::runtime
