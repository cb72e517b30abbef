// The runtime's Llama-style model (docs/runtime-model.md): parameter layout and
// initialisation, document packing, the local attention engine, the forward pass with its
// hand-written backward over a TokenBatch (the MoE FFN in moe.cpp), and AdamW.
#include "ballast/runtime/model.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "ballast/error.hpp"
#include "ballast/workload.hpp"
#include "moe_internal.hpp"

namespace ballast::runtime {

/// Row-major C = op(A) * op(B) + beta * C with the strides of dense operands: A is [m, k]
/// ([k, m] stored when transposed), B is [k, n] ([n, k] stored when transposed), C [m, n].
/// Empty shapes are fine: a rank with no tokens still runs every layer, so that an engine
/// that communicates sees the same calls on every rank.
void matmul(bool transpose_a, bool transpose_b, int m, int n, int k, const float* a,
            const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::size_t i = 0; i < static_cast<std::size_t>(m) * n; ++i) c[i] *= beta;
    return;
  }
  gemm(transpose_a, transpose_b, m, n, k, 1.0f, a, transpose_a ? m : k, b, transpose_b ? k : n,
       beta, c, n);
}

namespace {

void require_config(bool ok, const std::string& field, const std::string& problem) {
  if (!ok) throw InputError("model config: " + field + " " + problem);
}


/// Pointers to every tensor of one flat buffer (values or gradients), in the layout order
/// of parameter_layout().
template <typename Float>
struct TensorView {
  struct Layer {
    Float* attn_norm;
    Float* wq;
    Float* wk;
    Float* wv;
    Float* wo;
    Float* mlp_norm;
    Float* w_gate;  ///< dense FFN (null in an MoE model)
    Float* w_up;
    Float* w_down;
    moe::Weights<Float> moe;  ///< router and experts (null in a dense model)
  };
  Float* embedding = nullptr;
  std::vector<Layer> layers;
  Float* final_norm = nullptr;
  Float* output = nullptr;  ///< lm_head [hidden, vocab], or the embedding [vocab, hidden] when tied
};

std::vector<TensorInfo> parameter_layout(const ModelConfig& config) {
  std::vector<TensorInfo> tensors;
  std::size_t offset = 0;
  auto add = [&](std::string name, std::vector<int> shape) {
    std::size_t size = 1;
    for (int extent : shape) size *= static_cast<std::size_t>(extent);
    tensors.push_back({std::move(name), std::move(shape), offset, size});
    offset += size;
  };
  const int hidden = config.hidden;
  const int q_width = config.heads * config.head_dim();
  const int kv_width = config.kv_heads * config.head_dim();
  add("embedding", {config.vocab, hidden});
  for (int layer = 0; layer < config.layers; ++layer) {
    const std::string prefix = "layer" + std::to_string(layer) + ".";
    add(prefix + "attn_norm", {hidden});
    add(prefix + "wq", {hidden, q_width});
    add(prefix + "wk", {hidden, kv_width});
    add(prefix + "wv", {hidden, kv_width});
    add(prefix + "wo", {q_width, hidden});
    add(prefix + "mlp_norm", {hidden});
    if (config.moe()) {
      // The experts one after the other, each w_gate, w_up, w_down (moe::Weights).
      add(prefix + "router", {hidden, config.experts});
      for (int expert = 0; expert < config.experts; ++expert) {
        const std::string name = prefix + "expert" + std::to_string(expert) + ".";
        add(name + "w_gate", {hidden, config.expert_ffn_hidden});
        add(name + "w_up", {hidden, config.expert_ffn_hidden});
        add(name + "w_down", {config.expert_ffn_hidden, hidden});
      }
      continue;
    }
    add(prefix + "w_gate", {hidden, config.ffn_hidden});
    add(prefix + "w_up", {hidden, config.ffn_hidden});
    add(prefix + "w_down", {config.ffn_hidden, hidden});
  }
  add("final_norm", {hidden});
  if (!config.tied_embeddings) add("lm_head", {hidden, config.vocab});
  return tensors;
}

template <typename Float>
TensorView<Float> view_of(const ModelConfig& config, const std::vector<TensorInfo>& tensors,
                          Float* base) {
  std::size_t index = 0;
  auto next = [&] { return base + tensors.at(index++).offset; };
  TensorView<Float> view;
  view.embedding = next();
  for (int layer = 0; layer < config.layers; ++layer) {
    typename TensorView<Float>::Layer l{};
    l.attn_norm = next();
    l.wq = next();
    l.wk = next();
    l.wv = next();
    l.wo = next();
    l.mlp_norm = next();
    if (config.moe()) {
      l.moe.router = next();
      l.moe.experts = next();
      index += 3 * static_cast<std::size_t>(config.experts) - 1;  // past the other experts' tensors
    } else {
      l.w_gate = next();
      l.w_up = next();
      l.w_down = next();
    }
    view.layers.push_back(l);
  }
  view.final_norm = next();
  view.output = config.tied_embeddings ? view.embedding : next();
  return view;
}

/// A uniform double in (0, 1]: the top 53 bits of a splitmix64 draw, plus one ulp.
double uniform_open_closed(std::uint64_t& state) {
  return (static_cast<double>(splitmix64_next(state) >> 11) + 1.0) * 0x1.0p-53;
}

// ---- per-token ops -------------------------------------------------------------------

/// y = x / rms(x) * gain per row of x [n, width]; keeps 1 / rms per row for the backward.
void rmsnorm_forward(const float* x, const float* gain, int n, int width, float eps, float* y,
                     float* inverse_rms) {
  for (int t = 0; t < n; ++t) {
    const float* row = x + static_cast<std::size_t>(t) * width;
    double squares = 0;
    for (int j = 0; j < width; ++j) squares += static_cast<double>(row[j]) * row[j];
    const float r = static_cast<float>(1.0 / std::sqrt(squares / width + eps));
    inverse_rms[t] = r;
    float* out = y + static_cast<std::size_t>(t) * width;
    for (int j = 0; j < width; ++j) out[j] = row[j] * r * gain[j];
  }
}

/// With r = 1 / rms(x): dx += r * (g * dy) - x * r^3 / width * sum(g * dy * x), and
/// d_gain += dy * x * r.
void rmsnorm_backward(const float* x, const float* gain, const float* inverse_rms,
                      const float* d_y, int n, int width, float* d_x, float* d_gain) {
  for (int t = 0; t < n; ++t) {
    const std::size_t row = static_cast<std::size_t>(t) * width;
    const float r = inverse_rms[t];
    double dot = 0;
    for (int j = 0; j < width; ++j) dot += static_cast<double>(gain[j]) * d_y[row + j] * x[row + j];
    const float correction = static_cast<float>(dot * r * r * r / width);
    for (int j = 0; j < width; ++j) {
      d_x[row + j] += r * gain[j] * d_y[row + j] - x[row + j] * correction;
      d_gain[j] += d_y[row + j] * x[row + j] * r;
    }
  }
}

/// cos and sin of pos * theta^(-2i / head_dim) per token and pair i: [n, head_dim / 2].
void rope_tables(const TokenBatch& batch, int head_dim, float theta, std::vector<float>& cosines,
                 std::vector<float>& sines) {
  const int pairs = head_dim / 2;
  std::vector<double> frequencies(pairs);
  for (int i = 0; i < pairs; ++i)
    frequencies[i] = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
  cosines.resize(static_cast<std::size_t>(batch.size()) * pairs);
  sines.resize(cosines.size());
  for (int t = 0; t < batch.size(); ++t) {
    for (int i = 0; i < pairs; ++i) {
      const double angle = static_cast<double>(batch.pos[t]) * frequencies[i];
      cosines[static_cast<std::size_t>(t) * pairs + i] = static_cast<float>(std::cos(angle));
      sines[static_cast<std::size_t>(t) * pairs + i] = static_cast<float>(std::sin(angle));
    }
  }
}

/// Rotates each pair (2i, 2i+1) of every head of x [n, heads, head_dim] in place by the
/// token's angle (direction +1), or by minus it (-1: the backward, the transpose).
void rope_rotate(float* x, int n, int heads, int head_dim, const std::vector<float>& cosines,
                 const std::vector<float>& sines, float direction) {
  const int pairs = head_dim / 2;
  for (int t = 0; t < n; ++t) {
    const float* c = cosines.data() + static_cast<std::size_t>(t) * pairs;
    const float* s = sines.data() + static_cast<std::size_t>(t) * pairs;
    for (int h = 0; h < heads; ++h) {
      float* head = x + (static_cast<std::size_t>(t) * heads + h) * head_dim;
      for (int i = 0; i < pairs; ++i) {
        const float x0 = head[2 * i];
        const float x1 = head[2 * i + 1];
        const float sine = direction * s[i];
        head[2 * i] = x0 * c[i] - x1 * sine;
        head[2 * i + 1] = x0 * sine + x1 * c[i];
      }
    }
  }
}

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

/// Cross-entropy summed over the tokens with a target; overwrites logits [n, vocab] with
/// d(loss_sum)/d(logits) (softmax - one-hot; zero rows for tokens without a target).
double cross_entropy(const std::vector<std::int32_t>& targets, int vocab, float* logits) {
  double loss_sum = 0;
  for (std::size_t t = 0; t < targets.size(); ++t) {
    float* row = logits + t * vocab;
    if (targets[t] < 0) {
      std::fill(row, row + vocab, 0.0f);
      continue;
    }
    const float max = *std::max_element(row, row + vocab);
    double sum = 0;
    for (int j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j]) - max);
    const double log_sum_exp = max + std::log(sum);
    loss_sum += log_sum_exp - row[targets[t]];
    for (int j = 0; j < vocab; ++j)
      row[j] = static_cast<float>(std::exp(static_cast<double>(row[j]) - log_sum_exp));
    row[targets[t]] -= 1.0f;
  }
  return loss_sum;
}

