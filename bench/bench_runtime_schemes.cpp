// What the MPI runtime's attention schemes cost per rank against the kernel alone on the
// same (query, key) pairs: ring, Ulysses and all-gather, forward + backward through
// PlanAttentionEngine, one group of every rank, for a few batches and head shapes. Figures
// only, never a test (docs/runtime.md, "Scheme overheads", defines the columns).
//
// Run: OPENBLAS_NUM_THREADS=1 mpirun -np N build/bench/bench_runtime_schemes
//        [--repetitions R] [--format text|json] [--only BATCH/SHAPE/SCHEME]
// (N = 2 and 4 in the docs; --only runs the cases whose name contains the text, e.g.
// --only 8x512/h4kv2d16/ring, for a profiler.)
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ballast/cost_model.hpp"
#include "ballast/emulated_cluster.hpp"
#include "ballast/error.hpp"
#include "ballast/plan.hpp"
#include "ballast/plan_layout.hpp"
#include "ballast/runtime/emulation.hpp"
#include "ballast/runtime/kernels.hpp"
#include "ballast/runtime/model.hpp"
#include "ballast/runtime/mpi.hpp"
#include "ballast/runtime/plan_engine.hpp"

namespace {

using namespace ballast;
using namespace ballast::runtime;

/// A batch of `documents` documents of `length` tokens each.
struct BatchCase {
  const char* name;
  int documents;
  int length;
};

struct ShapeCase {
  const char* name;
  ModelConfig config;
};

ModelConfig model_config(int heads, int kv_heads) {
  ModelConfig config;  // the runtime's defaults: hidden 64, 4 heads, 2 KV heads
  config.heads = heads;
  config.kv_heads = kv_heads;
  return config;
}

/// A deterministic value in [-1, 1) for element `column` of token (sequence, position) of
/// tensor `salt`: every rank fills the tokens it holds with the same values.
float token_value(std::int64_t sequence, std::int64_t position, int column, int salt) {
  std::uint64_t x = static_cast<std::uint64_t>(sequence) * 0x9E3779B97F4A7C15ULL ^
                    static_cast<std::uint64_t>(position) * 0xBF58476D1CE4E5B9ULL ^
                    static_cast<std::uint64_t>(column) * 0x94D049BB133111EBULL ^
                    static_cast<std::uint64_t>(salt) << 56;
  x ^= x >> 31;  // splitmix64's finaliser
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return static_cast<float>(static_cast<double>(x >> 40) * 0x1.0p-24 * 2.0 - 1.0);
}

/// A rank's tokens (document, position) in its attention layout, and tensors on them.
struct TokenList {
  std::vector<std::int64_t> doc, pos;
  int size() const { return static_cast<int>(doc.size()); }
  TokenSpan span() const { return {doc.data(), pos.data(), size()}; }
  void append(const TokenList& other) {
    doc.insert(doc.end(), other.doc.begin(), other.doc.end());
    pos.insert(pos.end(), other.pos.begin(), other.pos.end());
  }
  /// [tokens, heads, head_dim]: heads [first_head, first_head + heads) of tensor `salt`.
  std::vector<float> tensor(int first_head, int heads, int head_dim, int salt) const {
    std::vector<float> values;
    values.reserve(static_cast<std::size_t>(size()) * heads * head_dim);
    for (int t = 0; t < size(); ++t) {
      for (int column = first_head * head_dim; column < (first_head + heads) * head_dim; ++column) {
        values.push_back(token_value(doc[static_cast<std::size_t>(t)],
                                     pos[static_cast<std::size_t>(t)], column, salt));
      }
    }
    return values;
  }
};

enum Salt { kQuery = 1, kKey, kValue, kOutputGradient };

TokenList layout_tokens(const Plan& plan, int rank) {
  TokenList tokens;
  for (const TokenRange& range : attention_layout(plan, 0, rank)) {
    for (std::int64_t p = range.begin_tokens; p < range.end_tokens; ++p) {
      tokens.doc.push_back(range.sequence_id);
      tokens.pos.push_back(p);
    }
  }
  return tokens;
}

/// One micro-batch, one group of every rank with `scheme`: ring and all-gather split every
/// document in 2g zigzag chunks (rank i holds chunks i and 2g-1-i, as static CP does),
/// Ulysses in g contiguous chunks. One emulated node, so no hop is routed.
Plan make_plan(Scheme scheme, int ranks, const BatchCase& batch, const ModelConfig& config) {
  Plan plan;
  plan.strategy = "bench";
  plan.model = planning_model(config);
  plan.cluster = emulated_cluster(plan.model, ranks, ranks, 1 << 16);
  const auto cost =
      make_cost_model(load_cost_model_spec("analytical"), plan.cluster, plan.model);
  plan.cost_model = cost->spec();
  AttentionGroup group;
  group.scheme = scheme;
  for (int r = 0; r < ranks; ++r) group.ranks.push_back(r);
  for (int d = 0; d < batch.documents; ++d) {
    plan.sequence_lengths_tokens.push_back(batch.length);
    SequenceChunks sequence{d, batch.length, {}};
    const int pieces = scheme == Scheme::ulysses ? ranks : 2 * ranks;
    for (int piece = 0; piece < pieces; ++piece) {
      const int rank = piece < ranks ? piece : 2 * ranks - 1 - piece;
      sequence.chunks.push_back({rank, static_cast<std::int64_t>(batch.length) * piece / pieces,
                                 static_cast<std::int64_t>(batch.length) * (piece + 1) / pieces});
    }
    group.sequences.push_back(sequence);
  }
  plan.micro_batches.push_back({{group}, {}, {}});
  require_valid(plan, *cost, "the benchmark's plan");
  return plan;
}

/// One timed run on this rank.
struct Sample {
  double busy_s = 0;
  double wall_s = 0;
  double wait_s = 0;
};

/// The smallest busy, wall and wait over `repetitions` runs (after one warm-up), every
/// rank starting together. `stats` (or null): the engine's counters, whose wait CPU time
/// is not busy.
Sample measure(int repetitions, const CommunicationStats* stats, const std::function<void()>& run) {
  Sample best{1e30, 1e30, 1e30};
  for (int repetition = 0; repetition <= repetitions; ++repetition) {
    check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    const double wait_cpu_before = stats ? stats->wait_cpu_s : 0;
    const double wait_before = stats ? stats->wait_s : 0;
    const double wall_start = MPI_Wtime();
    const double cpu_start = thread_cpu_s();
    run();
    const double cpu_s = thread_cpu_s() - cpu_start;
    const double wall_s = MPI_Wtime() - wall_start;
    if (repetition == 0) continue;  // warm-up: buffers, first-touch pages, OpenBLAS
    const double wait_cpu_s = stats ? stats->wait_cpu_s - wait_cpu_before : 0;
    best.busy_s = std::min(best.busy_s, cpu_s - wait_cpu_s);
    best.wall_s = std::min(best.wall_s, wall_s);
    best.wait_s = std::min(best.wait_s, stats ? stats->wait_s - wait_before : 0);
  }
  return best;
}

/// Kernel-only problem of one rank: its queries, the key blocks it visits, and the tensors.
struct KernelProblem {
  AttentionShape shape;
  TokenList queries;
  std::vector<TokenList> key_blocks;
  TokenList keys;  ///< the blocks concatenated
  std::vector<float> q, d_out, k, v;
  std::vector<std::vector<float>> block_k, block_v;
  // Outputs and scratch.
  AttentionAccumulator accumulator;
  std::vector<float> out, lse, delta, d_q, d_k, d_v;

