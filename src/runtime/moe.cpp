// The runtime model's mixture-of-experts FFN (moe_internal.hpp): Mixtral's routing (top-k
// of the router logits, softmax over the chosen k), the experts' SwiGLU on their owners
// and the hand-written backward through experts, gates and router.
#include "moe_internal.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>

#include "ballast/error.hpp"
#include "ballast/runtime/kernels.hpp"

namespace ballast::runtime::moe {

namespace {

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

/// The shape of one member's share of the experts.
struct Layout {
  int members = 1;
  int member = 0;
  int local_experts = 0;  ///< experts / members: member m owns m, m + members, ...
  int hidden = 0;
  int ffn = 0;  ///< expert_ffn_hidden
  int top_k = 0;
  std::size_t expert_stride() const { return 3 * static_cast<std::size_t>(hidden) * ffn; }
  int expert(int member_index, int local) const { return local * members + member_index; }
};

Layout layout_of(const ModelConfig& config, ExpertParallelGroup* group) {
  Layout layout;
  layout.members = group != nullptr ? group->size() : 1;
  layout.member = group != nullptr ? group->rank() : 0;
  check_expert_parallel(config, layout.members);
  layout.local_experts = config.experts / layout.members;
  layout.hidden = config.hidden;
  layout.ffn = config.expert_ffn_hidden;
  layout.top_k = config.experts_per_token;
  return layout;
}

/// The all-to-all of rows through the group, or a copy without one.
void exchange_rows(ExpertParallelGroup* group, const std::vector<float>& send,
                   const std::vector<int>& send_rows, int width, std::vector<float>& received,
                   const std::vector<int>& received_rows) {
  const std::size_t rows = std::accumulate(received_rows.begin(), received_rows.end(), std::size_t{0});
  received.resize(rows * width);
  if (group == nullptr) {
    received = send;
    return;
  }
  group->all_to_all(send.data(), send_rows, width, received.data(), received_rows);
}

/// Reorders held rows between arrival order (source member, local expert) and expert order
/// (local expert, source member), `width` floats each.
void reorder_held(const Layout& layout, const std::vector<int>& held_counts, int width,
                  bool to_expert_order, const std::vector<float>& from, std::vector<float>& to) {
  to.resize(from.size());
  const int members = layout.members, local = layout.local_experts;
  std::vector<std::size_t> arrival(held_counts.size()), expert_major(held_counts.size());
  std::size_t at = 0;
  for (int s = 0; s < members; ++s)
    for (int i = 0; i < local; ++i) {
      arrival[static_cast<std::size_t>(s * local + i)] = at;
      at += static_cast<std::size_t>(held_counts[static_cast<std::size_t>(s * local + i)]);
    }
  at = 0;
  for (int i = 0; i < local; ++i)
    for (int s = 0; s < members; ++s) {
      expert_major[static_cast<std::size_t>(s * local + i)] = at;
      at += static_cast<std::size_t>(held_counts[static_cast<std::size_t>(s * local + i)]);
    }
  for (std::size_t block = 0; block < held_counts.size(); ++block) {
    const std::size_t floats = static_cast<std::size_t>(held_counts[block]) * width;
    const std::size_t source = (to_expert_order ? arrival : expert_major)[block] * width;
    const std::size_t target = (to_expert_order ? expert_major : arrival)[block] * width;
    std::copy_n(from.begin() + static_cast<std::ptrdiff_t>(source), floats,
                to.begin() + static_cast<std::ptrdiff_t>(target));
  }
}

/// Rows each local expert holds (expert order): the sum over source members.
std::vector<int> rows_per_local_expert(const Layout& layout, const std::vector<int>& held_counts) {
  std::vector<int> rows(static_cast<std::size_t>(layout.local_experts), 0);
  for (int s = 0; s < layout.members; ++s)
    for (int i = 0; i < layout.local_experts; ++i)
      rows[static_cast<std::size_t>(i)] += held_counts[static_cast<std::size_t>(s * layout.local_experts + i)];
  return rows;
}

/// Chooses each token's top-k experts from logits [n, experts] (descending logit, ties to
/// the lower expert index) and their gates (softmax over the k chosen logits); records
/// the smallest gap between the k-th and (k+1)-th logit.
void route(const ModelConfig& config, const std::vector<float>& logits, int n, Activations& saved) {
  const int experts = config.experts, k = config.experts_per_token;
  saved.selected.resize(static_cast<std::size_t>(n) * k);
  saved.gates.resize(saved.selected.size());
  std::vector<int> order(static_cast<std::size_t>(experts));
  for (int t = 0; t < n; ++t) {
    const float* row = logits.data() + static_cast<std::size_t>(t) * experts;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [row](int a, int b) { return row[a] > row[b]; });
    if (k < experts) {
      saved.smallest_margin = std::min(
          saved.smallest_margin, static_cast<double>(row[order[static_cast<std::size_t>(k - 1)]]) -
                                     row[order[static_cast<std::size_t>(k)]]);
    }
    const double largest = row[order[0]];
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += std::exp(static_cast<double>(row[order[static_cast<std::size_t>(j)]]) - largest);
    for (int j = 0; j < k; ++j) {
      const int expert = order[static_cast<std::size_t>(j)];
      const std::size_t slot = static_cast<std::size_t>(t) * k + j;
      saved.selected[slot] = expert;
      saved.gates[slot] = static_cast<float>(std::exp(static_cast<double>(row[expert]) - largest) / sum);
    }
  }
}

}  // namespace

