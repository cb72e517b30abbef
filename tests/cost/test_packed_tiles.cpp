// Packed attention calls (cost_model.hpp): the cost model's tile count against the runtime
// kernel's own tiling (runtime::attention_tile_pairs) on the layouts ballast's runtime
// makes (local groups, zigzag ring steps, Ulysses member-order concatenations) and on
// arbitrary ones, against a brute-force tile scan for other tile sizes, causal pairs, and
// the packed pricing (per-block mode untouched, the floor still a floor).
#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "ballast/cost_model.hpp"
#include "ballast/runtime/kernels.hpp"

namespace ballast {
namespace {

using Ranges = std::vector<DocumentRange>;

/// A packed span token by token, as the runtime hands it to the kernel.
struct Tokenised {
  std::vector<std::int64_t> doc, pos;
  explicit Tokenised(const Ranges& ranges) {
    for (const DocumentRange& range : ranges) {
      for (Tokens p = range.begin; p < range.end; ++p) {
        doc.push_back(range.document);
        pos.push_back(p);
      }
    }
  }
  runtime::TokenSpan span() const {
    return {doc.data(), pos.data(), static_cast<int>(doc.size())};
  }
};

Tokens kernel_tile_pairs(const Ranges& queries, const Ranges& keys) {
  const Tokenised q(queries), k(keys);
  return runtime::attention_tile_pairs(q.span(), k.span());
}

/// The kernel's rule written out on tokens for any tile size: tile extents by a loop, every
/// tile pair tested.
Tokens brute_force_tile_pairs(const Ranges& queries, const Ranges& keys, Tokens tile) {
  struct Extent {
    std::int64_t min_doc, max_doc, min_pos, max_pos;
  };
  const auto extents = [tile](const Tokenised& t) {
    std::vector<Extent> tiles;
    for (std::size_t begin = 0; begin < t.doc.size(); begin += static_cast<std::size_t>(tile)) {
      Extent e{t.doc[begin], t.doc[begin], t.pos[begin], t.pos[begin]};
      for (std::size_t i = begin; i < std::min(t.doc.size(), begin + tile); ++i) {
        e = {std::min(e.min_doc, t.doc[i]), std::max(e.max_doc, t.doc[i]),
             std::min(e.min_pos, t.pos[i]), std::max(e.max_pos, t.pos[i])};
      }
      tiles.push_back(e);
    }
    return tiles;
  };
  Tokens pairs = 0;
  for (const Extent& q : extents(Tokenised(queries))) {
    for (const Extent& k : extents(Tokenised(keys))) {
      const bool disjoint = q.max_doc < k.min_doc || k.max_doc < q.min_doc;
      pairs += !disjoint && k.min_pos <= q.max_pos ? 1 : 0;
    }
  }
  return pairs;
}

Tokens brute_force_causal_pairs(const Ranges& queries, const Ranges& keys) {
  const Tokenised q(queries), k(keys);
  Tokens pairs = 0;
  for (std::size_t i = 0; i < q.doc.size(); ++i) {
    for (std::size_t j = 0; j < k.doc.size(); ++j) {
      pairs += q.doc[i] == k.doc[j] && k.pos[j] <= q.pos[i] ? 1 : 0;
    }
  }
  return pairs;
}

/// Document lengths: mostly short (below one 64-token tile), some long, some of one token.
std::vector<Tokens> random_lengths(std::mt19937_64& rng, int documents) {
  std::vector<Tokens> lengths;
  std::uniform_int_distribution<int> kind(0, 9);
  for (int i = 0; i < documents; ++i) {
    const int k = kind(rng);
    const Tokens high = k < 6 ? 63 : k < 9 ? 300 : 1200;
    lengths.push_back(std::uniform_int_distribution<Tokens>(1, high)(rng));
  }
  return lengths;
}

/// Document ids: increasing, or shuffled as a plan's group order leaves them (the
/// runtime passes sequence ids, which a planner's packing order does not sort).
std::vector<std::int64_t> random_ids(std::mt19937_64& rng, int documents) {
  std::vector<std::int64_t> ids;
  std::int64_t id = std::uniform_int_distribution<std::int64_t>(0, 5)(rng);
  for (int i = 0; i < documents; ++i) {
    ids.push_back(id);
    id += std::uniform_int_distribution<std::int64_t>(1, 3)(rng);
  }
  if (rng() % 2 == 0) std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

/// A local group: whole documents one after another, queries = keys.
Ranges local_span(std::mt19937_64& rng, int documents) {
  const std::vector<Tokens> lengths = random_lengths(rng, documents);
  const std::vector<std::int64_t> ids = random_ids(rng, documents);
  Ranges span;
  for (int i = 0; i < documents; ++i) span.push_back({ids[i], 0, lengths[i]});
  return span;
}

/// Zigzag ring over `members`: document d cut into 2 * members chunks (ends rounded
/// down), member m holding chunks m and 2 * members - 1 - m. Each member's span: its
/// chunks in document order, then chunk order (runtime group_tokens).
std::vector<Ranges> zigzag_members(std::mt19937_64& rng, int documents, int members) {
  const std::vector<Tokens> lengths = random_lengths(rng, documents);
  const std::vector<std::int64_t> ids = random_ids(rng, documents);
  std::vector<Ranges> spans(static_cast<std::size_t>(members));
  const int chunks = 2 * members;
  for (int d = 0; d < documents; ++d) {
    const auto bound = [&](int c) { return lengths[d] * c / chunks; };
    for (int m = 0; m < members; ++m) {
      for (int c : {m, chunks - 1 - m}) {
        if (bound(c) < bound(c + 1)) spans[m].push_back({ids[d], bound(c), bound(c + 1)});
      }
    }
  }
  return spans;
}

/// Ulysses over `members`: each document cut at random points into one contiguous chunk
/// per member (some empty); the call's span is every member's chunks in member order.
Ranges ulysses_span(std::mt19937_64& rng, int documents, int members) {
  const std::vector<Tokens> lengths = random_lengths(rng, documents);
  const std::vector<std::int64_t> ids = random_ids(rng, documents);
  std::vector<Ranges> spans(static_cast<std::size_t>(members));
  for (int d = 0; d < documents; ++d) {
    std::vector<Tokens> cuts = {0, lengths[d]};
    for (int m = 1; m < members; ++m) {
      cuts.push_back(std::uniform_int_distribution<Tokens>(0, lengths[d])(rng));
    }
    std::sort(cuts.begin(), cuts.end());
    for (int m = 0; m < members; ++m) {
      if (cuts[m] < cuts[m + 1]) spans[m].push_back({ids[d], cuts[m], cuts[m + 1]});
    }
  }
  Ranges all;
  for (const Ranges& span : spans) all.insert(all.end(), span.begin(), span.end());
  return all;
}

/// Anything: ranges of a few documents at random positions, repeats and overlaps included
/// (the kernel's rule is defined for any doc/pos arrays).
Ranges arbitrary_span(std::mt19937_64& rng, int ranges) {
  Ranges span;
  std::uniform_int_distribution<std::int64_t> document(0, 6);
  std::uniform_int_distribution<Tokens> position(0, 400), length(0, 150);
  for (int i = 0; i < ranges; ++i) {
    const Tokens begin = position(rng);
    span.push_back({document(rng), begin, begin + length(rng)});
  }
  return span;
}

std::string describe(const Ranges& ranges) {
  std::ostringstream text;
  for (const DocumentRange& r : ranges) {
    text << "(" << r.document << ":" << r.begin << "-" << r.end << ")";
  }
  return text.str();
}

void expect_kernel_count(const Ranges& queries, const Ranges& keys) {
  ASSERT_EQ(packed_tile_pairs({queries, keys}, runtime::kAttentionTileTokens),
            kernel_tile_pairs(queries, keys))
      << "queries " << describe(queries) << "\nkeys " << describe(keys);
}

TEST(PackedTiles, LocalGroupsMatchTheKernel) {
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 300; ++trial) {
    const Ranges span = local_span(rng, std::uniform_int_distribution<int>(1, 120)(rng));
    expect_kernel_count(span, span);
  }
}

TEST(PackedTiles, ZigzagRingStepsMatchTheKernel) {
  std::mt19937_64 rng(2);
  for (int trial = 0; trial < 150; ++trial) {
    const int members = std::uniform_int_distribution<int>(2, 6)(rng);
    const auto spans =
        zigzag_members(rng, std::uniform_int_distribution<int>(1, 12)(rng), members);
    for (int own = 0; own < members; ++own) {
      for (int owner = 0; owner < members; ++owner) expect_kernel_count(spans[own], spans[owner]);
    }
  }
}

TEST(PackedTiles, UlyssesConcatenationsMatchTheKernel) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const Ranges span = ulysses_span(rng, std::uniform_int_distribution<int>(1, 40)(rng),
                                     std::uniform_int_distribution<int>(2, 8)(rng));
    expect_kernel_count(span, span);
  }
}