  KernelProblem(const AttentionShape& problem_shape, const TokenList& query_tokens,
                const std::vector<TokenList>& blocks, int first_head, int first_kv_head)
      : shape(problem_shape), queries(query_tokens), key_blocks(blocks) {
    const int dim = shape.head_dim;
    for (const TokenList& block : key_blocks) {
      keys.append(block);
      block_k.push_back(block.tensor(first_kv_head, shape.kv_heads, dim, kKey));
      block_v.push_back(block.tensor(first_kv_head, shape.kv_heads, dim, kValue));
    }
    q = queries.tensor(first_head, shape.heads, dim, kQuery);
    d_out = queries.tensor(first_head, shape.heads, dim, kOutputGradient);
    k = keys.tensor(first_kv_head, shape.kv_heads, dim, kKey);
    v = keys.tensor(first_kv_head, shape.kv_heads, dim, kValue);
    out.resize(q.size());
    d_q.resize(q.size());
    lse.resize(static_cast<std::size_t>(queries.size()) * shape.heads);
    delta.resize(lse.size());
    d_k.resize(k.size());
    d_v.resize(k.size());
  }

  /// Forward and backward with every key in one call per pass.
  void run_whole() {
    accumulator.reset(queries.size(), shape);
    attention_forward_accumulate(shape, q.data(), queries.span(), k.data(), v.data(), keys.span(),
                                 accumulator);
    attention_forward_finalize(shape, accumulator, out.data(), lse.data());
    attention_backward_delta(shape, queries.size(), out.data(), d_out.data(), delta.data());
    std::fill(d_q.begin(), d_q.end(), 0.0f);
    std::fill(d_k.begin(), d_k.end(), 0.0f);
    std::fill(d_v.begin(), d_v.end(), 0.0f);
    attention_backward_accumulate(shape, q.data(), d_out.data(), lse.data(), delta.data(),
                                  queries.span(), k.data(), v.data(), keys.span(), d_q.data(),
                                  d_k.data(), d_v.data());
  }

