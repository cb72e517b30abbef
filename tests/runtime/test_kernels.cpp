// Tests for the runtime kernels: gemm against a naive triple loop; the blocked attention
// forward and backward against the naive double references on packed documents, ring and
// zigzag key blocks accumulated in any order, GQA shapes; the reference backward against
// finite differences in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "ballast/runtime/kernels.hpp"

namespace ballast::runtime {
namespace {

/// Norm-wise relative error bound of the fp32 kernels against the double references (see
/// docs/runtime-kernels.md, "Tolerance"): measured errors are 1e-7 to 1e-6.
constexpr double kTolerance = 1e-5;
constexpr float kInfinity = std::numeric_limits<float>::infinity();

/// splitmix64: a deterministic, platform-independent source for the random cases.
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  int integer(int low, int high) {  ///< uniform in [low, high]
    return low + static_cast<int>(next() % static_cast<std::uint64_t>(high - low + 1));
  }
  float uniform() {  ///< in [-1, 1)
    return static_cast<float>(static_cast<double>(next() >> 11) * 0x1.0p-52 - 1.0);
  }
  std::vector<float> values(std::size_t count, float amplitude = 1.0f) {
    std::vector<float> result(count);
    for (float& value : result) value = amplitude * uniform();
    return result;
  }
  template <typename T>
  void shuffle(std::vector<T>& items) {
    for (std::size_t i = items.size(); i > 1; --i) std::swap(items[i - 1], items[next() % i]);
  }

 private:
  std::uint64_t state_;
};

/// ||a - b|| / ||b|| (Frobenius); the absolute norm when b is zero.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double difference = 0, reference = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    difference += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    reference += static_cast<double>(b[i]) * b[i];
  }
  return reference > 0 ? std::sqrt(difference / reference) : std::sqrt(difference);
}

// ----------------------------------------------------------------------------------------
// gemm

TEST(Gemm, MatchesNaiveTripleLoop) {
  Random random(1);
  for (int trial = 0; trial < 60; ++trial) {
    const bool transpose_a = trial % 2 == 1;
    const bool transpose_b = (trial / 2) % 2 == 1;
    const int m = random.integer(1, 97), n = random.integer(1, 97), k = random.integer(1, 131);
    // Stored shapes, with padded row strides.
    const int a_rows = transpose_a ? k : m, a_cols = transpose_a ? m : k;
    const int b_rows = transpose_b ? n : k, b_cols = transpose_b ? k : n;
    const int lda = a_cols + random.integer(0, 5), ldb = b_cols + random.integer(0, 5);
    const int ldc = n + random.integer(0, 5);
    const float alpha = 0.5f + random.uniform(), beta = trial % 3 == 0 ? 0.0f : random.uniform();
    const std::vector<float> a = random.values(static_cast<std::size_t>(a_rows) * lda);
    const std::vector<float> b = random.values(static_cast<std::size_t>(b_rows) * ldb);
    std::vector<float> c = random.values(static_cast<std::size_t>(m) * ldc);
    const std::vector<float> c_before = c;
    gemm(transpose_a, transpose_b, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(),
         ldc);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double dot = 0, magnitude = 0;
        for (int p = 0; p < k; ++p) {
          const double a_ip = transpose_a ? a[p * lda + i] : a[i * lda + p];
          const double b_pj = transpose_b ? b[j * ldb + p] : b[p * ldb + j];
          dot += a_ip * b_pj;
          magnitude += std::abs(a_ip * b_pj);
        }
        const double expected = alpha * dot + beta * c_before[i * ldc + j];
        // |fl(sum) - sum| <= k eps sum|a b|: 1e-5 covers k <= 131 with eps = 6e-8.
        const double bound =
            kTolerance * (std::abs(alpha) * magnitude + std::abs(beta * c_before[i * ldc + j])) +
            1e-30;
        ASSERT_NEAR(c[i * ldc + j], expected, bound)
            << "trial " << trial << " m=" << m << " n=" << n << " k=" << k << " at " << i << ","
            << j;
      }
      for (int j = n; j < ldc; ++j) ASSERT_EQ(c[i * ldc + j], c_before[i * ldc + j]) << "padding";
    }
  }
}

