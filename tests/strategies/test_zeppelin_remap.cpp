// Zeppelin's remapping layer: the token-balanced linear layout is a valid plan layout,
// balances tokens to within one, and its transfer meets the minimal inter-node and total
// volumes (checked against a per-node brute-force oracle for the targets and a per-token
// recount of the moves) on hand-checked cases and seeded random micro-batches.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ballast/error.hpp"
#include "ballast/plan.hpp"
#include "builders.hpp"
#include "plan/plan_fixtures.hpp"
#include "zeppelin_remap.hpp"

namespace ballast::strategies {
namespace {

using testing::FakeCostModel;
using testing::small_model;

/// A rank, sequence id or token as a vector index.
std::size_t ix(std::int64_t value) { return static_cast<std::size_t>(value); }

/// nodes x gpus_per_node with memory that never limits a layout.
Cluster huge_cluster(int nodes, int gpus_per_node) {
  Cluster cluster = testing::small_cluster(nodes, gpus_per_node);
  cluster.gpu_memory_bytes = Bytes{1} << 50;
  return cluster;
}

/// A one-micro-batch plan around `micro_batch` (sequence ids 0 .. lengths.size()-1).
Plan plan_of(const Cluster& cluster, const MicroBatch& micro_batch,
             const std::vector<Tokens>& lengths) {
  Plan plan;
  plan.strategy = "remap-test";
  plan.cluster = cluster;
  plan.model = small_model();
  plan.cost_model = {{"family", "fake"}};
  plan.sequence_lengths_tokens = lengths;
  plan.micro_batches = {micro_batch};
  return plan;
}

SequenceChunks sequence_of(std::int64_t id, Tokens length, std::vector<Chunk> chunks) {
  return {id, length, std::move(chunks)};
}

std::tuple<int, std::int64_t, Tokens, Tokens> key(const LinearSlice& slice) {
  return {slice.rank, slice.sequence_id, slice.begin_tokens, slice.end_tokens};
}

/// The attention chunks as a layout: sorted by (rank, sequence, begin), adjacent merged.
std::vector<LinearSlice> chunks_as_layout(const MicroBatch& micro_batch) {
  std::vector<LinearSlice> slices;
  for (const auto& group : micro_batch.groups) {
    for (const auto& sequence : group.sequences) {
      for (const auto& chunk : sequence.chunks) {
        slices.push_back({chunk.rank, sequence.sequence_id, chunk.begin_tokens, chunk.end_tokens});
      }
    }
  }
  std::sort(slices.begin(), slices.end(),
            [](const LinearSlice& a, const LinearSlice& b) { return key(a) < key(b); });
  std::vector<LinearSlice> merged;
  for (const auto& slice : slices) {
    if (!merged.empty() && merged.back().rank == slice.rank &&
        merged.back().sequence_id == slice.sequence_id &&
        merged.back().end_tokens == slice.begin_tokens) {
      merged.back().end_tokens = slice.end_tokens;
    } else {
      merged.push_back(slice);
    }
  }
  return merged;
}

std::vector<std::tuple<int, std::int64_t, Tokens, Tokens>> keys(const std::vector<LinearSlice>& v) {
  std::vector<std::tuple<int, std::int64_t, Tokens, Tokens>> out;
  for (const auto& slice : v) out.push_back(key(slice));
  return out;
}

std::vector<std::tuple<int, int, Tokens>> keys(const std::vector<RemapMove>& v) {
  std::vector<std::tuple<int, int, Tokens>> out;
  for (const auto& move : v) out.emplace_back(move.src_rank, move.dst_rank, move.tokens);
  return out;
}

std::vector<Tokens> attention_tokens_per_rank(const MicroBatch& micro_batch, int ranks) {
  std::vector<Tokens> have(ix(ranks), 0);
  for (const auto& group : micro_batch.groups) {
    for (const auto& sequence : group.sequences) {
      for (const auto& chunk : sequence.chunks) have[ix(chunk.rank)] += chunk.size();
    }
  }
  return have;
}

/// Lexicographic minimum of (inter-node, total) moved tokens over all target choices
/// (e ranks at q + 1): every subset of each node's ranks, then a DP over the nodes.
std::pair<Tokens, Tokens> brute_force_minimum(const std::vector<Tokens>& have,
                                              const Cluster& cluster) {
  const int ranks = cluster.ranks();
  const int per_node = cluster.gpus_per_node;
  const Tokens total = std::accumulate(have.begin(), have.end(), Tokens{0});
  const Tokens q = total / ranks;
  const auto e = static_cast<int>(total % ranks);
  using Cost = std::pair<Tokens, Tokens>;
  const Cost infinite{std::numeric_limits<Tokens>::max() / 4, 0};
  std::vector<Cost> dp(ix(e) + 1, infinite);
  dp[0] = {0, 0};
  for (int node = 0; node < cluster.nodes; ++node) {
    const int first = node * per_node;
    Tokens node_have = 0;
    for (int r = first; r < first + per_node; ++r) node_have += have[ix(r)];
    std::vector<Cost> best(ix(per_node) + 1, infinite);
    for (unsigned mask = 0; mask < (1u << per_node); ++mask) {
      const int k = std::popcount(mask);
      Tokens moved = 0;
      for (int i = 0; i < per_node; ++i) {
        const Tokens target = q + ((mask >> i) & 1u);
        moved += std::max<Tokens>(0, have[ix(first + i)] - target);
      }
      const Cost cost{std::max<Tokens>(0, node_have - (q * per_node + k)), moved};
      best[ix(k)] = std::min(best[ix(k)], cost);
    }
    std::vector<Cost> next(dp.size(), infinite);
    for (std::size_t j = 0; j < dp.size(); ++j) {
      if (dp[j] == infinite) continue;
      for (std::size_t k = 0; k < best.size() && j + k < dp.size(); ++k) {
        const Cost sum{dp[j].first + best[k].first, dp[j].second + best[k].second};
        next[j + k] = std::min(next[j + k], sum);
      }
    }
    dp = std::move(next);
  }
  return dp[ix(e)];
}

struct Volumes {
  Tokens inter_node = 0;
  Tokens total = 0;
};

/// Every property of a layout; returns the moved volumes (from remap_moves).
Volumes check_layout(const Cluster& cluster, const MicroBatch& micro_batch,
                     const std::vector<Tokens>& lengths, const std::vector<LinearSlice>& layout) {
  const int ranks = cluster.ranks();
  const auto rank_count = ix(ranks);
  Volumes volumes;

  // A valid plan layout (covers every sequence [0, length) exactly once).
  Plan plan = plan_of(cluster, micro_batch, lengths);
  plan.micro_batches[0].linear_layout = layout;
  const FakeCostModel cost(cluster, small_model());
  const ValidationResult result = validate(plan, cost);
  EXPECT_TRUE(result.ok) << result.message;

  // Sorted by (rank, sequence, begin), adjacent slices merged.
  for (std::size_t i = 1; i < layout.size(); ++i) {
    const auto& a = layout[i - 1];
    const auto& b = layout[i];
    EXPECT_LT(std::make_tuple(a.rank, a.sequence_id, a.begin_tokens),
              std::make_tuple(b.rank, b.sequence_id, b.begin_tokens));
    EXPECT_FALSE(a.rank == b.rank && a.sequence_id == b.sequence_id &&
                 a.end_tokens == b.begin_tokens)
        << "unmerged slices at " << i;
  }

  // Tokens per rank: q or q + 1, exactly T mod N ranks at q + 1.
  const std::vector<Tokens> have = attention_tokens_per_rank(micro_batch, ranks);
  const Tokens total = std::accumulate(have.begin(), have.end(), Tokens{0});
  const Tokens q = total / ranks;
  std::vector<Tokens> final_tokens(rank_count, 0);
  for (const auto& slice : layout)
    final_tokens[ix(slice.rank)] += slice.end_tokens - slice.begin_tokens;
  Tokens plus_ones = 0;
  for (int r = 0; r < ranks; ++r) {
    const Tokens tokens = final_tokens[ix(r)];
    EXPECT_TRUE(tokens == q || tokens == q + 1)
        << "rank " << r << " holds " << tokens << ", q " << q;
    plus_ones += tokens - q;
  }
  EXPECT_EQ(plus_ones, total % ranks);

  // Per-token owners: attention and linear; recount the moves and the kept prefixes.
  std::vector<std::vector<int>> attention_owner(lengths.size());
  std::vector<std::vector<int>> linear_owner(lengths.size());
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    attention_owner[s].assign(ix(lengths[s]), -1);
    linear_owner[s].assign(ix(lengths[s]), -1);
  }
  // Each rank's attention tokens in (sequence, begin) order.
  std::vector<std::vector<std::pair<std::int64_t, Tokens>>> ordered(rank_count);
  for (const auto& group : micro_batch.groups) {
    for (const auto& sequence : group.sequences) {
      for (const auto& chunk : sequence.chunks) {
        for (Tokens t = chunk.begin_tokens; t < chunk.end_tokens; ++t) {
          attention_owner[ix(sequence.sequence_id)][ix(t)] = chunk.rank;
          ordered[ix(chunk.rank)].emplace_back(sequence.sequence_id, t);
        }
      }
    }
  }
  for (const auto& slice : layout) {
    for (Tokens t = slice.begin_tokens; t < slice.end_tokens; ++t) {
      linear_owner[ix(slice.sequence_id)][ix(t)] = slice.rank;
    }
  }
  std::vector<std::vector<Tokens>> pair_tokens(rank_count, std::vector<Tokens>(rank_count, 0));
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    for (std::size_t t = 0; t < attention_owner[s].size(); ++t) {
      const int src = attention_owner[s][t];
      const int dst = linear_owner[s][t];
      if (src != dst) ++pair_tokens[ix(src)][ix(dst)];
    }
  }
  std::vector<RemapMove> expected_moves;
  for (int src = 0; src < ranks; ++src) {
    for (int dst = 0; dst < ranks; ++dst) {
      const Tokens tokens = pair_tokens[ix(src)][ix(dst)];
      if (tokens > 0) expected_moves.push_back({src, dst, tokens});
    }
  }
  const std::vector<RemapMove> moves = remap_moves(micro_batch, layout);
  EXPECT_EQ(keys(moves), keys(expected_moves));
  for (const auto& move : moves) {
    volumes.total += move.tokens;
    if (!cluster.same_node(move.src_rank, move.dst_rank)) volumes.inter_node += move.tokens;
  }

