// Zeppelin's remapping layer: the token-balanced linear layout and its transfer volumes.
// The algorithm and its optimality argument are in zeppelin_remap.hpp.
#include "zeppelin_remap.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <utility>

#include "ballast/error.hpp"

namespace ballast::strategies {
namespace {

/// Tokens [begin, end) of a sequence.
struct Piece {
  std::int64_t sequence_id = 0;
  Tokens begin = 0;
  Tokens end = 0;
  Tokens size() const { return end - begin; }
};

bool by_sequence_then_begin(const Piece& a, const Piece& b) {
  return std::tie(a.sequence_id, a.begin) < std::tie(b.sequence_id, b.begin);
}

/// A chunk of the micro-batch with its sequence.
struct PlacedChunk {
  std::int64_t sequence_id = 0;
  Tokens begin = 0;
  Tokens end = 0;
  int rank = 0;
};

/// All chunks of the micro-batch sorted by (sequence id, begin).
std::vector<PlacedChunk> sorted_chunks(const MicroBatch& micro_batch) {
  std::vector<PlacedChunk> chunks;
  for (const AttentionGroup& group : micro_batch.groups) {
    for (const SequenceChunks& sequence : group.sequences) {
      for (const Chunk& chunk : sequence.chunks) {
        chunks.push_back({sequence.sequence_id, chunk.begin_tokens, chunk.end_tokens, chunk.rank});
      }
    }
  }
  std::sort(chunks.begin(), chunks.end(), [](const PlacedChunk& a, const PlacedChunk& b) {
    return std::tie(a.sequence_id, a.begin) < std::tie(b.sequence_id, b.begin);
  });
  return chunks;
}

/// Checks that every sequence's chunks (over all groups) cover [0, padded length) exactly
/// once, with ranks in [0, ranks).
void check_coverage(const MicroBatch& micro_batch, const std::vector<PlacedChunk>& chunks,
                    int ranks) {
  std::vector<std::pair<std::int64_t, Tokens>> padded;  // (sequence id, padded length)
  for (const AttentionGroup& group : micro_batch.groups) {
    for (const SequenceChunks& sequence : group.sequences) {
      padded.emplace_back(sequence.sequence_id, sequence.padded_length_tokens);
    }
  }
  std::sort(padded.begin(), padded.end());
  for (std::size_t i = 1; i < padded.size(); ++i) {
    BALLAST_CHECK(padded[i].first != padded[i - 1].first,
                  fmt::format("sequence {} appears twice in the micro-batch", padded[i].first));
  }
  std::size_t next = 0;
  for (const auto& [sequence_id, length] : padded) {
    Tokens covered = 0;
    for (; next < chunks.size() && chunks[next].sequence_id == sequence_id; ++next) {
      const PlacedChunk& chunk = chunks[next];
      BALLAST_CHECK(chunk.rank >= 0 && chunk.rank < ranks,
                    fmt::format("sequence {}: chunk rank {} outside [0, {})", sequence_id,
                                chunk.rank, ranks));
      BALLAST_CHECK(chunk.begin == covered && chunk.begin < chunk.end,
                    fmt::format("sequence {}: chunks must cover [0, {}) exactly once, got "
                                "[{}, {}) after {} tokens",
                                sequence_id, length, chunk.begin, chunk.end, covered));
      covered = chunk.end;
    }
    BALLAST_CHECK(covered == length,
                  fmt::format("sequence {}: chunks cover [0, {}) but its length is {} (the "
                              "remap needs chunks without padding)",
                              sequence_id, covered, length));
  }
  BALLAST_CHECK(next == chunks.size(), "every chunk belongs to a listed sequence");
}

/// Each rank's +1 (targets q or q + 1): tiers A, B, C, D of zeppelin_remap.hpp.
std::vector<Tokens> balanced_targets(const std::vector<Tokens>& have, const Cluster& cluster,
                                     Tokens total) {
  const int ranks = cluster.ranks();
  const int per_node = cluster.gpus_per_node;
  const Tokens q = total / ranks;
  Tokens plus_ones = total % ranks;
  std::vector<Tokens> target(static_cast<std::size_t>(ranks), q);
  std::vector<int> tiers[4];
  for (int node = 0; node < cluster.nodes; ++node) {
    const int first = node * per_node;
    Tokens node_have = 0;
    std::vector<int> useful;
    std::vector<int> other;
    for (int rank = first; rank < first + per_node; ++rank) {
      node_have += have[static_cast<std::size_t>(rank)];
      (have[static_cast<std::size_t>(rank)] > q ? useful : other).push_back(rank);
    }
    const Tokens surplus = std::clamp<Tokens>(node_have - q * per_node, 0, per_node);
    const auto both = static_cast<std::size_t>(std::min<Tokens>(surplus, useful.size()));
    const auto extra = static_cast<std::size_t>(surplus) - both;  // <= other.size()
    tiers[0].insert(tiers[0].end(), useful.begin(), useful.begin() + both);
    tiers[1].insert(tiers[1].end(), other.begin(), other.begin() + extra);
    tiers[2].insert(tiers[2].end(), useful.begin() + both, useful.end());
    tiers[3].insert(tiers[3].end(), other.begin() + extra, other.end());
  }
  for (const auto& tier : tiers) {
    for (const int rank : tier) {
      if (plus_ones == 0) return target;
      ++target[static_cast<std::size_t>(rank)];
      --plus_ones;
    }
  }
  BALLAST_CHECK(plus_ones == 0, "every +1 finds a rank");
  return target;
}

/// A surplus rank's give-away stream: its pieces after the kept prefix.
struct Source {
  int rank = 0;
  Tokens left = 0;        ///< tokens still to give
  std::size_t piece = 0;  ///< current piece of held[rank]
  Tokens offset = 0;      ///< tokens of that piece already kept or given
};

struct Sink {
  int rank = 0;
  Tokens need = 0;
};

/// Moves min(surplus, deficit) tokens from sources to sinks, both in list order; appends
/// the pieces to out[dst]. Leaves exhausted entries with left / need 0.
void transfer(std::vector<Source>& sources, std::vector<Sink>& sinks,
              const std::vector<std::vector<Piece>>& held, std::vector<std::vector<Piece>>& out) {
  std::size_t s = 0;
  std::size_t d = 0;
  while (true) {
    while (s < sources.size() && sources[s].left == 0) ++s;
    while (d < sinks.size() && sinks[d].need == 0) ++d;
    if (s == sources.size() || d == sinks.size()) return;
    Source& source = sources[s];
    Sink& sink = sinks[d];
    const Piece& piece = held[static_cast<std::size_t>(source.rank)][source.piece];
    const Tokens amount = std::min({source.left, sink.need, piece.size() - source.offset});
    const Tokens begin = piece.begin + source.offset;
    out[static_cast<std::size_t>(sink.rank)].push_back({piece.sequence_id, begin, begin + amount});
    source.left -= amount;
    sink.need -= amount;
    source.offset += amount;
    if (source.offset == piece.size()) {
      ++source.piece;
      source.offset = 0;
    }
  }
}

}  // namespace

std::vector<LinearSlice> balanced_linear_layout(const MicroBatch& micro_batch,
                                                const Cluster& cluster) {
  const int ranks = cluster.ranks();
  BALLAST_CHECK(ranks >= 1, "the cluster needs at least one rank");
  const auto rank_count = static_cast<std::size_t>(ranks);

  const std::vector<PlacedChunk> chunks = sorted_chunks(micro_batch);
  check_coverage(micro_batch, chunks, ranks);

  // Each rank's attention tokens, ordered by (sequence id, begin): the chunks are
  // already in that order, so bucketing keeps it.
  std::vector<std::vector<Piece>> held(rank_count);
  std::vector<Tokens> have(rank_count, 0);
  Tokens total = 0;
  for (const PlacedChunk& chunk : chunks) {
    held[static_cast<std::size_t>(chunk.rank)].push_back(
        {chunk.sequence_id, chunk.begin, chunk.end});
    have[static_cast<std::size_t>(chunk.rank)] += chunk.end - chunk.begin;
    total += chunk.end - chunk.begin;
  }
  const std::vector<Tokens> target = balanced_targets(have, cluster, total);

  // Kept prefixes; surplus ranks become sources positioned after their prefix.
  std::vector<std::vector<Piece>> out(rank_count);
  std::vector<std::vector<Source>> node_sources(static_cast<std::size_t>(cluster.nodes));
  std::vector<std::vector<Sink>> node_sinks(static_cast<std::size_t>(cluster.nodes));
  for (int rank = 0; rank < ranks; ++rank) {
    const auto r = static_cast<std::size_t>(rank);
    const auto node = static_cast<std::size_t>(cluster.node_of(rank));
    if (have[r] < target[r]) node_sinks[node].push_back({rank, target[r] - have[r]});
    Tokens keep = std::min(have[r], target[r]);
    Source source{rank, have[r] - keep, 0, 0};
    for (const Piece& piece : held[r]) {
      if (keep == 0) break;
      const Tokens kept = std::min(keep, piece.size());
      out[r].push_back({piece.sequence_id, piece.begin, piece.begin + kept});
      keep -= kept;
      if (kept == piece.size()) {
        ++source.piece;
      } else {
        source.offset = kept;
      }
    }
    if (source.left > 0) node_sources[node].push_back(source);
  }

  // Inside each node first, then the remainders across nodes (rank order both times).
  std::vector<Source> sources;
  std::vector<Sink> sinks;
  for (std::size_t node = 0; node < node_sources.size(); ++node) {
    transfer(node_sources[node], node_sinks[node], held, out);
    for (const Source& source : node_sources[node]) {
      if (source.left > 0) sources.push_back(source);
    }
    for (const Sink& sink : node_sinks[node]) {
      if (sink.need > 0) sinks.push_back(sink);
    }
  }
  transfer(sources, sinks, held, out);
  for (const Source& source : sources) BALLAST_CHECK(source.left == 0, "every surplus placed");
  for (const Sink& sink : sinks) BALLAST_CHECK(sink.need == 0, "every deficit filled");

  // Sort each rank's pieces and merge adjacent ones of one sequence.
  std::vector<LinearSlice> layout;
  for (int rank = 0; rank < ranks; ++rank) {
    auto& pieces = out[static_cast<std::size_t>(rank)];
    std::sort(pieces.begin(), pieces.end(), by_sequence_then_begin);
    const std::size_t first = layout.size();
    for (const Piece& piece : pieces) {
      if (layout.size() > first && layout.back().sequence_id == piece.sequence_id &&
          layout.back().end_tokens == piece.begin) {
        layout.back().end_tokens = piece.end;
      } else {
        layout.push_back({rank, piece.sequence_id, piece.begin, piece.end});
      }
    }
  }
  return layout;
}

std::vector<RemapMove> remap_moves(const MicroBatch& micro_batch,
                                   const std::vector<LinearSlice>& layout) {
  const std::vector<PlacedChunk> chunks = sorted_chunks(micro_batch);
  for (std::size_t i = 1; i < chunks.size(); ++i) {
    BALLAST_CHECK(
        chunks[i].sequence_id != chunks[i - 1].sequence_id || chunks[i].begin >= chunks[i - 1].end,
        fmt::format("sequence {}: attention chunks overlap at token {}", chunks[i].sequence_id,
                    chunks[i].begin));
  }
  std::vector<RemapMove> moves;
  for (const LinearSlice& slice : layout) {
    const auto sequence_begin = std::lower_bound(
        chunks.begin(), chunks.end(), slice.sequence_id,
        [](const PlacedChunk& chunk, std::int64_t id) { return chunk.sequence_id < id; });
    BALLAST_CHECK(
        sequence_begin != chunks.end() && sequence_begin->sequence_id == slice.sequence_id,
        fmt::format("linear slice of sequence {} on rank {}: the sequence is not in "
                    "the micro-batch",
                    slice.sequence_id, slice.rank));
    // First chunk of the slice's sequence ending after the slice's begin; chunks of one
    // sequence are disjoint, so their ends are sorted too.
    auto it = std::partition_point(sequence_begin, chunks.end(), [&](const PlacedChunk& chunk) {
      return chunk.sequence_id == slice.sequence_id && chunk.end <= slice.begin_tokens;
    });
    for (;
         it != chunks.end() && it->sequence_id == slice.sequence_id && it->begin < slice.end_tokens;
         ++it) {
      const Tokens overlap =
          std::min(it->end, slice.end_tokens) - std::max(it->begin, slice.begin_tokens);
      if (overlap > 0 && it->rank != slice.rank) moves.push_back({it->rank, slice.rank, overlap});
    }
  }
  std::sort(moves.begin(), moves.end(), [](const RemapMove& a, const RemapMove& b) {
    return std::tie(a.src_rank, a.dst_rank) < std::tie(b.src_rank, b.dst_rank);
  });
  std::vector<RemapMove> merged;
  for (const RemapMove& move : moves) {
    if (!merged.empty() && merged.back().src_rank == move.src_rank &&
        merged.back().dst_rank == move.dst_rank) {
      merged.back().tokens += move.tokens;
    } else {
      merged.push_back(move);
    }
  }
  return merged;
}

}  // namespace ballast::strategies