TEST(PackedTiles, ArbitrarySpansMatchTheKernel) {
  std::mt19937_64 rng(4);
  for (int trial = 0; trial < 500; ++trial) {
    std::uniform_int_distribution<int> ranges(0, 8);
    expect_kernel_count(arbitrary_span(rng, ranges(rng)), arbitrary_span(rng, ranges(rng)));
  }
}

TEST(PackedTiles, OtherTileSizesMatchABruteForceScan) {
  std::mt19937_64 rng(5);
  for (Tokens tile : {1, 3, 16, 100}) {
    for (int trial = 0; trial < 100; ++trial) {
      const Ranges queries = arbitrary_span(rng, 4), keys = arbitrary_span(rng, 4);
      ASSERT_EQ(packed_tile_pairs({queries, keys}, tile),
                brute_force_tile_pairs(queries, keys, tile))
          << "tile " << tile << "\nqueries " << describe(queries) << "\nkeys " << describe(keys);
    }
  }
}

TEST(PackedTiles, OneRangeEachSideIsTheBlocksTiles) {
  // The O(1) path (causal_tiles) against the general one: the same range cut in two.
  std::mt19937_64 rng(6);
  std::uniform_int_distribution<Tokens> position(0, 700);
  for (int trial = 0; trial < 300; ++trial) {
    Tokens q0 = position(rng), q1 = position(rng), k0 = position(rng), k1 = position(rng);
    if (q1 < q0) std::swap(q0, q1);
    if (k1 < k0) std::swap(k0, k1);
    const Ranges queries = {{7, q0, q1}}, keys = {{7, k0, k1}};
    const Tokens cut = (q0 + q1) / 2;
    const Ranges split = {{7, q0, cut}, {7, cut, q1}};
    const Tokens tiles = packed_tile_pairs({queries, keys}, 64);
    EXPECT_EQ(tiles, causal_tiles({q0, q1, k0, k1}, 64));
    EXPECT_EQ(tiles, packed_tile_pairs({split, keys}, 64));
    EXPECT_EQ(tiles, kernel_tile_pairs(queries, keys));
  }
  const Ranges a = {{1, 0, 100}}, b = {{2, 0, 100}};
  EXPECT_EQ(packed_tile_pairs({a, b}, 64), 0);  // other document
}

