// Runtime kernels: the OpenBLAS sgemm wrapper and the blocked online-softmax attention over
// packed variable-length documents (forward, finalize, backward), tile by tile.
// docs/runtime-kernels.md describes the algorithm, the tolerance and the measured speed.
#include "ballast/runtime/kernels.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "ballast/error.hpp"
#include "kernels_internal.hpp"

namespace ballast::runtime {

namespace kernels_detail {

void check_shape(const AttentionShape& shape) {
  BALLAST_CHECK(shape.heads > 0 && shape.kv_heads > 0 && shape.head_dim > 0,
                "attention shape must be positive");
  BALLAST_CHECK(shape.heads % shape.kv_heads == 0, "kv_heads must divide heads");
}

void check_span(TokenSpan span) {
  BALLAST_CHECK(span.count >= 0, "token span count must not be negative");
  BALLAST_CHECK(span.count == 0 || (span.doc != nullptr && span.pos != nullptr),
                "token span without doc/pos arrays");
}

}  // namespace kernels_detail

using namespace kernels_detail;

namespace {

/// Queries per tile. With the query heads of one KV head stacked, a tile's GEMMs have
/// kQueryTile * (heads / kv_heads) rows.
constexpr int kQueryTile = kAttentionTileTokens;
/// Keys per tile: the granularity at which the mask is decided (64 wastes little on the
/// diagonal of a causal document and on documents of 64 tokens).
constexpr int kKeyTile = kAttentionTileTokens;
/// Consecutive unmasked key tiles are merged into one GEMM of up to this many keys.
constexpr int kMaxKeyRun = 512;

// ----------------------------------------------------------------------------------------
// Tiles and the mask

/// Documents and positions a tile of consecutive tokens spans: enough to rule out, or rule
/// in, every (query, key) pair of a tile pair without looking at the pairs.
using TileExtent = TokenTiles::Tile;

enum class Visibility { none, all, some };

/// Conservative: `none` and `all` are exact claims, `some` means "mask per element".
Visibility tile_visibility(const TileExtent& queries, const TileExtent& keys) {
  if (queries.max_doc < keys.min_doc || keys.max_doc < queries.min_doc) return Visibility::none;
  if (keys.min_pos > queries.max_pos) return Visibility::none;
  // One document on each side and the ranges overlap: the same document.
  const bool one_document = queries.min_doc == queries.max_doc && keys.min_doc == keys.max_doc;
  if (one_document && keys.max_pos <= queries.min_pos) return Visibility::all;
  return Visibility::some;
}

/// Keys [begin, end) one query tile processes in one step: a masked key tile, or a run of
/// consecutive fully visible key tiles.
struct KeyRun {
  int begin = 0;
  int end = 0;
  bool masked = false;
};

/// The runs of one query tile, into `runs` (cleared first: one vector serves every tile).
void key_runs(const TileExtent& query_tile, const std::vector<TileExtent>& key_tiles,
              std::vector<KeyRun>& runs) {
  runs.clear();
  for (const TileExtent& key_tile : key_tiles) {
    const Visibility visibility = tile_visibility(query_tile, key_tile);
    if (visibility == Visibility::none) continue;
    const bool masked = visibility == Visibility::some;
    if (!masked && !runs.empty() && !runs.back().masked && runs.back().end == key_tile.begin &&
        key_tile.end - runs.back().begin <= kMaxKeyRun) {
      runs.back().end = key_tile.end;
    } else {
      runs.push_back({key_tile.begin, key_tile.end, masked});
    }
  }
}

/// The mask of a masked run as a bias [query tile tokens, run keys]: 0 where the key is
/// visible, -infinity where not. Computed once per (query tile, run), used by every head.
void build_bias(TokenSpan queries, const TileExtent& tile, TokenSpan keys, const KeyRun& run,
                float* bias) {
  const int count = run.end - run.begin;
  for (int query = tile.begin; query < tile.end; ++query) {
    float* row = bias + static_cast<std::size_t>(query - tile.begin) * count;
    for (int j = 0; j < count; ++j) {
      const int key = run.begin + j;
      const bool visible =
          keys.doc[key] == queries.doc[query] && keys.pos[key] <= queries.pos[query];
      row[j] = visible ? 0.0f : -kInfinity;
    }
  }
}


// ----------------------------------------------------------------------------------------
// One query tile against its key runs, every head

/// A query tile's rows of a [tokens, heads, head_dim] tensor, packed head-major as [heads,
/// tokens, head_dim]: the query heads of KV head g (heads g * group ...) are then one matrix
/// of group * tokens rows, and one GEMM covers them all.
struct TileLayout {
  int first_token = 0;
  int tokens = 0;
  int heads = 1;
  int head_dim = 1;
  std::size_t source(int head, int token) const {  ///< index in [tokens, heads] of the call
    return static_cast<std::size_t>(first_token + token) * heads + head;
  }
  std::size_t packed(int head, int token) const {
    return static_cast<std::size_t>(head) * tokens + token;
  }
};

void pack(const TileLayout& t, const float* source, float* packed) {
  for (int h = 0; h < t.heads; ++h) {
    for (int i = 0; i < t.tokens; ++i) {
      std::copy_n(source + t.source(h, i) * t.head_dim, t.head_dim,
                  packed + t.packed(h, i) * t.head_dim);
    }
  }
}

void unpack(const TileLayout& t, const float* packed, float* target, bool add) {
  for (int h = 0; h < t.heads; ++h) {
    for (int i = 0; i < t.tokens; ++i) {
      const float* row = packed + t.packed(h, i) * t.head_dim;
      float* out = target + t.source(h, i) * t.head_dim;
      for (int d = 0; d < t.head_dim; ++d) out[d] = add ? out[d] + row[d] : row[d];
    }
  }
}

/// Per-(token, head) values ([tokens, heads] in the call) packed as [heads, tokens].
void pack_values(const TileLayout& t, const float* source, float* packed) {
  for (int h = 0; h < t.heads; ++h) {
    for (int i = 0; i < t.tokens; ++i) packed[t.packed(h, i)] = source[t.source(h, i)];
  }
}

void unpack_values(const TileLayout& t, const float* packed, float* target) {
  for (int h = 0; h < t.heads; ++h) {
    for (int i = 0; i < t.tokens; ++i) target[t.source(h, i)] = packed[t.packed(h, i)];
  }
}

/// Floats that are not zeroed when allocated: every use below writes before it reads, so a
/// call's scratch (up to a megabyte of score rows) costs an allocation, not a pass over it.
class Floats {
 public:
  void resize(std::size_t size) {
    values_ = std::make_unique_for_overwrite<float[]>(size);
    size_ = size;
  }
  float* data() { return values_.get(); }
  float* begin() { return values_.get(); }
  float* end() { return values_.get() + size_; }