/// What the backward of one layer needs from its forward (the engine keeps q, k, v). Rows:
/// ns, this member's sequence shard (all n tokens without tensor parallelism); n, the
/// group's tokens; heads and FFN columns are this member's.
struct LayerActivations {
  std::vector<float> input;  // [ns, hidden] residual stream entering the layer
  std::vector<float> attn_rms;  // [ns] 1 / rms of input
  std::vector<float> attn_in;  // [n, hidden] RMSNorm(input), all-gathered
  std::vector<float> attention;  // [n, heads * head_dim] engine output
  std::vector<float> middle;  // [ns, hidden] input + attention * wo
  std::vector<float> mlp_rms;  // [ns]
  std::vector<float> mlp_in;  // [n, hidden] RMSNorm(middle), all-gathered
  std::vector<float> gate, up;  // [n, ffn] mlp_in * w_gate, mlp_in * w_up
  std::vector<float> activated;  // [n, ffn] silu(gate) * up
  moe::Activations moe;  // an MoE model's FFN instead of gate, up, activated
};

void check_batch(const ModelConfig& config, const Parameters& parameters,
                 const std::vector<TensorInfo>& layout, const TokenBatch& batch) {
  const std::size_t expected = layout.back().offset + layout.back().size;
  if (parameters.values.size() != expected || parameters.tensors.size() != layout.size())
    throw InputError("forward_backward: the parameters hold " +
                     std::to_string(parameters.values.size()) + " values in " +
                     std::to_string(parameters.tensors.size()) + " tensors, the config needs " +
                     std::to_string(expected) + " in " + std::to_string(layout.size()) +
                     "; make them with init_parameters for this config");
  const std::size_t n = batch.tokens.size();
  if (batch.targets.size() != n || batch.doc.size() != n || batch.pos.size() != n)
    throw InputError("forward_backward: the TokenBatch's tokens, targets, doc and pos differ in "
                     "length; give one entry per token in each");
  for (std::size_t t = 0; t < n; ++t) {
    if (batch.tokens[t] < 0 || batch.tokens[t] >= config.vocab ||
        batch.targets[t] < -1 || batch.targets[t] >= config.vocab)
      throw InputError("forward_backward: token " + std::to_string(t) + " has id " +
                       std::to_string(batch.tokens[t]) + " and target " +
                       std::to_string(batch.targets[t]) + "; ids must lie in [0, vocab = " +
                       std::to_string(config.vocab) + ") and targets also may be -1");
    if (batch.pos[t] < 0)
      throw InputError("forward_backward: token " + std::to_string(t) +
                       " has a negative position; positions count from 0 in each document");
  }
}

}  // namespace