TEST(Gemm, EmptyInnerDimensionScalesC) {
  std::vector<float> c = {1, 2, 3, 4};
  gemm(false, false, 2, 2, 0, 1.0f, nullptr, 0, nullptr, 0, 0.5f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2}));
  gemm(false, false, 2, 2, 0, 1.0f, nullptr, 0, nullptr, 0, 0.0f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>(4, 0.0f)));
}

// ----------------------------------------------------------------------------------------
// Attention fixtures

/// The documents and positions of a block of tokens.
struct Tokens {
  std::vector<std::int64_t> doc, pos;
  int size() const { return static_cast<int>(doc.size()); }
  TokenSpan span() const { return {doc.data(), pos.data(), size()}; }
  TokenSpan span(int begin, int end) const {
    return {doc.data() + begin, pos.data() + begin, end - begin};
  }
  void add(std::int64_t document, std::int64_t position) {
    doc.push_back(document);
    pos.push_back(position);
  }
};

/// Whole documents of the given lengths packed in order (document i has id i).
Tokens packed(const std::vector<int>& lengths) {
  Tokens tokens;
  for (std::size_t d = 0; d < lengths.size(); ++d) {
    for (int p = 0; p < lengths[d]; ++p) tokens.add(static_cast<std::int64_t>(d), p);
  }
  return tokens;
}

/// Random document lengths: many 1-token documents, short and long ones.
std::vector<int> random_lengths(Random& random, int documents, int longest) {
  std::vector<int> lengths(documents);
  for (int& length : lengths) {
    const int kind = random.integer(0, 3);
    length = kind == 0 ? 1 : kind == 1 ? random.integer(2, 16) : random.integer(1, longest);
  }
  return lengths;
}

/// Zigzag context parallelism over `ranks`: every document is cut into 2 * ranks chunks
/// and rank r holds chunks r and 2 ranks - 1 - r of each (a document shorter than that
/// gives some ranks empty chunks).
Tokens zigzag_rank(const std::vector<int>& lengths, int ranks, int rank) {
  Tokens tokens;
  for (std::size_t d = 0; d < lengths.size(); ++d) {
    const int chunks = 2 * ranks;
    for (int chunk : {rank, chunks - 1 - rank}) {
      const int begin = lengths[d] * chunk / chunks, end = lengths[d] * (chunk + 1) / chunks;
      for (int p = begin; p < end; ++p) tokens.add(static_cast<std::int64_t>(d), p);
    }
  }
  return tokens;
}

Tokens concatenate(const std::vector<Tokens>& parts) {
  Tokens all;
  for (const Tokens& part : parts) {
    all.doc.insert(all.doc.end(), part.doc.begin(), part.doc.end());
    all.pos.insert(all.pos.end(), part.pos.begin(), part.pos.end());
  }
  return all;
}

/// An attention problem: queries, keys split into blocks [begin, end) of the key tokens.
struct Problem {
  AttentionShape shape;
  Tokens queries, keys;
  std::vector<std::pair<int, int>> key_blocks;
  std::vector<float> q, k, v, d_out;
  std::size_t q_size() const {
    return static_cast<std::size_t>(queries.size()) * shape.heads * shape.head_dim;
  }
  std::size_t kv_size() const {
    return static_cast<std::size_t>(keys.size()) * shape.kv_heads * shape.head_dim;
  }
  std::size_t kv_offset(int token) const {
    return static_cast<std::size_t>(token) * shape.kv_heads * shape.head_dim;
  }
};

/// Fills q, k, v, d_out. q and k uniform in [-sqrt(6), sqrt(6)] (variance 2) make the
/// scaled scores' standard deviation 2 at any head_dim: a peaked softmax, not a uniform one.
void fill(Problem& problem, Random& random) {
  const float amplitude = std::sqrt(6.0f);
  problem.q = random.values(problem.q_size(), amplitude);
  problem.k = random.values(problem.kv_size(), amplitude);
  problem.v = random.values(problem.kv_size());
  problem.d_out = random.values(problem.q_size());
  if (problem.key_blocks.empty()) problem.key_blocks.push_back({0, problem.keys.size()});
}