 private:
  std::unique_ptr<float[]> values_;
  std::size_t size_ = 0;
};

/// Scratch of one call, sized for the largest tile.
struct Scratch {
  const RowKernels& row = row_kernels();
  Floats q, o, d_o, d_q;                ///< [heads, tile tokens, head_dim]
  Floats row_max, row_sum, lse, delta;  ///< [heads, tile tokens]
  Floats scores, d_scores;              ///< [group * tile tokens, kMaxKeyRun]
  Floats bias;                          ///< [tile tokens, kKeyTile]
  std::vector<KeyRun> runs;             ///< of the current query tile
  Scratch(const AttentionShape& shape, bool backward) {
    const std::size_t head_rows = static_cast<std::size_t>(kQueryTile) * shape.heads;
    const std::size_t group_rows =
        static_cast<std::size_t>(kQueryTile) * (shape.heads / shape.kv_heads);
    q.resize(head_rows * shape.head_dim);
    scores.resize(group_rows * kMaxKeyRun);
    bias.resize(static_cast<std::size_t>(kQueryTile) * kKeyTile);
    runs.reserve(16);
    if (backward) {
      d_o.resize(head_rows * shape.head_dim);
      d_q.resize(head_rows * shape.head_dim);
      lse.resize(head_rows);
      delta.resize(head_rows);
      d_scores.resize(group_rows * kMaxKeyRun);
    } else {
      o.resize(head_rows * shape.head_dim);
      row_max.resize(head_rows);
      row_sum.resize(head_rows);
    }
  }
};

/// What a tile's GEMMs need of one KV head: its rows in the packed tile and its keys.
struct KvHead {
  int group_rows = 0;          ///< query heads of this KV head x tile tokens
  std::size_t packed_row = 0;  ///< first packed row of its query heads
  std::size_t kv_offset = 0;   ///< of (run's first key, this KV head) in k, v, d_k, d_v
  int kv_stride = 0;           ///< kv_heads * head_dim
};

KvHead kv_head_of(const AttentionShape& shape, const TileLayout& t, int kv_head,
                  const KeyRun& run) {
  const int group = shape.heads / shape.kv_heads;
  return {group * t.tokens, static_cast<std::size_t>(kv_head) * group * t.tokens,
          (static_cast<std::size_t>(run.begin) * shape.kv_heads + kv_head) * shape.head_dim,
          shape.kv_heads * shape.head_dim};
}

Mask run_mask(TokenSpan queries, const TileExtent& tile, TokenSpan keys, const KeyRun& run,
              Scratch& scratch) {
  if (!run.masked) return {};
  build_bias(queries, tile, keys, run, scratch.bias.data());
  return {scratch.bias.data(), tile.end - tile.begin};
}

void forward_tile(const AttentionShape& shape, const TileExtent& tile, const float* q,
                  TokenSpan queries, const float* k, const float* v, TokenSpan keys,
                  const std::vector<KeyRun>& runs, AttentionAccumulator& accumulator,
                  Scratch& scratch) {
  const TileLayout t{tile.begin, tile.end - tile.begin, shape.heads, shape.head_dim};
  pack(t, q, scratch.q.data());
  pack(t, accumulator.out.data(), scratch.o.data());
  pack_values(t, accumulator.max.data(), scratch.row_max.data());
  pack_values(t, accumulator.sum.data(), scratch.row_sum.data());
  const int dim = shape.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  for (const KeyRun& run : runs) {
    const int count = run.end - run.begin;
    const Mask mask = run_mask(queries, tile, keys, run, scratch);
    for (int kv_head = 0; kv_head < shape.kv_heads; ++kv_head) {
      const KvHead h = kv_head_of(shape, t, kv_head, run);
      float* out = scratch.o.data() + h.packed_row * dim;
      gemm(false, true, h.group_rows, count, dim, scale, scratch.q.data() + h.packed_row * dim, dim,
           k + h.kv_offset, h.kv_stride, 0.0f, scratch.scores.data(), count);
      scratch.row.softmax_update(scratch.scores.data(), h.group_rows, count, mask,
                                 scratch.row_max.data() + h.packed_row,
                                 scratch.row_sum.data() + h.packed_row, out, dim);
      gemm(false, false, h.group_rows, dim, count, 1.0f, scratch.scores.data(), count,
           v + h.kv_offset, h.kv_stride, 1.0f, out, dim);
    }
  }
  unpack(t, scratch.o.data(), accumulator.out.data(), false);
  unpack_values(t, scratch.row_max.data(), accumulator.max.data());
  unpack_values(t, scratch.row_sum.data(), accumulator.sum.data());
}

struct BackwardInputs {
  const float* q;
  const float* d_out;
  const float* lse;
  const float* delta;
  TokenSpan queries;
  const float* k;
  const float* v;
  TokenSpan keys;
};

/// Adds the tile's gradients to d_q, d_k and d_v.
void backward_tile(const AttentionShape& shape, const TileExtent& tile, const BackwardInputs& in,
                   const std::vector<KeyRun>& runs, float* d_q, float* d_k, float* d_v,
                   Scratch& scratch) {
  const TileLayout t{tile.begin, tile.end - tile.begin, shape.heads, shape.head_dim};
  pack(t, in.q, scratch.q.data());
  pack(t, in.d_out, scratch.d_o.data());
  pack_values(t, in.lse, scratch.lse.data());
  pack_values(t, in.delta, scratch.delta.data());
  std::fill(scratch.d_q.begin(), scratch.d_q.end(), 0.0f);
  const int dim = shape.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  float* p = scratch.scores.data();
  float* d_s = scratch.d_scores.data();
  for (const KeyRun& run : runs) {
    const int count = run.end - run.begin;
    const Mask mask = run_mask(in.queries, tile, in.keys, run, scratch);
    for (int kv_head = 0; kv_head < shape.kv_heads; ++kv_head) {
      const KvHead h = kv_head_of(shape, t, kv_head, run);
      const float* q_rows = scratch.q.data() + h.packed_row * dim;
      const float* d_o_rows = scratch.d_o.data() + h.packed_row * dim;
      gemm(false, true, h.group_rows, count, dim, scale, q_rows, dim, in.k + h.kv_offset,
           h.kv_stride, 0.0f, p, count);
      scratch.row.probabilities(p, h.group_rows, count, mask, scratch.lse.data() + h.packed_row);
      // dV += P^T dO;  dP = dO V^T;  dS = P (dP - delta);  dQ += dS K scale;  dK += dS^T Q scale.
      gemm(true, false, count, dim, h.group_rows, 1.0f, p, count, d_o_rows, dim, 1.0f,
           d_v + h.kv_offset, h.kv_stride);
      gemm(false, true, h.group_rows, count, dim, 1.0f, d_o_rows, dim, in.v + h.kv_offset,
           h.kv_stride, 0.0f, d_s, count);
      scratch.row.score_gradients(d_s, p, h.group_rows, count, scratch.delta.data() + h.packed_row);
      gemm(false, false, h.group_rows, dim, count, scale, d_s, count, in.k + h.kv_offset,
           h.kv_stride, 1.0f, scratch.d_q.data() + h.packed_row * dim, dim);
      gemm(true, false, count, dim, h.group_rows, scale, d_s, count, q_rows, dim, 1.0f,
           d_k + h.kv_offset, h.kv_stride);
    }
  }
  unpack(t, scratch.d_q.data(), d_q, true);
}


}  // namespace

// ----------------------------------------------------------------------------------------
// GEMM

void gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  BALLAST_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm sizes must not be negative");
  if (m == 0 || n == 0) return;
  BALLAST_CHECK(ldc >= n, "gemm ldc must be at least n");
  if (k == 0) {  // C = beta C; BLAS would also accept it, but lda/ldb may then be 0.
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        float& value = c[static_cast<std::size_t>(i) * ldc + j];
        value = beta == 0.0f ? 0.0f : beta * value;
      }
    }
    return;
  }
  BALLAST_CHECK(lda >= (transpose_a ? m : k), "gemm lda must be at least op(A)'s stored row");
  BALLAST_CHECK(ldb >= (transpose_b ? k : n), "gemm ldb must be at least op(B)'s stored row");
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
              ldc);
}