TEST(PackedTiles, ShortDocumentsShareTiles) {
  // 256 documents of 16 tokens in id order: 64 query tiles, each seeing only its own key
  // tile (4 documents in each); tiled per block they would be 256 tiles.
  Ranges span;
  for (int d = 0; d < 256; ++d) span.push_back({d, 0, 16});
  EXPECT_EQ(packed_tile_pairs({span, span}, 64), 64);
  // The same documents in a shuffled id order: every tile's id range meets almost every
  // other's, and every key tile starts at position 0, so nearly all 64 x 64 pairs run.
  Ranges shuffled = span;
  std::mt19937_64 rng(8);
  std::vector<std::int64_t> ids(256);
  for (int d = 0; d < 256; ++d) ids[d] = d;
  std::shuffle(ids.begin(), ids.end(), rng);
  for (int d = 0; d < 256; ++d) shuffled[d].document = ids[d];
  EXPECT_EQ(packed_tile_pairs({shuffled, shuffled}, 64), kernel_tile_pairs(shuffled, shuffled));
  EXPECT_GT(packed_tile_pairs({shuffled, shuffled}, 64), 64 * 60);  // 3,938 with this seed
}

TEST(PackedCalls, CausalPairsAndDocumentBlocks) {
  std::mt19937_64 rng(9);
  for (int trial = 0; trial < 300; ++trial) {
    const Ranges queries = arbitrary_span(rng, 5), keys = arbitrary_span(rng, 5);
    const PackedAttentionCall call{queries, keys};
    EXPECT_EQ(causal_pairs(call), brute_force_causal_pairs(queries, keys));
    Tokens block_pairs = 0;
    for (const AttentionBlock& block : document_blocks(call)) {
      EXPECT_GT(causal_pairs(block), 0);
      block_pairs += causal_pairs(block);
    }
    EXPECT_EQ(block_pairs, causal_pairs(call));
  }
  // Query-range then key-range order, one block per (query range, key range) of a document.
  const Ranges queries = {{5, 0, 10}, {3, 0, 4}, {5, 20, 30}};
  const Ranges keys = {{5, 25, 30}, {3, 0, 4}, {5, 0, 10}};
  const std::vector<AttentionBlock> blocks = document_blocks({queries, keys});
  ASSERT_EQ(blocks.size(), 4u);
  EXPECT_EQ(blocks[0].q_begin, 0);   // (5: 0-10) x (5: 0-10); (5: 25-30) has no pair
  EXPECT_EQ(blocks[1].q_end, 4);     // (3: 0-4) x (3: 0-4)
  EXPECT_EQ(blocks[2].kv_begin, 25); // (5: 20-30) x (5: 25-30)
  EXPECT_EQ(blocks[3].kv_begin, 0);  // (5: 20-30) x (5: 0-10)
}