void forward(const ModelConfig& config, ExpertParallelGroup* group, const float* x, int n,
             const Weights<const float>& weights, float* out, Activations& saved) {
  const Layout layout = layout_of(config, group);
  const int hidden = layout.hidden, ffn = layout.ffn, k = layout.top_k;
  const int members = layout.members, local = layout.local_experts;
  std::vector<float> logits(static_cast<std::size_t>(n) * config.experts);  // [n, experts]
  matmul(false, false, n, config.experts, hidden, x, weights.router, 0.0f, logits.data());
  saved.smallest_margin = std::numeric_limits<double>::infinity();
  route(config, logits, n, saved);

  // Dispatch: rows by destination member, its local expert, token.
  std::vector<int> send_counts(static_cast<std::size_t>(members * local), 0);
  saved.send_rows.assign(static_cast<std::size_t>(members), 0);
  saved.slot_row.assign(saved.selected.size(), -1);
  std::vector<float> send;
  int row = 0;
  for (int m = 0; m < members; ++m) {
    for (int i = 0; i < local; ++i) {
      const int expert = layout.expert(m, i);
      for (std::size_t slot = 0; slot < saved.selected.size(); ++slot) {
        if (saved.selected[slot] != expert) continue;
        const std::size_t t = slot / static_cast<std::size_t>(k);
        send.insert(send.end(), x + t * hidden, x + (t + 1) * hidden);
        saved.slot_row[slot] = row++;
        ++send_counts[static_cast<std::size_t>(m * local + i)];
        ++saved.send_rows[static_cast<std::size_t>(m)];
      }
    }
  }
  saved.held_counts.assign(send_counts.size(), 0);
  if (group != nullptr)
    group->exchange_counts(send_counts, local, saved.held_counts);
  else
    saved.held_counts = send_counts;
  saved.held_rows.assign(static_cast<std::size_t>(members), 0);
  for (int s = 0; s < members; ++s)
    for (int i = 0; i < local; ++i)
      saved.held_rows[static_cast<std::size_t>(s)] += saved.held_counts[static_cast<std::size_t>(s * local + i)];
  std::vector<float> arrived;
  exchange_rows(group, send, saved.send_rows, hidden, arrived, saved.held_rows);
  reorder_held(layout, saved.held_counts, hidden, true, arrived, saved.held_in);

  // This member's experts on the rows they hold: silu(x w_gate) * (x w_up) w_down.
  const std::size_t held = saved.held_in.size() / static_cast<std::size_t>(hidden);
  saved.gate_pre.resize(held * ffn);
  saved.up_pre.resize(held * ffn);
  saved.activated.resize(held * ffn);
  std::vector<float> held_out(held * hidden);
  std::size_t first = 0;
  const std::vector<int> expert_rows = rows_per_local_expert(layout, saved.held_counts);
  for (int i = 0; i < local; ++i) {
    const int rows = expert_rows[static_cast<std::size_t>(i)];
    const float* w_gate = weights.experts + layout.expert(layout.member, i) * layout.expert_stride();
    const float* w_up = w_gate + static_cast<std::size_t>(hidden) * ffn;
    const float* w_down = w_up + static_cast<std::size_t>(hidden) * ffn;
    const float* in = saved.held_in.data() + first * hidden;
    float* gate_pre = saved.gate_pre.data() + first * ffn;
    float* up_pre = saved.up_pre.data() + first * ffn;
    float* activated = saved.activated.data() + first * ffn;
    matmul(false, false, rows, ffn, hidden, in, w_gate, 0.0f, gate_pre);
    matmul(false, false, rows, ffn, hidden, in, w_up, 0.0f, up_pre);
    for (std::size_t e = 0; e < static_cast<std::size_t>(rows) * ffn; ++e)
      activated[e] = gate_pre[e] * sigmoid(gate_pre[e]) * up_pre[e];
    matmul(false, false, rows, hidden, ffn, activated, w_down, 0.0f, held_out.data() + first * hidden);
    first += static_cast<std::size_t>(rows);
  }
  std::vector<float> returning;
  reorder_held(layout, saved.held_counts, hidden, false, held_out, returning);
  exchange_rows(group, returning, saved.held_rows, hidden, saved.expert_out, saved.send_rows);

  // Combine: each token's experts in selection order, weighted by their gates.
  std::fill(out, out + static_cast<std::size_t>(n) * hidden, 0.0f);
  for (std::size_t slot = 0; slot < saved.selected.size(); ++slot) {
    float* target = out + (slot / static_cast<std::size_t>(k)) * hidden;
    const float* expert_row = saved.expert_out.data() + static_cast<std::size_t>(saved.slot_row[slot]) * hidden;
    const float gate = saved.gates[slot];
    for (int h = 0; h < hidden; ++h) target[h] += gate * expert_row[h];
  }
}