  /// The same with one call per key block and pass (what a ring's steps call).
  void run_blocks() {
    accumulator.reset(queries.size(), shape);
    for (std::size_t b = 0; b < key_blocks.size(); ++b) {
      attention_forward_accumulate(shape, q.data(), queries.span(), block_k[b].data(),
                                   block_v[b].data(), key_blocks[b].span(), accumulator);
    }
    attention_forward_finalize(shape, accumulator, out.data(), lse.data());
    attention_backward_delta(shape, queries.size(), out.data(), d_out.data(), delta.data());
    std::fill(d_q.begin(), d_q.end(), 0.0f);
    std::size_t offset = 0;
    for (std::size_t b = 0; b < key_blocks.size(); ++b) {
      const std::size_t floats = block_k[b].size();
      std::fill_n(d_k.begin() + static_cast<std::ptrdiff_t>(offset), floats, 0.0f);
      std::fill_n(d_v.begin() + static_cast<std::ptrdiff_t>(offset), floats, 0.0f);
      attention_backward_accumulate(shape, q.data(), d_out.data(), lse.data(), delta.data(),
                                    queries.span(), block_k[b].data(), block_v[b].data(),
                                    key_blocks[b].span(), d_q.data(), d_k.data() + offset,
                                    d_v.data() + offset);
      offset += floats;
    }
  }
};

/// The engine's forward and backward of layer 0 on this rank's tokens.
struct SchemeProblem {
  PlanAttentionEngine engine;
  AttentionShape shape;
  TokenBatch batch;
  std::vector<float> q, k, v, d_out, out, d_q, d_k, d_v;

  SchemeProblem(const Plan& plan, const ModelConfig& config)
      : engine(plan, 0, MPI_COMM_WORLD), shape(config.attention_shape()) {
    std::vector<std::vector<std::int32_t>> documents;
    for (std::int64_t length : plan.sequence_lengths_tokens) {
      documents.emplace_back(static_cast<std::size_t>(length), 0);
    }
    batch = engine.linear_batch(documents);
    TokenList tokens;
    tokens.doc = batch.doc;
    tokens.pos = batch.pos;
    const int dim = shape.head_dim;
    q = tokens.tensor(0, shape.heads, dim, kQuery);
    d_out = tokens.tensor(0, shape.heads, dim, kOutputGradient);
    k = tokens.tensor(0, shape.kv_heads, dim, kKey);
    v = tokens.tensor(0, shape.kv_heads, dim, kValue);
    out.resize(q.size());
    d_q.resize(q.size());
    d_k.resize(k.size());
    d_v.resize(k.size());
  }

