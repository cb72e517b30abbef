// Runtime kernels: the OpenBLAS sgemm wrapper, the blocked online-softmax attention over
// packed variable-length documents (forward, finalize, backward) and its naive references.
// docs/runtime-kernels.md describes the algorithm, the tolerance and the measured speed.
#include "ballast/runtime/kernels.hpp"

#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ballast/error.hpp"

namespace ballast::runtime {
namespace {

constexpr float kInfinity = std::numeric_limits<float>::infinity();
/// Queries per tile. With the query heads of one KV head stacked, a tile's GEMMs have
/// kQueryTile * (heads / kv_heads) rows.
constexpr int kQueryTile = 64;
/// Keys per tile: the granularity at which the mask is decided (64 wastes little on the
/// diagonal of a causal document and on documents of 64 tokens).
constexpr int kKeyTile = 64;
/// Consecutive unmasked key tiles are merged into one GEMM of up to this many keys.
constexpr int kMaxKeyRun = 512;

// ----------------------------------------------------------------------------------------
// Checks

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

std::size_t head_values(int tokens, int heads, const AttentionShape& shape) {
  return static_cast<std::size_t>(tokens) * heads * shape.head_dim;
}

// ----------------------------------------------------------------------------------------
// Tiles and the mask

/// Documents and positions a tile of consecutive tokens spans: enough to rule out, or rule
/// in, every (query, key) pair of a tile pair without looking at the pairs.
struct TileExtent {
  int begin = 0;
  int end = 0;
  std::int64_t min_doc = 0, max_doc = 0, min_pos = 0, max_pos = 0;
};

std::vector<TileExtent> tile_extents(TokenSpan span, int tile_size) {
  std::vector<TileExtent> tiles;
  for (int begin = 0; begin < span.count; begin += tile_size) {
    TileExtent tile;
    tile.begin = begin;
    tile.end = std::min(span.count, begin + tile_size);
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
  return tiles;
}

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

std::vector<KeyRun> key_runs(const TileExtent& query_tile,
                             const std::vector<TileExtent>& key_tiles) {
  std::vector<KeyRun> runs;
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
  return runs;
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

/// A masked run's bias, or none (bias null) for a run of fully visible tiles. Stacked row r
/// of a head group is token r % tokens of the query tile.
struct Mask {
  const float* bias = nullptr;
  int tokens = 0;
  const float* row(int stacked_row, int count) const {
    return bias == nullptr ? nullptr
                           : bias + static_cast<std::size_t>(stacked_row % tokens) * count;
  }
};

// ----------------------------------------------------------------------------------------
// Row operations on the score rows of a tile, W floats at a time: GCC/Clang vector
// extensions compiled for the x86-64 baseline (SSE2, W = 4) and, chosen at run time, for
// AVX2 (W = 8) and AVX-512 (W = 16). SIMD without -ffast-math or intrinsics.

#define BALLAST_ROWS_INLINE [[gnu::always_inline]] inline

template <int W>
struct VectorTypes;
#define BALLAST_VECTOR_TYPES(width)                                                \
  template <>                                                                      \
  struct VectorTypes<width> {                                                      \
    typedef float Floats __attribute__((vector_size(width * sizeof(float))));      \
    typedef std::int32_t Ints __attribute__((vector_size(width * sizeof(float)))); \
  };
BALLAST_VECTOR_TYPES(4)
BALLAST_VECTOR_TYPES(8)
BALLAST_VECTOR_TYPES(16)

// Every function below is inlined into one instruction set's functions, so the vector
// calling convention -Wpsabi warns about never reaches an ABI boundary (vector
// parameters are references for the same reason: GCC notes them regardless of pragmas).
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

template <int W>
struct Lanes {
  using Floats = typename VectorTypes<W>::Floats;
  using Ints = typename VectorTypes<W>::Ints;

  BALLAST_ROWS_INLINE static Floats load(const float* source) {
    Floats values;
    std::memcpy(&values, source, sizeof values);
    return values;
  }
  BALLAST_ROWS_INLINE static void store(float* target, const Floats& values) {
    std::memcpy(target, &values, sizeof values);
  }
  BALLAST_ROWS_INLINE static Floats broadcast(float value) { return Floats{} + value; }
  /// Lane-wise `mask ? a : b` for a comparison's mask (all bits set or none).
  BALLAST_ROWS_INLINE static Floats select(const Ints& mask, const Floats& a, const Floats& b) {
    return std::bit_cast<Floats>((std::bit_cast<Ints>(a) & mask) |
                                 (std::bit_cast<Ints>(b) & ~mask));
  }

  /// exp(x) without calls or branches: x = n ln2 + r with |r| <= ln2/2 and Cephes' expf
  /// polynomial for exp(r); relative error 8.1e-8 (1.4 ulp) at most over [-87, 0], where
  /// the kernels use it. x below -87 (exp a denormal or 0) and -infinity give 0; NaN
  /// stays NaN.
  BALLAST_ROWS_INLINE static Floats exp(const Floats& x) {
    const Floats low = broadcast(-87.0f), high = broadcast(88.0f);
    Floats clamped = select(x > low, x, low);
    clamped = select(clamped < high, clamped, high);
    const Floats round_magic = broadcast(12582912.0f);  // 1.5 * 2^23: adding it rounds
    const Floats n = (clamped * 1.44269504088896341f + round_magic) - round_magic;
    const Floats r = (clamped - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 in two parts
    Floats p = broadcast(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const Ints two_to_n = (__builtin_convertvector(n, Ints) + 127) << 23;
    const Floats value = select(x < low, Floats{}, p * std::bit_cast<Floats>(two_to_n));
    return select(x != x, x, value);
  }
  BALLAST_ROWS_INLINE static float exp_scalar(float x) { return exp(broadcast(x))[0]; }

  BALLAST_ROWS_INLINE static float max(const float* x, int count) {
    Floats lanes = broadcast(-kInfinity);
    int j = 0;
    for (; j + W <= count; j += W) {
      const Floats values = load(x + j);
      lanes = select(lanes < values, values, lanes);
    }
    float result = -kInfinity;
    for (int lane = 0; lane < W; ++lane) result = std::max(result, lanes[lane]);
    for (; j < count; ++j) result = std::max(result, x[j]);
    return result;
  }

  /// x[j] = exp(x[j] - shift); returns the sum of the new x.
  BALLAST_ROWS_INLINE static float exp_shifted_sum(float* x, int count, float shift) {
    const Floats shifts = broadcast(shift);
    Floats sums{};
    int j = 0;
    for (; j + W <= count; j += W) {
      const Floats values = exp(load(x + j) - shifts);
      store(x + j, values);
      sums += values;
    }
    float result = 0;
    for (int lane = 0; lane < W; ++lane) result += sums[lane];
    for (; j < count; ++j) {
      x[j] = exp_scalar(x[j] - shift);
      result += x[j];
    }
    return result;
  }

  /// Where bias is -infinity, the score becomes -infinity (also a NaN score: masked keys
  /// must not reach the softmax).
  BALLAST_ROWS_INLINE static void apply_bias(float* scores, const float* bias, int count) {
    int j = 0;
    for (; j + W <= count; j += W) {
      const Floats biases = load(bias + j);
      store(scores + j, select(biases == Floats{}, load(scores + j), biases));
    }
    for (; j < count; ++j) scores[j] = bias[j] == 0.0f ? scores[j] : bias[j];
  }

  /// Online softmax over one run of keys: scores [rows, count] become P = exp(s - new max);
  /// row_max, row_sum and out [rows, dim] are rescaled to the new maxima.
  BALLAST_ROWS_INLINE static void softmax_update(float* scores, int rows, int count, Mask mask,
                                                 float* row_max, float* row_sum, float* out,
                                                 int dim) {
    for (int row = 0; row < rows; ++row) {
      float* p = scores + static_cast<std::size_t>(row) * count;
      if (mask.bias != nullptr) apply_bias(p, mask.row(row, count), count);
      const float new_max = std::max(row_max[row], max(p, count));
      if (new_max == -kInfinity) {  // nothing visible yet: P = 0, state unchanged
        std::fill_n(p, count, 0.0f);
        continue;
      }
      const float correction = exp_scalar(row_max[row] - new_max);  // 0 when the old max is -inf
      row_sum[row] = row_sum[row] * correction + exp_shifted_sum(p, count, new_max);
      row_max[row] = new_max;
      if (correction == 1.0f) continue;
      float* out_row = out + static_cast<std::size_t>(row) * dim;
      for (int d = 0; d < dim; ++d) out_row[d] *= correction;
    }
  }

  /// P = exp(s - lse) in place over scores [rows, count]; rows with lse -inf (queries that
  /// see no key at all) are 0.
  BALLAST_ROWS_INLINE static void probabilities(float* scores, int rows, int count, Mask mask,
                                                const float* lse) {
    for (int row = 0; row < rows; ++row) {
      float* p = scores + static_cast<std::size_t>(row) * count;
      if (lse[row] == -kInfinity) {
        std::fill_n(p, count, 0.0f);
        continue;
      }
      if (mask.bias != nullptr) apply_bias(p, mask.row(row, count), count);
      exp_shifted_sum(p, count, lse[row]);
    }
  }

  /// dS = P (dP - delta) in place over d_scores (holding dP) [rows, count].
  BALLAST_ROWS_INLINE static void score_gradients(float* d_scores, const float* p, int rows,
                                                  int count, const float* delta) {
    for (int row = 0; row < rows; ++row) {
      const std::size_t begin = static_cast<std::size_t>(row) * count, end = begin + count;
      std::size_t j = begin;
      const Floats row_delta = broadcast(delta[row]);
      for (; j + W <= end; j += W)
        store(d_scores + j, load(p + j) * (load(d_scores + j) - row_delta));
      for (; j < end; ++j) d_scores[j] = p[j] * (d_scores[j] - delta[row]);
    }
  }
};

/// The row operations for one instruction set.
struct RowKernels {
  void (*softmax_update)(float* scores, int rows, int count, Mask mask, float* row_max,
                         float* row_sum, float* out, int dim);
  void (*probabilities)(float* scores, int rows, int count, Mask mask, const float* lse);
  void (*score_gradients)(float* d_scores, const float* p, int rows, int count, const float* delta);
};

// Out-of-line instances: the target attribute must sit on the functions Lanes<W> inlines into.
#define BALLAST_ROW_KERNELS(name, width, ...)                                                \
  __VA_ARGS__ void name##_softmax_update(float* s, int rows, int count, Mask mask, float* m, \
                                         float* l, float* o, int dim) {                      \
    Lanes<width>::softmax_update(s, rows, count, mask, m, l, o, dim);                        \
  }                                                                                          \
  __VA_ARGS__ void name##_probabilities(float* s, int rows, int count, Mask mask,            \
                                        const float* lse) {                                  \
    Lanes<width>::probabilities(s, rows, count, mask, lse);                                  \
  }                                                                                          \
  __VA_ARGS__ void name##_score_gradients(float* d, const float* p, int rows, int count,     \
                                          const float* delta) {                              \
    Lanes<width>::score_gradients(d, p, rows, count, delta);                                 \
  }                                                                                          \
  constexpr RowKernels name##_kernels{name##_softmax_update, name##_probabilities,           \
                                      name##_score_gradients};

BALLAST_ROW_KERNELS(baseline, 4)
#if defined(__x86_64__) && defined(__GNUC__)
BALLAST_ROW_KERNELS(avx2, 8, __attribute__((target("avx2,fma"))))
BALLAST_ROW_KERNELS(avx512, 16, __attribute__((target("avx512f"))))
#endif

/// The widest row kernels the CPU runs, or those BALLAST_KERNEL_SIMD names (baseline,
/// avx2, avx512; for tests and comparisons) if the CPU runs them.
const RowKernels& row_kernels() {
#if defined(__x86_64__) && defined(__GNUC__)
  const char* requested = std::getenv("BALLAST_KERNEL_SIMD");
  const std::string name = requested != nullptr ? requested : "";
  const bool avx512 = __builtin_cpu_supports("avx512f") && (name.empty() || name == "avx512");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    (name.empty() || name == "avx512" || name == "avx2");
  if (avx512) return avx512_kernels;
  if (avx2) return avx2_kernels;
#endif
  return baseline_kernels;
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

/// Scratch of one call, sized for the largest tile.
struct Scratch {
  const RowKernels& row = row_kernels();
  std::vector<float> q, o, d_o, d_q;                ///< [heads, tile tokens, head_dim]
  std::vector<float> row_max, row_sum, lse, delta;  ///< [heads, tile tokens]
  std::vector<float> scores, d_scores;              ///< [group * tile tokens, kMaxKeyRun]
  std::vector<float> bias;                          ///< [tile tokens, kKeyTile]
  Scratch(const AttentionShape& shape, bool backward) {
    const std::size_t head_rows = static_cast<std::size_t>(kQueryTile) * shape.heads;
    const std::size_t group_rows =
        static_cast<std::size_t>(kQueryTile) * (shape.heads / shape.kv_heads);
    q.resize(head_rows * shape.head_dim);
    scores.resize(group_rows * kMaxKeyRun);
    bias.resize(static_cast<std::size_t>(kQueryTile) * kKeyTile);
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
  check_shape(shape);
  check_span(queries);
  check_span(keys);
  BALLAST_CHECK(
      accumulator.out.size() == head_values(queries.count, shape.heads, shape) &&
          accumulator.max.size() == static_cast<std::size_t>(queries.count) * shape.heads &&
          accumulator.sum.size() == accumulator.max.size(),
      "accumulator not reset for these queries and shape");
  if (queries.count == 0 || keys.count == 0) return;
  const std::vector<TileExtent> key_tiles = tile_extents(keys, kKeyTile);
  Scratch scratch(shape, false);
  for (const TileExtent& query_tile : tile_extents(queries, kQueryTile)) {
    const std::vector<KeyRun> runs = key_runs(query_tile, key_tiles);
    if (!runs.empty())
      forward_tile(shape, query_tile, q, queries, k, v, keys, runs, accumulator, scratch);
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
  check_shape(shape);
  check_span(queries);
  check_span(keys);
  if (queries.count == 0 || keys.count == 0) return;
  const BackwardInputs inputs{q, d_out, lse, delta, queries, k, v, keys};
  const std::vector<TileExtent> key_tiles = tile_extents(keys, kKeyTile);
  Scratch scratch(shape, true);
  for (const TileExtent& query_tile : tile_extents(queries, kQueryTile)) {
    const std::vector<KeyRun> runs = key_runs(query_tile, key_tiles);
    if (!runs.empty()) backward_tile(shape, query_tile, inputs, runs, d_q, d_k, d_v, scratch);
  }
}

// ----------------------------------------------------------------------------------------
// References: every score materialised, double accumulation.

namespace {

/// Probabilities of one (query, head) over all keys (0 where masked) in double; false if
/// the query sees no key.
bool reference_probabilities(const AttentionShape& shape, const float* q, TokenSpan queries,
                             const float* k, TokenSpan keys, int query, int head,
                             std::vector<double>& probabilities) {
  const int dim = shape.head_dim;
  const int kv_head = head / (shape.heads / shape.kv_heads);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  const float* q_row = q + (static_cast<std::size_t>(query) * shape.heads + head) * dim;
  probabilities.assign(keys.count, 0.0);
  double max_score = -std::numeric_limits<double>::infinity();
  std::vector<char> visible(keys.count, 0);
  for (int key = 0; key < keys.count; ++key) {
    if (keys.doc[key] != queries.doc[query] || keys.pos[key] > queries.pos[query]) continue;
    const float* k_row = k + (static_cast<std::size_t>(key) * shape.kv_heads + kv_head) * dim;
    double dot = 0;
    for (int d = 0; d < dim; ++d) dot += static_cast<double>(q_row[d]) * k_row[d];
    probabilities[key] = dot * scale;
    visible[key] = 1;
    max_score = std::max(max_score, dot * scale);
  }
  if (max_score == -std::numeric_limits<double>::infinity()) return false;
  double sum = 0;
  for (int key = 0; key < keys.count; ++key) {
    probabilities[key] = visible[key] ? std::exp(probabilities[key] - max_score) : 0.0;
    sum += probabilities[key];
  }
  for (double& probability : probabilities) probability /= sum;
  return true;
}

}  // namespace

void attention_reference_forward(const AttentionShape& shape, const float* q, TokenSpan queries,
                                 const float* k, const float* v, TokenSpan keys, float* out) {
  check_shape(shape);
  check_span(queries);
  check_span(keys);
  const int dim = shape.head_dim;
  const int group = shape.heads / shape.kv_heads;
  std::vector<double> probabilities;
  std::vector<double> row(dim);
  for (int query = 0; query < queries.count; ++query) {
    for (int head = 0; head < shape.heads; ++head) {
      std::fill(row.begin(), row.end(), 0.0);
      if (reference_probabilities(shape, q, queries, k, keys, query, head, probabilities)) {
        for (int key = 0; key < keys.count; ++key) {
          if (probabilities[key] == 0.0) continue;
          const float* v_row =
              v + (static_cast<std::size_t>(key) * shape.kv_heads + head / group) * dim;
          for (int d = 0; d < dim; ++d) row[d] += probabilities[key] * v_row[d];
        }
      }
      float* target = out + (static_cast<std::size_t>(query) * shape.heads + head) * dim;
      for (int d = 0; d < dim; ++d) target[d] = static_cast<float>(row[d]);
    }
  }
}

void attention_reference_backward(const AttentionShape& shape, const float* q, const float* d_out,
                                  TokenSpan queries, const float* k, const float* v, TokenSpan keys,
                                  float* d_q, float* d_k, float* d_v) {
  check_shape(shape);
  check_span(queries);
  check_span(keys);
  const int dim = shape.head_dim;
  const int group = shape.heads / shape.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  std::vector<double> d_k_sum(head_values(keys.count, shape.kv_heads, shape), 0.0);
  std::vector<double> d_v_sum(d_k_sum.size(), 0.0);
  std::vector<double> probabilities, d_scores(keys.count), d_q_row(dim);
  for (int query = 0; query < queries.count; ++query) {
    for (int head = 0; head < shape.heads; ++head) {
      const std::size_t q_offset = (static_cast<std::size_t>(query) * shape.heads + head) * dim;
      std::fill(d_q_row.begin(), d_q_row.end(), 0.0);
      if (reference_probabilities(shape, q, queries, k, keys, query, head, probabilities)) {
        // dP_j = dO . v_j; delta = sum_j P_j dP_j; dS_j = P_j (dP_j - delta).
        double delta = 0;
        for (int key = 0; key < keys.count; ++key) {
          d_scores[key] = 0;
          if (probabilities[key] == 0.0) continue;
          const float* v_row =
              v + (static_cast<std::size_t>(key) * shape.kv_heads + head / group) * dim;
          double dot = 0;
          for (int d = 0; d < dim; ++d) dot += static_cast<double>(d_out[q_offset + d]) * v_row[d];
          d_scores[key] = dot;
          delta += probabilities[key] * dot;
        }
        for (int key = 0; key < keys.count; ++key) {
          if (probabilities[key] == 0.0) continue;
          const double d_score = probabilities[key] * (d_scores[key] - delta) * scale;
          const std::size_t kv_offset =
              (static_cast<std::size_t>(key) * shape.kv_heads + head / group) * dim;
          for (int d = 0; d < dim; ++d) {
            d_q_row[d] += d_score * k[kv_offset + d];
            d_k_sum[kv_offset + d] += d_score * q[q_offset + d];
            d_v_sum[kv_offset + d] += probabilities[key] * d_out[q_offset + d];
          }
        }
      }
      for (int d = 0; d < dim; ++d) d_q[q_offset + d] = static_cast<float>(d_q_row[d]);
    }
  }
  for (std::size_t i = 0; i < d_k_sum.size(); ++i) {
    d_k[i] = static_cast<float>(d_k_sum[i]);
    d_v[i] = static_cast<float>(d_v_sum[i]);
  }
}

}  // namespace ballast::runtime