void ModelConfig::check() const {
  require_config(vocab > 0, "vocab", "must be positive (256 for bytes)");
  require_config(hidden > 0, "hidden", "must be positive");
  require_config(layers > 0, "layers", "must be positive");
  require_config(heads > 0, "heads", "must be positive");
  require_config(kv_heads > 0, "kv_heads", "must be positive");
  require_config(ffn_hidden > 0, "ffn_hidden", "must be positive");
  require_config(hidden % heads == 0, "hidden",
                 "= " + std::to_string(hidden) + " is not divisible by heads = " +
                     std::to_string(heads) + "; choose hidden a multiple of heads");
  require_config(head_dim() % 2 == 0, "heads",
                 "gives an odd head_dim = hidden / heads = " + std::to_string(head_dim()) +
                     "; RoPE rotates pairs, so choose heads with an even hidden / heads");
  require_config(heads % kv_heads == 0, "kv_heads",
                 "= " + std::to_string(kv_heads) + " does not divide heads = " +
                     std::to_string(heads) + "; choose a divisor of heads");
  require_config(rope_theta > 0 && std::isfinite(rope_theta), "rope_theta",
                 "must be positive and finite (10000 is usual)");
  require_config(norm_eps > 0 && std::isfinite(norm_eps), "norm_eps",
                 "must be positive and finite (1e-5 is usual)");
  require_config(experts >= 0, "experts", "must be 0 (a dense model) or positive");
  if (experts == 0) {
    require_config(experts_per_token == 0 && expert_ffn_hidden == 0,
                   experts_per_token != 0 ? "experts_per_token" : "expert_ffn_hidden",
                   "is set but experts = 0 (a dense model); set experts > 0 for an MoE model, "
                   "or leave it 0");
    return;
  }
  require_config(experts_per_token >= 1 && experts_per_token <= experts, "experts_per_token",
                 "= " + std::to_string(experts_per_token) + " is outside [1, experts = " +
                     std::to_string(experts) + "]; choose the top-k in that range (2 in Mixtral)");
  require_config(expert_ffn_hidden > 0, "expert_ffn_hidden",
                 "must be positive in an MoE model (each expert's SwiGLU width)");
}