// ----------------------------------------------------------------------------------------
// Attention

TokenTiles::TokenTiles(TokenSpan token_span) : span(token_span) {
  check_span(span);
  tiles.reserve(static_cast<std::size_t>((span.count + kAttentionTileTokens - 1) /
                                         kAttentionTileTokens));
  for (int begin = 0; begin < span.count; begin += kAttentionTileTokens) {
    Tile tile;
    tile.begin = begin;
    tile.end = std::min(span.count, begin + kAttentionTileTokens);
    tile.min_doc = tile.max_doc = span.doc[begin];
    tile.min_pos = tile.max_pos = span.pos[begin];
    for (int t = begin + 1; t < tile.end; ++t) {
      tile.min_doc = std::min(tile.min_doc, span.doc[t]);
      tile.max_doc = std::max(tile.max_doc, span.doc[t]);
      tile.min_pos = std::min(tile.min_pos, span.pos[t]);
      tile.max_pos = std::max(tile.max_pos, span.pos[t]);
    }
    tiles.push_back(tile);
  }
}

void AttentionAccumulator::reset(int query_count, const AttentionShape& shape) {
  check_shape(shape);
  BALLAST_CHECK(query_count >= 0, "query count must not be negative");
  out.assign(head_values(query_count, shape.heads, shape), 0.0f);
  max.assign(static_cast<std::size_t>(query_count) * shape.heads, -kInfinity);
  sum.assign(static_cast<std::size_t>(query_count) * shape.heads, 0.0f);
}