/// Splits [0, count) into `blocks` random contiguous ranges (some may be empty).
std::vector<std::pair<int, int>> random_blocks(Random& random, int count, int blocks) {
  std::vector<int> cuts = {0, count};
  for (int b = 1; b < blocks; ++b) cuts.push_back(random.integer(0, count));
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::pair<int, int>> result;
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) result.push_back({cuts[i], cuts[i + 1]});
  return result;
}

struct Forward {
  std::vector<float> out, lse;
};

/// The kernels' forward: the key blocks accumulated in `order`, then finalized.
Forward kernel_forward(const Problem& p, const std::vector<int>& order) {
  AttentionAccumulator accumulator;
  accumulator.reset(p.queries.size(), p.shape);
  for (int block : order) {
    const auto [begin, end] = p.key_blocks[block];
    attention_forward_accumulate(p.shape, p.q.data(), p.queries.span(),
                                 p.k.data() + p.kv_offset(begin), p.v.data() + p.kv_offset(begin),
                                 p.keys.span(begin, end), accumulator);
  }
  Forward result{std::vector<float>(p.q_size()),
                 std::vector<float>(static_cast<std::size_t>(p.queries.size()) * p.shape.heads)};
  attention_forward_finalize(p.shape, accumulator, result.out.data(), result.lse.data());
  return result;
}

struct Gradients {
  std::vector<float> d_q, d_k, d_v;
};

/// The kernels' backward with the final lse: the key blocks in `order`.
Gradients kernel_backward(const Problem& p, const Forward& forward, const std::vector<int>& order) {
  std::vector<float> delta(forward.lse.size());
  attention_backward_delta(p.shape, p.queries.size(), forward.out.data(), p.d_out.data(),
                           delta.data());
  Gradients g{std::vector<float>(p.q_size()), std::vector<float>(p.kv_size()),
              std::vector<float>(p.kv_size())};
  for (int block : order) {
    const auto [begin, end] = p.key_blocks[block];
    const std::size_t offset = p.kv_offset(begin);
    attention_backward_accumulate(p.shape, p.q.data(), p.d_out.data(), forward.lse.data(),
                                  delta.data(), p.queries.span(), p.k.data() + offset,
                                  p.v.data() + offset, p.keys.span(begin, end), g.d_q.data(),
                                  g.d_k.data() + offset, g.d_v.data() + offset);
  }
  return g;
}

std::vector<float> reference_out(const Problem& p) {
  std::vector<float> out(p.q_size());
  attention_reference_forward(p.shape, p.q.data(), p.queries.span(), p.k.data(), p.v.data(),
                              p.keys.span(), out.data());
  return out;
}

Gradients reference_gradients(const Problem& p) {
  Gradients g{std::vector<float>(p.q_size()), std::vector<float>(p.kv_size()),
              std::vector<float>(p.kv_size())};
  attention_reference_backward(p.shape, p.q.data(), p.d_out.data(), p.queries.span(), p.k.data(),
                               p.v.data(), p.keys.span(), g.d_q.data(), g.d_k.data(), g.d_v.data());
  return g;
}

/// lse per (query, head) in double: log sum over visible keys of exp(q.k / sqrt(d)).
std::vector<double> reference_lse(const Problem& p) {
  const int dim = p.shape.head_dim, group = p.shape.heads / p.shape.kv_heads;
  std::vector<double> lse;
  for (int i = 0; i < p.queries.size(); ++i) {
    for (int h = 0; h < p.shape.heads; ++h) {
      std::vector<double> scores;
      for (int j = 0; j < p.keys.size(); ++j) {
        if (p.keys.doc[j] != p.queries.doc[i] || p.keys.pos[j] > p.queries.pos[i]) continue;
        double dot = 0;
        for (int d = 0; d < dim; ++d) {
          dot += static_cast<double>(
                     p.q[(static_cast<std::size_t>(i) * p.shape.heads + h) * dim + d]) *
                 p.k[(static_cast<std::size_t>(j) * p.shape.kv_heads + h / group) * dim + d];
        }
        scores.push_back(dot / std::sqrt(static_cast<double>(dim)));
      }
      if (scores.empty()) {
        lse.push_back(-std::numeric_limits<double>::infinity());
        continue;
      }
      const double max = *std::max_element(scores.begin(), scores.end());
      double sum = 0;
      for (double s : scores) sum += std::exp(s - max);
      lse.push_back(max + std::log(sum));
    }
  }
  return lse;
}