  void run() {
    engine.forward(0, shape, batch, q.data(), k.data(), v.data(), out.data());
    engine.backward(0, shape, batch, d_out.data(), d_q.data(), d_k.data(), d_v.data());
  }
};

struct Row {
  std::string batch, shape, scheme;
  int ranks = 0;
  std::string skipped;  ///< why the scheme cannot run this case, or empty
  // Means over ranks (seconds) and the largest per-rank ratio.
  double kernel_busy_s = 0, kernel_blocks_busy_s = 0, scheme_busy_s = 0;
  double kernel_wall_s = 0, scheme_wall_s = 0, scheme_wait_s = 0;
  double busy_ratio = 0, busy_ratio_max = 0;
};

/// Gathers one value per rank to every rank.
std::vector<double> all_ranks(double value) {
  int ranks = 1;
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &ranks), "MPI_Comm_size");
  std::vector<double> values(static_cast<std::size_t>(ranks));
  check_mpi(MPI_Allgather(&value, 1, MPI_DOUBLE, values.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD),
            "MPI_Allgather");
  return values;
}

double mean(const std::vector<double>& values) {
  double sum = 0;
  for (double value : values) sum += value;
  return sum / static_cast<double>(values.size());
}

Row run_case(const BatchCase& batch, const ShapeCase& shape_case, Scheme scheme, int ranks,
             int rank, int repetitions) {
  const ModelConfig& config = shape_case.config;
  Row row{batch.name, shape_case.name, to_string(scheme), ranks, {}};
  if (scheme == Scheme::ulysses && (config.heads % ranks != 0 || config.kv_heads % ranks != 0)) {
    row.skipped = fmt::format("{} ranks do not divide {} KV heads", ranks, config.kv_heads);
    return row;
  }
  const Plan plan = make_plan(scheme, ranks, batch, config);
  std::vector<TokenList> members;
  for (int r = 0; r < ranks; ++r) members.push_back(layout_tokens(plan, r));
  const AttentionShape shape = config.attention_shape();
  // The kernel on the pairs this rank computes: own queries against every member's keys
  // (ring, all-gather), or every token of the group on this member's heads (Ulysses).
  KernelProblem kernel_problem = [&] {
    if (scheme != Scheme::ulysses) {
      return KernelProblem(shape, members[static_cast<std::size_t>(rank)], members, 0, 0);
    }
    TokenList all;
    for (const TokenList& member : members) all.append(member);
    const AttentionShape member_shape{shape.heads / ranks, shape.kv_heads / ranks, shape.head_dim};
    return KernelProblem(member_shape, all, {all}, rank * member_shape.heads,
                         rank * member_shape.kv_heads);
  }();
  const Sample whole = measure(repetitions, nullptr, [&] { kernel_problem.run_whole(); });
  const Sample blocks = measure(repetitions, nullptr, [&] { kernel_problem.run_blocks(); });
  SchemeProblem scheme_problem(plan, config);
  const Sample engine =
      measure(repetitions, &scheme_problem.engine.stats(), [&] { scheme_problem.run(); });
  const auto kernel_busy = all_ranks(whole.busy_s);
  const auto scheme_busy = all_ranks(engine.busy_s);
  row.kernel_busy_s = mean(kernel_busy);
  row.kernel_blocks_busy_s = mean(all_ranks(blocks.busy_s));
  row.scheme_busy_s = mean(scheme_busy);
  const auto kernel_walls = all_ranks(whole.wall_s);
  const auto scheme_walls = all_ranks(engine.wall_s);
  row.kernel_wall_s = *std::max_element(kernel_walls.begin(), kernel_walls.end());
  row.scheme_wall_s = *std::max_element(scheme_walls.begin(), scheme_walls.end());
  row.scheme_wait_s = mean(all_ranks(engine.wait_s));
  row.busy_ratio = row.scheme_busy_s / row.kernel_busy_s;
  for (std::size_t r = 0; r < scheme_busy.size(); ++r) {
    row.busy_ratio_max = std::max(row.busy_ratio_max, scheme_busy[r] / kernel_busy[r]);
  }
  return row;
}