const TensorInfo& Parameters::info(const std::string& name) const {
  for (const TensorInfo& tensor : tensors)
    if (tensor.name == name) return tensor;
  throw InternalError("Parameters::info: no parameter tensor named '" + name + "'");
}

Parameters init_parameters(const ModelConfig& config, std::uint64_t seed) {
  config.check();
  Parameters parameters;
  parameters.tensors = parameter_layout(config);
  const TensorInfo& last = parameters.tensors.back();
  parameters.values.resize(last.offset + last.size);
  std::uint64_t state = seed;
  constexpr double kStd = 0.02;
  constexpr double kTwoPi = 6.283185307179586476925;
  // One splitmix64 stream in layout order: lm_head is last, so a tied and an untied model
  // of one seed share every other tensor. Box-Muller gives two normals per two draws.
  for (const TensorInfo& tensor : parameters.tensors) {
    float* values = parameters.values.data() + tensor.offset;
    if (tensor.shape.size() == 1) {
      std::fill(values, values + tensor.size, 1.0f);
      continue;
    }
    for (std::size_t i = 0; i < tensor.size; i += 2) {
      const double radius = std::sqrt(-2.0 * std::log(uniform_open_closed(state)));
      const double angle = kTwoPi * uniform_open_closed(state);
      values[i] = static_cast<float>(kStd * radius * std::cos(angle));
      if (i + 1 < tensor.size) values[i + 1] = static_cast<float>(kStd * radius * std::sin(angle));
    }
  }
  return parameters;
}

TokenBatch pack_documents(const std::vector<std::vector<std::int32_t>>& documents) {
  TokenBatch batch;
  for (std::size_t d = 0; d < documents.size(); ++d) {
    const auto& document = documents[d];
    for (std::size_t i = 0; i < document.size(); ++i) {
      batch.tokens.push_back(document[i]);
      batch.targets.push_back(i + 1 < document.size() ? document[i + 1] : -1);
      batch.doc.push_back(static_cast<std::int64_t>(d));
      batch.pos.push_back(static_cast<std::int64_t>(i));
    }
  }
  return batch;
}

void LocalAttentionEngine::forward(int layer, const AttentionShape& shape,
                                   const TokenBatch& batch, const float* q, const float* k,
                                   const float* v, float* out) {
  BALLAST_CHECK(layer >= 0, "attention layer index must be non-negative");
  if (saved_.size() <= static_cast<std::size_t>(layer)) saved_.resize(layer + 1);
  Saved& saved = saved_[layer];
  const std::size_t n = static_cast<std::size_t>(batch.size());
  const std::size_t q_size = n * shape.heads * shape.head_dim;
  const std::size_t kv_size = n * shape.kv_heads * shape.head_dim;
  saved.q.assign(q, q + q_size);
  saved.k.assign(k, k + kv_size);
  saved.v.assign(v, v + kv_size);
  saved.out.resize(q_size);
  saved.lse.resize(n * shape.heads);
  if (n == 0) return;
  AttentionAccumulator accumulator;
  accumulator.reset(batch.size(), shape);
  attention_forward_accumulate(shape, q, batch.span(), k, v, batch.span(), accumulator);
  attention_forward_finalize(shape, accumulator, saved.out.data(), saved.lse.data());
  std::copy(saved.out.begin(), saved.out.end(), out);
}

void LocalAttentionEngine::backward(int layer, const AttentionShape& shape,
                                    const TokenBatch& batch, const float* d_out, float* d_q,
                                    float* d_k, float* d_v) {
  BALLAST_CHECK(layer >= 0 && static_cast<std::size_t>(layer) < saved_.size(),
                "attention backward of layer " + std::to_string(layer) + " before its forward");
  const Saved& saved = saved_[layer];
  const int n = batch.size();
  const std::size_t q_size = static_cast<std::size_t>(n) * shape.heads * shape.head_dim;
  const std::size_t kv_size = static_cast<std::size_t>(n) * shape.kv_heads * shape.head_dim;
  BALLAST_CHECK(saved.q.size() == q_size && saved.k.size() == kv_size,
                "attention backward of layer " + std::to_string(layer) +
                    " with another batch or shape than its forward");
  std::fill(d_q, d_q + q_size, 0.0f);
  std::fill(d_k, d_k + kv_size, 0.0f);
  std::fill(d_v, d_v + kv_size, 0.0f);
  if (n == 0) return;
  std::vector<float> delta(static_cast<std::size_t>(n) * shape.heads);
  attention_backward_delta(shape, n, saved.out.data(), d_out, delta.data());
  attention_backward_accumulate(shape, saved.q.data(), d_out, saved.lse.data(), delta.data(),
                                batch.span(), saved.k.data(), saved.v.data(), batch.span(), d_q,
                                d_k, d_v);
}