// ---- pricing ----

Cluster packed_cluster(bool with_curves) {
  Cluster cluster = cluster_preset("h100");
  cluster.attention_tile_tokens = 64;
  cluster.attention_tiles_packed = true;
  if (!with_curves) {
    cluster.attention_forward_curve.clear();
    cluster.attention_backward_curve.clear();
  }
  return cluster;
}

TEST(PackedPricing, FlatEfficiencyChargesTheKernelsTiles) {
  const AnalyticalCostModel cost(packed_cluster(false), model_preset("llama-7b"));
  const double tile_s = cost.attention_pair_floor_s(64.0 * 64.0, Pass::forward);
  std::mt19937_64 rng(10);
  for (int trial = 0; trial < 50; ++trial) {
    const Ranges span = ulysses_span(rng, 30, 4);
    const double tiles = cost.attention_call_time_s({span, span}, 1, Pass::forward) / tile_s;
    EXPECT_NEAR(tiles, static_cast<double>(kernel_tile_pairs(span, span)), 1e-9 * tiles);
  }
}

TEST(PackedPricing, BlocksAreLaidOutAsTheirOwnDocuments) {
  const AnalyticalCostModel cost(packed_cluster(true), model_preset("llama-7b"));
  std::vector<AttentionBlock> blocks;
  Ranges span;
  for (int d = 0; d < 256; ++d) {
    blocks.push_back(whole_document(16));
    span.push_back({d, 0, 16});
  }
  for (Pass pass : {Pass::forward, Pass::backward}) {
    EXPECT_DOUBLE_EQ(cost.attention_time_s(blocks, 2, pass),
                     cost.attention_call_time_s({span, span}, 2, pass));
  }
}

TEST(PackedPricing, OneWholeDocumentCostsWhatItCostsPerBlock) {
  // Same tiles (one range each side: causal_tiles), same length: byte-identical times.
  Cluster per_block = packed_cluster(true);
  per_block.attention_tiles_packed = false;
  const AnalyticalCostModel packed(packed_cluster(true), model_preset("llama-7b"));
  const AnalyticalCostModel blocks(per_block, model_preset("llama-7b"));
  for (Tokens length : {1, 16, 64, 100, 512, 3000, 20000}) {
    const std::vector<AttentionBlock> document = {whole_document(length)};
    for (Pass pass : {Pass::forward, Pass::backward}) {
      EXPECT_DOUBLE_EQ(packed.attention_time_s(document, 1, pass),
                       blocks.attention_time_s(document, 1, pass))
          << length;
    }
  }
}

TEST(PackedPricing, UnsharedTilesCostThePerBlockPrice) {
  // Documents of whole tiles share none: a call costs what its blocks cost per block, so a
  // batch of L-token documents (a curve point as `ballast calibrate --host` measures it)
  // runs at the point's efficiency in both modes.
  Cluster per_block = packed_cluster(true);
  per_block.attention_tiles_packed = false;
  const AnalyticalCostModel packed(packed_cluster(true), model_preset("llama-7b"));
  const AnalyticalCostModel blocks(per_block, model_preset("llama-7b"));
  for (Tokens length : {64, 128, 512, 2048}) {
    const std::vector<AttentionBlock> documents(static_cast<std::size_t>(4096 / length),
                                                whole_document(length));
    for (Pass pass : {Pass::forward, Pass::backward}) {
      EXPECT_EQ(packed.attention_time_s(documents, 1, pass),
                blocks.attention_time_s(documents, 1, pass))
          << length;
    }
  }
}

