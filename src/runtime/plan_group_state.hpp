// Internal to the MPI engine (plan_engine.cpp, plan_schemes.cpp): what one attention group
// keeps from call to call, so that after the first layer a call builds no token lists or
// tiles and allocates no buffers.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "ballast/plan.hpp"
#include "ballast/runtime/kernels.hpp"
#include "ballast/runtime/plan_engine.hpp"

namespace ballast::runtime {

namespace schemes_detail {

/// A member's tokens: document (sequence id) and position inside it, in layout order.
struct Member {
  std::vector<std::int64_t> documents, positions;
  int size() const { return static_cast<int>(documents.size()); }
  TokenSpan span() const { return {documents.data(), positions.data(), size()}; }
};

/// A routed part of a ring shift that this rank relays: received into `data`, then sent on
/// to rank `to` with `send_tag`.
struct Relay {
  std::vector<float> data;
  int to = 0;
  int send_tag = 0;
  MPI_Request request = MPI_REQUEST_NULL;
};

}  // namespace schemes_detail

struct PlanAttentionEngine::GroupState {
  const AttentionGroup* group = nullptr;
  int group_index = 0;  ///< in the micro-batch (MPI tags)
  int position = 0;     ///< this rank's position in the group's rank list (ring order)
  int first = 0;        ///< this rank's first token of the group in its attention layout
  int count = 0;        ///< this rank's tokens of the group
  /// Every member's tokens (a local group: this rank's only) and their tiles; the tiles
  /// point into `members`, which is never resized after they are built.
  std::vector<schemes_detail::Member> members;
  std::vector<TokenTiles> tiles;
  /// Ulysses: every token of the group in member order, its tiles, and member m's first
  /// row among them.
  schemes_detail::Member all;
  TokenTiles all_tiles;
  std::vector<int> first_row;

  // Buffers every layer and pass reuse (sized at first use).
  AttentionAccumulator accumulator;
  std::vector<float> delta;
  /// Ring: the travelling [K | V] block and the next one; the dK/dV partial of the current
  /// block, the accumulated [dK | dV] being sent on and the one arriving.
  std::vector<float> kv_current, kv_incoming, dkv_partial, dkv_outgoing, dkv_incoming;
  std::vector<std::size_t> sizes;  ///< ring: floats each hop of a shift carries
  /// All-gather: every member's [K | V] block (member order, at block_offsets[m]), the dK/dV
  /// partials of them from this rank's queries (same layout), and the partials of this
  /// rank's block that every member returns ([dK | dV] per member).
  std::vector<float> gathered, partials, returned;
  std::vector<std::size_t> block_offsets;
  /// Ulysses: what this rank sends every member (its tokens' rows of the member's heads)
  /// and receives back; dO and the gradients of this member's heads of every group token.
  std::vector<float> send, receive, d_out_heads, d_q_heads, d_k_heads, d_v_heads;

  // Point-to-point in flight: this rank's own requests and, for routed ring hops, its relays
  // (relays[0, relay_count) are live; the vector keeps its buffers from shift to shift).
  std::vector<MPI_Request> requests;
  std::vector<schemes_detail::Relay> relays;
  std::size_t relay_count = 0;
};

}  // namespace ballast::runtime