ShardRows tensor_parallel_shard(int tokens, int members, int member) {
  BALLAST_CHECK(tokens >= 0 && members >= 1 && member >= 0 && member < members,
                "tensor_parallel_shard of member " + std::to_string(member) + " of " +
                    std::to_string(members));
  const int base = tokens / members, extra = tokens % members;
  return {member * base + std::min(member, extra), base + (member < extra ? 1 : 0)};
}

void check_tensor_parallel(const ModelConfig& config, int members) {
  require_config(members >= 1, "tensor parallelism", "must be at least 1");
  require_config(!config.moe() || members == 1, "experts",
                 "= " + std::to_string(config.experts) + " (an MoE model) with tensor parallelism " +
                     std::to_string(members) + ": the runtime's MoE layer does not split experts " +
                     "over a TP group; run it with tensor parallelism 1 (expert parallelism "
                     "spreads the experts instead)");
  const auto divides = [&](int value, const char* field) {
    require_config(value % members == 0, field,
                   "= " + std::to_string(value) + " is not divisible by the tensor-parallel size " +
                       std::to_string(members) + "; choose a TP size that divides " + field +
                       " (column- and row-parallel linears split it evenly)");
  };
  divides(config.heads, "heads");
  divides(config.kv_heads, "kv_heads");
  divides(config.ffn_hidden, "ffn_hidden");
}

void check_expert_parallel(const ModelConfig& config, int members) {
  require_config(members >= 1, "expert parallelism", "must be at least 1");
  if (members == 1) return;
  require_config(config.moe(), "expert parallelism",
                 "= " + std::to_string(members) + " needs an MoE model; set experts > 0 or "
                     "expert parallelism 1");
  require_config(config.experts % members == 0, "experts",
                 "= " + std::to_string(config.experts) + " is not divisible by the expert-parallel size " +
                     std::to_string(members) + "; choose an EP size that divides experts (every "
                     "member owns experts / EP of them)");
}

namespace {

/// matmul() on blocks of larger row-major matrices: lda, ldb, ldc are the full row widths.
void matmul_ld(bool transpose_a, bool transpose_b, int m, int n, int k, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) c[static_cast<std::size_t>(i) * ldc + j] *= beta;
    return;
  }
  gemm(transpose_a, transpose_b, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}

/// The sequence-parallel collectives of one member, or the identity without a group.
struct SequenceParallel {
  TensorParallelGroup* group = nullptr;
  std::vector<int> row_counts;  ///< per member
  int members() const { return group != nullptr ? group->size() : 1; }
  /// shard [rows, width] -> all [n, width]
  void gather(const std::vector<float>& shard, int width, std::vector<float>& all) const {
    if (group == nullptr) {
      all = shard;
      return;
    }
    std::size_t rows = 0;
    for (const int count : row_counts) rows += static_cast<std::size_t>(count);
    all.resize(rows * width);
    group->all_gather(shard.data(), row_counts, width, all.data());
  }
  /// all [n, width] summed over members -> this member's rows, added to `shard`.
  void scatter_add(const std::vector<float>& all, int width, std::vector<float>& scratch,
                   std::vector<float>& shard) const {
    if (group == nullptr) {
      for (std::size_t i = 0; i < shard.size(); ++i) shard[i] += all[i];
      return;
    }
    scratch.resize(shard.size());
    group->reduce_scatter(all.data(), row_counts, width, scratch.data());
    for (std::size_t i = 0; i < shard.size(); ++i) shard[i] += scratch[i];
  }
};

}  // namespace

