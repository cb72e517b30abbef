// Cost-only step-time estimate of a plan (no simulation): what batch-adaptive uses to
// compare candidate degrees. With tensor parallelism each rank also pays its TP
// collectives on the tokens it holds.
#include <algorithm>
#include <map>

#include "ballast/error.hpp"
#include "builders.hpp"

namespace ballast::strategies {

namespace {

constexpr Pass kPasses[] = {Pass::forward, Pass::backward};

/// Tokens a rank holds in a group (padding included).
Tokens member_tokens(const AttentionGroup& group, int rank) {
  Tokens tokens = 0;
  for (const SequenceChunks& sequence : group.sequences) {
    for (const Chunk& chunk : sequence.chunks) {
      if (chunk.rank == rank) tokens += chunk.size();
    }
  }
  return tokens;
}

/// The rank's own queries against every earlier key of their sequence (what a ring or
/// all-gather member computes over all steps; for a local group, whole documents).
std::vector<AttentionBlock> own_query_blocks(const AttentionGroup& group, int rank) {
  std::vector<AttentionBlock> blocks;
  for (const SequenceChunks& sequence : group.sequences) {
    for (const Chunk& chunk : sequence.chunks) {
      if (chunk.rank == rank)
        blocks.push_back({chunk.begin_tokens, chunk.end_tokens, 0, chunk.end_tokens});
    }
  }
  return blocks;
}

std::vector<Bytes> bytes_per_member(const AttentionGroup& group, Bytes bytes_per_token) {
  std::vector<Bytes> bytes;
  for (int rank : group.ranks) bytes.push_back(bytes_per_token * member_tokens(group, rank));
  return bytes;
}

/// Ring: d-1 KV hops per pass (KV and dKV backward), overlapped with the attention.
void add_ring_group(const AttentionGroup& group, const CostModel& cost,
                    std::map<int, Seconds>& rank_time_s) {
  const std::size_t size = group.ranks.size();
  Seconds slowest_hop_s = 0;
  for (std::size_t i = 0; i < size; ++i) {
    const Bytes bytes = cost.model().kv_bytes_per_token() * member_tokens(group, group.ranks[i]);
    slowest_hop_s = std::max(slowest_hop_s,
                             cost.p2p_time_s(bytes, group.ranks[i], group.ranks[(i + 1) % size]));
  }
  const Seconds ring_comm_s = static_cast<double>(size - 1) * slowest_hop_s;
  for (int rank : group.ranks) {
    const std::vector<AttentionBlock> blocks = own_query_blocks(group, rank);
    const Tokens tokens = member_tokens(group, rank);
    rank_time_s[rank] +=
        pass_count(cost.model(), Pass::forward) *
            (std::max(cost.attention_time_s(blocks, 1, Pass::forward), ring_comm_s) +
             cost.linear_time_s(tokens, Pass::forward)) +
        std::max(cost.attention_time_s(blocks, 1, Pass::backward), 2 * ring_comm_s) +
        cost.linear_time_s(tokens, Pass::backward);
  }
}

/// Local, all-gather (KV gathered forward, dKV reduce-scattered backward, not overlapped)
/// and Ulysses (QKV and output all-to-alls each pass, KV heads replicated beyond k as the
/// simulator charges them; heads split group-size ways).
void add_collective_group(const AttentionGroup& group, const CostModel& cost,
                          std::map<int, Seconds>& rank_time_s) {
  const Model& model = cost.model();
  const auto size = static_cast<int>(group.ranks.size());
  Seconds comm_per_pass_s = 0;
  std::vector<AttentionBlock> ulysses_blocks;
  if (group.scheme == Scheme::all_gather) {
    comm_per_pass_s =
        cost.all_gather_time_s(group.ranks, bytes_per_member(group, model.kv_bytes_per_token()));
  } else if (group.scheme == Scheme::ulysses) {
    const Bytes qkv_per_token =
        ulysses_qkv_bytes_per_token(model, cost.cluster().tensor_parallel.gpus, size);
    comm_per_pass_s =
        cost.all_to_all_time_s(group.ranks, bytes_per_member(group, qkv_per_token)) +
        cost.all_to_all_time_s(group.ranks,
                               bytes_per_member(group, model.hidden_bytes_per_token()));
    for (const SequenceChunks& sequence : group.sequences) {
      ulysses_blocks.push_back(whole_document(sequence.padded_length_tokens));
    }
  }
  for (int rank : group.ranks) {
    const Tokens tokens = member_tokens(group, rank);
    const std::vector<AttentionBlock> blocks =
        group.scheme == Scheme::ulysses ? ulysses_blocks : own_query_blocks(group, rank);
    const int head_split = group.scheme == Scheme::ulysses ? size : 1;
    for (Pass pass : kPasses) {
      rank_time_s[rank] += pass_count(model, pass) * (cost.attention_time_s(blocks, head_split, pass) +
                                                      cost.linear_time_s(tokens, pass) +
                                                      comm_per_pass_s);
    }
  }
}

}  // namespace

Seconds estimate_plan_time_s(const Plan& plan, const CostModel& cost) {
  Seconds step_s = cost.gradient_sync_time_s();
  const Seconds overhead_s =
      cost.micro_batch_overhead_s(Pass::forward) + cost.micro_batch_overhead_s(Pass::backward);
  for (const MicroBatch& micro_batch : plan.micro_batches) {
    std::map<int, Seconds> rank_time_s;  // ordered: deterministic
    std::map<int, Tokens> rank_tokens;
    // The linear modules' collectives: TP's, an MoE model's expert-parallel all-to-alls.
    const bool linear_collectives = cost.cluster().tensor_parallel.gpus > 1 ||
                                    (cost.model().is_moe() && cost.model().expert_parallel > 1);
    for (const AttentionGroup& group : micro_batch.groups) {
      if (group.scheme == Scheme::ring) {
        add_ring_group(group, cost, rank_time_s);
      } else {
        add_collective_group(group, cost, rank_time_s);
      }
      if (!linear_collectives) continue;
      for (int rank : group.ranks) rank_tokens[rank] += member_tokens(group, rank);
    }
    for (const auto& [rank, tokens] : rank_tokens) {
      rank_time_s[rank] += cost.linear_collectives_time_s(tokens);
    }
    Seconds micro_batch_s = 0;
    for (const auto& [rank, time_s] : rank_time_s) {
      micro_batch_s = std::max(micro_batch_s, time_s + overhead_s);
    }
    step_s += micro_batch_s;
  }
  return step_s;
}

}  // namespace ballast::strategies