void attention_forward_accumulate(const AttentionShape& shape, const float* q, TokenSpan queries,
                                  const float* k, const float* v, TokenSpan keys,
                                  AttentionAccumulator& accumulator) {
  attention_forward_accumulate(shape, q, TokenTiles(queries), k, v, TokenTiles(keys), accumulator);
}

void attention_forward_accumulate(const AttentionShape& shape, const float* q,
                                  const TokenTiles& query_tiles, const float* k, const float* v,
                                  const TokenTiles& key_tiles, AttentionAccumulator& accumulator) {
  const TokenSpan queries = query_tiles.span, keys = key_tiles.span;
  check_shape(shape);
  check_span(queries);
  check_span(keys);
  BALLAST_CHECK(
      accumulator.out.size() == head_values(queries.count, shape.heads, shape) &&
          accumulator.max.size() == static_cast<std::size_t>(queries.count) * shape.heads &&
          accumulator.sum.size() == accumulator.max.size(),
      "accumulator not reset for these queries and shape");
  if (queries.count == 0 || keys.count == 0) return;
  Scratch scratch(shape, false);
  for (const TileExtent& query_tile : query_tiles.tiles) {
    key_runs(query_tile, key_tiles.tiles, scratch.runs);
    if (!scratch.runs.empty()) {
      forward_tile(shape, query_tile, q, queries, k, v, keys, scratch.runs, accumulator, scratch);
    }
  }
}