void backward(const ModelConfig& config, ExpertParallelGroup* group, const float* x, int n,
              const Weights<const float>& weights, const Activations& saved,
              const float* d_out, const Weights<float>& gradients, float* d_x) {
  const Layout layout = layout_of(config, group);
  const int hidden = layout.hidden, ffn = layout.ffn, k = layout.top_k;
  const int experts = config.experts, local = layout.local_experts;
  BALLAST_CHECK(saved.selected.size() == static_cast<std::size_t>(n) * k,
                "MoE backward with another batch than its forward");
  // d(gate_j) = d_out . expert_j(x); the experts' output rows get gate_j * d_out.
  std::vector<float> d_gates(saved.selected.size());
  std::vector<float> d_sent(saved.expert_out.size());
  for (std::size_t slot = 0; slot < saved.selected.size(); ++slot) {
    const float* d_row = d_out + (slot / static_cast<std::size_t>(k)) * hidden;
    const std::size_t row = static_cast<std::size_t>(saved.slot_row[slot]) * hidden;
    double dot = 0;
    for (int h = 0; h < hidden; ++h) {
      dot += static_cast<double>(d_row[h]) * saved.expert_out[row + h];
      d_sent[row + h] = saved.gates[slot] * d_row[h];
    }
    d_gates[slot] = static_cast<float>(dot);
  }
  std::vector<float> arrived, d_held_out;
  exchange_rows(group, d_sent, saved.send_rows, hidden, arrived, saved.held_rows);
  reorder_held(layout, saved.held_counts, hidden, true, arrived, d_held_out);

  // This member's experts backward, in expert order.
  const std::size_t held = saved.held_in.size() / static_cast<std::size_t>(hidden);
  std::vector<float> d_held_in(held * hidden);
  std::vector<float> d_activated, d_gate_pre, d_up_pre;
  std::size_t first = 0;
  const std::vector<int> expert_rows = rows_per_local_expert(layout, saved.held_counts);
  for (int i = 0; i < local; ++i) {
    const int rows = expert_rows[static_cast<std::size_t>(i)];
    const std::size_t offset = layout.expert(layout.member, i) * layout.expert_stride();
    const std::size_t matrix = static_cast<std::size_t>(hidden) * ffn;
    const float* w_gate = weights.experts + offset;
    const float* w_up = w_gate + matrix;
    const float* w_down = w_up + matrix;
    float* g_gate = gradients.experts + offset;
    float* g_up = g_gate + matrix;
    float* g_down = g_up + matrix;
    const float* in = saved.held_in.data() + first * hidden;
    const float* gate_pre = saved.gate_pre.data() + first * ffn;
    const float* up_pre = saved.up_pre.data() + first * ffn;
    const float* activated = saved.activated.data() + first * ffn;
    const float* d_y = d_held_out.data() + first * hidden;
    const std::size_t size = static_cast<std::size_t>(rows) * ffn;
    d_activated.resize(size);
    d_gate_pre.resize(size);
    d_up_pre.resize(size);
    matmul(true, false, ffn, hidden, rows, activated, d_y, 1.0f, g_down);
    matmul(false, true, rows, ffn, hidden, d_y, w_down, 0.0f, d_activated.data());
    for (std::size_t e = 0; e < size; ++e) {
      const float s = sigmoid(gate_pre[e]);
      d_up_pre[e] = d_activated[e] * gate_pre[e] * s;
      d_gate_pre[e] = d_activated[e] * up_pre[e] * s * (1.0f + gate_pre[e] * (1.0f - s));
    }
    matmul(true, false, hidden, ffn, rows, in, d_gate_pre.data(), 1.0f, g_gate);
    matmul(true, false, hidden, ffn, rows, in, d_up_pre.data(), 1.0f, g_up);
    float* d_in = d_held_in.data() + first * hidden;
    matmul(false, true, rows, hidden, ffn, d_gate_pre.data(), w_gate, 0.0f, d_in);
    matmul(false, true, rows, hidden, ffn, d_up_pre.data(), w_up, 1.0f, d_in);
    first += static_cast<std::size_t>(rows);
  }
  std::vector<float> returning, d_expert_in;
  reorder_held(layout, saved.held_counts, hidden, false, d_held_in, returning);
  exchange_rows(group, returning, saved.held_rows, hidden, d_expert_in, saved.send_rows);

  // Gate softmax: d(logit_j) = gate_j (d(gate_j) - sum_i gate_i d(gate_i)) for the chosen
  // experts, 0 for the others (the top-k choice is piecewise constant).
  std::vector<float> d_logits(static_cast<std::size_t>(n) * experts, 0.0f);
  for (int t = 0; t < n; ++t) {
    const std::size_t base = static_cast<std::size_t>(t) * k;
    double weighted = 0;
    for (int j = 0; j < k; ++j) weighted += static_cast<double>(saved.gates[base + j]) * d_gates[base + j];
    for (int j = 0; j < k; ++j) {
      d_logits[static_cast<std::size_t>(t) * experts + saved.selected[base + j]] =
          static_cast<float>(saved.gates[base + j] * (d_gates[base + j] - weighted));
    }
  }
  matmul(true, false, hidden, experts, n, x, d_logits.data(), 1.0f, gradients.router);
  matmul(false, true, n, hidden, experts, d_logits.data(), weights.router, 0.0f, d_x);
  for (std::size_t slot = 0; slot < saved.selected.size(); ++slot) {
    float* target = d_x + (slot / static_cast<std::size_t>(k)) * hidden;
    const float* row = d_expert_in.data() + static_cast<std::size_t>(saved.slot_row[slot]) * hidden;
    for (int h = 0; h < hidden; ++h) target[h] += row[h];
  }
}

}  // namespace ballast::runtime::moe
