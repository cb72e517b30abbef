// Runtime kernels: the naive attention references (every score materialised, double
// accumulation), the slow, obviously correct version the tests compare the tiled one against.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ballast/runtime/kernels.hpp"
#include "kernels_internal.hpp"

namespace ballast::runtime {

using namespace kernels_detail;

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