  // A rank keeps a prefix of its attention tokens (all of them when it has no surplus).
  for (int r = 0; r < ranks; ++r) {
    auto& tokens = ordered[ix(r)];
    std::sort(tokens.begin(), tokens.end());
    const Tokens keep = std::min(have[ix(r)], final_tokens[ix(r)]);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const auto [s, t] = tokens[i];
      const bool kept = linear_owner[ix(s)][ix(t)] == r;
      EXPECT_EQ(kept, static_cast<Tokens>(i) < keep) << "rank " << r << " token " << s << ":" << t;
      if (kept != (static_cast<Tokens>(i) < keep)) break;
    }
  }

  // The minimal volumes for these targets, from per-rank and per-node totals.
  Tokens rank_bound = 0;
  for (int r = 0; r < ranks; ++r) {
    rank_bound += std::max<Tokens>(0, have[ix(r)] - final_tokens[ix(r)]);
  }
  Tokens node_bound = 0;
  for (int node = 0; node < cluster.nodes; ++node) {
    Tokens node_have = 0;
    Tokens node_final = 0;
    for (int r = node * cluster.gpus_per_node; r < (node + 1) * cluster.gpus_per_node; ++r) {
      node_have += have[ix(r)];
      node_final += final_tokens[ix(r)];
    }
    node_bound += std::max<Tokens>(0, node_have - node_final);
  }
  EXPECT_EQ(volumes.total, rank_bound);
  EXPECT_EQ(volumes.inter_node, node_bound);

  // And the targets are the best possible: (inter-node, total) is the brute-force minimum.
  const auto [best_inter, best_total] = brute_force_minimum(have, cluster);
  EXPECT_EQ(volumes.inter_node, best_inter);
  EXPECT_EQ(volumes.total, best_total);
  return volumes;
}