void print_text(const std::vector<Row>& rows, int repetitions) {
  std::printf("Per rank, forward + backward of one layer; busy = thread CPU time minus CPU time\n"
              "in blocking MPI waits; best of %d runs; ms = milliseconds, means over ranks\n"
              "(wall: the slowest rank). kernel = the kernel alone on this rank's pairs, one\n"
              "call per pass; blocks = one call per member's key block; ratio = scheme busy /\n"
              "kernel busy (mean over ranks; the largest rank's in parentheses).\n\n",
              repetitions);
  std::printf("%-8s %-9s %-10s %5s %10s %10s %10s %14s %10s %10s %10s\n", "batch", "shape",
              "scheme", "ranks", "kernel ms", "blocks ms", "scheme ms", "ratio (max)", "k wall ms",
              "s wall ms", "wait ms");
  for (const Row& row : rows) {
    if (!row.skipped.empty()) {
      std::printf("%-8s %-9s %-10s %5d  skipped: %s\n", row.batch.c_str(), row.shape.c_str(),
                  row.scheme.c_str(), row.ranks, row.skipped.c_str());
      continue;
    }
    std::printf("%-8s %-9s %-10s %5d %10.3f %10.3f %10.3f %6.2f (%5.2f) %10.3f %10.3f %10.3f\n",
                row.batch.c_str(), row.shape.c_str(), row.scheme.c_str(), row.ranks,
                1e3 * row.kernel_busy_s, 1e3 * row.kernel_blocks_busy_s, 1e3 * row.scheme_busy_s,
                row.busy_ratio, row.busy_ratio_max, 1e3 * row.kernel_wall_s,
                1e3 * row.scheme_wall_s, 1e3 * row.scheme_wait_s);
  }
}

void print_json(const std::vector<Row>& rows, int repetitions) {
  nlohmann::json cases = nlohmann::json::array();
  for (const Row& row : rows) {
    nlohmann::json entry = {{"batch", row.batch}, {"shape", row.shape}, {"scheme", row.scheme},
                            {"ranks", row.ranks}};
    if (!row.skipped.empty()) {
      entry["skipped"] = row.skipped;
    } else {
      entry["kernel_busy_s"] = row.kernel_busy_s;
      entry["kernel_blocks_busy_s"] = row.kernel_blocks_busy_s;
      entry["scheme_busy_s"] = row.scheme_busy_s;
      entry["busy_ratio"] = row.busy_ratio;
      entry["busy_ratio_max"] = row.busy_ratio_max;
      entry["kernel_wall_s"] = row.kernel_wall_s;
      entry["scheme_wall_s"] = row.scheme_wall_s;
      entry["scheme_wait_s"] = row.scheme_wait_s;
    }
    cases.push_back(entry);
  }
  std::printf("%s\n", nlohmann::json{{"repetitions", repetitions}, {"cases", cases}}.dump(2).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &ranks), "MPI_Comm_size");
  int repetitions = 5;
  bool json = false;
  std::string only;  // run only the cases whose "batch/shape/scheme" contains it
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--repetitions" && a + 1 < argc) {
      repetitions = std::max(1, std::atoi(argv[++a]));
    } else if (arg == "--only" && a + 1 < argc) {
      only = argv[++a];
    } else if (arg == "--format" && a + 1 < argc && (std::strcmp(argv[a + 1], "json") == 0 ||
                                                     std::strcmp(argv[a + 1], "text") == 0)) {
      json = std::strcmp(argv[++a], "json") == 0;
    } else {
      if (rank == 0) {
        std::fprintf(stderr, "usage: mpirun -np N bench_runtime_schemes [--repetitions R] "
                             "[--format text|json] [--only BATCH/SHAPE/SCHEME]\n");
      }
      MPI_Finalize();
      return 2;
    }
  }
  try {
    const BatchCase batches[] = {{"1x2048", 1, 2048}, {"8x512", 8, 512}, {"64x32", 64, 32}};
    const ShapeCase shapes[] = {{"h4kv2d16", model_config(4, 2)}, {"h8kv4d8", model_config(8, 4)}};
    std::vector<Row> rows;
    for (const BatchCase& batch : batches) {
      for (const ShapeCase& shape : shapes) {
        for (Scheme scheme : {Scheme::ring, Scheme::ulysses, Scheme::all_gather}) {
          const std::string name =
              fmt::format("{}/{}/{}", batch.name, shape.name, to_string(scheme));
          if (name.find(only) == std::string::npos) continue;
          rows.push_back(run_case(batch, shape, scheme, ranks, rank, repetitions));
        }
      }
    }
    if (rank == 0) json ? print_json(rows, repetitions) : print_text(rows, repetitions);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return 0;
}
