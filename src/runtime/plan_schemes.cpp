// The attention schemes of PlanAttentionEngine (plan_engine.hpp) on this rank's tokens of
// one group: the group's state (built at its first call), the dispatch by scheme, and
// local, all_gather and ulysses (with a ring in the middle: usp), forward and backward (the
// ring: plan_ring.cpp).
#include <algorithm>
#include <memory>
#include <unordered_map>
#include <utility>

#include "ballast/error.hpp"
#include "ballast/runtime/plan_engine.hpp"
#include "plan_schemes_internal.hpp"

namespace ballast::runtime {

using namespace schemes_detail;

namespace {

/// This rank's position in the group's rank list (ring order for a ring).
int position_of(const AttentionGroup& group, int rank) {
  const auto it = std::find(group.ranks.begin(), group.ranks.end(), rank);
  BALLAST_CHECK(it != group.ranks.end(), "a rank runs only the groups it belongs to");
  return static_cast<int>(it - group.ranks.begin());
}


/// Ulysses' pack: `tokens` rows of `width` floats starting at column `column` of rows
/// `stride` floats apart (a member's heads of a [tokens, heads, head_dim] array), into
/// consecutive rows.
void copy_columns_out(const float* from, int stride, int column, int tokens, int width,
                      float* to) {
  for (int token = 0; token < tokens; ++token) {
    std::copy_n(from + rows(token, stride) + column, width, to + rows(token, width));
  }
}
/// Ulysses' unpack, the inverse of copy_columns_out (`add`: adds to the target instead).
void copy_columns_in(const float* from, int tokens, int width, float* to, int stride, int column,
                     bool add) {
  for (int token = 0; token < tokens; ++token) {
    const float* row = from + rows(token, width);
    float* target = to + rows(token, stride) + column;
    if (add) {
      add_to(target, row, static_cast<std::size_t>(width));
    } else {
      std::copy_n(row, width, target);
    }
  }
}


/// Each member's heads in a Ulysses group of `group_size` (plan.hpp's
/// ulysses_degree_allowed): query heads [m h/g, (m+1) h/g) and the KV heads they read,
/// k/g of them from m k/g when g <= k, else the one KV head (m h/g) / (h/k), which g/k
/// members hold (replicated).
struct UlyssesHeads {
  int heads = 0;     ///< query heads per member
  int kv_heads = 0;  ///< KV heads per member
  int group = 0;     ///< query heads per KV head (GQA)
  int kv_first(int member) const { return member * heads / group; }
};

UlyssesHeads ulysses_heads(const AttentionShape& shape, int group_size) {
  BALLAST_CHECK(shape.heads % group_size == 0 && (shape.kv_heads % group_size == 0 ||
                                                  group_size % shape.kv_heads == 0),
                "a validated plan's Ulysses degree divides the heads and divides or is a "
                "multiple of the KV heads");
  return {shape.heads / group_size, std::max(1, shape.kv_heads / group_size),
          shape.heads / shape.kv_heads};
}

}  // namespace

void PlanAttentionEngine::gather_members(GroupState& state) {
  for (const Member& member : state.members) {
    state.first_row.push_back(state.all.size());
    state.all.documents.insert(state.all.documents.end(), member.documents.begin(),
                               member.documents.end());
    state.all.positions.insert(state.all.positions.end(), member.positions.begin(),
                               member.positions.end());
  }
  state.all_tiles = TokenTiles(state.all.span());
}

void PlanAttentionEngine::split_usp(GroupState& state) {
  const AttentionGroup& group = *state.group;
  const int degree = group.ulysses_degree;
  const int size = static_cast<int>(group.ranks.size());
  BALLAST_CHECK(degree >= 1 && size % degree == 0, "a validated usp group is whole stages");
  const int stages = size / degree;
  const int stage = state.position / degree;
  const int member = state.position % degree;
  // This rank's stage: a Ulysses group of its u members.
  state.stage_group.scheme = Scheme::ulysses;
  state.stage_group.ranks.assign(group.ranks.begin() + stage * degree,
                                 group.ranks.begin() + (stage + 1) * degree);
  auto stage_state = std::make_unique<GroupState>();
  stage_state->group = &state.stage_group;
  stage_state->group_index = state.group_index;
  stage_state->position = member;
  stage_state->first = state.first;
  stage_state->count = state.count;
  stage_state->members.assign(state.members.begin() + stage * degree,
                              state.members.begin() + (stage + 1) * degree);
  for (const Member& one : stage_state->members) stage_state->tiles.emplace_back(one.span());
  gather_members(*stage_state);
  // The ring of the stages' member `member`: position j holds stage j's tokens.
  state.ring_group.scheme = Scheme::ring;
  auto ring_state = std::make_unique<GroupState>();
  ring_state->group = &state.ring_group;
  ring_state->group_index = state.group_index;
  ring_state->position = stage;
  ring_state->members.resize(static_cast<std::size_t>(stages));
  for (int j = 0; j < stages; ++j) {
    state.ring_group.ranks.push_back(group.ranks[static_cast<std::size_t>(j * degree + member)]);
    Member& tokens = ring_state->members[static_cast<std::size_t>(j)];
    for (int i = j * degree; i < (j + 1) * degree; ++i) {
      const Member& one = state.members[static_cast<std::size_t>(i)];
      tokens.documents.insert(tokens.documents.end(), one.documents.begin(), one.documents.end());
      tokens.positions.insert(tokens.positions.end(), one.positions.begin(), one.positions.end());
    }
  }
  ring_state->count = ring_state->members[static_cast<std::size_t>(stage)].size();
  for (const Member& one : ring_state->members) ring_state->tiles.emplace_back(one.span());
  state.stage = std::move(stage_state);
  state.ring = std::move(ring_state);
}

PlanAttentionEngine::GroupState& PlanAttentionEngine::group_state(std::size_t index) {
  std::unique_ptr<GroupState>& slot = group_states_[index];
  if (slot) return *slot;
  const GroupTokens& mine = my_groups_[index];
  const AttentionGroup& group = micro_batch_.groups[static_cast<std::size_t>(mine.group)];
  auto state = std::make_unique<GroupState>();
  state->group = &group;
  state->group_index = mine.group;
  state->position = position_of(group, rank_);
  state->first = mine.first;
  state->count = mine.count;
  // Each member's tokens in group order. The document of a token is its sequence's index
  // in group.sequences, not its sequence id: every member lays its tokens out in that
  // order, so documents increase along each member's span, which is what lets the kernel
  // skip tile pairs whose document ranges do not meet (with sequence ids in a planner's
  // order, tiles of unrelated documents overlap in id range and are computed masked: 3x
  // the attention of the default `ballast run` step).
  std::unordered_map<std::int64_t, std::int64_t> index_of;
  for (std::size_t i = 0; i < group.sequences.size(); ++i) {
    index_of.emplace(group.sequences[i].sequence_id, static_cast<std::int64_t>(i));
  }
  state->members.resize(group.ranks.size());
  for (std::size_t member = 0; member < group.ranks.size(); ++member) {
    for (const TokenRef& token : group_tokens(group, group.ranks[member])) {
      state->members[member].documents.push_back(index_of.at(token.sequence));
      state->members[member].positions.push_back(token.position);
    }
  }
  BALLAST_CHECK(state->members[static_cast<std::size_t>(state->position)].size() == mine.count,
                "group token counts must agree");
  for (const Member& member : state->members) state->tiles.emplace_back(member.span());
  if (group.scheme == Scheme::ulysses && group.ranks.size() > 1) gather_members(*state);
  if (group.scheme == Scheme::usp) split_usp(*state);
  slot = std::move(state);
  return *slot;
}

void PlanAttentionEngine::run_group_forward(const AttentionShape& shape, std::size_t index,
                                            Saved& saved) {
  GroupState& state = group_state(index);
  const AttentionGroup& group = *state.group;
  // Row widths in floats: a token's queries, and its keys (or values).
  const int q_width = shape.heads * shape.head_dim;
  const int kv_width = shape.kv_heads * shape.head_dim;
  const float* q = saved.q.data() + rows(state.first, q_width);
  const float* k = saved.k.data() + rows(state.first, kv_width);
  const float* v = saved.v.data() + rows(state.first, kv_width);
  float* out = saved.out.data() + rows(state.first, q_width);
  float* lse = saved.lse.data() + rows(state.first, shape.heads);
  if (group.ranks.size() == 1 || group.scheme == Scheme::local) {
    const TokenTiles& own = state.tiles[static_cast<std::size_t>(state.position)];
    state.accumulator.reset(state.count, shape);
    attention_forward_accumulate(shape, q, own, k, v, own, state.accumulator);
    attention_forward_finalize(shape, state.accumulator, out, lse);
  } else if (group.scheme == Scheme::ring) {
    ring_forward(shape, state, q, k, v, out, lse);
  } else if (group.scheme == Scheme::all_gather) {
    all_gather_forward(shape, state, q, k, v, out, lse);
  } else {  // ulysses, or usp: Ulysses in this rank's stage around the ring of its peers
    if (saved.head_shards.size() < my_groups_.size()) saved.head_shards.resize(my_groups_.size());
    const bool usp = group.scheme == Scheme::usp;
    ulysses_forward(shape, usp ? *state.stage : state, q, k, v, out, lse,
                    saved.head_shards[index], usp ? state.ring.get() : nullptr);
  }
}

void PlanAttentionEngine::run_group_backward(const AttentionShape& shape, std::size_t index,
                                             const Saved& saved, const float* d_out_all,
                                             float* d_q_all, float* d_k_all, float* d_v_all) {
  GroupState& state = group_state(index);
  const AttentionGroup& group = *state.group;
  const int q_width = shape.heads * shape.head_dim;
  const int kv_width = shape.kv_heads * shape.head_dim;
  const std::size_t q_offset = rows(state.first, q_width);
  const std::size_t kv_offset = rows(state.first, kv_width);
  const float* d_out = d_out_all + q_offset;
  float* d_q = d_q_all + q_offset;
  float* d_k = d_k_all + kv_offset;
  float* d_v = d_v_all + kv_offset;
  const bool local = group.ranks.size() == 1 || group.scheme == Scheme::local;
  if (!local && (group.scheme == Scheme::ulysses || group.scheme == Scheme::usp)) {
    const bool usp = group.scheme == Scheme::usp;
    ulysses_backward(shape, usp ? *state.stage : state, saved.head_shards.at(index), d_out, d_q,
                     d_k, d_v, usp ? state.ring.get() : nullptr);
    return;
  }
  const float* q = saved.q.data() + q_offset;
  const float* k = saved.k.data() + kv_offset;
  const float* v = saved.v.data() + kv_offset;
  const float* out = saved.out.data() + q_offset;
  const float* lse = saved.lse.data() + rows(state.first, shape.heads);
  state.delta.resize(rows(state.count, shape.heads));
  attention_backward_delta(shape, state.count, out, d_out, state.delta.data());
  if (local) {
    const TokenTiles& own = state.tiles[static_cast<std::size_t>(state.position)];
    attention_backward_accumulate(shape, q, d_out, lse, state.delta.data(), own, k, v, own, d_q,
                                  d_k, d_v);
  } else if (group.scheme == Scheme::ring) {
    ring_backward(shape, state, q, k, v, d_out, lse, state.delta.data(), d_q, d_k, d_v);
  } else {
    all_gather_backward(shape, state, q, k, v, d_out, lse, state.delta.data(), d_q, d_k, d_v);
  }
}

// ----------------------------------------------------------------------------------------
// All-gather

namespace {

/// Offsets of every member's [K | V] block in a buffer of all of them (member order);
/// returns the total.
std::size_t block_layout(const std::vector<Member>& members, int kv_width,
                         std::vector<std::size_t>& offsets) {
  offsets.clear();
  std::size_t total = 0;
  for (const Member& member : members) {
    offsets.push_back(total);
    total += 2 * rows(member.size(), kv_width);
  }
  return total;
}

/// Member `member`'s block in a buffer laid out by block_layout().
float* block_of(std::vector<float>& buffer, const std::vector<std::size_t>& offsets,
                int member) {
  return buffer.data() + offsets[static_cast<std::size_t>(member)];
}

}  // namespace

std::size_t PlanAttentionEngine::post_kv_gather(const AttentionShape& shape, GroupState& state,
                                                const float* k, const float* v, int phase) {
  const AttentionGroup& group = *state.group;
  const int group_size = static_cast<int>(group.ranks.size());
  const int kv_width = shape.kv_heads * shape.head_dim;
  const std::size_t total = block_layout(state.members, kv_width, state.block_offsets);
  state.gathered.resize(total);
  float* own_block = block_of(state.gathered, state.block_offsets, state.position);
  copy_kv_block(k, v, rows(state.count, kv_width), own_block);
  const int tag = tag_of(state.group_index, phase);
  for (int member = 0; member < group_size; ++member) {
    if (member == state.position) continue;
    post_receive(block_of(state.gathered, state.block_offsets, member),
                 2 * rows(state.members[static_cast<std::size_t>(member)].size(), kv_width),
                 group.ranks[static_cast<std::size_t>(member)], tag, state.requests);
  }
  for (int member = 0; member < group_size; ++member) {
    if (member == state.position) continue;
    post_send(own_block, 2 * rows(state.count, kv_width),
              group.ranks[static_cast<std::size_t>(member)], tag, state.requests);
  }
  return total;
}

void PlanAttentionEngine::all_gather_forward(const AttentionShape& shape, GroupState& state,
                                             const float* q, const float* k, const float* v,
                                             float* out, float* lse) {
  const AttentionGroup& group = *state.group;
  const int group_size = static_cast<int>(group.ranks.size());
  const int kv_width = shape.kv_heads * shape.head_dim;
  post_kv_gather(shape, state, k, v, kForward);
  // This rank's own block while the others arrive, then the others in member order.
  const TokenTiles& own = at_position(state.tiles, state.position);
  state.accumulator.reset(state.count, shape);
  attention_forward_accumulate(shape, q, own, k, v, own, state.accumulator);
  wait_exchange(state.requests);
  for (int member = 0; member < group_size; ++member) {
    if (member == state.position) continue;
    const float* block = block_of(state.gathered, state.block_offsets, member);
    const std::size_t block_kv_floats =
        rows(state.members[static_cast<std::size_t>(member)].size(), kv_width);
    attention_forward_accumulate(shape, q, own, block, block + block_kv_floats,
                                 state.tiles[static_cast<std::size_t>(member)], state.accumulator);
  }
  attention_forward_finalize(shape, state.accumulator, out, lse);
}

void PlanAttentionEngine::all_gather_backward(const AttentionShape& shape, GroupState& state,
                                              const float* q, const float* k, const float* v,
                                              const float* d_out, const float* lse,
                                              const float* delta, float* d_q, float* d_k,
                                              float* d_v) {
  const AttentionGroup& group = *state.group;
  const int group_size = static_cast<int>(group.ranks.size());
  const int kv_width = shape.kv_heads * shape.head_dim;
  const std::size_t own_kv_floats = rows(state.count, kv_width);
  const auto position = static_cast<std::size_t>(state.position);
  // Gather KV again (as LLaMA-3 CP does); partials[m] = [dK | dV] of member m's tokens from
  // this rank's queries, in the gathered layout.
  const std::size_t total = post_kv_gather(shape, state, k, v, kBackward);
  state.partials.assign(total, 0.0f);
  const TokenTiles& own = state.tiles[position];
  const auto backward_block = [&](int member, const float* block_k, const float* block_v) {
    float* partial = block_of(state.partials, state.block_offsets, member);
    const std::size_t block_kv_floats =
        rows(state.members[static_cast<std::size_t>(member)].size(), kv_width);
    attention_backward_accumulate(shape, q, d_out, lse, delta, own, block_k, block_v,
                                  state.tiles[static_cast<std::size_t>(member)], d_q, partial,
                                  partial + block_kv_floats);
  };
  backward_block(state.position, k, v);  // while the other blocks arrive
  wait_exchange(state.requests);
  for (int member = 0; member < group_size; ++member) {
    if (member == state.position) continue;
    const float* block = block_of(state.gathered, state.block_offsets, member);
    backward_block(member, block,
                   block + rows(state.members[static_cast<std::size_t>(member)].size(), kv_width));
  }
  // Partials back to their owners; returned[m] = member m's partial of this rank's block.
  const std::size_t own_block_floats = 2 * own_kv_floats;
  state.returned.resize(static_cast<std::size_t>(group_size) * own_block_floats);
  const int back_tag = tag_of(state.group_index, kBackwardBack);
  for (int member = 0; member < group_size; ++member) {
    if (member == state.position) continue;
    post_receive(state.returned.data() + static_cast<std::size_t>(member) * own_block_floats,
                 own_block_floats, group.ranks[static_cast<std::size_t>(member)], back_tag,
                 state.requests);
  }
  for (int member = 0; member < group_size; ++member) {
    if (member == state.position) continue;
    post_send(block_of(state.partials, state.block_offsets, member),
              2 * rows(state.members[static_cast<std::size_t>(member)].size(), kv_width),
              group.ranks[static_cast<std::size_t>(member)], back_tag, state.requests);
  }
  wait_exchange(state.requests);
  for (int member = 0; member < group_size; ++member) {  // fixed order: the same sum every run
    const float* gradients =
        member == state.position
            ? block_of(state.partials, state.block_offsets, state.position)
            : state.returned.data() + static_cast<std::size_t>(member) * own_block_floats;
    add_to(d_k, gradients, own_kv_floats);
    add_to(d_v, gradients + own_kv_floats, own_kv_floats);
  }
}

// ----------------------------------------------------------------------------------------
// Ulysses: member m computes query heads [m * heads / g, (m + 1) * heads / g) and the KV
// heads they read (UlyssesHeads: beyond the KV heads, one KV head replicated on g / kv_heads
// members) of every token of the group, in member order. Each direction is one pack (a
// token's columns of a member's heads into consecutive rows) and one unpack; a member's
// rows of the head-sharded arrays are contiguous, so they are sent and received in place.
// The backward's unpack adds every member's dK, dV to the KV head's columns, so the
// replicas' gradients sum on the owner, in member order (the same sum every run).

void PlanAttentionEngine::ulysses_forward(const AttentionShape& shape, GroupState& state,
                                          const float* q, const float* k, const float* v,
                                          float* out, float* lse, HeadShard& shard,
                                          GroupState* ring) {
  const AttentionGroup& group = *state.group;
  const int group_size = static_cast<int>(group.ranks.size());
  const UlyssesHeads sharding = ulysses_heads(shape, group_size);
  const int head_dim = shape.head_dim;
  const int heads = sharding.heads;  // per member
  const int kv_heads = sharding.kv_heads;
  const int q_width = shape.heads * head_dim, kv_width = shape.kv_heads * head_dim;
  const int q_columns = heads * head_dim, kv_columns = kv_heads * head_dim;
  const int count = state.count;
  const int total = state.all.size();
  shard.q.resize(rows(total, q_columns));
  shard.k.resize(rows(total, kv_columns));
  shard.v.resize(rows(total, kv_columns));
  shard.out.resize(rows(total, q_columns));
  shard.lse.resize(rows(total, heads));
  // Pack: for member m, this rank's tokens' q, k, v of m's heads as [q rows | k rows | v
  // rows]; this rank's own heads go straight into its shard.
  const std::size_t section = rows(count, q_columns + 2 * kv_columns);
  state.send.resize(static_cast<std::size_t>(group_size) * section);
  const auto row_of = [&](int member) { return state.first_row[static_cast<std::size_t>(member)]; };
  for (int member = 0; member < group_size; ++member) {
    float* q_rows = state.send.data() + static_cast<std::size_t>(member) * section;
    float* k_rows = q_rows + rows(count, q_columns);
    float* v_rows = k_rows + rows(count, kv_columns);
    if (member == state.position) {
      q_rows = shard.q.data() + rows(row_of(member), q_columns);
      k_rows = shard.k.data() + rows(row_of(member), kv_columns);
      v_rows = shard.v.data() + rows(row_of(member), kv_columns);
    }
    copy_columns_out(q, q_width, member * q_columns, count, q_columns, q_rows);
    const int kv_column = sharding.kv_first(member) * head_dim;
    copy_columns_out(k, kv_width, kv_column, count, kv_columns, k_rows);
    copy_columns_out(v, kv_width, kv_column, count, kv_columns, v_rows);
  }
  const int tag = tag_of(state.group_index, kForward);
  for (int member = 0; member < group_size; ++member) {
    if (member == state.position) continue;
    const int peer = group.ranks[static_cast<std::size_t>(member)];
    const int tokens = state.members[static_cast<std::size_t>(member)].size();
    post_receive(shard.q.data() + rows(row_of(member), q_columns), rows(tokens, q_columns), peer,
                 tag, state.requests);
    post_receive(shard.k.data() + rows(row_of(member), kv_columns), rows(tokens, kv_columns), peer,
                 tag, state.requests);
    post_receive(shard.v.data() + rows(row_of(member), kv_columns), rows(tokens, kv_columns), peer,
                 tag, state.requests);
  }
  for (int member = 0; member < group_size; ++member) {  // in the receives' order
    if (member == state.position) continue;
    const int peer = group.ranks[static_cast<std::size_t>(member)];
    const float* q_rows = state.send.data() + static_cast<std::size_t>(member) * section;
    post_send(q_rows, rows(count, q_columns), peer, tag, state.requests);
    post_send(q_rows + rows(count, q_columns), rows(count, kv_columns), peer, tag, state.requests);
    post_send(q_rows + rows(count, q_columns + kv_columns), rows(count, kv_columns), peer, tag,
              state.requests);
  }
  wait_exchange(state.requests);
  const AttentionShape member_shape{heads, kv_heads, head_dim};
  if (ring != nullptr) {  // USP: this member's heads of its stage around the stages' ring
    ring_forward(member_shape, *ring, shard.q.data(), shard.k.data(), shard.v.data(),
                 shard.out.data(), shard.lse.data());
  } else {
    state.accumulator.reset(total, member_shape);
    attention_forward_accumulate(member_shape, shard.q.data(), state.all_tiles, shard.k.data(),
                                 shard.v.data(), state.all_tiles, state.accumulator);
    attention_forward_finalize(member_shape, state.accumulator, shard.out.data(),
                               shard.lse.data());
  }
  // Back to the owners: member m's rows of out and lse, as they are; receive[m] = [out rows |
  // lse rows] of this rank's tokens for m's heads.
  const std::size_t back_section = rows(count, q_columns + heads);
  state.receive.resize(static_cast<std::size_t>(group_size) * back_section);
  const int back_tag = tag_of(state.group_index, kForwardBack);
  for (int member = 0; member < group_size; ++member) {
    if (member == state.position) continue;
    const int peer = group.ranks[static_cast<std::size_t>(member)];
    float* out_rows = state.receive.data() + static_cast<std::size_t>(member) * back_section;
    post_receive(out_rows, rows(count, q_columns), peer, back_tag, state.requests);
    post_receive(out_rows + rows(count, q_columns), rows(count, heads), peer, back_tag,
                 state.requests);
  }
  for (int member = 0; member < group_size; ++member) {
    if (member == state.position) continue;
    const int peer = group.ranks[static_cast<std::size_t>(member)];
    const int tokens = state.members[static_cast<std::size_t>(member)].size();
    post_send(shard.out.data() + rows(row_of(member), q_columns), rows(tokens, q_columns), peer,
              back_tag, state.requests);
    post_send(shard.lse.data() + rows(row_of(member), heads), rows(tokens, heads), peer, back_tag,
              state.requests);
  }
  wait_exchange(state.requests);
  for (int member = 0; member < group_size; ++member) {
    const float* out_rows = state.receive.data() + static_cast<std::size_t>(member) * back_section;
    const float* lse_rows = out_rows + rows(count, q_columns);
    if (member == state.position) {
      out_rows = shard.out.data() + rows(row_of(member), q_columns);
      lse_rows = shard.lse.data() + rows(row_of(member), heads);
    }
    copy_columns_in(out_rows, count, q_columns, out, q_width, member * q_columns, false);
    copy_columns_in(lse_rows, count, heads, lse, shape.heads, member * heads, false);
  }
}

void PlanAttentionEngine::ulysses_backward(const AttentionShape& shape, GroupState& state,
                                           const HeadShard& shard, const float* d_out, float* d_q,
                                           float* d_k, float* d_v, GroupState* ring) {
  // The forward kept this member's heads of q, k, v, out and lse: only dO travels here, and
  // dQ, dK, dV go back.
  const AttentionGroup& group = *state.group;
  const int group_size = static_cast<int>(group.ranks.size());
  const UlyssesHeads sharding = ulysses_heads(shape, group_size);
  const int head_dim = shape.head_dim;
  const int heads = sharding.heads;
  const int kv_heads = sharding.kv_heads;
  const int q_width = shape.heads * head_dim, kv_width = shape.kv_heads * head_dim;
  const int q_columns = heads * head_dim, kv_columns = kv_heads * head_dim;
  const int count = state.count;
  const int total = state.all.size();
  const auto row_of = [&](int member) { return state.first_row[static_cast<std::size_t>(member)]; };
  state.d_out_heads.resize(rows(total, q_columns));
  const std::size_t section = rows(count, q_columns);
  state.send.resize(static_cast<std::size_t>(group_size) * section);
  for (int member = 0; member < group_size; ++member) {
    float* target = member == state.position
                        ? state.d_out_heads.data() + rows(row_of(member), q_columns)
                        : state.send.data() + static_cast<std::size_t>(member) * section;
    copy_columns_out(d_out, q_width, member * q_columns, count, q_columns, target);
  }
  const int tag = tag_of(state.group_index, kBackward);
  for (int member = 0; member < group_size; ++member) {
    if (member == state.position) continue;
    post_receive(state.d_out_heads.data() + rows(row_of(member), q_columns),
                 rows(state.members[static_cast<std::size_t>(member)].size(), q_columns),
                 group.ranks[static_cast<std::size_t>(member)], tag, state.requests);
  }
  for (int member = 0; member < group_size; ++member) {
    if (member == state.position) continue;
    post_send(state.send.data() + static_cast<std::size_t>(member) * section, section,
              group.ranks[static_cast<std::size_t>(member)], tag, state.requests);
  }
  wait_exchange(state.requests);
  const AttentionShape member_shape{heads, kv_heads, head_dim};
  state.delta.resize(rows(total, heads));
  attention_backward_delta(member_shape, total, shard.out.data(), state.d_out_heads.data(),
                           state.delta.data());
  state.d_q_heads.assign(rows(total, q_columns), 0.0f);
  state.d_k_heads.assign(rows(total, kv_columns), 0.0f);
  state.d_v_heads.assign(rows(total, kv_columns), 0.0f);
  if (ring != nullptr) {  // USP: the ring's backward, dK/dV home to their stage
    ring_backward(member_shape, *ring, shard.q.data(), shard.k.data(), shard.v.data(),
                  state.d_out_heads.data(), shard.lse.data(), state.delta.data(),
                  state.d_q_heads.data(), state.d_k_heads.data(), state.d_v_heads.data());
  } else {
    attention_backward_accumulate(member_shape, shard.q.data(), state.d_out_heads.data(),
                                  shard.lse.data(), state.delta.data(), state.all_tiles,
                                  shard.k.data(), shard.v.data(), state.all_tiles,
                                  state.d_q_heads.data(), state.d_k_heads.data(),
                                  state.d_v_heads.data());
  }
  // Back to the owners: member m's rows of dQ, dK, dV as they are; receive[m] = [dq rows |
  // dk rows | dv rows] of this rank's tokens for m's heads.
  const std::size_t back_section = rows(count, q_columns + 2 * kv_columns);
  state.receive.resize(static_cast<std::size_t>(group_size) * back_section);
  const int back_tag = tag_of(state.group_index, kBackwardBack);
  for (int member = 0; member < group_size; ++member) {
    if (member == state.position) continue;
    const int peer = group.ranks[static_cast<std::size_t>(member)];
    float* d_q_rows = state.receive.data() + static_cast<std::size_t>(member) * back_section;
    post_receive(d_q_rows, rows(count, q_columns), peer, back_tag, state.requests);
    post_receive(d_q_rows + rows(count, q_columns), rows(count, kv_columns), peer, back_tag,
                 state.requests);
    post_receive(d_q_rows + rows(count, q_columns + kv_columns), rows(count, kv_columns), peer,
                 back_tag, state.requests);
  }
  for (int member = 0; member < group_size; ++member) {
    if (member == state.position) continue;
    const int peer = group.ranks[static_cast<std::size_t>(member)];
    const int tokens = state.members[static_cast<std::size_t>(member)].size();
    post_send(state.d_q_heads.data() + rows(row_of(member), q_columns), rows(tokens, q_columns),
              peer, back_tag, state.requests);
    post_send(state.d_k_heads.data() + rows(row_of(member), kv_columns), rows(tokens, kv_columns),
              peer, back_tag, state.requests);
    post_send(state.d_v_heads.data() + rows(row_of(member), kv_columns), rows(tokens, kv_columns),
              peer, back_tag, state.requests);
  }
  wait_exchange(state.requests);
  for (int member = 0; member < group_size; ++member) {
    const float* d_q_rows = state.receive.data() + static_cast<std::size_t>(member) * back_section;
    const float* d_k_rows = d_q_rows + rows(count, q_columns);
    const float* d_v_rows = d_k_rows + rows(count, kv_columns);
    if (member == state.position) {
      d_q_rows = state.d_q_heads.data() + rows(row_of(member), q_columns);
      d_k_rows = state.d_k_heads.data() + rows(row_of(member), kv_columns);
      d_v_rows = state.d_v_heads.data() + rows(row_of(member), kv_columns);
    }
    copy_columns_in(d_q_rows, count, q_columns, d_q, q_width, member * q_columns, true);
    const int kv_column = sharding.kv_first(member) * head_dim;  // replicas add up here
    copy_columns_in(d_k_rows, count, kv_columns, d_k, kv_width, kv_column, true);
    copy_columns_in(d_v_rows, count, kv_columns, d_v, kv_width, kv_column, true);
  }
}


}  // namespace ballast::runtime