void attention_forward_finalize(const AttentionShape& shape,
                                const AttentionAccumulator& accumulator, float* out, float* lse) {
  check_shape(shape);
  const std::size_t rows = accumulator.sum.size();
  BALLAST_CHECK(accumulator.max.size() == rows &&
                    accumulator.out.size() == rows * static_cast<std::size_t>(shape.head_dim),
                "accumulator sizes do not match the shape");
  const int dim = shape.head_dim;
  for (std::size_t row = 0; row < rows; ++row) {
    const float sum = accumulator.sum[row];
    const float* in = accumulator.out.data() + row * dim;
    float* target = out + row * dim;
    if (sum == 0.0f) {  // no visible key (a NaN sum falls through and stays visible)
      std::fill_n(target, dim, 0.0f);
      lse[row] = -kInfinity;
      continue;
    }
    const float inverse = 1.0f / sum;
    for (int d = 0; d < dim; ++d) target[d] = in[d] * inverse;
    lse[row] = accumulator.max[row] + std::log(sum);
  }
}

void attention_backward_delta(const AttentionShape& shape, int query_count, const float* out,
                              const float* d_out, float* delta) {
  check_shape(shape);
  BALLAST_CHECK(query_count >= 0, "query count must not be negative");
  const std::size_t rows = static_cast<std::size_t>(query_count) * shape.heads;
  for (std::size_t row = 0; row < rows; ++row) {
    double sum = 0;
    for (int d = 0; d < shape.head_dim; ++d) {
      sum += static_cast<double>(out[row * shape.head_dim + d]) * d_out[row * shape.head_dim + d];
    }
    delta[row] = static_cast<float>(sum);
  }
}

void attention_backward_accumulate(const AttentionShape& shape, const float* q, const float* d_out,
                                   const float* lse, const float* delta, TokenSpan queries,
                                   const float* k, const float* v, TokenSpan keys, float* d_q,
                                   float* d_k, float* d_v) {
  attention_backward_accumulate(shape, q, d_out, lse, delta, TokenTiles(queries), k, v,
                                TokenTiles(keys), d_q, d_k, d_v);
}

void attention_backward_accumulate(const AttentionShape& shape, const float* q, const float* d_out,
                                   const float* lse, const float* delta,
                                   const TokenTiles& query_tiles, const float* k, const float* v,
                                   const TokenTiles& key_tiles, float* d_q, float* d_k,
                                   float* d_v) {
  const TokenSpan queries = query_tiles.span, keys = key_tiles.span;
  check_shape(shape);
  check_span(queries);
  check_span(keys);
  if (queries.count == 0 || keys.count == 0) return;
  const BackwardInputs inputs{q, d_out, lse, delta, queries, k, v, keys};
  Scratch scratch(shape, true);
  for (const TileExtent& query_tile : query_tiles.tiles) {
    key_runs(query_tile, key_tiles.tiles, scratch.runs);
    if (!scratch.runs.empty()) {
      backward_tile(shape, query_tile, inputs, scratch.runs, d_q, d_k, d_v, scratch);
    }
  }
}

std::int64_t attention_tile_pairs(TokenSpan queries, TokenSpan keys) {
  check_span(queries);
  check_span(keys);
  if (queries.count == 0 || keys.count == 0) return 0;
  // The forward and backward loops above: every key tile of every run of every query tile.
  const TokenTiles query_tiles(queries), key_tiles(keys);
  std::vector<KeyRun> runs;
  std::int64_t pairs = 0;
  for (const TileExtent& query_tile : query_tiles.tiles) {
    key_runs(query_tile, key_tiles.tiles, runs);
    for (const KeyRun& run : runs) {
      pairs += (run.end - run.begin + kKeyTile - 1) / kKeyTile;  // runs start on a tile
    }
  }
  return pairs;
}

}  // namespace ballast::runtime
