// Runtime kernels: the SIMD row operations of the tiled attention (masking, online softmax,
// exp, score gradients) for SSE2 / AVX2 / AVX-512, and the instruction set chosen once per process.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels_internal.hpp"

namespace ballast::runtime::kernels_detail {
namespace {

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

/// The row kernels the CPU runs and BALLAST_KERNEL_SIMD asks for (see row_kernels()).
const RowKernels& detect_row_kernels() {
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

}  // namespace

const RowKernels& row_kernels() {
  // Decided once per process, not per attention call: the CPU does not change, and a
  // function-local static is initialised exactly once even when threads race to the first
  // call (C++11 [stmt.dcl]/4; GCC guards it with __cxa_guard_acquire), then only read, so
  // concurrent attention calls share it without a lock. getenv runs only inside that one
  // initialisation; BALLAST_KERNEL_SIMD must therefore be set before the process starts
  // (tests/runtime/CMakeLists.txt runs the attention tests once per instruction set).
  static const RowKernels& kernels = detect_row_kernels();
  return kernels;
}

}  // namespace ballast::runtime::kernels_detail
