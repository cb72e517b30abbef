// Internal to the MPI engine (plan_engine.cpp, plan_schemes.cpp, plan_ring.cpp, plan_usp.cpp): the MPI
// tags of a group's phases, and what one attention group keeps from call to call, so that
// after the first layer a call builds no token lists or tiles and allocates no buffers.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "ballast/error.hpp"
#include "ballast/plan.hpp"
#include "ballast/runtime/kernels.hpp"
#include "ballast/runtime/plan_engine.hpp"

namespace ballast::runtime {

namespace schemes_detail {

// MPI tags. Each group of a micro-batch owns kTagsPerGroup consecutive tags, starting at
// kTagsPerGroup * group; a phase is an offset among them. A ring shift sends direct parts
// on its phase's tag and the three stages of a routed part on the next three tags, so
// ring phases lie kTagsPerRingPhase apart; the other exchanges use one tag each.
inline constexpr int kRoutedDispatch = 1;  ///< routed part: source -> its proxy (NVLink)
inline constexpr int kRoutedCrossing = 2;  ///< routed part: proxy -> destination's proxy (NIC)
inline constexpr int kRoutedCombine = 3;   ///< routed part: that proxy -> destination (NVLink)
inline constexpr int kTagsPerRingPhase = 4;
/// Phases: ring shifts, all-gathers and all-to-alls of the forward and the backward pass;
/// the ring's dK/dV shifts (one step behind the KV blocks, the last one returning them to
/// their owners); the exchanges that send results home (Ulysses outputs; all-gather dK/dV
/// and Ulysses gradients).
inline constexpr int kForward = 0;
inline constexpr int kBackward = kForward + kTagsPerRingPhase;
inline constexpr int kBackwardGradients = kBackward + kTagsPerRingPhase;
inline constexpr int kForwardBack = kBackwardGradients + kTagsPerRingPhase;
inline constexpr int kBackwardBack = kForwardBack + 1;
inline constexpr int kTagsPerGroup = 16;
static_assert(kForwardBack == 12 && kBackwardBack == 13 && kBackwardBack < kTagsPerGroup,
              "the tag scheme of docs/runtime.md");
inline constexpr int kLargestTag = 32767;  // the smallest MPI_TAG_UB the MPI standard guarantees

inline int tag_of(int group, int phase) {
  const int tag = kTagsPerGroup * group + phase;
  BALLAST_CHECK(tag <= kLargestTag,
                "too many groups in one micro-batch for MPI tags (at most 2048)");
  return tag;
}

/// Floats of `count` rows of `width` floats.
inline std::size_t rows(int count, int width) {
  return static_cast<std::size_t>(count) * static_cast<std::size_t>(width);
}

/// `position` wrapped into [0, size): -1 is the last.
inline int wrapped(int position, int size) { return (position % size + size) % size; }

/// The member at `position` of a list (positions wrap around: -1 is the last).
template <typename T>
const T& at_position(const std::vector<T>& list, int position) {
  return list[static_cast<std::size_t>(wrapped(position, static_cast<int>(list.size())))];
}

/// Writes the block [k | v] (kv_floats floats each) to `block`.
inline void copy_kv_block(const float* k, const float* v, std::size_t kv_floats, float* block) {
  std::copy_n(k, kv_floats, block);
  std::copy_n(v, kv_floats, block + kv_floats);
}

/// Adds `count` floats of `from` to `to`.
inline void add_to(float* to, const float* from, std::size_t count) {
  for (std::size_t element = 0; element < count; ++element) to[element] += from[element];
}

/// A member's tokens in layout order: document (the sequence's index in its group) and
/// position inside it.
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

  /// USP: this rank's stage as a Ulysses group of its u members (`stage_group`, position m)
  /// and the ring of the stages' member m (`ring_group`, position = the stage; a member of
  /// it is a whole stage's tokens in member order), with the parent's group index (their
  /// peers differ: stage messages stay inside the stage, ring messages between stages).
  AttentionGroup stage_group, ring_group;
  std::unique_ptr<GroupState> stage, ring;
};

}  // namespace ballast::runtime