TEST(ZeppelinRemap, HandCheckedSmallCase) {
  // 2 nodes x 2 GPUs. Sequence 0 (7 tokens) local on rank 0; sequence 1 (4 tokens) on a
  // ring [1, 2], contiguous; rank 3 empty. have = [7, 2, 2, 0], T = 11, q = 2, e = 3.
  // Node 0 holds 9 > 2 q = 4: its +1s go to rank 0 (useful) and rank 1 (keeps a token in
  // the node); the last +1 goes to rank 2. Targets [3, 3, 3, 2]: rank 0 keeps [0, 3),
  // gives [3, 4) to rank 1 inside the node, then [4, 5) to rank 2 and [5, 7) to rank 3.
  const Cluster cluster = huge_cluster(2, 2);
  const MicroBatch micro_batch = testing::micro_batch_of(
      {testing::local_group(0, {{0, 7}}),
       AttentionGroup{Scheme::ring, {1, 2}, {sequence_of(1, 4, {{1, 0, 2}, {2, 2, 4}})}, 1}});
  const std::vector<Tokens> lengths = {7, 4};
  const auto layout = balanced_linear_layout(micro_batch, cluster);
  const std::vector<LinearSlice> expected = {{0, 0, 0, 3}, {1, 0, 3, 4}, {1, 1, 0, 2},
                                             {2, 0, 4, 5}, {2, 1, 2, 4}, {3, 0, 5, 7}};
  EXPECT_EQ(keys(layout), keys(expected));
  EXPECT_EQ(keys(remap_moves(micro_batch, layout)),
            (std::vector<std::tuple<int, int, Tokens>>{{0, 1, 1}, {0, 2, 1}, {0, 3, 2}}));
  const Volumes volumes = check_layout(cluster, micro_batch, lengths, layout);
  EXPECT_EQ(volumes.inter_node, 3);
  EXPECT_EQ(volumes.total, 4);
}