TEST(PackedPricing, HugeCallsArePricedPerBlock) {
  // A planner probing a 2^28-token ring step (zeppelin's crossovers) would make counting
  // O(4M tiles) per call: beyond kMaxPackedCallTokens the blocks are priced on their own.
  Cluster per_block = packed_cluster(true);
  per_block.attention_tiles_packed = false;
  const AnalyticalCostModel packed(packed_cluster(true), model_preset("llama-7b"));
  const AnalyticalCostModel blocks(per_block, model_preset("llama-7b"));
  const Tokens half = Tokens{1} << 27;
  const std::vector<AttentionBlock> zigzag = {{0, half, 0, half}, {half, 2 * half, half, 2 * half}};
  for (Pass pass : {Pass::forward, Pass::backward}) {
    EXPECT_EQ(packed.attention_time_s(zigzag, 1, pass), blocks.attention_time_s(zigzag, 1, pass));
  }
}

TEST(PackedPricing, SharedTilesAtTheBlocksMeanEfficiency) {
  // 256 x 16 tokens: 64 shared tiles at the efficiency each 16-token document gets per
  // block (the curves' first point), a quarter of the per-block price.
  Cluster per_block = packed_cluster(true);
  per_block.attention_tiles_packed = false;
  const AnalyticalCostModel packed(packed_cluster(true), model_preset("llama-7b"));
  const AnalyticalCostModel blocks(per_block, model_preset("llama-7b"));
  const std::vector<AttentionBlock> documents(256, whole_document(16));
  for (Pass pass : {Pass::forward, Pass::backward}) {
    EXPECT_NEAR(packed.attention_time_s(documents, 1, pass) * 4,
                blocks.attention_time_s(documents, 1, pass),
                1e-12 * blocks.attention_time_s(documents, 1, pass));
  }
}

TEST(PackedPricing, ShortDocumentsCostLessThanPerBlock) {
  Cluster per_block = packed_cluster(false);
  per_block.attention_tiles_packed = false;
  const AnalyticalCostModel packed(packed_cluster(false), model_preset("llama-7b"));
  const AnalyticalCostModel blocks(per_block, model_preset("llama-7b"));
  const std::vector<AttentionBlock> documents(256, whole_document(16));
  // 64 shared tiles against 256 tiles of their own.
  EXPECT_NEAR(packed.attention_time_s(documents, 1, Pass::forward) * 4,
              blocks.attention_time_s(documents, 1, Pass::forward), 1e-12);
}

TEST(PackedPricing, PerBlockClusterPricesTheCallsDocumentBlocks) {
  Cluster per_block = packed_cluster(true);
  per_block.attention_tiles_packed = false;
  const AnalyticalCostModel cost(per_block, model_preset("llama-7b"));
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 50; ++trial) {
    const auto spans = zigzag_members(rng, 5, 3);
    const PackedAttentionCall call{spans[2], spans[0]};
    const std::vector<AttentionBlock> blocks = document_blocks(call);
    EXPECT_EQ(cost.attention_call_time_s(call, 1, Pass::backward),
              blocks.empty() ? 0.0 : cost.attention_time_s(blocks, 1, Pass::backward));
  }
}

TEST(PackedPricing, FloorStaysALowerBound) {
  // Every allowed pair lies in a computed tile: time * d >= floor(pairs), with the curves
  // (the call's efficiency never above the best) and flat.
  std::mt19937_64 rng(12);
  for (bool curves : {true, false}) {
    const AnalyticalCostModel cost(packed_cluster(curves), model_preset("llama-7b"));
    for (int trial = 0; trial < 200; ++trial) {
      const int kind = trial % 4;
      std::vector<Ranges> sides;
      if (kind == 0) {
        const Ranges span = local_span(rng, 50);
        sides = {span, span};
      } else if (kind == 1) {
        const auto spans = zigzag_members(rng, 6, 4);
        sides = {spans[trial % 4], spans[(trial / 4) % 4]};
      } else if (kind == 2) {
        const Ranges span = ulysses_span(rng, 20, 4);
        sides = {span, span};
      } else {
        sides = {arbitrary_span(rng, 6), arbitrary_span(rng, 6)};
      }
      const PackedAttentionCall call{sides[0], sides[1]};
      const double pairs = static_cast<double>(causal_pairs(call));
      for (Pass pass : {Pass::forward, Pass::backward}) {
        for (int d : {1, 4}) {
          EXPECT_GE(cost.attention_call_time_s(call, d, pass) * d * (1 + 1e-12),
                    cost.attention_pair_floor_s(pairs, pass));
        }
      }
    }
  }
}

}  // namespace
}  // namespace ballast
