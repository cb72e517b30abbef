// Single-thread speed of the runtime kernels: OpenBLAS sgemm (the ceiling) and the blocked
// attention forward and backward on one causal 4096-token document and on a pack of 64
// documents of 64 tokens, 8 heads x 64 (MHA and GQA 8/2). Figures: docs/runtime-kernels.md.
// Packed batches of short documents (packed/...: 256 x 16, 64 x 64, 8 x 512 tokens, a
// mix; "shuffled": document ids not in span order, as sequence ids in a planner's order
// were before the plan engine numbered a group's documents by index) also report
// the tile pairs the kernel computes and the emulated cluster's predictions (analytical
// cost model, per-block and packed tiles: docs/cost-model.md, "Packed tiles").
// Run: OPENBLAS_NUM_THREADS=1 build/bench/bench_kernels [--benchmark_format=json]; on a CPU
// newer than OpenBLAS, add OPENBLAS_CORETYPE=Cooperlake (see openblas_core in the header).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ballast/cost_model.hpp"
#include "ballast/emulated_cluster.hpp"
#include "ballast/runtime/kernels.hpp"

// From OpenBLAS (declared here because netlib's cblas.h, which Debian's alternatives may
// select, does not declare them).
extern "C" void openblas_set_num_threads(int num_threads);
extern "C" char* openblas_get_corename(void);

namespace {

using namespace ballast::runtime;
using ballast::Pass;

std::vector<float> random_values(std::size_t count, std::uint64_t seed) {
  std::vector<float> values(count);
  for (float& value : values) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;  // LCG; speed only
    value = static_cast<float>(static_cast<double>(seed >> 40) * 0x1.0p-24 * 2.0 - 1.0);
  }
  return values;
}