TEST(ZeppelinRemap, PlusOnesGoToTheNodeWithSurplus) {
  // 2 nodes x 2 GPUs; everything on node 1: have = [0, 0, 5, 4], T = 9, q = 2, e = 1.
  // Giving the +1 to rank 0 would send 5 tokens across; giving it to rank 2 sends 4.
  const Cluster cluster = huge_cluster(2, 2);
  const MicroBatch micro_batch = testing::micro_batch_of(
      {testing::local_group(2, {{0, 5}}), testing::local_group(3, {{1, 4}})});
  const auto layout = balanced_linear_layout(micro_batch, cluster);
  const std::vector<LinearSlice> expected = {
      {0, 0, 3, 5}, {1, 1, 2, 4}, {2, 0, 0, 3}, {3, 1, 0, 2}};
  EXPECT_EQ(keys(layout), keys(expected));
  EXPECT_EQ(keys(remap_moves(micro_batch, layout)),
            (std::vector<std::tuple<int, int, Tokens>>{{2, 0, 2}, {3, 1, 2}}));
  const Volumes volumes = check_layout(cluster, micro_batch, {5, 4}, layout);
  EXPECT_EQ(volumes.inter_node, 4);
  EXPECT_EQ(volumes.total, 4);
}

TEST(ZeppelinRemap, BalancedMicroBatchMovesNothing) {
  const Cluster cluster = huge_cluster(2, 4);
  // Exactly 600 tokens per rank: locals, a zigzag ring and a contiguous all-gather.
  {
    std::vector<AttentionGroup> groups;
    groups.push_back(testing::local_group(0, {{0, 600}}));
    groups.push_back(testing::local_group(1, {{1, 200}, {2, 400}}));
    groups.push_back(AttentionGroup{
        Scheme::ring,
        {2, 3, 4},
        {sequence_of(3, 1800, zigzag_chunks_unpadded(1800, std::vector<int>{2, 3, 4}))},
        1});
    groups.push_back(
        AttentionGroup{Scheme::all_gather,
                       {5, 6, 7},
                       {sequence_of(4, 1800, contiguous_chunks(1800, std::vector<int>{5, 6, 7}))},
                       1});
    const MicroBatch micro_batch = testing::micro_batch_of(std::move(groups));
    const auto layout = balanced_linear_layout(micro_batch, cluster);
    EXPECT_EQ(keys(layout), keys(chunks_as_layout(micro_batch)));
    EXPECT_TRUE(remap_moves(micro_batch, layout).empty());
    check_layout(cluster, micro_batch, {600, 200, 400, 1800, 1800}, layout);
  }
  // q or q + 1 already (T = 8 * 100 + 3): still nothing moves.
  {
    std::vector<AttentionGroup> groups;
    const std::vector<Tokens> sizes = {100, 101, 100, 100, 101, 100, 100, 101};
    std::vector<Tokens> lengths;
    for (int r = 0; r < 8; ++r) {
      lengths.push_back(sizes[ix(r)]);
      groups.push_back(testing::local_group(r, {{r, sizes[ix(r)]}}));
    }
    const MicroBatch micro_batch = testing::micro_batch_of(std::move(groups));
    const auto layout = balanced_linear_layout(micro_batch, cluster);
    EXPECT_EQ(keys(layout), keys(chunks_as_layout(micro_batch)));
    EXPECT_TRUE(remap_moves(micro_batch, layout).empty());
    check_layout(cluster, micro_batch, lengths, layout);
  }
}

