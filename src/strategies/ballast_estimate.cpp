// The ballast strategy's incremental step-time estimate (ballast.hpp): per micro-batch
// and rank from the CostModel, each group's part cached so a move re-prices only the
// groups it rewrites. Tested against the simulator in tests/strategies/test_ballast.cpp.
#include <algorithm>
#include <map>

#include "ballast.hpp"
#include "ballast/error.hpp"
#include "ballast/tensor_parallel.hpp"
#include "zeppelin_remap.hpp"

namespace ballast::strategies::ballast_search {

namespace {

constexpr Pass kPasses[] = {Pass::forward, Pass::backward};

/// Position of each rank in group.ranks.
std::map<int, std::size_t> positions_of(const AttentionGroup& group) {
  std::map<int, std::size_t> position;
  for (std::size_t i = 0; i < group.ranks.size(); ++i) position[group.ranks[i]] = i;
  return position;
}

/// Tokens each member holds (padding included), by position.
std::vector<Tokens> member_tokens(const AttentionGroup& group,
                                  const std::map<int, std::size_t>& position) {
  std::vector<Tokens> tokens(group.ranks.size(), 0);
  for (const SequenceChunks& sequence : group.sequences) {
    for (const Chunk& chunk : sequence.chunks) tokens[position.at(chunk.rank)] += chunk.size();
  }
  return tokens;
}

/// Each member's own queries against every earlier key of their sequences (a ring or
/// all-gather member's work over all steps; a local rank's whole documents).
std::vector<std::vector<AttentionBlock>> own_query_blocks(
    const AttentionGroup& group, const std::map<int, std::size_t>& position) {
  std::vector<std::vector<AttentionBlock>> blocks(group.ranks.size());
  for (const SequenceChunks& sequence : group.sequences) {
    for (const Chunk& chunk : sequence.chunks) {
      blocks[position.at(chunk.rank)].push_back(
          {chunk.begin_tokens, chunk.end_tokens, 0, chunk.end_tokens});
    }
  }
  return blocks;
}

Seconds blocks_time_s(const CostModel& cost, const std::vector<AttentionBlock>& blocks,
                      int head_split, Pass pass) {
  return blocks.empty() ? 0.0 : cost.attention_time_s(blocks, head_split, pass);
}

/// The forward pass's g - 1 KV hops of a ring, each as long as the slowest member's block
/// over its link (routed when the group is).
Seconds ring_hops_s(const AttentionGroup& group, const std::vector<Tokens>& tokens,
                    const CostModel& cost, const PlanEvaluator& evaluator) {
  const std::size_t size = group.ranks.size();
  const Bytes kv_per_token = cost.model().kv_bytes_per_token();
  Seconds slowest_hop_s = 0;
  for (std::size_t i = 0; i < size; ++i) {
    const int src = group.ranks[i];
    const int dst = group.ranks[(i + 1) % size];
    const Bytes bytes = kv_per_token * tokens[i];
    const bool routed = group.routing_proxies > 1 && !cost.cluster().same_node(src, dst);
    slowest_hop_s = std::max(
        slowest_hop_s, routed ? evaluator.transfer_time_s(bytes, src, dst, group.routing_proxies,
                                                          group.routing_chunks)
                              : cost.p2p_time_s(bytes, src, dst));
  }
  return static_cast<double>(size - 1) * slowest_hop_s;
}

/// Ring: per pass, a member computes its queries against every block while the KV blocks
/// travel (g - 1 hops forward; KV and dKV backward, so twice the hops): the pass takes the
/// larger. A hop takes the slowest member's block over its link (routed when the group is).
void estimate_ring(const AttentionGroup& group, const CostModel& cost,
                   const PlanEvaluator& evaluator, GroupEstimate& estimate) {
  const auto position = positions_of(group);
  const std::size_t size = group.ranks.size();
  const Seconds hops_s = ring_hops_s(group, member_tokens(group, position), cost, evaluator);
  const auto blocks = own_query_blocks(group, position);
  for (std::size_t i = 0; i < size; ++i) {
    Seconds time_s = 0;
    for (Pass pass : kPasses) {
      const Seconds comm_s = pass == Pass::forward ? hops_s : 2 * hops_s;
      time_s += pass_count(cost.model(), pass) *
                std::max(blocks_time_s(cost, blocks[i], 1, pass), comm_s);
    }
    estimate.member_time_s[i] = time_s;
  }
}

/// All-gather (KV gathered every pass, dKV reduce-scattered backward) and Ulysses (an
/// all-to-all in and one out every pass; heads split group-size ways), not overlapped;
/// local: the whole documents.
void estimate_collective(const AttentionGroup& group, const CostModel& cost,
                         GroupEstimate& estimate) {
  const Model& model = cost.model();
  const auto position = positions_of(group);
  const std::vector<Tokens> tokens = member_tokens(group, position);
  const auto size = static_cast<int>(group.ranks.size());
  const auto bytes_of = [&](Bytes per_token) {
    std::vector<Bytes> bytes;
    for (Tokens held : tokens) bytes.push_back(held * per_token);
    return bytes;
  };
  const bool ulysses = group.scheme == Scheme::ulysses && size > 1;
  const bool all_gather = group.scheme == Scheme::all_gather && size > 1;
  Seconds comm_forward_s = 0;
  Seconds comm_backward_s = 0;
  std::vector<AttentionBlock> documents;
  if (ulysses) {
    const Seconds qkv_s = cost.all_to_all_time_s(
        group.ranks, bytes_of(ulysses_qkv_bytes_per_token(model, cost.cluster().tensor_parallel.gpus,
                                                          static_cast<int>(size))));
    const Seconds hidden_s =
        cost.all_to_all_time_s(group.ranks, bytes_of(model.hidden_bytes_per_token()));
    comm_forward_s = comm_backward_s = qkv_s + hidden_s;
    for (const SequenceChunks& sequence : group.sequences) {
      documents.push_back(whole_document(sequence.padded_length_tokens));
    }
  } else if (all_gather) {
    comm_forward_s = cost.all_gather_time_s(group.ranks, bytes_of(model.kv_bytes_per_token()));
    comm_backward_s = 2 * comm_forward_s;
  }
  const auto blocks = own_query_blocks(group, position);
  for (int i = 0; i < size; ++i) {
    Seconds time_s = 0;
    for (Pass pass : kPasses) {
      const Seconds compute_s = ulysses ? blocks_time_s(cost, documents, size, pass)
                                        : blocks_time_s(cost, blocks[i], 1, pass);
      time_s += pass_count(model, pass) *
                (compute_s + (pass == Pass::forward ? comm_forward_s : comm_backward_s));
    }
    estimate.member_time_s[i] = time_s;
  }
}

/// USP (a ring over r stages of u members, Ulysses inside each stage): per pass, the
/// stage's two all-to-alls (QKV or dO in, output or dQKV out) in series with, on the member's
/// ring over the stages, the larger of its compute (the stage's queries against every
/// earlier key, heads split u ways) and the r - 1 hops of a stage's KV for its heads (twice
/// the hops backward, as estimate_ring). A hop takes the slowest member's link, and the u
/// rings cross at once: a NIC that m of them cross gives each 1/m of it, as the simulator's
/// shared ports do (a800-roce has two GPUs per NIC; at the NIC's full speed a 129K-token
/// USP over 64 A800s with its stages inside nodes was estimated at 1.31 s against 2.39 s
/// simulated). Packed-tiles clusters get the same estimate.
void estimate_usp(const AttentionGroup& group, const CostModel& cost, GroupEstimate& estimate) {
  const Model& model = cost.model();
  const Cluster& cluster = cost.cluster();
  const int tensor_parallel = cluster.tensor_parallel.gpus;
  const auto position = positions_of(group);
  const std::vector<Tokens> tokens = member_tokens(group, position);
  const auto size = static_cast<int>(group.ranks.size());
  const int u = std::max(1, group.ulysses_degree);
  const int r = size / u;
  std::vector<Tokens> stage_tokens(static_cast<std::size_t>(r), 0);
  std::vector<std::vector<AttentionBlock>> stage_blocks(static_cast<std::size_t>(r));
  for (const SequenceChunks& sequence : group.sequences) {
    for (const Chunk& chunk : sequence.chunks) {
      const auto stage = position.at(chunk.rank) / static_cast<std::size_t>(u);
      stage_tokens[stage] += chunk.size();
      stage_blocks[stage].push_back({chunk.begin_tokens, chunk.end_tokens, 0, chunk.end_tokens});
    }
  }
  const Bytes kv_per_token = usp_kv_bytes_per_token(model, tensor_parallel, u);
  Seconds slowest_hop_s = 0;
  std::map<int, int> sending, receiving;  // per NIC, the rings crossing on it at one hop
  for (int stage = 0; stage < r; ++stage) {
    const auto member_rank = [&](int of_stage, int m) {
      return group.ranks[static_cast<std::size_t>(of_stage * u + m)];
    };
    const int next = (stage + 1) % r;
    sending.clear();
    receiving.clear();
    for (int m = 0; m < u; ++m) {
      const int src = member_rank(stage, m), dst = member_rank(next, m);
      if (cluster.same_node(src, dst)) continue;
      ++sending[cluster.nic_of(src)];
      ++receiving[cluster.nic_of(dst)];
    }
    const Bytes bytes = kv_per_token * stage_tokens[static_cast<std::size_t>(stage)];
    for (int m = 0; m < u; ++m) {
      const int src = member_rank(stage, m), dst = member_rank(next, m);
      const int sharing = cluster.same_node(src, dst)
                              ? 1
                              : std::max(sending[cluster.nic_of(src)], receiving[cluster.nic_of(dst)]);
      slowest_hop_s = std::max(slowest_hop_s, cost.p2p_time_s(bytes * sharing, src, dst));
    }
  }
  const Seconds hops_s = static_cast<double>(r - 1) * slowest_hop_s;
  const Bytes qkv_per_token = ulysses_qkv_bytes_per_token(model, tensor_parallel, u);
  std::vector<Seconds> all_to_all_s(static_cast<std::size_t>(r), 0);  // per stage, in + out
  for (int stage = 0; stage < r; ++stage) {
    const std::vector<int> members(group.ranks.begin() + stage * u, group.ranks.begin() + (stage + 1) * u);
    const auto bytes_of = [&](Bytes per_token) {
      std::vector<Bytes> bytes;
      for (int k = stage * u; k < (stage + 1) * u; ++k) bytes.push_back(tokens[static_cast<std::size_t>(k)] * per_token);
      return bytes;
    };
    all_to_all_s[static_cast<std::size_t>(stage)] =
        cost.all_to_all_time_s(members, bytes_of(qkv_per_token)) +
        cost.all_to_all_time_s(members, bytes_of(model.hidden_bytes_per_token()));
  }
  for (int i = 0; i < size; ++i) {
    const int stage = i / u;
    Seconds time_s = 0;
    for (Pass pass : kPasses) {
      const Seconds compute_s = blocks_time_s(cost, stage_blocks[static_cast<std::size_t>(stage)], u, pass);
      time_s += pass_count(model, pass) *
                (all_to_all_s[static_cast<std::size_t>(stage)] +
                 std::max(compute_s, pass == Pass::forward ? hops_s : 2 * hops_s));
    }
    estimate.member_time_s[static_cast<std::size_t>(i)] = time_s;
  }
}

/// Attention-only estimate of a packed-tiles cluster (the simulator prices each call's
/// packed spans): per member, one call per ring step / gathered holder, or the Ulysses
/// call over all the group's tokens; the communication as estimate_ring / _collective.
void estimate_packed(const AttentionGroup& group, const CostModel& cost,
                     const PlanEvaluator& evaluator, GroupEstimate& estimate) {
  const auto position = positions_of(group);
  std::vector<std::vector<DocumentRange>> spans(group.ranks.size());
  for (std::size_t s = 0; s < group.sequences.size(); ++s) {
    for (const Chunk& chunk : group.sequences[s].chunks) {
      spans[position.at(chunk.rank)].push_back(
          {static_cast<std::int64_t>(s), chunk.begin_tokens, chunk.end_tokens});
    }
  }
  const auto call_s = [&](const std::vector<DocumentRange>& queries,
                          const std::vector<DocumentRange>& keys, int head_split, Pass pass) {
    return queries.empty() || keys.empty()
               ? 0.0
               : cost.attention_call_time_s({queries, keys}, head_split, pass);
  };
  const std::size_t size = group.ranks.size();
  if (group.scheme == Scheme::ring && size > 1) {
    // As estimate_ring, with the compute of every step's packed call.
    const Seconds hops_s = ring_hops_s(group, member_tokens(group, position), cost, evaluator);
    for (std::size_t i = 0; i < size; ++i) {
      Seconds time_s = 0;
      for (Pass pass : kPasses) {
        Seconds compute_s = 0;
        for (std::size_t owner = 0; owner < size; ++owner)
          compute_s += call_s(spans[i], spans[owner], 1, pass);
        time_s += pass_count(cost.model(), pass) *
                  std::max(compute_s, pass == Pass::forward ? hops_s : 2 * hops_s);
      }
      estimate.member_time_s[i] = time_s;
    }
    return;
  }
  // Local, all-gather, Ulysses: the collective estimate less its compute, plus the calls.
  GroupEstimate unpacked{group.ranks, std::vector<Seconds>(size, 0)};
  estimate_collective(group, cost, unpacked);
  std::vector<DocumentRange> all;
  for (const auto& span : spans) all.insert(all.end(), span.begin(), span.end());
  const bool ulysses = group.scheme == Scheme::ulysses && size > 1;
  for (std::size_t i = 0; i < size; ++i) {
    Seconds packed_s = 0;
    Seconds unpacked_compute_s = 0;
    const auto blocks = own_query_blocks(group, position);
    std::vector<AttentionBlock> documents;
    for (const SequenceChunks& sequence : group.sequences)
      documents.push_back(whole_document(sequence.padded_length_tokens));
    for (Pass pass : kPasses) {
      Seconds calls_s = 0;
      if (ulysses) {
        calls_s = call_s(all, all, static_cast<int>(size), pass);
      } else if (size == 1) {
        calls_s = call_s(spans[i], spans[i], 1, pass);
      } else {
        for (const auto& holder : spans) calls_s += call_s(spans[i], holder, 1, pass);
      }
      packed_s += pass_count(cost.model(), pass) * calls_s;
      unpacked_compute_s +=
          pass_count(cost.model(), pass) *
          (ulysses ? blocks_time_s(cost, documents, static_cast<int>(size), pass)
                   : blocks_time_s(cost, blocks[i], 1, pass));
    }
    estimate.member_time_s[i] = unpacked.member_time_s[i] - unpacked_compute_s + packed_s;
  }
}

}  // namespace

bool ulysses_group_allowed(const CostModel& cost, int group_ranks) {
  // The plan IR's rule (KV heads replicated beyond their count, any size dividing the heads).
  return group_ranks >= 1 &&
         ulysses_degree_allowed(cost.model(), cost.cluster().tensor_parallel.gpus, group_ranks);
}

GroupEstimate estimate_group(const AttentionGroup& group, const CostModel& cost,
                             const PlanEvaluator& evaluator) {
  GroupEstimate estimate{group.ranks, std::vector<Seconds>(group.ranks.size(), 0)};
  if (group.scheme == Scheme::usp && group.ranks.size() > 1) {
    estimate_usp(group, cost, estimate);
  } else if (cost.cluster().attention_tiles_packed) {
    estimate_packed(group, cost, evaluator, estimate);
  } else if (group.scheme == Scheme::ring && group.ranks.size() > 1) {
    estimate_ring(group, cost, evaluator, estimate);
  } else {
    estimate_collective(group, cost, estimate);
  }
  return estimate;
}

namespace {

/// estimate_micro_batch() over `group_count` groups read through `group_at(g)` and a
/// linear layout; `remapped` is the whole micro-batch, needed (and given) only when the
/// layout is not empty.
template <class GroupAt>
MicroBatchEstimate estimate_groups(std::size_t group_count, const GroupAt& group_at,
                                   const std::vector<LinearSlice>& linear_layout,
                                   const MicroBatch* remapped, const CostModel& cost,
                                   const PlanEvaluator& evaluator, const MicroBatchEstimate* previous,
                                   const std::vector<int>& origin) {
  const int ranks = cost.cluster().ranks();
  MicroBatchEstimate estimate;
  estimate.remapped = !linear_layout.empty();
  estimate.rank_time_s.assign(static_cast<std::size_t>(ranks), 0.0);
  estimate.groups.reserve(group_count);
  // Ranks whose time is made afresh: all of them, or with a previous estimate of an
  // unremapped micro-batch (and none now) only those a changed group holds.
  const bool incremental = previous != nullptr && !previous->remapped && !estimate.remapped &&
                           previous->rank_time_s.size() == estimate.rank_time_s.size();
  std::vector<bool> fresh(static_cast<std::size_t>(ranks), !incremental);
  if (incremental) {
    std::vector<bool> kept(previous->groups.size(), false);
    for (std::size_t g = 0; g < group_count; ++g) {
      const int from = g < origin.size() ? origin[g] : -1;
      if (from >= 0) {
        kept[static_cast<std::size_t>(from)] = true;
      } else {
        for (int rank : group_at(g).ranks) fresh[static_cast<std::size_t>(rank)] = true;
      }
    }
    for (std::size_t g = 0; g < kept.size(); ++g) {
      if (kept[g]) continue;
      for (int rank : previous->groups[g]->ranks) fresh[static_cast<std::size_t>(rank)] = true;
    }
  }
  std::vector<Tokens> linear_tokens(static_cast<std::size_t>(ranks), 0);
  std::vector<bool> participates(static_cast<std::size_t>(ranks), false);
  for (std::size_t g = 0; g < group_count; ++g) {
    const AttentionGroup& group = group_at(g);
    const int from = previous != nullptr && g < origin.size() ? origin[g] : -1;
    estimate.groups.push_back(from >= 0 ? previous->groups[static_cast<std::size_t>(from)]
                                        : std::make_shared<const GroupEstimate>(
                                              estimate_group(group, cost, evaluator)));
    const GroupEstimate& priced = *estimate.groups.back();
    for (std::size_t i = 0; i < priced.ranks.size(); ++i) {
      const auto rank = static_cast<std::size_t>(priced.ranks[i]);
      if (!fresh[rank]) continue;
      estimate.rank_time_s[rank] += priced.member_time_s[i];
      participates[rank] = true;
    }
    if (estimate.remapped) continue;
    for (const SequenceChunks& sequence : group.sequences) {
      for (const Chunk& chunk : sequence.chunks) linear_tokens[static_cast<std::size_t>(chunk.rank)] += chunk.size();
    }
  }
  for (const LinearSlice& slice : linear_layout) {
    linear_tokens[static_cast<std::size_t>(slice.rank)] += slice.end_tokens - slice.begin_tokens;
  }
  const Model& model = cost.model();
  const double forward_passes = pass_count(model, Pass::forward);
  if (estimate.remapped) {
    // Each remap (to attention and back, every pass): a rank sends and receives its
    // flows one after another on its ports; it waits for the longer direction.
    std::map<std::pair<int, int>, Tokens> moved;  // (linear rank, attention rank)
    for (const RemapMove& move : remap_moves(*remapped, linear_layout)) {
      moved[{move.src_rank, move.dst_rank}] += move.tokens;
    }
    std::vector<Seconds> send_s(static_cast<std::size_t>(ranks), 0.0);
    std::vector<Seconds> receive_s(static_cast<std::size_t>(ranks), 0.0);
    for (const auto& [pair, tokens] : moved) {
      const Seconds time_s = cost.p2p_time_s(tokens * model.hidden_bytes_per_token(), pair.first, pair.second);
      send_s[static_cast<std::size_t>(pair.first)] += time_s;
      receive_s[static_cast<std::size_t>(pair.second)] += time_s;
    }
    for (int rank = 0; rank < ranks; ++rank) {
      const auto r = static_cast<std::size_t>(rank);
      estimate.rank_time_s[r] += 2 * (forward_passes + 1) * std::max(send_s[r], receive_s[r]);
    }
  }
  const Seconds overhead_s = forward_passes * cost.micro_batch_overhead_s(Pass::forward) +
                             cost.micro_batch_overhead_s(Pass::backward);
  for (int rank = 0; rank < ranks; ++rank) {
    const auto r = static_cast<std::size_t>(rank);
    if (!fresh[r]) {
      estimate.rank_time_s[r] = previous->rank_time_s[r];
    } else {
      if (linear_tokens[r] > 0) participates[r] = true;
      // Every rank pays the overhead, as in the simulator (sim/program.cpp).
      estimate.rank_time_s[r] += overhead_s;
      if (participates[r]) {
        estimate.rank_time_s[r] += forward_passes * cost.linear_time_s(linear_tokens[r], Pass::forward) +
                                   cost.linear_time_s(linear_tokens[r], Pass::backward) +
                                   cost.linear_collectives_time_s(linear_tokens[r]);
      }
    }
    estimate.time_s = std::max(estimate.time_s, estimate.rank_time_s[r]);
  }
  return estimate;
}

}  // namespace

MicroBatchEstimate estimate_micro_batch(const MicroBatch& micro_batch, const CostModel& cost,
                                        const PlanEvaluator& evaluator,
                                        const MicroBatchEstimate* previous,
                                        const std::vector<int>& origin) {
  return estimate_groups(
      micro_batch.groups.size(), [&](std::size_t g) -> const AttentionGroup& { return micro_batch.groups[g]; },
      micro_batch.linear_layout, &micro_batch, cost, evaluator, previous, origin);
}

MicroBatchEstimate estimate_edit(const MicroBatchEdit& edit, const CostModel& cost,
                                 const PlanEvaluator& evaluator, const MicroBatchEstimate* previous) {
  if (!edit.linear_layout.empty()) {  // the remap's moves need the micro-batch whole
    const MicroBatch micro_batch = edit.micro_batch();
    return estimate_micro_batch(micro_batch, cost, evaluator, previous, edit.origin);
  }
  return estimate_groups(
      edit.group_count(), [&](std::size_t g) -> const AttentionGroup& { return edit.group(g); },
      edit.linear_layout, nullptr, cost, evaluator, previous, edit.origin);
}

Seconds PlanEstimate::step_time_s() const {
  Seconds step_s = gradient_sync_s;
  for (const MicroBatchEstimate& micro_batch : micro_batches) step_s += micro_batch.time_s;
  return step_s;
}

RankOffsets rank_offsets(const PlanEstimate& estimate, const std::vector<Seconds>& simulated_rank_time_s) {
  if (simulated_rank_time_s.empty()) return {};
  const std::size_t ranks = simulated_rank_time_s.size();
  std::vector<Seconds> estimated_s(ranks, 0.0);
  for (const MicroBatchEstimate& micro_batch : estimate.micro_batches) {
    BALLAST_CHECK(micro_batch.rank_time_s.size() == ranks, "an estimate per rank of the simulation");
    for (std::size_t r = 0; r < ranks; ++r) estimated_s[r] += micro_batch.rank_time_s[r];
  }
  RankOffsets offsets;
  for (const MicroBatchEstimate& micro_batch : estimate.micro_batches) {
    std::vector<Seconds>& offset_s = offsets.emplace_back(ranks, 0.0);
    for (std::size_t r = 0; r < ranks; ++r) {
      if (estimated_s[r] <= 0) continue;
      offset_s[r] = (simulated_rank_time_s[r] - estimated_s[r]) * (micro_batch.rank_time_s[r] / estimated_s[r]);
    }
  }
  return offsets;
}

MicroBatchEstimate anchored(MicroBatchEstimate estimate, const std::vector<Seconds>& offset_s) {
  if (offset_s.empty()) return estimate;
  BALLAST_CHECK(offset_s.size() == estimate.rank_time_s.size(), "an offset per rank");
  estimate.time_s = 0;
  for (std::size_t r = 0; r < offset_s.size(); ++r) {
    if (estimate.rank_time_s[r] <= 0) continue;
    estimate.rank_time_s[r] = std::max<Seconds>(0, estimate.rank_time_s[r] + offset_s[r]);
    estimate.time_s = std::max(estimate.time_s, estimate.rank_time_s[r]);
  }
  return estimate;
}

PlanEstimate anchored(const PlanEstimate& estimate, const RankOffsets& offsets) {
  if (offsets.empty()) return estimate;
  BALLAST_CHECK(offsets.size() == estimate.micro_batches.size(), "offsets per micro-batch");
  PlanEstimate result;
  result.gradient_sync_s = estimate.gradient_sync_s;
  for (std::size_t m = 0; m < offsets.size(); ++m) {
    result.micro_batches.push_back(anchored(estimate.micro_batches[m], offsets[m]));
  }
  return result;
}

PlanEstimate estimate_plan(const Plan& plan, const CostModel& cost, const PlanEvaluator& evaluator) {
  PlanEstimate estimate;
  // The overlapped sync's last bucket waits for the end of the last backward pass
  // (simulator.hpp, gradient_sync_buckets: one bucket per layer).
  estimate.gradient_sync_s = cost.gradient_bucket_sync_time_s(std::max(1, cost.model().layers));
  for (const MicroBatch& micro_batch : plan.micro_batches) {
    estimate.micro_batches.push_back(estimate_micro_batch(micro_batch, cost, evaluator));
  }
  return estimate;
}

}  // namespace ballast::strategies::ballast_search