std::vector<int> identity_order(const Problem& p) {
  std::vector<int> order(p.key_blocks.size());
  std::iota(order.begin(), order.end(), 0);
  return order;
}

/// Everything one problem must satisfy: the forward (out and lse) and the backward match
/// the references with the blocks in order and shuffled, and both orders agree.
void check_problem(const Problem& p, Random& random, const std::string& label) {
  SCOPED_TRACE(label + " heads=" + std::to_string(p.shape.heads) + "/" +
               std::to_string(p.shape.kv_heads) + " head_dim=" + std::to_string(p.shape.head_dim) +
               " queries=" + std::to_string(p.queries.size()) + " keys=" +
               std::to_string(p.keys.size()) + " blocks=" + std::to_string(p.key_blocks.size()));
  std::vector<int> order = identity_order(p);
  const Forward forward = kernel_forward(p, order);
  random.shuffle(order);
  const Forward shuffled = kernel_forward(p, order);
  const std::vector<float> expected = reference_out(p);
  EXPECT_LT(relative_error(forward.out, expected), kTolerance);
  EXPECT_LT(relative_error(shuffled.out, expected), kTolerance);
  EXPECT_LT(relative_error(shuffled.out, forward.out), kTolerance);

  const std::vector<double> lse = reference_lse(p);
  for (std::size_t row = 0; row < lse.size(); ++row) {
    if (std::isinf(lse[row])) {
      ASSERT_EQ(forward.lse[row], -kInfinity) << "row " << row;
      ASSERT_EQ(shuffled.lse[row], -kInfinity) << "row " << row;
    } else {
      // lse is O(1..10); 1e-5 absolute is ~100 ulp.
      ASSERT_NEAR(forward.lse[row], lse[row], kTolerance * std::max(1.0, std::abs(lse[row])))
          << "row " << row;
      ASSERT_NEAR(shuffled.lse[row], lse[row], kTolerance * std::max(1.0, std::abs(lse[row])))
          << "row " << row;
    }
  }

  const Gradients reference = reference_gradients(p);
  const Gradients gradients = kernel_backward(p, forward, identity_order(p));
  const Gradients gradients_shuffled = kernel_backward(p, shuffled, order);
  for (const Gradients* g : {&gradients, &gradients_shuffled}) {
    EXPECT_LT(relative_error(g->d_q, reference.d_q), kTolerance) << "d_q";
    EXPECT_LT(relative_error(g->d_k, reference.d_k), kTolerance) << "d_k";
    EXPECT_LT(relative_error(g->d_v, reference.d_v), kTolerance) << "d_v";
  }
}

const AttentionShape kShapes[] = {{1, 1, 8},  {4, 2, 16}, {8, 1, 64},
                                  {4, 2, 40}, {1, 1, 64}, {8, 1, 8}};

// ----------------------------------------------------------------------------------------
// Attention tests

TEST(Attention, PackedDocumentsSelfAttention) {
  Random random(2);
  int case_index = 0;
  for (const AttentionShape& shape : kShapes) {
    Problem p;
    p.shape = shape;
    p.queries = p.keys = packed(random_lengths(random, random.integer(3, 12), 150));
    fill(p, random);
    check_problem(p, random, "packed case " + std::to_string(case_index++));
  }
}

TEST(Attention, LongDocumentMergesUnmaskedKeyTiles) {
  Random random(3);
  for (const AttentionShape& shape : {AttentionShape{2, 1, 32}, AttentionShape{4, 4, 64}}) {
    Problem p;
    p.shape = shape;
    p.queries = p.keys = packed({700, 1, 90});
    fill(p, random);
    check_problem(p, random, "long document");
  }
}

