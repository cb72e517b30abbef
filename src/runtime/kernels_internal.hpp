// Internal to the runtime kernels: what the tiled attention (kernels_attention.cpp), its
// SIMD row operations (kernels_rows.cpp) and the references (kernels_reference.cpp) share.
#pragma once

#include <cstddef>
#include <limits>

#include "ballast/runtime/kernels.hpp"

namespace ballast::runtime::kernels_detail {

inline constexpr float kInfinity = std::numeric_limits<float>::infinity();

/// Internal invariants of every kernel entry point (BALLAST_CHECK).
void check_shape(const AttentionShape& shape);
void check_span(TokenSpan span);

/// Floats of a [tokens, heads, head_dim] tensor.
inline std::size_t head_values(int tokens, int heads, const AttentionShape& shape) {
  return static_cast<std::size_t>(tokens) * heads * shape.head_dim;
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

/// The row operations on a tile's score rows for one instruction set.
struct RowKernels {
  /// Online softmax over one run of keys: scores [rows, count] become P = exp(s - new max);
  /// row_max, row_sum and out [rows, dim] are rescaled to the new maxima.
  void (*softmax_update)(float* scores, int rows, int count, Mask mask, float* row_max,
                         float* row_sum, float* out, int dim);
  /// P = exp(s - lse) in place over scores [rows, count]; rows with lse -inf are 0.
  void (*probabilities)(float* scores, int rows, int count, Mask mask, const float* lse);
  /// dS = P (dP - delta) in place over d_scores (holding dP) [rows, count].
  void (*score_gradients)(float* d_scores, const float* p, int rows, int count, const float* delta);
};

/// The widest row kernels the CPU runs, or those BALLAST_KERNEL_SIMD names (baseline, avx2,
/// avx512) if the CPU runs them. Decided once, at the first call of the process.
const RowKernels& row_kernels();

}  // namespace ballast::runtime::kernels_detail