TEST(ZeppelinRemap, FewerTokensThanRanks) {
  // T = 3 on 8 ranks, all on rank 5: three ranks hold one token, the others none.
  const Cluster cluster = huge_cluster(2, 4);
  const MicroBatch micro_batch =
      testing::micro_batch_of({testing::local_group(5, {{0, 1}, {1, 2}})});
  const auto layout = balanced_linear_layout(micro_batch, cluster);
  // Node 1 keeps all three (targets of its ranks 4..7: rank 5 useful first, then 4, 6).
  const std::vector<LinearSlice> expected = {{4, 1, 0, 1}, {5, 0, 0, 1}, {6, 1, 1, 2}};
  EXPECT_EQ(keys(layout), keys(expected));
  const Volumes volumes = check_layout(cluster, micro_batch, {1, 2}, layout);
  EXPECT_EQ(volumes.inter_node, 0);
  EXPECT_EQ(volumes.total, 2);
}

TEST(ZeppelinRemap, RejectsChunksThatDoNotCoverTheSequence) {
  const Cluster cluster = huge_cluster(2, 2);
  MicroBatch gap = testing::micro_batch_of(
      {AttentionGroup{Scheme::ring, {0, 1}, {sequence_of(0, 10, {{0, 0, 4}, {1, 5, 10}})}, 1}});
  EXPECT_THROW(balanced_linear_layout(gap, cluster), InternalError);
  MicroBatch short_chunks = testing::micro_batch_of({testing::local_group(0, {{0, 10}})});
  short_chunks.groups[0].sequences[0].chunks[0].end_tokens = 8;
  EXPECT_THROW(balanced_linear_layout(short_chunks, cluster), InternalError);
  MicroBatch twice = testing::micro_batch_of(
      {testing::local_group(0, {{0, 10}}), testing::local_group(1, {{0, 10}})});
  EXPECT_THROW(balanced_linear_layout(twice, cluster), InternalError);
  MicroBatch bad_rank = testing::micro_batch_of({testing::local_group(9, {{0, 10}})});
  EXPECT_THROW(balanced_linear_layout(bad_rank, cluster), InternalError);
}

struct RandomCase {
  Cluster cluster;
  MicroBatch micro_batch;
  std::vector<Tokens> lengths;
};

