// Tests of the runtime's model: config checks, parameter layout, packing, every gradient
// against finite differences, invariance to the order and grouping of documents, the
// local attention engine against the naive reference, and AdamW lowering the loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "ballast/error.hpp"
#include "ballast/runtime/model.hpp"
#include "ballast/workload.hpp"

namespace ballast::runtime {
namespace {

ModelConfig tiny_config(bool tied) {
  ModelConfig config;
  config.vocab = 32;
  config.hidden = 16;
  config.layers = 2;
  config.heads = 4;
  config.kv_heads = 2;
  config.ffn_hidden = 24;
  config.tied_embeddings = tied;
  return config;
}

/// tiny_config with a mixture of 4 experts of width 8, top-2, in every layer.
ModelConfig tiny_moe_config(bool tied) {
  ModelConfig config = tiny_config(tied);
  config.experts = 4;
  config.experts_per_token = 2;
  config.expert_ffn_hidden = 8;
  return config;
}

/// Three documents, one of them a single token (no target).
std::vector<std::vector<std::int32_t>> tiny_documents() {
  return {{3, 17, 5, 29, 8}, {11}, {30, 2, 2, 19, 7, 23}};
}

double uniform(std::uint64_t& state) {
  return static_cast<double>(splitmix64_next(state) >> 11) * 0x1.0p-53;
}

/// Parameters far from init, so that every path (attention that is not uniform, norms that
/// are not 1, a residual stream the layers change) carries gradient worth checking.
Parameters random_parameters(const ModelConfig& config, std::uint64_t seed) {
  Parameters parameters = init_parameters(config, seed);
  std::uint64_t state = seed * 7 + 1;
  for (const TensorInfo& tensor : parameters.tensors) {
    const bool norm = tensor.shape.size() == 1;
    const double scale = norm ? 0.4 : 1.2 / std::sqrt(static_cast<double>(tensor.shape[0]));
    for (std::size_t i = tensor.offset; i < tensor.offset + tensor.size; ++i)
      parameters.values[i] =
          static_cast<float>((norm ? 1.0 : 0.0) + scale * (2.0 * uniform(state) - 1.0));
  }
  return parameters;
}

StepOutput run(const ModelConfig& config, const Parameters& parameters, const TokenBatch& batch) {
  LocalAttentionEngine engine;
  return forward_backward(config, parameters, batch, engine);
}

double loss_at(const ModelConfig& config, const Parameters& parameters, const TokenBatch& batch) {
  return run(config, parameters, batch).loss_sum;
}

double max_abs(const std::vector<float>& values) {
  double largest = 0;
  for (float value : values) largest = std::max(largest, static_cast<double>(std::abs(value)));
  return largest;
}

/// The naive attention of kernels.hpp behind the engine interface: the slow reference the
/// local engine (and every distributed one) must match.
class ReferenceAttentionEngine final : public AttentionEngine {
 public:
  void forward(int layer, const AttentionShape& shape, const TokenBatch& batch, const float* q,
               const float* k, const float* v, float* out) override {
    if (saved_.size() <= static_cast<std::size_t>(layer)) saved_.resize(layer + 1);
    const std::size_t n = batch.size();
    saved_[layer].q.assign(q, q + n * shape.heads * shape.head_dim);
    saved_[layer].k.assign(k, k + n * shape.kv_heads * shape.head_dim);
    saved_[layer].v.assign(v, v + n * shape.kv_heads * shape.head_dim);
    attention_reference_forward(shape, q, batch.span(), k, v, batch.span(), out);
  }
  void backward(int layer, const AttentionShape& shape, const TokenBatch& batch,
                const float* d_out, float* d_q, float* d_k, float* d_v) override {
    const auto& s = saved_.at(layer);
    attention_reference_backward(shape, s.q.data(), d_out, batch.span(), s.k.data(), s.v.data(),
                                 batch.span(), d_q, d_k, d_v);
  }

