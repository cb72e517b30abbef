// Packed attention calls (cost_model.hpp, PackedAttentionCall): their causal pairs and the
// (query tile, key tile) pairs a kernel computes that tiles a call's packed spans, as
// ballast's CPU runtime kernel does (src/runtime/kernels_attention.cpp).
#include <algorithm>
#include <numeric>
#include <vector>

#include "ballast/cost_model.hpp"
#include "ballast/error.hpp"

namespace ballast {

namespace {

/// What the kernel records of a tile (its TileExtent): the smallest and largest document
/// id and position among its tokens.
struct TileRange {
  std::int64_t min_document = 0;
  std::int64_t max_document = 0;
  Tokens min_position = 0;
  Tokens max_position = 0;
};

/// The tiles of `tile_tokens` consecutive tokens of a packed span, from its first token.
/// O(ranges + tiles): each step fills a tile or ends a range.
std::vector<TileRange> tile_ranges(std::span<const DocumentRange> span, Tokens tile_tokens) {
  std::vector<TileRange> tiles;
  Tokens offset = 0;  // tokens of the span before `begin`
  for (const DocumentRange& range : span) {
    for (Tokens begin = range.begin; begin < range.end;) {
      const Tokens room = tile_tokens - offset % tile_tokens;  // left in the current tile
      const Tokens end = std::min(range.end, begin + room);
      if (offset % tile_tokens == 0) {
        tiles.push_back({range.document, range.document, begin, end - 1});
      } else {
        TileRange& tile = tiles.back();
        tile.min_document = std::min(tile.min_document, range.document);
        tile.max_document = std::max(tile.max_document, range.document);
        tile.min_position = std::min(tile.min_position, begin);
        tile.max_position = std::max(tile.max_position, end - 1);
      }
      offset += end - begin;
      begin = end;
    }
  }
  return tiles;
}

/// Counts of values added at indices 0..n-1, prefix sums in O(log n) (a Fenwick tree).
class PrefixCounter {
 public:
  explicit PrefixCounter(std::size_t size) : tree_(size + 1, 0) {}
  void add(std::size_t index) {
    for (std::size_t i = index + 1; i < tree_.size(); i += i & (~i + 1)) ++tree_[i];
  }
  /// Values added at indices < end.
  Tokens count_below(std::size_t end) const {
    Tokens count = 0;
    for (std::size_t i = end; i > 0; i -= i & (~i + 1)) count += tree_[i];
    return count;
  }

 private:
  std::vector<Tokens> tree_;
};

/// Pairs (query tile, key tile) with key.min_position <= query.max_position whose document
/// ranges meet. Ranges that do not meet lie wholly after (key.min_document >
/// query.max_document) or wholly before (key.max_document < query.min_document), never
/// both, so a sweep over the queries by max_position that adds the keys by min_position
/// counts the visible ones as added - after - before, each a prefix count over the key
/// documents. O(tiles log tiles).
Tokens count_visible_pairs(const std::vector<TileRange>& queries,
                           const std::vector<TileRange>& keys) {
  std::vector<std::int64_t> documents;  // every key tile's min and max, sorted, unique
  for (const TileRange& key : keys) {
    documents.push_back(key.min_document);
    documents.push_back(key.max_document);
  }
  std::sort(documents.begin(), documents.end());
  documents.erase(std::unique(documents.begin(), documents.end()), documents.end());
  const auto index_of = [&](std::int64_t document) {
    return static_cast<std::size_t>(
        std::lower_bound(documents.begin(), documents.end(), document) - documents.begin());
  };
  const auto by = [](auto member) {
    return [member](const TileRange* a, const TileRange* b) { return a->*member < b->*member; };
  };
  std::vector<const TileRange*> query_order, key_order;
  for (const TileRange& query : queries) query_order.push_back(&query);
  for (const TileRange& key : keys) key_order.push_back(&key);
  std::sort(query_order.begin(), query_order.end(), by(&TileRange::max_position));
  std::sort(key_order.begin(), key_order.end(), by(&TileRange::min_position));

  PrefixCounter min_documents(documents.size()), max_documents(documents.size());
  std::size_t added = 0;
  Tokens pairs = 0;
  for (const TileRange* query : query_order) {
    for (; added < key_order.size() && key_order[added]->min_position <= query->max_position;
         ++added) {
      min_documents.add(index_of(key_order[added]->min_document));
      max_documents.add(index_of(key_order[added]->max_document));
    }
    // Added keys whose first document is <= the query's last, less those wholly before.
    const std::size_t not_after = static_cast<std::size_t>(
        std::upper_bound(documents.begin(), documents.end(), query->max_document) -
        documents.begin());
    const Tokens before = max_documents.count_below(index_of(query->min_document));
    pairs += min_documents.count_below(not_after) - before;
  }
  return pairs;
}

}  // namespace

std::vector<AttentionBlock> document_blocks(const PackedAttentionCall& call) {
  // The key ranges by document (stable: each document's in span order), looked up per
  // query range.
  std::vector<std::size_t> keys(call.keys.size());
  std::iota(keys.begin(), keys.end(), std::size_t{0});
  std::stable_sort(keys.begin(), keys.end(), [&](std::size_t a, std::size_t b) {
    return call.keys[a].document < call.keys[b].document;
  });
  std::vector<AttentionBlock> blocks;
  for (const DocumentRange& query : call.queries) {
    auto key = std::lower_bound(keys.begin(), keys.end(), query.document,
                                [&](std::size_t k, std::int64_t document) {
                                  return call.keys[k].document < document;
                                });
    for (; key != keys.end() && call.keys[*key].document == query.document; ++key) {
      const DocumentRange& range = call.keys[*key];
      const AttentionBlock block{query.begin, query.end, range.begin, range.end};
      if (causal_pairs(block) > 0) blocks.push_back(block);
    }
  }
  return blocks;
}

Tokens causal_pairs(const PackedAttentionCall& call) {
  if (call.queries.size() == 1 && call.keys.size() == 1) {  // no allocation
    const DocumentRange& query = call.queries.front();
    const DocumentRange& key = call.keys.front();
    if (query.document != key.document) return 0;
    return causal_pairs(AttentionBlock{query.begin, query.end, key.begin, key.end});
  }
  Tokens pairs = 0;
  for (const AttentionBlock& block : document_blocks(call)) pairs += causal_pairs(block);
  return pairs;
}

Tokens packed_tile_pairs(const PackedAttentionCall& call, Tokens tile_tokens) {
  BALLAST_CHECK(tile_tokens >= 1, "tiles hold at least one token");
  if (call.queries.size() == 1 && call.keys.size() == 1) {  // tiles aligned to each range
    const DocumentRange& query = call.queries.front();
    const DocumentRange& key = call.keys.front();
    if (query.document != key.document) return 0;
    return causal_tiles({query.begin, query.end, key.begin, key.end}, tile_tokens);
  }
  const std::vector<TileRange> queries = tile_ranges(call.queries, tile_tokens);
  const std::vector<TileRange> keys = tile_ranges(call.keys, tile_tokens);
  if (queries.empty() || keys.empty()) return 0;
  return count_visible_pairs(queries, keys);
}

}  // namespace ballast
