// Single-thread speed of the runtime kernels: OpenBLAS sgemm (the ceiling) and the blocked
// attention forward and backward on one causal 4096-token document and on a pack of 64
// documents of 64 tokens, 8 heads x 64 (MHA and GQA 8/2). Figures: docs/runtime-kernels.md.
// Run: OPENBLAS_NUM_THREADS=1 build/bench/bench_kernels [--benchmark_format=json]; on a CPU
// newer than OpenBLAS, add OPENBLAS_CORETYPE=Cooperlake (see openblas_core in the header).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ballast/runtime/kernels.hpp"

// From OpenBLAS (declared here because netlib's cblas.h, which Debian's alternatives may
// select, does not declare them).
extern "C" void openblas_set_num_threads(int num_threads);
extern "C" char* openblas_get_corename(void);

namespace {

using namespace ballast::runtime;

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

Problem make_problem(int documents, int length, int kv_heads) {
  Problem p;
  p.shape = {8, kv_heads, 64};
  for (int d = 0; d < documents; ++d) {
    for (int position = 0; position < length; ++position) {
      p.doc.push_back(d);
      p.pos.push_back(position);
    }
  }
  p.pairs = static_cast<double>(documents) * length * (length + 1) / 2;
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

void attention_forward(benchmark::State& state, int documents, int length, int kv_heads) {
  const Problem p = make_problem(documents, length, kv_heads);
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
}

void attention_backward(benchmark::State& state, int documents, int length, int kv_heads) {
  const Problem p = make_problem(documents, length, kv_heads);
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
}

const bool registered = [] {
  benchmark::RegisterBenchmark("sgemm", sgemm)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond);
  struct Layout {
    const char* name;
    int documents, length;
  };
  for (const Layout& layout : {Layout{"causal4096", 1, 4096}, Layout{"docs64x64", 64, 64}}) {
    for (int kv_heads : {8, 2}) {
      const std::string suffix =
          std::string(layout.name) + "/h8kv" + std::to_string(kv_heads) + "d64";
      benchmark::RegisterBenchmark(("attention_forward/" + suffix).c_str(), attention_forward,
                                   layout.documents, layout.length, kv_heads)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("attention_backward/" + suffix).c_str(), attention_backward,
                                   layout.documents, layout.length, kv_heads)
          ->Unit(benchmark::kMillisecond);
    }
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