 private:
  struct Saved {
    std::vector<float> q, k, v;
  };
  std::vector<Saved> saved_;
};

// ---- config, layout, packing ----------------------------------------------------------

void expect_config_error(const ModelConfig& config, const std::string& field) {
  try {
    config.check();
    ADD_FAILURE() << "no InputError for a bad " << field;
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find(field), std::string::npos) << error.what();
  }
}

TEST(ModelConfig, DefaultsAndTinyAreValid) {
  EXPECT_NO_THROW(ModelConfig{}.check());
  EXPECT_NO_THROW(tiny_config(true).check());
  EXPECT_EQ(tiny_config(true).head_dim(), 4);
}

TEST(ModelConfig, CheckNamesTheBadField) {
  auto with = [](auto change) {
    ModelConfig config = tiny_config(true);
    change(config);
    return config;
  };
  expect_config_error(with([](ModelConfig& c) { c.vocab = 0; }), "vocab");
  expect_config_error(with([](ModelConfig& c) { c.hidden = -16; }), "hidden");
  expect_config_error(with([](ModelConfig& c) { c.layers = 0; }), "layers");
  expect_config_error(with([](ModelConfig& c) { c.heads = 0; }), "heads");
  expect_config_error(with([](ModelConfig& c) { c.kv_heads = 0; }), "kv_heads");
  expect_config_error(with([](ModelConfig& c) { c.ffn_hidden = 0; }), "ffn_hidden");
  expect_config_error(with([](ModelConfig& c) { c.hidden = 18; }), "hidden");  // 18 % 4
  expect_config_error(with([](ModelConfig& c) { c.hidden = 12; }), "head_dim");  // 3, odd
  expect_config_error(with([](ModelConfig& c) { c.kv_heads = 3; }), "kv_heads");
  expect_config_error(with([](ModelConfig& c) { c.rope_theta = 0; }), "rope_theta");
  expect_config_error(with([](ModelConfig& c) { c.norm_eps = -1; }), "norm_eps");
  EXPECT_THROW(init_parameters(with([](ModelConfig& c) { c.kv_heads = 3; }), 1), InputError);
}

TEST(ModelConfig, MoeFieldsAreChecked) {
  auto with = [](auto change) {
    ModelConfig config = tiny_moe_config(true);
    change(config);
    return config;
  };
  EXPECT_NO_THROW(tiny_moe_config(true).check());
  EXPECT_TRUE(tiny_moe_config(true).moe());
  EXPECT_FALSE(tiny_config(true).moe());
  expect_config_error(with([](ModelConfig& c) { c.experts = -1; }), "experts");
  expect_config_error(with([](ModelConfig& c) { c.experts_per_token = 0; }), "experts_per_token");
  expect_config_error(with([](ModelConfig& c) { c.experts_per_token = 5; }), "experts_per_token");
  expect_config_error(with([](ModelConfig& c) { c.expert_ffn_hidden = 0; }), "expert_ffn_hidden");
  expect_config_error(with([](ModelConfig& c) { c.experts = 0; }), "experts_per_token");
  expect_config_error(with([](ModelConfig& c) {
                        c.experts = 0;
                        c.experts_per_token = 0;
                      }),
                      "expert_ffn_hidden");
  // Tensor parallelism is rejected for an MoE model; EP must divide the experts and needs one.
  auto message_of = [](auto call) {
    try {
      call();
    } catch (const InputError& error) {
      return std::string(error.what());
    }
    return std::string("no InputError");
  };
  EXPECT_NE(message_of([&] { check_tensor_parallel(tiny_moe_config(true), 2); }).find("experts"),
            std::string::npos);
  EXPECT_NO_THROW(check_expert_parallel(tiny_moe_config(true), 2));
  EXPECT_NO_THROW(check_expert_parallel(tiny_moe_config(true), 4));
  EXPECT_NE(message_of([&] { check_expert_parallel(tiny_moe_config(true), 3); }).find("experts"),
            std::string::npos);
  EXPECT_NE(message_of([&] { check_expert_parallel(tiny_config(true), 2); }).find("expert parallelism"),
            std::string::npos);
  EXPECT_NO_THROW(check_expert_parallel(tiny_config(true), 1));
}

TEST(ModelParameters, MoeLayoutRouterAndExperts) {
  const ModelConfig config = tiny_moe_config(true);
  const Parameters parameters = init_parameters(config, 42);
  // Per layer: 6 attention and norm tensors, the router, 3 per expert.
  EXPECT_EQ(parameters.tensors.size(), 1u + (7u + 3u * 4u) * config.layers + 1u);
  std::size_t offset = 0;
  for (const TensorInfo& tensor : parameters.tensors) {
    EXPECT_EQ(tensor.offset, offset) << tensor.name;
    offset += tensor.size;
  }
  EXPECT_EQ(offset, parameters.values.size());
  EXPECT_EQ(parameters.info("layer0.router").shape, (std::vector<int>{16, 4}));
  EXPECT_EQ(parameters.info("layer1.expert3.w_gate").shape, (std::vector<int>{16, 8}));
  EXPECT_EQ(parameters.info("layer1.expert3.w_up").shape, (std::vector<int>{16, 8}));
  EXPECT_EQ(parameters.info("layer1.expert3.w_down").shape, (std::vector<int>{8, 16}));
  EXPECT_EQ(parameters.info("layer0.router").offset, parameters.info("layer0.mlp_norm").offset + 16);
  EXPECT_THROW(parameters.info("layer0.w_gate"), InternalError);
  EXPECT_THROW(parameters.info("layer0.expert4.w_up"), InternalError);
  // The same seed gives the dense model's embedding and first attention weights.
  const Parameters dense = init_parameters(tiny_config(true), 42);
  const std::size_t shared = parameters.info("layer0.mlp_norm").offset;
  EXPECT_TRUE(std::equal(dense.values.begin(), dense.values.begin() + static_cast<std::ptrdiff_t>(shared),
                         parameters.values.begin()));
}

TEST(ModelParameters, LayoutShapesAndInit) {
  for (bool tied : {true, false}) {
    const ModelConfig config = tiny_config(tied);
    const Parameters parameters = init_parameters(config, 42);
    EXPECT_EQ(parameters.tensors.size(), 1u + 9u * config.layers + 1u + (tied ? 0u : 1u));
    std::size_t offset = 0;
    for (const TensorInfo& tensor : parameters.tensors) {
      EXPECT_EQ(tensor.offset, offset) << tensor.name;
      offset += tensor.size;
    }
    EXPECT_EQ(offset, parameters.values.size());
    EXPECT_EQ(parameters.info("embedding").shape, (std::vector<int>{32, 16}));
    EXPECT_EQ(parameters.info("layer0.wq").shape, (std::vector<int>{16, 16}));
    EXPECT_EQ(parameters.info("layer1.wk").shape, (std::vector<int>{16, 8}));
    EXPECT_EQ(parameters.info("layer1.wv").shape, (std::vector<int>{16, 8}));
    EXPECT_EQ(parameters.info("layer1.wo").shape, (std::vector<int>{16, 16}));
    EXPECT_EQ(parameters.info("layer1.w_gate").shape, (std::vector<int>{16, 24}));
    EXPECT_EQ(parameters.info("layer1.w_up").shape, (std::vector<int>{16, 24}));
    EXPECT_EQ(parameters.info("layer1.w_down").shape, (std::vector<int>{24, 16}));
    EXPECT_EQ(parameters.info("final_norm").shape, (std::vector<int>{16}));
    if (tied)
      EXPECT_THROW(parameters.info("lm_head"), InternalError);
    else
      EXPECT_EQ(parameters.info("lm_head").shape, (std::vector<int>{16, 32}));
    EXPECT_THROW(parameters.info("layer2.wq"), InternalError);

    // Norms are 1; matrices have mean ~0 and standard deviation ~0.02.
    const TensorInfo& norm = parameters.info("layer1.mlp_norm");
    for (std::size_t i = 0; i < norm.size; ++i) EXPECT_EQ(parameters.values[norm.offset + i], 1.0f);
    double sum = 0, squares = 0;
    std::size_t count = 0;
    for (const TensorInfo& tensor : parameters.tensors) {
      if (tensor.shape.size() != 2) continue;
      for (std::size_t i = tensor.offset; i < tensor.offset + tensor.size; ++i) {
        sum += parameters.values[i];
        squares += static_cast<double>(parameters.values[i]) * parameters.values[i];
        ++count;
      }
    }
    const double mean = sum / count;
    const double std = std::sqrt(squares / count - mean * mean);
    EXPECT_NEAR(mean, 0.0, 0.002);
    EXPECT_NEAR(std, 0.02, 0.001);
  }
  // Deterministic in the seed; the tied model is the untied one without its lm_head.
  const Parameters tied = init_parameters(tiny_config(true), 7);
  const Parameters untied = init_parameters(tiny_config(false), 7);
  EXPECT_EQ(tied.values, init_parameters(tiny_config(true), 7).values);
  EXPECT_NE(tied.values, init_parameters(tiny_config(true), 8).values);
  EXPECT_TRUE(std::equal(tied.values.begin(), tied.values.end(), untied.values.begin()));
}

TEST(ModelPacking, TargetsDocumentsAndPositions) {
  const TokenBatch batch = pack_documents({{1, 2, 3}, {}, {4}, {5, 6}});
  EXPECT_EQ(batch.tokens, (std::vector<std::int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(batch.targets, (std::vector<std::int32_t>{2, 3, -1, -1, 6, -1}));
  EXPECT_EQ(batch.doc, (std::vector<std::int64_t>{0, 0, 0, 2, 3, 3}));
  EXPECT_EQ(batch.pos, (std::vector<std::int64_t>{0, 1, 2, 0, 0, 1}));
  EXPECT_EQ(batch.size(), 6);
  EXPECT_EQ(batch.span().count, 6);
}

TEST(ModelForward, RejectsBadBatchesAndParameters) {
  const ModelConfig config = tiny_config(true);
  const Parameters parameters = init_parameters(config, 1);
  TokenBatch batch = pack_documents({{1, 2, 40}});
  EXPECT_THROW(run(config, parameters, batch), InputError);  // 40 >= vocab
  batch = pack_documents({{1, 2, 3}});
  batch.pos.pop_back();
  EXPECT_THROW(run(config, parameters, batch), InputError);
  EXPECT_THROW(run(tiny_config(false), parameters, pack_documents({{1, 2}})), InputError);
}

TEST(ModelForward, EmptyBatchGivesZeroLossAndGradients) {
  const ModelConfig config = tiny_config(false);
  const StepOutput output = run(config, init_parameters(config, 1), TokenBatch{});
  EXPECT_EQ(output.loss_sum, 0.0);
  EXPECT_EQ(output.target_count, 0);
  EXPECT_EQ(max_abs(output.gradients), 0.0);
}

// ---- gradients -------------------------------------------------------------------------

/// Central differences of the fp32 model. With h = 1e-2 on parameters of size ~0.3 the
/// truncation error h^2 / 6 * f''' is ~1e-5 * |f'''|, and the rounding of the fp32 loss
/// (~40 nats summed from fp32 logits, relative error ~1e-7 per op over a few dozen ops,
/// so ~1e-5 absolute) divided by 2h is ~5e-4. Hence the tolerance 2e-3 + 2% relative:
/// large against that noise, far below any real error (a dropped term or a wrong sign
/// is off by O(|gradient|), and the checked gradients reach O(0.1 .. 1)).
class ModelGradient : public ::testing::TestWithParam<bool> {};

/// Central differences of sampled entries of every tensor against `analytic`.
void expect_finite_differences_match(const ModelConfig& config, Parameters parameters,
                                     const TokenBatch& batch, const StepOutput& analytic) {
  constexpr float kStep = 1e-2f;
  constexpr double kAbsolute = 2e-3, kRelative = 0.02;
  std::uint64_t state = 99;
  for (const TensorInfo& tensor : parameters.tensors) {
    // All entries of small tensors, 24 sampled ones (plus the first and last) of others.
    std::vector<std::size_t> entries;
    if (tensor.size <= 32) {
      entries.resize(tensor.size);
      std::iota(entries.begin(), entries.end(), std::size_t{0});
    } else {
      entries = {0, tensor.size - 1};
      for (int i = 0; i < 24; ++i) entries.push_back(uniform_below(state, tensor.size));
    }
    double largest = 0;
    for (std::size_t entry : entries) {
      const std::size_t index = tensor.offset + entry;
      const float original = parameters.values[index];
      parameters.values[index] = original + kStep;
      const double plus = loss_at(config, parameters, batch);
      parameters.values[index] = original - kStep;
      const double minus = loss_at(config, parameters, batch);
      parameters.values[index] = original;
      const double numeric = (plus - minus) / (2.0 * kStep);
      const double exact = analytic.gradients[index];
      largest = std::max(largest, std::abs(exact));
      EXPECT_NEAR(exact, numeric, kAbsolute + kRelative * std::abs(numeric))
          << tensor.name << "[" << entry << "]";
    }
    EXPECT_GT(largest, 1e-2) << tensor.name << ": the check saw no real gradient";
  }
}

TEST_P(ModelGradient, EveryTensorMatchesFiniteDifferences) {
  const ModelConfig config = tiny_config(GetParam());
  const Parameters parameters = random_parameters(config, 5);
  const TokenBatch batch = pack_documents(tiny_documents());
  const StepOutput analytic = run(config, parameters, batch);
  EXPECT_EQ(analytic.target_count, 9);
  expect_finite_differences_match(config, parameters, batch, analytic);
  if (config.tied_embeddings) return;
  // Tokens absent from the batch get no embedding gradient (untied only: tied, the LM head
  // reaches every row).
  const TensorInfo& embedding = parameters.info("embedding");
  for (int j = 0; j < config.hidden; ++j)
    EXPECT_EQ(analytic.gradients[embedding.offset + 1 * config.hidden + j], 0.0f);
}

/// The gradient along one seeded random direction over every parameter against the
/// central difference of the loss (step 1e-3).
void expect_directional_derivative_matches(const ModelConfig& config, const Parameters& parameters,
                                           const TokenBatch& batch, const StepOutput& analytic) {
  std::uint64_t state = 3;
  std::vector<float> direction(parameters.values.size());
  for (float& d : direction) d = static_cast<float>(2.0 * uniform(state) - 1.0);
  double exact = 0;
  for (std::size_t i = 0; i < direction.size(); ++i)
    exact += static_cast<double>(direction[i]) * analytic.gradients[i];
  constexpr float kStep = 1e-3f;
  Parameters plus = parameters, minus = parameters;
  for (std::size_t i = 0; i < direction.size(); ++i) {
    plus.values[i] += kStep * direction[i];
    minus.values[i] -= kStep * direction[i];
  }
  const double numeric =
      (loss_at(config, plus, batch) - loss_at(config, minus, batch)) / (2.0 * kStep);
  EXPECT_NEAR(exact, numeric, 0.01 * std::abs(exact) + 0.05) << exact;
}

TEST_P(ModelGradient, DirectionalDerivativeOverAllParameters) {
  const ModelConfig config = tiny_config(GetParam());
  const Parameters parameters = random_parameters(config, 11);
  const TokenBatch batch = pack_documents(tiny_documents());
  const StepOutput analytic = run(config, parameters, batch);
  expect_directional_derivative_matches(config, parameters, batch, analytic);
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, ModelGradient, ::testing::Values(true, false),
                         [](const auto& test) { return test.param ? "Tied" : "Untied"; });

/// The MoE layer (4 experts, top-2) through experts, gate softmax and router. The top-k
/// choice is piecewise constant, so a central difference is only the derivative while no
/// token's selection flips between loss(p - h) and loss(p + h): a step h = 0.01 moves a
/// logit by O(h), so the smallest gap between a token's k-th and (k+1)-th logit must be
/// well above it. Routers scaled by 3 and seed 4 give 0.28 (seeds 1-39 scanned: the
/// largest); checked below, so a change that moves it fails loudly rather than flakily.
TEST(ModelGradientMoe, EveryTensorMatchesFiniteDifferences) {
  for (bool tied : {true, false}) {
    const ModelConfig config = tiny_moe_config(tied);
    Parameters parameters = random_parameters(config, 4);
    for (int layer = 0; layer < config.layers; ++layer) {
      const TensorInfo& router = parameters.info("layer" + std::to_string(layer) + ".router");
      for (std::size_t i = router.offset; i < router.offset + router.size; ++i) parameters.values[i] *= 3.0f;
    }
    const TokenBatch batch = pack_documents(tiny_documents());
    const StepOutput analytic = run(config, parameters, batch);
    EXPECT_EQ(analytic.target_count, 9);
    std::printf("smallest top-k margin %.4f (%s)\n", analytic.smallest_top_k_margin,
                tied ? "tied" : "untied");
    EXPECT_GT(analytic.smallest_top_k_margin, 0.1);
    expect_finite_differences_match(config, parameters, batch, analytic);
  }
}

TEST(ModelGradientMoe, DirectionalDerivativeAndTopKOfAll) {
  // k = experts: no selection at all, so every direction is smooth.
  ModelConfig config = tiny_moe_config(false);
  config.experts_per_token = config.experts;
  const Parameters parameters = random_parameters(config, 11);
  const TokenBatch batch = pack_documents(tiny_documents());
  const StepOutput analytic = run(config, parameters, batch);
  EXPECT_TRUE(std::isinf(analytic.smallest_top_k_margin));
  expect_directional_derivative_matches(config, parameters, batch, analytic);
}

// ---- invariance the distributed runtime relies on --------------------------------------

/// |a - b| <= tolerance * max|b| per entry: fp32 sums over tokens in another order.
void expect_same_gradients(const std::vector<float>& actual, const std::vector<float>& expected,
                           double tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  const double bound = tolerance * max_abs(expected);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < actual.size(); ++i)
    if (std::abs(static_cast<double>(actual[i]) - expected[i]) > bound && bad++ < 5)
      ADD_FAILURE() << "gradient " << i << ": " << actual[i] << " vs " << expected[i];
}

TEST(ModelInvariance, DocumentOrderDoesNotMatter) {
  for (bool tied : {true, false}) {
    const ModelConfig config = tiny_config(tied);
    const Parameters parameters = random_parameters(config, 21);
    auto documents = tiny_documents();
    const StepOutput reference = run(config, parameters, pack_documents(documents));
    std::rotate(documents.begin(), documents.begin() + 2, documents.end());
    const StepOutput rotated = run(config, parameters, pack_documents(documents));
    EXPECT_NEAR(rotated.loss_sum, reference.loss_sum, 1e-5 * reference.loss_sum);
    EXPECT_EQ(rotated.target_count, reference.target_count);
    expect_same_gradients(rotated.gradients, reference.gradients, 1e-5);
  }
}

TEST(ModelInvariance, AnyTokenOrderDoesNotMatter) {
  // Masks and RoPE come from doc and pos only, so the batch's tokens may come in any order
  // (as a rank's zigzag chunks do). This is also the test that catches RoPE reading the
  // token's index instead of pos: RoPE scores depend only on position differences, which a
  // per-document offset keeps but a shuffle does not.
  const ModelConfig config = tiny_config(false);
  const Parameters parameters = random_parameters(config, 23);
  const TokenBatch packed = pack_documents(tiny_documents());
  std::vector<int> order(packed.size());
  std::iota(order.begin(), order.end(), 0);
  std::uint64_t state = 5;
  for (int i = packed.size() - 1; i > 0; --i)
    std::swap(order[i], order[uniform_below(state, static_cast<std::uint64_t>(i) + 1)]);
  TokenBatch shuffled;
  for (int t : order) {
    shuffled.tokens.push_back(packed.tokens[t]);
    shuffled.targets.push_back(packed.targets[t]);
    shuffled.doc.push_back(packed.doc[t]);
    shuffled.pos.push_back(packed.pos[t]);
  }
  const StepOutput reference = run(config, parameters, packed);
  const StepOutput output = run(config, parameters, shuffled);
  EXPECT_NEAR(output.loss_sum, reference.loss_sum, 1e-5 * reference.loss_sum);
  expect_same_gradients(output.gradients, reference.gradients, 1e-5);
}

TEST(ModelInvariance, BatchIsTheSumOfItsDocuments) {
  for (bool tied : {true, false}) {
    const ModelConfig config = tiny_config(tied);
    const Parameters parameters = random_parameters(config, 31);
    const auto documents = tiny_documents();
    const StepOutput batch = run(config, parameters, pack_documents(documents));
    double loss_sum = 0;
    std::int64_t target_count = 0;
    std::vector<float> gradients(parameters.values.size(), 0.0f);
    for (const auto& document : documents) {
      // Alone, the document has id 0 and the same positions: positions restart per document.
      const StepOutput alone = run(config, parameters, pack_documents({document}));
      loss_sum += alone.loss_sum;
      target_count += alone.target_count;
      for (std::size_t i = 0; i < gradients.size(); ++i) gradients[i] += alone.gradients[i];
    }
    EXPECT_NEAR(batch.loss_sum, loss_sum, 1e-5 * loss_sum);
    EXPECT_EQ(batch.target_count, target_count);
    expect_same_gradients(batch.gradients, gradients, 1e-5);
  }
}

TEST(ModelInvariance, LocalEngineMatchesTheNaiveReference) {
  for (bool tied : {true, false}) {
    const ModelConfig config = tiny_config(tied);
    const Parameters parameters = random_parameters(config, 41);
    const TokenBatch batch = pack_documents(tiny_documents());
    ReferenceAttentionEngine reference_engine;
    const StepOutput reference = forward_backward(config, parameters, batch, reference_engine);
    const StepOutput local = run(config, parameters, batch);
    EXPECT_NEAR(local.loss_sum, reference.loss_sum, 1e-5 * reference.loss_sum);
    expect_same_gradients(local.gradients, reference.gradients, 1e-4);
  }
}

// ---- loss at init and training ----------------------------------------------------------

std::vector<std::int32_t> bytes_of(const std::string& text) {
  std::vector<std::int32_t> tokens;
  for (unsigned char c : text) tokens.push_back(c);
  return tokens;
}

TEST(ModelTraining, InitialLossIsAboutLnVocab) {
  ModelConfig config;  // byte-level defaults
  for (bool tied : {true, false}) {
    config.tied_embeddings = tied;
    const StepOutput output =
        run(config, init_parameters(config, 2024),
            pack_documents({bytes_of("The quick brown fox jumps over the lazy dog."),
                            bytes_of("Pack my box with five dozen liquor jugs!")}));
    EXPECT_EQ(output.target_count, 43 + 39);
    EXPECT_NEAR(output.loss_sum / output.target_count, std::log(256.0), 0.05);
  }
}

TEST(ModelTraining, AdamWFirstStepByHand) {
  // Step 1: m_hat = g and v_hat = g^2, so each parameter moves by -lr * g / (|g| + eps),
  // after matrices decay by lr * weight_decay.
  ModelConfig config = tiny_config(true);
  Parameters parameters = random_parameters(config, 3);
  const Parameters before = parameters;
  std::vector<float> gradients(parameters.values.size());
  for (std::size_t i = 0; i < gradients.size(); ++i)
    gradients[i] = (i % 3 == 0 ? -1.0f : 1.0f) * (0.01f + 0.001f * static_cast<float>(i % 7));
  AdamWConfig adamw;
  adamw.learning_rate = 0.01f;
  adamw.weight_decay = 0.5f;
  AdamWState state;
  adamw_step(adamw, gradients, parameters, state);
  EXPECT_EQ(state.step, 1);
  for (const TensorInfo& tensor : parameters.tensors) {
    const float keep = tensor.shape.size() == 2 ? 1.0f - 0.01f * 0.5f : 1.0f;
    for (std::size_t i = tensor.offset; i < tensor.offset + tensor.size; ++i) {
      const float expected =
          before.values[i] * keep - 0.01f * (gradients[i] > 0 ? 1.0f : -1.0f);
      EXPECT_NEAR(parameters.values[i], expected, 1e-6) << tensor.name;
    }
  }
  EXPECT_THROW(adamw_step(adamw, std::vector<float>(3), parameters, state), InputError);
}

TEST(ModelTraining, AdamWLowersTheLossOnRepeatedText) {
  ModelConfig config;
  config.hidden = 32;
  config.ffn_hidden = 64;
  config.heads = 4;
  config.kv_heads = 2;
  const std::string sentence = "ballast balances the batch. ";
  std::string text;
  for (int i = 0; i < 3; ++i) text += sentence;
  const TokenBatch batch = pack_documents({bytes_of(text), bytes_of(sentence + sentence)});
  Parameters parameters = init_parameters(config, 9);
  AdamWConfig adamw;
  adamw.learning_rate = 1e-2f;
  AdamWState state;
  std::vector<double> losses;
  for (int step = 0; step < 15; ++step) {
    LocalAttentionEngine engine;
    StepOutput output = forward_backward(config, parameters, batch, engine);
    losses.push_back(output.loss_sum / output.target_count);
    for (float& g : output.gradients) g /= static_cast<float>(output.target_count);
    adamw_step(adamw, output.gradients, parameters, state);
  }
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.05);
  EXPECT_LT(losses.back(), 0.6 * losses.front()) << losses.back();
  for (std::size_t i = 1; i < 5; ++i) EXPECT_LT(losses[i], losses[i - 1]);
}

}  // namespace
}  // namespace ballast::runtime