void sgemm(benchmark::State& state) {
  const int size = static_cast<int>(state.range(0));
  const std::size_t values = static_cast<std::size_t>(size) * size;
  const std::vector<float> a = random_values(values, 1), b = random_values(values, 2);
  std::vector<float> c(values);
  for (auto _ : state) {
    gemm(false, false, size, size, size, 1.0f, a.data(), size, b.data(), size, 0.0f, c.data(),
         size);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * size * size * size * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

/// One attention problem: `documents` documents of `length` tokens, packed.
struct Problem {
  AttentionShape shape;
  std::vector<std::int64_t> doc, pos;
  std::vector<float> q, k, v, d_out, out, lse, delta;
  double pairs = 0;  ///< visible (query, key) pairs
  TokenSpan span() const { return {doc.data(), pos.data(), static_cast<int>(doc.size())}; }
  std::size_t q_size() const { return doc.size() * shape.heads * shape.head_dim; }
  std::size_t kv_size() const { return doc.size() * shape.kv_heads * shape.head_dim; }
  /// FLOPs of the forward: 2 GEMMs (QK^T, PV) of 2 * head_dim per pair and head.
  double forward_flops() const { return 4.0 * pairs * shape.head_dim * shape.heads; }
};

/// A packed batch: document lengths in span order and the ids they carry.
struct Batch {
  std::vector<int> lengths;
  std::vector<std::int64_t> ids;
};

Batch uniform_batch(int documents, int length) {
  Batch batch{std::vector<int>(static_cast<std::size_t>(documents), length), {}};
  for (int d = 0; d < documents; ++d) batch.ids.push_back(d);
  return batch;
}

/// 4,096 tokens: one 1,024-token document, 8 of 200, 40 of 30, 128 of 10 and 112 of 1,
/// in that order (longest first, as a packing planner leaves them).
Batch mixed_batch() {
  Batch batch;
  for (const auto& [count, length] :
       {std::pair{1, 1024}, {8, 200}, {40, 30}, {128, 10}, {112, 1}}) {
    for (int d = 0; d < count; ++d) batch.lengths.push_back(length);
  }
  batch.ids.resize(batch.lengths.size());
  std::iota(batch.ids.begin(), batch.ids.end(), std::int64_t{0});
  return batch;
}

/// The same documents carrying their ids in a random order.
Batch shuffled(Batch batch) {
  std::shuffle(batch.ids.begin(), batch.ids.end(), std::mt19937_64(1));
  return batch;
}

Problem make_problem(const Batch& batch, int kv_heads) {
  Problem p;
  p.shape = {8, kv_heads, 64};
  for (std::size_t d = 0; d < batch.lengths.size(); ++d) {
    const int length = batch.lengths[d];
    for (int position = 0; position < length; ++position) {
      p.doc.push_back(batch.ids[d]);
      p.pos.push_back(position);
    }
    p.pairs += static_cast<double>(length) * (length + 1) / 2;
  }
  p.q = random_values(p.q_size(), 3);
  p.k = random_values(p.kv_size(), 4);
  p.v = random_values(p.kv_size(), 5);
  p.d_out = random_values(p.q_size(), 6);
  AttentionAccumulator accumulator;
  accumulator.reset(static_cast<int>(p.doc.size()), p.shape);
  attention_forward_accumulate(p.shape, p.q.data(), p.span(), p.k.data(), p.v.data(), p.span(),
                               accumulator);
  p.out.resize(p.q_size());
  p.lse.resize(p.doc.size() * p.shape.heads);
  p.delta.resize(p.lse.size());
  attention_forward_finalize(p.shape, accumulator, p.out.data(), p.lse.data());
  attention_backward_delta(p.shape, p.span().count, p.out.data(), p.d_out.data(), p.delta.data());
  return p;
}

/// The kernel's tile pairs and the emulated cluster's predictions (one layer of this
/// shape, per-block and packed tiles) as counters.
void add_model_counters(benchmark::State& state, const Batch& batch, const Problem& p, Pass pass) {
  ballast::Model model;
  model.name = "bench";
  model.layers = 1;
  model.hidden = p.shape.heads * p.shape.head_dim;
  model.heads = p.shape.heads;
  model.kv_heads = p.shape.kv_heads;
  model.ffn_hidden = model.hidden;
  model.activation_bytes_per_token = 1;
  ballast::Cluster cluster = ballast::emulated_cluster(model, 1, 1, 1 << 20);
  std::vector<ballast::AttentionBlock> blocks;
  std::vector<ballast::DocumentRange> span;
  ballast::Tokens per_block_tiles = 0;
  for (std::size_t d = 0; d < batch.lengths.size(); ++d) {
    blocks.push_back(ballast::whole_document(batch.lengths[d]));
    span.push_back({batch.ids[d], 0, batch.lengths[d]});
    per_block_tiles += ballast::causal_tiles(blocks.back(), cluster.attention_tile_tokens);
  }
  const ballast::AnalyticalCostModel per_block(cluster, model);
  cluster.attention_tiles_packed = true;
  const ballast::AnalyticalCostModel packed(cluster, model);
  // The emulated cluster keeps the h100 preset's curves; without them every tile runs at
  // its flat attention_efficiency (0.8, what emulated_cluster.cpp's comment calibrates).
  cluster.attention_forward_curve.clear();
  cluster.attention_backward_curve.clear();
  const ballast::AnalyticalCostModel packed_flat(cluster, model);
  state.counters["tiles"] = static_cast<double>(attention_tile_pairs(p.span(), p.span()));
  state.counters["tiles_model_packed"] =
      static_cast<double>(ballast::packed_tile_pairs({span, span}, cluster.attention_tile_tokens));
  state.counters["tiles_model_per_block"] = static_cast<double>(per_block_tiles);
  state.counters["predicted_packed_ms"] = 1e3 * packed.attention_call_time_s({span, span}, 1, pass);
  state.counters["predicted_per_block_ms"] = 1e3 * per_block.attention_time_s(blocks, 1, pass);
  state.counters["predicted_packed_flat_ms"] =
      1e3 * packed_flat.attention_call_time_s({span, span}, 1, pass);
}

void attention_forward(benchmark::State& state, const Batch& batch, int kv_heads,
                       bool model_counters) {
  const Problem p = make_problem(batch, kv_heads);
  AttentionAccumulator accumulator;
  std::vector<float> out(p.q_size()), lse(p.lse.size());
  for (auto _ : state) {
    accumulator.reset(p.span().count, p.shape);
    attention_forward_accumulate(p.shape, p.q.data(), p.span(), p.k.data(), p.v.data(), p.span(),
                                 accumulator);
    attention_forward_finalize(p.shape, accumulator, out.data(), lse.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(p.forward_flops() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["pairs"] = p.pairs;
  if (model_counters) add_model_counters(state, batch, p, Pass::forward);
}

void attention_backward(benchmark::State& state, const Batch& batch, int kv_heads,
                        bool model_counters) {
  const Problem p = make_problem(batch, kv_heads);
  std::vector<float> d_q(p.q_size()), d_k(p.kv_size()), d_v(p.kv_size()), delta(p.delta.size());
  for (auto _ : state) {
    attention_backward_delta(p.shape, p.span().count, p.out.data(), p.d_out.data(), delta.data());
    std::fill(d_q.begin(), d_q.end(), 0.0f);
    std::fill(d_k.begin(), d_k.end(), 0.0f);
    std::fill(d_v.begin(), d_v.end(), 0.0f);
    attention_backward_accumulate(p.shape, p.q.data(), p.d_out.data(), p.lse.data(), delta.data(),
                                  p.span(), p.k.data(), p.v.data(), p.span(), d_q.data(),
                                  d_k.data(), d_v.data());
    benchmark::DoNotOptimize(d_q.data());
  }
  // FlashAttention's convention: the backward's 5 GEMMs count 2.5 forwards.
  state.counters["GFLOP/s"] = benchmark::Counter(2.5 * p.forward_flops() * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["pairs"] = p.pairs;
  if (model_counters) add_model_counters(state, batch, p, Pass::backward);
}

const bool registered = [] {
  benchmark::RegisterBenchmark("sgemm", sgemm)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond);
  struct Layout {
    std::string name;
    Batch batch;
  };
  const auto add = [](const std::string& name, const Batch& batch, int kv_heads, bool model) {
    const std::string suffix = name + "/h8kv" + std::to_string(kv_heads) + "d64";
    benchmark::RegisterBenchmark(("attention_forward/" + suffix).c_str(), attention_forward,
                                 batch, kv_heads, model)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("attention_backward/" + suffix).c_str(), attention_backward,
                                 batch, kv_heads, model)
        ->Unit(benchmark::kMillisecond);
  };
  for (const Layout& layout : {Layout{"causal4096", uniform_batch(1, 4096)},
                               Layout{"docs64x64", uniform_batch(64, 64)}}) {
    for (int kv_heads : {8, 2}) add(layout.name, layout.batch, kv_heads, false);
  }
  // Packed batches with the tile counts and predictions (MHA).
  for (const Layout& layout :
       {Layout{"docs256x16", uniform_batch(256, 16)}, Layout{"docs64x64", uniform_batch(64, 64)},
        Layout{"docs8x512", uniform_batch(8, 512)}, Layout{"mixed", mixed_batch()},
        Layout{"docs256x16_shuffled", shuffled(uniform_batch(256, 16))},
        Layout{"mixed_shuffled", shuffled(mixed_batch())}}) {
    add("packed/" + layout.name, layout.batch, 8, true);
  }
  return true;
}();

}  // namespace

int main(int argc, char** argv) {
  openblas_set_num_threads(1);  // the single-thread figures; OPENBLAS_NUM_THREADS=1 too
  // The kernel OpenBLAS picked: a CPU newer than the library falls back to "Prescott" (SSE3,
  // ~5x slower); OPENBLAS_CORETYPE overrides it (docs/runtime-kernels.md).
  benchmark::AddCustomContext("openblas_core", openblas_get_corename());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