TEST(Attention, MisalignedTilesOfOneDocument) {
  // Query and key tiles start at unrelated positions, so a key tile can end one position
  // past a query tile's first query: the tile-level "fully visible" test must be exact.
  Random random(10);
  for (const AttentionShape& shape : kShapes) {
    Problem p;
    p.shape = shape;
    const int first_query = random.integer(0, 70), queries = random.integer(100, 400);
    for (int position = first_query; position < first_query + queries; ++position)
      p.queries.add(0, position);
    for (int position = 0; position < first_query + queries; ++position) p.keys.add(0, position);
    fill(p, random);
    // A block starting at first_query + 2 (mod 64) makes key tiles end at a query tile's
    // first position + 1; the other cut is random.
    const int cut = (first_query + 2) % 64, other_cut = random.integer(cut, p.keys.size());
    p.key_blocks = {{0, cut}, {cut, other_cut}, {other_cut, p.keys.size()}};
    check_problem(p, random, "misaligned");
  }
}

TEST(Attention, KeyBlocksInAnyOrderEqualOneCall) {
  Random random(4);
  for (const AttentionShape& shape : kShapes) {
    Problem p;
    p.shape = shape;
    p.queries = p.keys = packed(random_lengths(random, random.integer(2, 8), 200));
    fill(p, random);
    p.key_blocks = random_blocks(random, p.keys.size(), random.integer(2, 6));
    check_problem(p, random, "split keys");
  }
}

TEST(Attention, ZigzagRingBlocks) {
  Random random(5);
  for (const AttentionShape& shape : kShapes) {
    const int ranks = random.integer(2, 4);
    const std::vector<int> lengths = random_lengths(random, random.integer(1, 4), 400);
    std::vector<Tokens> rank_tokens;
    for (int r = 0; r < ranks; ++r) rank_tokens.push_back(zigzag_rank(lengths, ranks, r));
    const int query_rank = random.integer(0, ranks - 1);
    Problem p;
    p.shape = shape;
    p.queries = rank_tokens[query_rank];
    p.keys = concatenate(rank_tokens);  // every rank's KV block visits in turn
    int begin = 0;
    for (const Tokens& tokens : rank_tokens) {
      p.key_blocks.push_back({begin, begin + tokens.size()});
      begin += tokens.size();
    }
    fill(p, random);
    check_problem(p, random,
                  "zigzag rank " + std::to_string(query_rank) + " of " + std::to_string(ranks));
  }
}

TEST(Attention, TokenTilesBuiltOnceEqualSpans) {
  // What a ring does: the query tiles and each key block's tiles built once, then used by
  // every step of the forward and the backward (twice here, as two layers would). The
  // tiles are what the span calls build, so the results are the same bits.
  Random random(12);
  for (const AttentionShape& shape : kShapes) {
    const int ranks = random.integer(2, 4);
    const std::vector<int> lengths = random_lengths(random, random.integer(1, 6), 300);
    std::vector<Tokens> rank_tokens;
    for (int r = 0; r < ranks; ++r) rank_tokens.push_back(zigzag_rank(lengths, ranks, r));
    Problem p;
    p.shape = shape;
    p.queries = rank_tokens[random.integer(0, ranks - 1)];
    p.keys = concatenate(rank_tokens);
    for (int begin = 0; const Tokens& tokens : rank_tokens) {
      p.key_blocks.push_back({begin, begin + tokens.size()});
      begin += tokens.size();
    }
    fill(p, random);
    const Forward expected = kernel_forward(p, identity_order(p));
    const Gradients expected_gradients = kernel_backward(p, expected, identity_order(p));
    const TokenTiles query_tiles(p.queries.span());
    std::vector<TokenTiles> key_tiles;
    for (const auto& [begin, end] : p.key_blocks) key_tiles.emplace_back(p.keys.span(begin, end));
    for (int pass = 0; pass < 2; ++pass) {
      AttentionAccumulator accumulator;
      accumulator.reset(p.queries.size(), p.shape);
      for (std::size_t b = 0; b < p.key_blocks.size(); ++b) {
        const std::size_t offset = p.kv_offset(p.key_blocks[b].first);
        attention_forward_accumulate(p.shape, p.q.data(), query_tiles, p.k.data() + offset,
                                     p.v.data() + offset, key_tiles[b], accumulator);
      }
      Forward forward{std::vector<float>(p.q_size()), std::vector<float>(expected.lse.size())};
      attention_forward_finalize(p.shape, accumulator, forward.out.data(), forward.lse.data());
      EXPECT_EQ(forward.out, expected.out);
      EXPECT_EQ(forward.lse, expected.lse);
      std::vector<float> delta(forward.lse.size());
      attention_backward_delta(p.shape, p.queries.size(), forward.out.data(), p.d_out.data(),
                               delta.data());
      Gradients g{std::vector<float>(p.q_size()), std::vector<float>(p.kv_size()),
                  std::vector<float>(p.kv_size())};
      for (std::size_t b = 0; b < p.key_blocks.size(); ++b) {
        const std::size_t offset = p.kv_offset(p.key_blocks[b].first);
        attention_backward_accumulate(p.shape, p.q.data(), p.d_out.data(), forward.lse.data(),
                                      delta.data(), query_tiles, p.k.data() + offset,
                                      p.v.data() + offset, key_tiles[b], g.d_q.data(),
                                      g.d_k.data() + offset, g.d_v.data() + offset);
      }
      EXPECT_EQ(g.d_q, expected_gradients.d_q);
      EXPECT_EQ(g.d_k, expected_gradients.d_k);
      EXPECT_EQ(g.d_v, expected_gradients.d_v);
    }
  }
}

