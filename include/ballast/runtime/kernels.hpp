// CPU kernels of the runtime: single-precision GEMM through OpenBLAS and a blocked,
// online-softmax (FlashAttention-style) causal attention over packed variable-length
// documents, forward and backward, in a form that composes across KV blocks (ring
// attention adds one visiting KV block at a time). Naive references for the tests.
#pragma once

#include <cstdint>
#include <vector>

namespace ballast::runtime {

/// Row-major C = alpha * op(A) * op(B) + beta * C through OpenBLAS (cblas_sgemm);
/// op(A) is m x k, op(B) is k x n; lda/ldb/ldc are the row strides of A, B, C as stored.
void gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc);

/// Head layout of one attention call. Query head h uses KV head h / (heads / kv_heads)
/// (grouped-query attention); kv_heads divides heads.
struct AttentionShape {
  int heads = 1;
  int kv_heads = 1;
  int head_dim = 1;
};

/// Which document and position each token of a block holds. Key j is visible to query i
/// iff doc[j] == doc[i] and pos[j] <= pos[i] (causal inside a document, nothing across
/// documents); positions are the tokens' indices inside their document.
struct TokenSpan {
  const std::int64_t* doc = nullptr;
  const std::int64_t* pos = nullptr;
  int count = 0;
};

/// Tokens per tile: the kernels cut queries and keys alike into tiles of this many
/// consecutive tokens (in the span's order).
inline constexpr int kAttentionTileTokens = 64;

/// A TokenSpan cut into the kernels' tiles, each with the range of its documents and
/// positions: what an attention call derives from its query and key spans to decide which
/// tile pairs to compute. Built once, it stands for the span in any number of calls (a
/// ring's steps and every layer reuse the tiles of their blocks) instead of being rebuilt
/// by each. The span's arrays must outlive it.
struct TokenTiles {
  struct Tile {
    int begin = 0;  ///< tokens [begin, end) of the span
    int end = 0;
    std::int64_t min_doc = 0, max_doc = 0, min_pos = 0, max_pos = 0;
  };
  TokenSpan span;
  std::vector<Tile> tiles;
  TokenTiles() = default;
  explicit TokenTiles(TokenSpan span);
};

/// Running online-softmax state for nq queries: unnormalised output [nq, heads, head_dim],
/// running row maximum and row sum of exp(score - max) [nq, heads], scores scaled by
/// 1/sqrt(head_dim).
struct AttentionAccumulator {
  std::vector<float> out;
  std::vector<float> max;
  std::vector<float> sum;
  /// Zero output and sum, maximum -infinity.
  void reset(int query_count, const AttentionShape& shape);
};

/// Adds keys/values k, v ([nk, kv_heads, head_dim]) to the accumulator of queries q
/// ([nq, heads, head_dim]). Tiled (blocks of queries x keys), tiles the mask empties are
/// skipped; GEMMs for the tile scores and the P*V product. Any order of key blocks gives
/// the same result up to rounding.
void attention_forward_accumulate(const AttentionShape& shape, const float* q, TokenSpan queries,
                                  const float* k, const float* v, TokenSpan keys,
                                  AttentionAccumulator& accumulator);
/// The same with the tiles of both spans built by the caller (TokenTiles).
void attention_forward_accumulate(const AttentionShape& shape, const float* q,
                                  const TokenTiles& queries, const float* k, const float* v,
                                  const TokenTiles& keys, AttentionAccumulator& accumulator);

/// out = accumulator.out / sum, lse = max + log(sum) per (query, head); a query that saw no
/// visible key gets out 0 and lse -infinity.
void attention_forward_finalize(const AttentionShape& shape, const AttentionAccumulator& accumulator,
                                float* out, float* lse);

/// delta[i, h] = sum over head_dim of d_out * out (FlashAttention's D), [nq, heads].
void attention_backward_delta(const AttentionShape& shape, int query_count, const float* out,
                              const float* d_out, float* delta);

/// Backward of one (queries, keys) block pair, given the final lse and delta of the
/// queries: accumulates (+=) d_q [nq, heads, head_dim], d_k and d_v [nk, kv_heads,
/// head_dim]. Summing it over every key block of the queries gives the exact gradients.
void attention_backward_accumulate(const AttentionShape& shape, const float* q, const float* d_out,
                                   const float* lse, const float* delta, TokenSpan queries,
                                   const float* k, const float* v, TokenSpan keys, float* d_q,
                                   float* d_k, float* d_v);
/// The same with the tiles of both spans built by the caller (TokenTiles).
void attention_backward_accumulate(const AttentionShape& shape, const float* q, const float* d_out,
                                   const float* lse, const float* delta, const TokenTiles& queries,
                                   const float* k, const float* v, const TokenTiles& keys,
                                   float* d_q, float* d_k, float* d_v);

/// The (query tile, key tile) pairs attention_forward_accumulate and
/// attention_backward_accumulate compute for these spans, masked or not: the pairs whose
/// tiles' document and position ranges do not rule out every (query, key) pair. Made by
/// the kernel's own tiling and mask decision; the cost model's packed tile count
/// (cost_model.hpp, packed_tile_pairs) is tested against it.
std::int64_t attention_tile_pairs(TokenSpan queries, TokenSpan keys);

/// Naive references that materialise every score (double accumulation): out [nq, heads,
/// head_dim] and, for the backward, d_q, d_k, d_v overwritten.
void attention_reference_forward(const AttentionShape& shape, const float* q, TokenSpan queries,
                                 const float* k, const float* v, TokenSpan keys, float* out);
void attention_reference_backward(const AttentionShape& shape, const float* q, const float* d_out,
                                  TokenSpan queries, const float* k, const float* v,
                                  TokenSpan keys, float* d_q, float* d_k, float* d_v);

}  // namespace ballast::runtime