RandomCase random_case(std::mt19937_64& rng) {
  auto uniform = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  const int nodes = static_cast<int>(uniform(2, 4));
  const int per_node = static_cast<int>(uniform(4, 8));
  RandomCase out{huge_cluster(nodes, per_node), {}, {}};
  const int ranks = out.cluster.ranks();

  // Ranks that hold attention tokens: all, a random subset, one node, or a few.
  std::vector<int> active;
  switch (uniform(0, 3)) {
    case 0:
      for (int r = 0; r < ranks; ++r) active.push_back(r);
      break;
    case 1:
      for (int r = 0; r < ranks; ++r) {
        if (uniform(0, 2) > 0) active.push_back(r);
      }
      break;
    case 2: {
      const int node = static_cast<int>(uniform(0, nodes - 1));
      for (int r = node * per_node; r < (node + 1) * per_node; ++r) active.push_back(r);
      break;
    }
    default:
      for (int r = 0; r < ranks; ++r) {
        if (uniform(0, 5) == 0) active.push_back(r);
      }
  }
  if (active.empty()) active.push_back(static_cast<int>(uniform(0, ranks - 1)));

  // Lengths: 1..5000, tiny (T < N is likely), or a mix with many one-token sequences.
  const int sequences = static_cast<int>(uniform(1, 40));
  const auto length_mode = uniform(0, 3);
  for (int s = 0; s < sequences; ++s) {
    Tokens length = 0;
    if (length_mode == 0) {
      length = uniform(1, 3);
    } else if (length_mode == 1) {
      length = uniform(0, 2) == 0 ? 1 : uniform(1, 5000);
    } else {
      length = uniform(1, 5000);
    }
    out.lengths.push_back(length);
  }

  // Groups: locals (several sequences per group sometimes), rings / all-gathers with
  // zigzag or contiguous chunks over random ranks, ulysses with contiguous chunks.
  std::vector<AttentionGroup>& groups = out.micro_batch.groups;
  for (int s = 0; s < sequences; ++s) {
    const Tokens length = out.lengths[ix(s)];
    const auto kind = uniform(0, 3);
    if (kind == 0 || active.size() < 2) {
      const int rank = active[static_cast<std::size_t>(
          uniform(0, static_cast<std::int64_t>(active.size()) - 1))];
      if (!groups.empty() && groups.back().scheme == Scheme::local &&
          groups.back().ranks[0] == rank) {
        groups.back().sequences.push_back(whole_sequence(s, length, rank));
      } else {
        groups.push_back(
            AttentionGroup{Scheme::local, {rank}, {whole_sequence(s, length, rank)}, 1});
      }
      continue;
    }
    std::vector<int> members = active;
    std::shuffle(members.begin(), members.end(), rng);
    int size = static_cast<int>(
        uniform(2, std::min<std::int64_t>(8, static_cast<std::int64_t>(members.size()))));
    Scheme scheme = kind == 1 ? Scheme::ring : Scheme::all_gather;
    if (kind == 3) {
      scheme = Scheme::ulysses;
      size = members.size() >= 4 && uniform(0, 1) == 0 ? 4 : 2;
    }
    members.resize(ix(size));
    const bool zigzag = scheme != Scheme::ulysses && uniform(0, 1) == 0;
    SequenceChunks sequence{
        s, length,
        zigzag ? zigzag_chunks_unpadded(length, members) : contiguous_chunks(length, members)};
    // Sometimes share the previous group when it has the same scheme and ranks.
    if (!groups.empty() && groups.back().scheme == scheme && groups.back().ranks == members) {
      groups.back().sequences.push_back(std::move(sequence));
    } else {
      groups.push_back(AttentionGroup{scheme, members, {std::move(sequence)}, 1});
    }
  }
  return out;
}

TEST(ZeppelinRemap, RandomMicroBatchesAreOptimal) {
  std::mt19937_64 rng(20260611);
  int below_ranks = 0;
  int with_remainder = 0;
  int with_empty_ranks = 0;
  int with_inter_node = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const RandomCase c = random_case(rng);
    SCOPED_TRACE("trial " + std::to_string(trial));
    const int ranks = c.cluster.ranks();
    const std::vector<Tokens> have = attention_tokens_per_rank(c.micro_batch, ranks);
    const Tokens total = std::accumulate(have.begin(), have.end(), Tokens{0});
    below_ranks += total < ranks;
    with_remainder += total % ranks != 0;
    with_empty_ranks += std::count(have.begin(), have.end(), 0) > 0;

    const auto layout = balanced_linear_layout(c.micro_batch, c.cluster);
    const Volumes volumes = check_layout(c.cluster, c.micro_batch, c.lengths, layout);
    with_inter_node += volumes.inter_node > 0;
    // Determinism: same input (and a copy of it), same output.
    const MicroBatch copy = c.micro_batch;
    EXPECT_EQ(keys(balanced_linear_layout(copy, c.cluster)), keys(layout));
    EXPECT_EQ(keys(remap_moves(copy, layout)), keys(remap_moves(c.micro_batch, layout)));
    if (::testing::Test::HasFailure()) return;
  }
  // The generator reaches the interesting corners.
  EXPECT_GT(below_ranks, 10);
  EXPECT_GT(with_remainder, 200);
  EXPECT_GT(with_empty_ranks, 50);
  EXPECT_GT(with_inter_node, 50);
}

}  // namespace
}  // namespace ballast::strategies