TEST(Attention, TokenTilesRecordEachTilesRanges) {
  Tokens tokens = packed({70, 1, 100});  // tiles of 64: [0, 64), [64, 128), [128, 171)
  const TokenTiles tiles(tokens.span());
  ASSERT_EQ(tiles.tiles.size(), 3u);
  EXPECT_EQ(tiles.tiles[1].begin, 64);
  EXPECT_EQ(tiles.tiles[1].end, 128);
  EXPECT_EQ(tiles.tiles[1].min_doc, 0);
  EXPECT_EQ(tiles.tiles[1].max_doc, 2);
  EXPECT_EQ(tiles.tiles[1].min_pos, 0);
  EXPECT_EQ(tiles.tiles[1].max_pos, 69);
  EXPECT_EQ(tiles.tiles[2].end, 171);
  EXPECT_EQ(tiles.tiles[2].min_doc, 2);
  EXPECT_EQ(tiles.tiles[2].min_pos, 57);
  EXPECT_EQ(tiles.tiles[2].max_pos, 99);
  EXPECT_TRUE(TokenTiles(tokens.span(0, 0)).tiles.empty());
}

TEST(Attention, ShuffledTokenOrder) {
  Random random(6);
  for (const AttentionShape& shape : kShapes) {
    Problem p;
    p.shape = shape;
    Tokens tokens = packed(random_lengths(random, random.integer(2, 6), 120));
    std::vector<int> order(tokens.size());
    std::iota(order.begin(), order.end(), 0);
    random.shuffle(order);
    for (int i : order) p.queries.add(tokens.doc[i], tokens.pos[i]);
    random.shuffle(order);
    for (int i : order) p.keys.add(tokens.doc[i], tokens.pos[i]);
    fill(p, random);
    p.key_blocks = random_blocks(random, p.keys.size(), 3);
    check_problem(p, random, "shuffled");
  }
}

TEST(Attention, EveryInstructionSetMatchesTheReference) {
  // The row operations exist for SSE2, AVX2 and AVX-512; the process picks one at its first
  // call (BALLAST_KERNEL_SIMD, else the widest the CPU runs). ctest runs the Attention tests
  // again in processes started with BALLAST_KERNEL_SIMD=baseline and =avx2
  // (tests/runtime/CMakeLists.txt), so every path this CPU has is tested.
  const char* simd = std::getenv("BALLAST_KERNEL_SIMD");
  Random random(11);
  for (const AttentionShape& shape : {AttentionShape{4, 2, 24}, AttentionShape{8, 1, 64}}) {
    Problem p;
    p.shape = shape;
    p.queries = p.keys = packed(random_lengths(random, random.integer(3, 8), 200));
    fill(p, random);
    p.key_blocks = random_blocks(random, p.keys.size(), 3);
    check_problem(p, random, simd != nullptr ? simd : "default");
  }
}