StepOutput forward_backward(const ModelConfig& config, const Parameters& parameters,
                            const TokenBatch& batch, AttentionEngine& attention,
                            TensorParallelGroup* tensor_parallel,
                            ExpertParallelGroup* expert_parallel) {
  config.check();
  const std::vector<TensorInfo> layout = parameter_layout(config);
  check_batch(config, parameters, layout, batch);
  const auto weights = view_of(config, layout, parameters.values.data());
  StepOutput result;
  result.gradients.assign(parameters.values.size(), 0.0f);
  const auto grads = view_of(config, layout, result.gradients.data());

  SequenceParallel sp;
  if (tensor_parallel != nullptr && tensor_parallel->size() > 1) sp.group = tensor_parallel;
  const int members = sp.members();
  const int member = sp.group != nullptr ? sp.group->rank() : 0;
  check_tensor_parallel(config, members);
  if (expert_parallel != nullptr && expert_parallel->size() == 1) expert_parallel = nullptr;
  check_expert_parallel(config, expert_parallel != nullptr ? expert_parallel->size() : 1);
  const int n = batch.size();  // the group's tokens: attention and the linears' inputs
  for (int m = 0; m < members; ++m) sp.row_counts.push_back(tensor_parallel_shard(n, members, m).count);
  const ShardRows shard = tensor_parallel_shard(n, members, member);
  const int s0 = shard.first, ns = shard.count;  // this member's sequence shard

  const int hidden = config.hidden;
  const int vocab = config.vocab;
  const int ffn_width = config.ffn_hidden;
  const int ffn = ffn_width / members;  // this member's FFN columns [f0, f0 + ffn)
  const int f0 = member * ffn;
  const AttentionShape full_shape = config.attention_shape();
  const AttentionShape shape{full_shape.heads / members, full_shape.kv_heads / members,
                             full_shape.head_dim};  // this member's heads
  const int q_full = full_shape.heads * full_shape.head_dim;
  const int kv_full = full_shape.kv_heads * full_shape.head_dim;
  const int q_width = shape.heads * shape.head_dim;
  const int kv_width = shape.kv_heads * shape.head_dim;
  const int q0 = member * q_width, kv0 = member * kv_width;  // column offsets of my heads
  const std::size_t rows = static_cast<std::size_t>(n);
  const std::size_t shard_rows = static_cast<std::size_t>(ns);
  std::vector<float> cosines, sines;
  rope_tables(batch, shape.head_dim, config.rope_theta, cosines, sines);

  // ---- forward ----
  std::vector<float> x(shard_rows * hidden);  // [ns, hidden] residual stream of my shard
  for (int t = 0; t < ns; ++t)
    std::copy_n(weights.embedding + static_cast<std::size_t>(batch.tokens[s0 + t]) * hidden, hidden,
                x.begin() + static_cast<std::ptrdiff_t>(t) * hidden);
  std::vector<LayerActivations> saved(config.layers);
  std::vector<float> q(rows * q_width), k(rows * kv_width), v(rows * kv_width);
  std::vector<float> norm_shard(shard_rows * hidden), partial(rows * hidden), scratch;
  for (int layer = 0; layer < config.layers; ++layer) {
    const auto& w = weights.layers[layer];
    LayerActivations& a = saved[layer];
    a.input = x;
    a.attn_rms.resize(shard_rows);
    rmsnorm_forward(x.data(), w.attn_norm, ns, hidden, config.norm_eps, norm_shard.data(),
                    a.attn_rms.data());
    sp.gather(norm_shard, hidden, a.attn_in);  // [n, hidden]
    matmul_ld(false, false, n, q_width, hidden, a.attn_in.data(), hidden, w.wq + q0, q_full, 0.0f,
              q.data(), q_width);
    matmul_ld(false, false, n, kv_width, hidden, a.attn_in.data(), hidden, w.wk + kv0, kv_full,
              0.0f, k.data(), kv_width);
    matmul_ld(false, false, n, kv_width, hidden, a.attn_in.data(), hidden, w.wv + kv0, kv_full,
              0.0f, v.data(), kv_width);
    rope_rotate(q.data(), n, shape.heads, shape.head_dim, cosines, sines, 1.0f);
    rope_rotate(k.data(), n, shape.kv_heads, shape.head_dim, cosines, sines, 1.0f);
    a.attention.resize(rows * q_width);
    attention.forward(layer, shape, batch, q.data(), k.data(), v.data(), a.attention.data());
    // Row-parallel output projection: my heads' rows of wo, summed over the group.
    matmul(false, false, n, hidden, q_width, a.attention.data(),
           w.wo + static_cast<std::size_t>(q0) * hidden, 0.0f, partial.data());
    sp.scatter_add(partial, hidden, scratch, x);
    a.middle = x;
    a.mlp_rms.resize(shard_rows);
    rmsnorm_forward(x.data(), w.mlp_norm, ns, hidden, config.norm_eps, norm_shard.data(),
                    a.mlp_rms.data());
    sp.gather(norm_shard, hidden, a.mlp_in);
    if (config.moe()) {  // no TP: the shard is every row
      moe::forward(config, expert_parallel, a.mlp_in.data(), n, {w.moe.router, w.moe.experts},
                   partial.data(), a.moe);
      result.smallest_top_k_margin = std::min(result.smallest_top_k_margin, a.moe.smallest_margin);
      sp.scatter_add(partial, hidden, scratch, x);
      continue;
    }
    a.gate.resize(rows * ffn);
    a.up.resize(rows * ffn);
    matmul_ld(false, false, n, ffn, hidden, a.mlp_in.data(), hidden, w.w_gate + f0, ffn_width,
              0.0f, a.gate.data(), ffn);
    matmul_ld(false, false, n, ffn, hidden, a.mlp_in.data(), hidden, w.w_up + f0, ffn_width,
              0.0f, a.up.data(), ffn);
    a.activated.resize(rows * ffn);
    for (std::size_t i = 0; i < a.activated.size(); ++i)
      a.activated[i] = a.gate[i] * sigmoid(a.gate[i]) * a.up[i];
    matmul(false, false, n, hidden, ffn, a.activated.data(),
           w.w_down + static_cast<std::size_t>(f0) * hidden, 0.0f, partial.data());
    sp.scatter_add(partial, hidden, scratch, x);
  }
  std::vector<float> final_rms(shard_rows), final_out(shard_rows * hidden);
  rmsnorm_forward(x.data(), weights.final_norm, ns, hidden, config.norm_eps, final_out.data(),
                  final_rms.data());
  std::vector<float> logits(shard_rows * vocab);  // [ns, vocab], then d(loss_sum)/d(logits)
  if (config.tied_embeddings)
    matmul(false, true, ns, vocab, hidden, final_out.data(), weights.output, 0.0f, logits.data());
  else
    matmul(false, false, ns, vocab, hidden, final_out.data(), weights.output, 0.0f, logits.data());
  const std::vector<std::int32_t> targets(batch.targets.begin() + s0, batch.targets.begin() + s0 + ns);
  result.loss_sum = cross_entropy(targets, vocab, logits.data());
  result.target_count = std::count_if(targets.begin(), targets.end(),
                                      [](std::int32_t target) { return target >= 0; });

  // ---- backward ----
  const float* d_logits = logits.data();
  std::vector<float> d_final(shard_rows * hidden);
  if (config.tied_embeddings) {
    matmul(true, false, vocab, hidden, ns, d_logits, final_out.data(), 1.0f, grads.output);
    matmul(false, false, ns, hidden, vocab, d_logits, weights.output, 0.0f, d_final.data());
  } else {
    matmul(true, false, hidden, vocab, ns, final_out.data(), d_logits, 1.0f, grads.output);
    matmul(false, true, ns, hidden, vocab, d_logits, weights.output, 0.0f, d_final.data());
  }
  std::vector<float> d_x(shard_rows * hidden, 0.0f);  // d(loss_sum)/d(my residual stream)
  rmsnorm_backward(x.data(), weights.final_norm, final_rms.data(), d_final.data(), ns, hidden,
                   d_x.data(), grads.final_norm);
  std::vector<float> d_x_all;  // [n, hidden] the group's d_x (the all-gather's adjoint)
  std::vector<float> d_activated(rows * ffn), d_gate(rows * ffn), d_up(rows * ffn);
  std::vector<float> d_norm(rows * hidden), d_norm_shard(shard_rows * hidden);
  std::vector<float> d_attention(rows * q_width);
  std::vector<float> d_q(rows * q_width), d_k(rows * kv_width), d_v(rows * kv_width);
  for (int layer = config.layers - 1; layer >= 0; --layer) {
    const auto& w = weights.layers[layer];
    const auto& g = grads.layers[layer];
    const LayerActivations& a = saved[layer];
    // MLP: x_out = middle + (silu(gate) * up) * w_down, or the MoE FFN of mlp_in.
    sp.gather(d_x, hidden, d_x_all);
    if (config.moe()) {
      moe::backward(config, expert_parallel, a.mlp_in.data(), n, {w.moe.router, w.moe.experts},
                    a.moe, d_x_all.data(), {g.moe.router, g.moe.experts}, d_norm.data());
    } else {
      float* g_down = g.w_down + static_cast<std::size_t>(f0) * hidden;
      const float* w_down = w.w_down + static_cast<std::size_t>(f0) * hidden;
      matmul(true, false, ffn, hidden, n, a.activated.data(), d_x_all.data(), 1.0f, g_down);
      matmul(false, true, n, ffn, hidden, d_x_all.data(), w_down, 0.0f, d_activated.data());
      for (std::size_t i = 0; i < d_activated.size(); ++i) {
        const float s = sigmoid(a.gate[i]);
        d_up[i] = d_activated[i] * a.gate[i] * s;
        d_gate[i] = d_activated[i] * a.up[i] * s * (1.0f + a.gate[i] * (1.0f - s));
      }
      matmul_ld(true, false, hidden, ffn, n, a.mlp_in.data(), hidden, d_gate.data(), ffn, 1.0f,
                g.w_gate + f0, ffn_width);
      matmul_ld(true, false, hidden, ffn, n, a.mlp_in.data(), hidden, d_up.data(), ffn, 1.0f,
                g.w_up + f0, ffn_width);
      matmul_ld(false, true, n, hidden, ffn, d_gate.data(), ffn, w.w_gate + f0, ffn_width, 0.0f,
                d_norm.data(), hidden);
      matmul_ld(false, true, n, hidden, ffn, d_up.data(), ffn, w.w_up + f0, ffn_width, 1.0f,
                d_norm.data(), hidden);
    }
    std::fill(d_norm_shard.begin(), d_norm_shard.end(), 0.0f);
    sp.scatter_add(d_norm, hidden, scratch, d_norm_shard);
    rmsnorm_backward(a.middle.data(), w.mlp_norm, a.mlp_rms.data(), d_norm_shard.data(), ns,
                     hidden, d_x.data(), g.mlp_norm);
    // Attention: middle = input + attention(rope(q), rope(k), v) * wo.
    sp.gather(d_x, hidden, d_x_all);
    float* g_wo = g.wo + static_cast<std::size_t>(q0) * hidden;
    const float* w_wo = w.wo + static_cast<std::size_t>(q0) * hidden;
    matmul(true, false, q_width, hidden, n, a.attention.data(), d_x_all.data(), 1.0f, g_wo);
    matmul(false, true, n, q_width, hidden, d_x_all.data(), w_wo, 0.0f, d_attention.data());
    attention.backward(layer, shape, batch, d_attention.data(), d_q.data(), d_k.data(),
                       d_v.data());
    rope_rotate(d_q.data(), n, shape.heads, shape.head_dim, cosines, sines, -1.0f);
    rope_rotate(d_k.data(), n, shape.kv_heads, shape.head_dim, cosines, sines, -1.0f);
    matmul_ld(true, false, hidden, q_width, n, a.attn_in.data(), hidden, d_q.data(), q_width,
              1.0f, g.wq + q0, q_full);
    matmul_ld(true, false, hidden, kv_width, n, a.attn_in.data(), hidden, d_k.data(), kv_width,
              1.0f, g.wk + kv0, kv_full);
    matmul_ld(true, false, hidden, kv_width, n, a.attn_in.data(), hidden, d_v.data(), kv_width,
              1.0f, g.wv + kv0, kv_full);
    matmul_ld(false, true, n, hidden, q_width, d_q.data(), q_width, w.wq + q0, q_full, 0.0f,
              d_norm.data(), hidden);
    matmul_ld(false, true, n, hidden, kv_width, d_k.data(), kv_width, w.wk + kv0, kv_full, 1.0f,
              d_norm.data(), hidden);
    matmul_ld(false, true, n, hidden, kv_width, d_v.data(), kv_width, w.wv + kv0, kv_full, 1.0f,
              d_norm.data(), hidden);
    std::fill(d_norm_shard.begin(), d_norm_shard.end(), 0.0f);
    sp.scatter_add(d_norm, hidden, scratch, d_norm_shard);
    rmsnorm_backward(a.input.data(), w.attn_norm, a.attn_rms.data(), d_norm_shard.data(), ns,
                     hidden, d_x.data(), g.attn_norm);
  }
  for (int t = 0; t < ns; ++t) {
    float* row = grads.embedding + static_cast<std::size_t>(batch.tokens[s0 + t]) * hidden;
    const float* d_row = d_x.data() + static_cast<std::size_t>(t) * hidden;
    for (int j = 0; j < hidden; ++j) row[j] += d_row[j];
  }
  return result;
}