TEST(Attention, SoftmaxWeightsCarryTheExponentialsAccuracy) {
  // Document i holds two keys and a query seeing both, with exact scores 0 and d_i (head
  // dim 4: scale 1/2; k = 0 and e_0, q = 2 d_i e_0) and one-hot values, so the output is
  // (1, exp(d_i)) / (1 + exp(d_i)) and out[1] / out[0] is the kernels' exp(d_i) up to one
  // rounding: 1.4 ulp of the exponential (docs/runtime-kernels.md) + 1 ulp < 2e-7. The
  // 1e-5 tolerance elsewhere could not see an exponential off by 1e-6.
  const AttentionShape shape{1, 1, 4};
  constexpr int kDocuments = 3000;
  Tokens keys, queries;
  std::vector<float> q(kDocuments * 4, 0.0f), k(kDocuments * 2 * 4, 0.0f), v(k.size(), 0.0f);
  std::vector<double> differences;
  for (int i = 0; i < kDocuments; ++i) {
    const double difference = static_cast<float>(-86.9 * i / (kDocuments - 1));
    differences.push_back(difference);
    keys.add(i, 0);
    keys.add(i, 1);
    queries.add(i, 1);
    k[(2 * i + 1) * 4] = 1.0f;
    v[(2 * i) * 4] = 1.0f;
    v[(2 * i + 1) * 4 + 1] = 1.0f;
    q[i * 4] = static_cast<float>(2 * difference);
  }
  // The process's instruction set (ctest reruns this with the narrower ones).
  const char* simd = std::getenv("BALLAST_KERNEL_SIMD");
  AttentionAccumulator accumulator;
  accumulator.reset(kDocuments, shape);
  attention_forward_accumulate(shape, q.data(), queries.span(), k.data(), v.data(), keys.span(),
                               accumulator);
  std::vector<float> out(q.size()), lse(kDocuments);
  attention_forward_finalize(shape, accumulator, out.data(), lse.data());
  double worst = 0;
  for (int i = 0; i < kDocuments; ++i) {
    const double ratio = static_cast<double>(out[i * 4 + 1]) / out[i * 4];
    worst = std::max(worst, std::abs(ratio / std::exp(differences[i]) - 1));
  }
  EXPECT_LT(worst, 2e-7) << (simd != nullptr ? simd : "default");
}

TEST(Attention, QueriesSeeingNoKeyGiveZeroAndMinusInfinity) {
  Random random(7);
  Problem p;
  p.shape = {4, 2, 16};
  // Keys: positions 50..99 of document 0 and all of document 1. Queries: positions 0..49
  // of document 0 (see nothing), 60..69 of document 0 (see some), document 2 (see nothing).
  for (int position = 50; position < 100; ++position) p.keys.add(0, position);
  for (int position = 0; position < 30; ++position) p.keys.add(1, position);
  for (int position = 0; position < 50; ++position) p.queries.add(0, position);
  for (int position = 60; position < 70; ++position) p.queries.add(0, position);
  for (int position = 0; position < 5; ++position) p.queries.add(2, position);
  fill(p, random);
  check_problem(p, random, "no visible key");
  const Forward forward = kernel_forward(p, identity_order(p));
  const Gradients gradients = kernel_backward(p, forward, identity_order(p));
  const std::size_t row_values = static_cast<std::size_t>(p.shape.heads) * p.shape.head_dim;
  for (int i = 0; i < p.queries.size(); ++i) {
    const bool sees_nothing = i < 50 || i >= 60;
    for (int h = 0; h < p.shape.heads; ++h) {
      EXPECT_EQ(std::isinf(forward.lse[i * p.shape.heads + h]), sees_nothing) << "query " << i;
    }
    if (!sees_nothing) continue;
    for (std::size_t d = 0; d < row_values; ++d) {
      ASSERT_EQ(forward.out[i * row_values + d], 0.0f) << "query " << i;
      ASSERT_EQ(gradients.d_q[i * row_values + d], 0.0f) << "query " << i;
    }
  }
}