void adamw_step(const AdamWConfig& config, const std::vector<float>& gradients,
                Parameters& parameters, AdamWState& state) {
  const std::size_t size = parameters.values.size();
  if (gradients.size() != size)
    throw InputError("adamw_step: " + std::to_string(gradients.size()) +
                     " gradients for " + std::to_string(size) +
                     " parameters; pass forward_backward's gradients for these parameters");
  if (state.m.empty() && state.v.empty() && state.step == 0) {
    state.m.assign(size, 0.0f);
    state.v.assign(size, 0.0f);
  }
  BALLAST_CHECK(state.m.size() == size && state.v.size() == size,
                "AdamW state made for other parameters");
  ++state.step;
  const double step = static_cast<double>(state.step);
  const float correction1 = static_cast<float>(1.0 - std::pow(config.beta1, step));
  const float correction2 = static_cast<float>(1.0 - std::pow(config.beta2, step));
  for (const TensorInfo& tensor : parameters.tensors) {
    const float decay = tensor.shape.size() >= 2 ? config.learning_rate * config.weight_decay : 0;
    for (std::size_t i = tensor.offset; i < tensor.offset + tensor.size; ++i) {
      const float g = gradients[i];
      state.m[i] = config.beta1 * state.m[i] + (1.0f - config.beta1) * g;
      state.v[i] = config.beta2 * state.v[i] + (1.0f - config.beta2) * g * g;
      const float m_hat = state.m[i] / correction1;
      const float v_hat = state.v[i] / correction2;
      float& p = parameters.values[i];
      p -= decay * p;
      p -= config.learning_rate * m_hat / (std::sqrt(v_hat) + config.epsilon);
    }
  }
}

StepDifference compare_with_reference(const Parameters& parameters, double loss_sum,
                                      const std::vector<float>& gradients,
                                      const StepOutput& reference) {
  StepDifference difference;
  difference.max_relative_error =
      std::abs(loss_sum - reference.loss_sum) / std::max(1e-30, std::abs(reference.loss_sum));
  for (const TensorInfo& tensor : parameters.tensors) {
    double diff = 0, norm = 0;
    for (std::size_t i = tensor.offset; i < tensor.offset + tensor.size; ++i) {
      const double d = static_cast<double>(gradients[i]) - static_cast<double>(reference.gradients[i]);
      diff += d * d;
      norm += static_cast<double>(reference.gradients[i]) * static_cast<double>(reference.gradients[i]);
    }
    const double error = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
    if (error > difference.max_relative_error) {
      difference.max_relative_error = error;
      difference.worst = tensor.name;
    }
  }
  return difference;
}

}  // namespace ballast::runtime