TEST(Attention, EmptySpansAreNoOps) {
  const AttentionShape shape{2, 1, 8};
  Tokens tokens = packed({3});
  Random random(8);
  const std::vector<float> q = random.values(3 * 2 * 8), kv = random.values(3 * 8);
  AttentionAccumulator accumulator;
  accumulator.reset(3, shape);
  attention_forward_accumulate(shape, q.data(), tokens.span(), kv.data(), kv.data(),
                               tokens.span(0, 0), accumulator);
  EXPECT_EQ(accumulator.out, std::vector<float>(q.size(), 0.0f));
  EXPECT_EQ(accumulator.sum, std::vector<float>(6, 0.0f));
  AttentionAccumulator none;
  none.reset(0, shape);
  attention_forward_accumulate(shape, nullptr, tokens.span(0, 0), kv.data(), kv.data(),
                               tokens.span(), none);
  std::vector<float> d_q(q.size(), 1.0f), d_kv(kv.size(), 1.0f);
  const std::vector<float> lse(6, 0.0f), delta(6, 0.0f);
  attention_backward_accumulate(shape, q.data(), q.data(), lse.data(), delta.data(), tokens.span(),
                                kv.data(), kv.data(), tokens.span(0, 0), d_q.data(), d_kv.data(),
                                d_kv.data());
  EXPECT_EQ(d_q, std::vector<float>(q.size(), 1.0f));
}

// ----------------------------------------------------------------------------------------
// Finite differences of the reference backward

/// sum(out * d_out) of causal varlen attention, all in double (a third, simplest
/// implementation; the test below also checks it against attention_reference_forward).
double loss_in_double(const AttentionShape& shape, const Tokens& tokens,
                      const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, const std::vector<float>& d_out,
                      std::vector<double>* out = nullptr) {
  const int dim = shape.head_dim, group = shape.heads / shape.kv_heads, n = tokens.size();
  double loss = 0;
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < shape.heads; ++h) {
      std::vector<double> weights(n, 0.0);
      double max = -std::numeric_limits<double>::infinity(), sum = 0;
      for (int j = 0; j < n; ++j) {
        if (tokens.doc[j] != tokens.doc[i] || tokens.pos[j] > tokens.pos[i]) continue;
        double dot = 0;
        for (int d = 0; d < dim; ++d)
          dot += q[(i * shape.heads + h) * dim + d] * k[(j * shape.kv_heads + h / group) * dim + d];
        weights[j] = dot / std::sqrt(static_cast<double>(dim));
        max = std::max(max, weights[j]);
      }
      for (int j = 0; j < n; ++j) {
        const bool visible = tokens.doc[j] == tokens.doc[i] && tokens.pos[j] <= tokens.pos[i];
        weights[j] = visible ? std::exp(weights[j] - max) : 0.0;
        sum += weights[j];
      }
      for (int d = 0; d < dim; ++d) {
        double value = 0;
        for (int j = 0; j < n; ++j)
          value += weights[j] / sum * v[(j * shape.kv_heads + h / group) * dim + d];
        if (out != nullptr) out->push_back(value);
        loss += value * d_out[(i * shape.heads + h) * dim + d];
      }
    }
  }
  return loss;
}

TEST(AttentionReference, BackwardMatchesFiniteDifferences) {
  Random random(9);
  Problem p;
  p.shape = {4, 2, 3};
  p.queries = p.keys = packed({3, 1, 4});
  fill(p, random);
  std::vector<double> q(p.q.begin(), p.q.end()), k(p.k.begin(), p.k.end()),
      v(p.v.begin(), p.v.end());

  std::vector<double> out;
  loss_in_double(p.shape, p.queries, q, k, v, p.d_out, &out);
  const std::vector<float> expected = reference_out(p);
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(expected[i], out[i], 1e-6) << i;

  const Gradients analytic = reference_gradients(p);
  constexpr double kStep = 1e-5;  // central differences: error ~ step^2 + 1e-16 / step
  auto check = [&](std::vector<double>& x, const std::vector<float>& gradient, const char* name) {
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double saved = x[i];
      x[i] = saved + kStep;
      const double up = loss_in_double(p.shape, p.queries, q, k, v, p.d_out);
      x[i] = saved - kStep;
      const double down = loss_in_double(p.shape, p.queries, q, k, v, p.d_out);
      x[i] = saved;
      const double numeric = (up - down) / (2 * kStep);
      // The analytic value was rounded to fp32 (relative 6e-8).
      EXPECT_NEAR(gradient[i], numeric, 1e-7 + 1e-6 * std::abs(numeric)) << name << "[" << i << "]";
    }
  };
  check(q, analytic.d_q, "d_q");
  check(k, analytic.d_k, "d_k");
  check(v, analytic.d_v, "d_v");
}

}  // namespace
}  // namespace ballast::runtime
