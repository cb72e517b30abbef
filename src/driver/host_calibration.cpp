// Host calibration (host_calibration.hpp): the runtime's kernels and MPI measured on this
// machine and fitted into a cluster.
#include "ballast/driver/host_calibration.hpp"

#include <cblas.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <system_error>

#include <nlohmann/json.hpp>

#include "ballast/attention_calibration.hpp"
#include "ballast/collectives.hpp"
#include "ballast/cost_model.hpp"
#include "ballast/error.hpp"
#include "ballast/runtime/emulation.hpp"
#include "ballast/runtime/mpi.hpp"
#include "ballast/runtime/plan_engine.hpp"

namespace ballast::driver {

namespace {

using runtime::check_mpi;

// What the calibration measures (sizes chosen so that the whole calibration takes a few
// seconds with 2 ranks on 2 cores; each figure is the median of kRepeats runs).
constexpr int kRepeats = 5;
constexpr int kGemmSize = 256;                     ///< square sgemm for the peak
/// forward_backward without attention on up to this many tokens (and a quarter of it),
/// fewer for wide models: at most kLinearFlops per run.
constexpr int kLinearTokens = 2048;
constexpr double kLinearFlops = 2e9;
constexpr int kLinearDocumentTokens = 64;
constexpr Tokens kAttentionLengths[] = {64, 128, 256, 512, 1024, 2048};
constexpr Tokens kAttentionTokensPerCall = 2048;   ///< documents of L tokens per call: 2048 / L
constexpr Bytes kPingPongBytes[] = {8, 64 * 1024, 1024 * 1024, 4 * 1024 * 1024};
constexpr Bytes kCollectiveBytes[] = {4 * 1024, 256 * 1024, 4 * 1024 * 1024};
/// Link fields of a one-rank job, where nothing is sent: large enough never to matter.
constexpr double kUnmeasuredBandwidthBytesPerS = 1e12;

/// Median thread CPU time of `work` over kRepeats runs after one warm-up run.
double cpu_seconds(const std::function<void()>& work) {
  work();
  std::vector<double> times;
  for (int repeat = 0; repeat < kRepeats; ++repeat) {
    const double start = runtime::thread_cpu_s();
    work();
    times.push_back(runtime::thread_cpu_s() - start);
  }
  return median(times);
}

/// The mean over the ranks of comm (every rank gets it): compute measured on every rank at
/// once.
double mean_over_ranks(double value, MPI_Comm comm) {
  int ranks = 1;
  check_mpi(MPI_Comm_size(comm, &ranks), "MPI_Comm_size");
  double sum = 0;
  check_mpi(MPI_Allreduce(&value, &sum, 1, MPI_DOUBLE, MPI_SUM, comm), "MPI_Allreduce");
  return sum / ranks;
}

double max_over_ranks(double value, MPI_Comm comm) {
  double worst = 0;
  check_mpi(MPI_Allreduce(&value, &worst, 1, MPI_DOUBLE, MPI_MAX, comm), "MPI_Allreduce");
  return worst;
}


std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(colon + 1);
        name.erase(0, name.find_first_not_of(" \t"));
        return name;
      }
    }
  }
  return "unknown CPU";
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::vector<float> random_floats(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = normal(generator);
  return values;
}

/// An attention engine that computes nothing (zero outputs and gradients): what
/// forward_backward costs without attention.
class NoAttention final : public runtime::AttentionEngine {
 public:
  void forward(int, const runtime::AttentionShape& shape, const runtime::TokenBatch& batch,
               const float*, const float*, const float*, float* out) override {
    std::fill_n(out, static_cast<std::size_t>(batch.size()) * shape.heads * shape.head_dim, 0.0f);
  }
  void backward(int, const runtime::AttentionShape& shape, const runtime::TokenBatch& batch,
                const float*, float* d_q, float* d_k, float* d_v) override {
    const std::size_t n = static_cast<std::size_t>(batch.size());
    std::fill_n(d_q, n * shape.heads * shape.head_dim, 0.0f);
    std::fill_n(d_k, n * shape.kv_heads * shape.head_dim, 0.0f);
    std::fill_n(d_v, n * shape.kv_heads * shape.head_dim, 0.0f);
  }
};

runtime::TokenBatch documents_batch(int tokens, int document_tokens) {
  std::vector<std::vector<std::int32_t>> documents;
  std::mt19937 generator(7);
  for (int begin = 0; begin < tokens; begin += document_tokens) {
    std::vector<std::int32_t> document(static_cast<std::size_t>(std::min(document_tokens, tokens - begin)));
    for (std::int32_t& token : document) token = static_cast<std::int32_t>(generator() % 256);
    documents.push_back(std::move(document));
  }
  return runtime::pack_documents(documents);
}

struct Sample {
  Bytes bytes = 0;
  double time_s = 0;
};

/// Half the round trip of a message of `bytes` between rank pairs (2i, 2i + 1), every pair
/// at once; the slowest pair's median. An odd last rank waits.
double ping_pong_s(Bytes bytes, int rank, int ranks, MPI_Comm comm) {
  const int peer = rank % 2 == 0 ? rank + 1 : rank - 1;
  const bool paired = peer < ranks;
  std::vector<char> buffer(static_cast<std::size_t>(bytes));
  const int count = static_cast<int>(bytes);
  const int rounds = bytes <= 64 * 1024 ? 20 : 4;
  std::vector<double> times;
  for (int repeat = 0; repeat < kRepeats; ++repeat) {
    check_mpi(MPI_Barrier(comm), "MPI_Barrier");
    const double start = MPI_Wtime();
    for (int round = 0; paired && round < rounds; ++round) {
      if (rank % 2 == 0) {
        check_mpi(MPI_Send(buffer.data(), count, MPI_CHAR, peer, 0, comm), "MPI_Send");
        check_mpi(MPI_Recv(buffer.data(), count, MPI_CHAR, peer, 0, comm, MPI_STATUS_IGNORE), "MPI_Recv");
      } else {
        check_mpi(MPI_Recv(buffer.data(), count, MPI_CHAR, peer, 0, comm, MPI_STATUS_IGNORE), "MPI_Recv");
        check_mpi(MPI_Send(buffer.data(), count, MPI_CHAR, peer, 0, comm), "MPI_Send");
      }
    }
    times.push_back((MPI_Wtime() - start) / (2.0 * rounds));
  }
  return max_over_ranks(paired ? median(times) : 0.0, comm);
}

/// One collective of `bytes` (nccl-tests' size convention) on `group`; the median time of
/// the slowest member.
double collective_s(CollectiveOp op, Bytes bytes, MPI_Comm group) {
  int size = 1;
  check_mpi(MPI_Comm_size(group, &size), "MPI_Comm_size");
  const std::size_t floats = static_cast<std::size_t>(bytes) / sizeof(float);
  const std::size_t per_member = floats / static_cast<std::size_t>(size);
  std::vector<float> send(floats, 1.0f), receive(floats, 0.0f);
  const auto run = [&] {
    switch (op) {
      case CollectiveOp::all_reduce:
        check_mpi(MPI_Allreduce(send.data(), receive.data(), static_cast<int>(floats), MPI_FLOAT,
                                MPI_SUM, group), "MPI_Allreduce");
        break;
      case CollectiveOp::all_to_all:
        check_mpi(MPI_Alltoall(send.data(), static_cast<int>(per_member), MPI_FLOAT, receive.data(),
                               static_cast<int>(per_member), MPI_FLOAT, group), "MPI_Alltoall");
        break;
      case CollectiveOp::all_gather:
        check_mpi(MPI_Allgather(send.data(), static_cast<int>(per_member), MPI_FLOAT, receive.data(),
                                static_cast<int>(per_member), MPI_FLOAT, group), "MPI_Allgather");
        break;
      default:
        BALLAST_CHECK(false, "the host calibration measures all_reduce, all_to_all, all_gather");
    }
  };
  run();
  std::vector<double> times;
  const int rounds = bytes <= 256 * 1024 ? 10 : 3;
  for (int repeat = 0; repeat < kRepeats; ++repeat) {
    check_mpi(MPI_Barrier(group), "MPI_Barrier");
    const double start = MPI_Wtime();
    for (int round = 0; round < rounds; ++round) run();
    times.push_back((MPI_Wtime() - start) / rounds);
  }
  return max_over_ranks(median(times), group);
}

constexpr CollectiveOp kMeasuredCollectives[] = {CollectiveOp::all_reduce, CollectiveOp::all_to_all,
                                                 CollectiveOp::all_gather};

std::string size_in_words(Bytes bytes) {
  if (bytes >= 1024 * 1024) return fmt::format("{} MiB", bytes / (1024 * 1024));
  if (bytes >= 1024) return fmt::format("{} KiB", bytes / 1024);
  return fmt::format("{} B", bytes);
}

}  // namespace

std::string pin_blas_threads() {
  const char* chosen = std::getenv("OPENBLAS_NUM_THREADS");
  if (chosen != nullptr && *chosen != '\0') {
    return fmt::format("BLAS: {} thread(s) per rank (OPENBLAS_NUM_THREADS={})", openblas_get_num_threads(),
                       chosen);
  }
  openblas_set_num_threads(1);
  return "BLAS: 1 thread per rank (OPENBLAS_NUM_THREADS was unset; set it to use more)";
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

void broadcast_string(std::string& text, MPI_Comm comm) {
  long long size = static_cast<long long>(text.size());
  check_mpi(MPI_Bcast(&size, 1, MPI_LONG_LONG, 0, comm), "MPI_Bcast");
  text.resize(static_cast<std::size_t>(size));
  check_mpi(MPI_Bcast(text.data(), static_cast<int>(size), MPI_CHAR, 0, comm), "MPI_Bcast");
}

std::string model_shape(const runtime::ModelConfig& model) {
  // A dense model's text is unchanged by the MoE fields, so its cached calibrations stay valid.
  const std::string experts = model.moe() ? fmt::format(", {} experts top-{} of ffn {}", model.experts,
                                                        model.experts_per_token, model.expert_ffn_hidden)
                                          : "";
  return fmt::format("hidden {}, layers {}, heads {}, kv heads {}, ffn {}{}, vocab {}, {}", model.hidden,
                     model.layers, model.heads, model.kv_heads, model.ffn_hidden, experts, model.vocab,
                     model.tied_embeddings ? "tied" : "untied");
}

HostRecord current_host(const runtime::ModelConfig& model, MPI_Comm comm) {
  HostRecord here;
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &here.ranks), "MPI_Comm_size");
  if (rank == 0) {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    here.host = name;
    char library[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int length = 0;
    check_mpi(MPI_Get_library_version(library, &length), "MPI_Get_library_version");
    here.mpi = std::string(library, static_cast<std::size_t>(length));
    here.mpi = here.mpi.substr(0, here.mpi.find_first_of("\n,"));
    here.cpu = cpu_model();
  }
  broadcast_string(here.host, comm);
  broadcast_string(here.mpi, comm);
  broadcast_string(here.cpu, comm);
  here.blas_threads = std::max(1, openblas_get_num_threads());
  here.model = model_shape(model);
  return here;
}

HostCalibration calibrate_host(const runtime::ModelConfig& model, MPI_Comm comm) {
  model.check();
  int rank = 0, ranks = 1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &ranks), "MPI_Comm_size");
  const double wall_start = MPI_Wtime();
  HostCalibration calibration;
  HostRecord record = current_host(model, comm);
  record.measured_at = rank == 0 ? utc_now() : "";
  broadcast_string(record.measured_at, comm);

  // ---- compute: every rank at once (as in a run), thread CPU time ----
  check_mpi(MPI_Barrier(comm), "MPI_Barrier");
  const std::vector<float> a = random_floats(kGemmSize * kGemmSize, 1);
  const std::vector<float> b = random_floats(kGemmSize * kGemmSize, 2);
  std::vector<float> c(kGemmSize * kGemmSize);
  const double gemm_s = mean_over_ranks(cpu_seconds([&] {
    runtime::gemm(false, false, kGemmSize, kGemmSize, kGemmSize, 1.0f, a.data(), kGemmSize, b.data(),
                  kGemmSize, 0.0f, c.data(), kGemmSize);
  }), comm);
  const double gemm_flops = 2.0 * kGemmSize * kGemmSize * kGemmSize;
  double peak = gemm_flops / gemm_s;
  calibration.rows.push_back({"sgemm (peak)", fmt::format("{0}x{0}x{0}", kGemmSize), gemm_s, gemm_s});

  const runtime::Parameters parameters = runtime::init_parameters(model, 1);
  const Model planning = runtime::planning_model(model);
  std::vector<double> linear_s;
  const double linear_flops = 3.0 * planning.linear_flops_per_token();  // forward + 2x backward
  const int large = static_cast<int>(std::clamp(kLinearFlops / linear_flops, 256.0, double{kLinearTokens}));
  const int linear_tokens[] = {large / 4, large};
  for (const int tokens : linear_tokens) {
    const runtime::TokenBatch batch = documents_batch(tokens, kLinearDocumentTokens);
    NoAttention none;
    linear_s.push_back(mean_over_ranks(
        cpu_seconds([&] { runtime::forward_backward(model, parameters, batch, none); }), comm));
  }
  // t(T) = fixed + per_token * T through the two sizes; the cost model is per token.
  double per_token_s =
      (linear_s[1] - linear_s[0]) / static_cast<double>(linear_tokens[1] - linear_tokens[0]);
  if (!(per_token_s > 0)) per_token_s = linear_s[1] / linear_tokens[1];  // noise: no fixed part
  const runtime::AttentionShape shape = model.attention_shape();
  std::vector<AttentionBenchmarkRow> attention_rows;
  for (const Tokens length : kAttentionLengths) {
    const Tokens documents = std::max<Tokens>(1, kAttentionTokensPerCall / length);
    const int n = static_cast<int>(documents * length);
    std::vector<std::int64_t> doc(static_cast<std::size_t>(n)), pos(static_cast<std::size_t>(n));
    for (int t = 0; t < n; ++t) {
      doc[static_cast<std::size_t>(t)] = t / length;
      pos[static_cast<std::size_t>(t)] = t % length;
    }
    const runtime::TokenSpan span{doc.data(), pos.data(), n};
    const std::size_t q_floats = static_cast<std::size_t>(n) * shape.heads * shape.head_dim;
    const std::size_t kv_floats = static_cast<std::size_t>(n) * shape.kv_heads * shape.head_dim;
    const std::vector<float> q = random_floats(q_floats, 3), k = random_floats(kv_floats, 4),
                             v = random_floats(kv_floats, 5), d_out = random_floats(q_floats, 6);
    std::vector<float> out(q_floats), lse(static_cast<std::size_t>(n) * shape.heads),
        delta(lse.size()), d_q(q_floats), d_k(kv_floats), d_v(kv_floats);
    runtime::AttentionAccumulator accumulator;
    const double forward_s = mean_over_ranks(cpu_seconds([&] {
      accumulator.reset(n, shape);
      runtime::attention_forward_accumulate(shape, q.data(), span, k.data(), v.data(), span, accumulator);
      runtime::attention_forward_finalize(shape, accumulator, out.data(), lse.data());
    }), comm);
    const double backward_s = mean_over_ranks(cpu_seconds([&] {
      std::fill(d_q.begin(), d_q.end(), 0.0f);
      std::fill(d_k.begin(), d_k.end(), 0.0f);
      std::fill(d_v.begin(), d_v.end(), 0.0f);
      runtime::attention_backward_delta(shape, n, out.data(), d_out.data(), delta.data());
      runtime::attention_backward_accumulate(shape, q.data(), d_out.data(), lse.data(), delta.data(), span,
                                             k.data(), v.data(), span, d_q.data(), d_k.data(), d_v.data());
    }), comm);
    attention_rows.push_back({length, Pass::forward, forward_s, shape.heads, shape.head_dim, documents});
    attention_rows.push_back({length, Pass::backward, backward_s, shape.heads, shape.head_dim, documents});
  }
  // The sgemm's rate is the peak unless a slowed sgemm (ranks share cores and caches) left
  // an attention call faster than it: then that call's rate is, and no efficiency exceeds 1
  // (fit_attention_curves refuses one that does).
  for (const AttentionBenchmarkRow& row : attention_rows) peak = std::max(peak, attention_call_flops(row) / row.time_s);
  double matmul_efficiency = linear_flops / (per_token_s * peak);
  if (!(matmul_efficiency > 0) || matmul_efficiency > 1) {
    matmul_efficiency = std::clamp(std::isfinite(matmul_efficiency) ? matmul_efficiency : 1.0, 1e-3, 1.0);
  }

  // ---- the cluster, before the links ----
  Cluster cluster;
  cluster.name = fmt::format("host-{}-{}r", record.host, ranks);
  cluster.gpu_name = "CPU core (one MPI rank of ballast run)";
  cluster.nodes = 1;
  cluster.gpus_per_node = ranks;
  cluster.nics_per_node = ranks;
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  cluster.gpu_memory_bytes =
      std::max<Bytes>(Bytes{1} << 30, static_cast<Bytes>(pages) * page_size / std::max(1, ranks));
  cluster.memory_usable_fraction = 0.9;
  cluster.peak_flops_per_s = peak;
  cluster.matmul_efficiency = matmul_efficiency;
  cluster.attention_tile_tokens = 64;  // the runtime kernel's kQueryTile and kKeyTile
  cluster.attention_tiles_packed = true;  // the kernel tiles a call's packed span (cost-model.md)
  cluster.attention_efficiency = 1.0;  // replaced by the curves below
  cluster.intra_node_bus_bw_bytes_per_s = kUnmeasuredBandwidthBytesPerS;
  cluster.intra_node_p2p_bw_bytes_per_s = kUnmeasuredBandwidthBytesPerS;
  cluster.nic_bw_bytes_per_s = kUnmeasuredBandwidthBytesPerS;
  cluster.intra_node_latency_s = 0;
  cluster.inter_node_latency_s = 0;
  const std::string source = fmt::format("the host calibration on {}", record.host);
  const AttentionCalibration attention = fit_attention_curves(cluster, attention_rows, source);
  cluster = attention.cluster;
  double best_attention = 0;
  for (const auto& point : cluster.attention_forward_curve) best_attention = std::max(best_attention, point.efficiency);
  cluster.attention_efficiency = std::clamp(best_attention, 1e-3, 1.0);

  for (std::size_t i = 0; i < linear_s.size(); ++i) {
    const double fitted = linear_flops * linear_tokens[i] / (peak * matmul_efficiency);
    calibration.rows.push_back({"linear fwd+bwd", fmt::format("{} tokens", linear_tokens[i]), linear_s[i], fitted});
  }
  for (const AttentionCalibrationRow& row : attention.rows) {
    calibration.rows.push_back({row.measured.pass == Pass::forward ? "attention fwd" : "attention bwd",
                                fmt::format("{} x {} tokens", row.measured.batch, row.measured.seq_len_tokens),
                                row.measured.time_s, row.fitted_predicted_s});
  }

  // ---- links: every pair / group at once ----
  if (ranks >= 2) {
    std::vector<CollectiveSample> p2p;
    for (const Bytes bytes : kPingPongBytes) p2p.push_back({bytes, ping_pong_s(bytes, rank, ranks, comm)});
    const CollectiveFit link = fit_collective_noisy(CollectiveOp::send_recv, 2, p2p, source + ": ping-pong");
    cluster.intra_node_p2p_bw_bytes_per_s = link.bus_bw_bytes_per_s;
    cluster.nic_bw_bytes_per_s = link.bus_bw_bytes_per_s;
    cluster.intra_node_latency_s = link.latency_s;
    cluster.inter_node_latency_s = link.latency_s;
    cluster.intra_node_collectives[CollectiveOp::send_recv].push_back(link);
    for (const CollectiveSample& sample : p2p) {
      calibration.rows.push_back({"send_recv (half ping-pong)", size_in_words(sample.bytes), sample.time_s,
                                  link.latency_s + static_cast<double>(sample.bytes) / link.bus_bw_bytes_per_s});
    }
    for (int group_size = 2; group_size <= ranks; group_size *= 2) {
      if (ranks % group_size != 0) continue;
      MPI_Comm group = MPI_COMM_NULL;
      check_mpi(MPI_Comm_split(comm, rank / group_size, rank, &group), "MPI_Comm_split");
      check_mpi(MPI_Comm_set_errhandler(group, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
      for (const CollectiveOp op : kMeasuredCollectives) {
        std::vector<CollectiveSample> samples;
        for (const Bytes bytes : kCollectiveBytes) {
          // The slowest group sets what every rank records.
          samples.push_back({bytes, max_over_ranks(collective_s(op, bytes, group), comm)});
        }
        const CollectiveFit fit = fit_collective_noisy(
            op, group_size, samples, fmt::format("{}: {} on {} ranks", source, collective_op_name(op), group_size));
        cluster.intra_node_collectives[op].push_back(fit);
        for (const CollectiveSample& sample : samples) {
          calibration.rows.push_back(
              {fmt::format("{} ({} ranks)", collective_op_name(op), group_size), size_in_words(sample.bytes),
               sample.time_s,
               fit.latency_s + static_cast<double>(sample.bytes) * bus_bandwidth_factor(op, group_size) /
                                   fit.bus_bw_bytes_per_s});
        }
      }
      check_mpi(MPI_Comm_free(&group), "MPI_Comm_free");
    }
    // The bus bandwidth of uncalibrated collectives: the all-gather's on the whole job.
    cluster.intra_node_bus_bw_bytes_per_s = cluster.intra_node_collectives[CollectiveOp::all_gather].back().bus_bw_bytes_per_s;
  }
  cluster.measured_on = record;
  cluster.provenance = fmt::format(
      "measured by `ballast calibrate --host` on {} ({}), {} MPI rank(s), {} BLAS thread(s) per rank, {}, at {}; "
      "runtime model {}{}",
      record.host, record.cpu, ranks, record.blas_threads, record.mpi, record.measured_at, record.model,
      ranks >= 2 ? "" : "; links not measured (one rank sends nothing)");
  validate_cluster(cluster, source);
  calibration.cluster = std::move(cluster);
  calibration.seconds = MPI_Wtime() - wall_start;
  // Every rank computed the same reductions; rank 0's cluster is the record.
  std::string text = rank == 0 ? to_json(calibration.cluster).dump() : std::string();
  broadcast_string(text, comm);
  calibration.cluster = cluster_from_json(nlohmann::json::parse(text), source);
  return calibration;
}

void check_host_calibration(const Cluster& cluster, const HostRecord& here, const std::string& source) {
  const std::string fix = fmt::format(
      "measure this job with `mpirun -np {} ballast calibrate --host -o FILE` (same model flags) "
      "and pass --cluster FILE, or drop --cluster to use (or make) the cached calibration",
      here.ranks);
  if (!cluster.measured_on) {
    throw InputError(fmt::format("{}: cluster '{}' was not measured on a host (no \"measured_on\"): "
                                 "ballast run predicts this machine's runs only from its own "
                                 "measurements; {}", source, cluster.name, fix));
  }
  const HostRecord& there = *cluster.measured_on;
  const auto mismatch = [&](const char* what, const std::string& file_value, const std::string& job_value) {
    throw InputError(fmt::format("{}: the calibration was measured with {} {} but this job has {}; {}", source,
                                 what, file_value, job_value, fix));
  };
  if (there.host != here.host) mismatch("host", there.host, here.host);
  if (there.cpu != here.cpu) mismatch("CPU", there.cpu, here.cpu);
  if (there.ranks != here.ranks) mismatch("ranks", std::to_string(there.ranks), std::to_string(here.ranks));
  if (there.blas_threads != here.blas_threads) {
    mismatch("BLAS threads per rank", std::to_string(there.blas_threads), std::to_string(here.blas_threads));
  }
  if (there.model != here.model) mismatch("the model", "'" + there.model + "'", "'" + here.model + "'");
  if (there.mpi != here.mpi) mismatch("MPI", "'" + there.mpi + "'", "'" + here.mpi + "'");
}

std::string host_calibration_cache_path(const HostRecord& here) {
  std::filesystem::path directory;
  if (const char* cache = std::getenv("BALLAST_CACHE_DIR"); cache != nullptr && *cache != '\0') {
    directory = cache;
  } else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    directory = std::filesystem::path(xdg) / "ballast";
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    directory = std::filesystem::path(home) / ".cache" / "ballast";
  } else {
    directory = std::filesystem::temp_directory_path() / "ballast";
  }
  std::string model;
  for (const char c : here.model) {
    if (std::isalnum(static_cast<unsigned char>(c))) model += c;
    else if (!model.empty() && model.back() != '-') model += '-';
  }
  std::string host;
  for (const char c : here.host) host += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
  return (directory / fmt::format("host-{}-np{}-blas{}-{}.json", host, here.ranks, here.blas_threads, model))
      .string();
}

void write_cluster_file(const Cluster& cluster, const std::string& path) {
  const std::filesystem::path target(path);
  std::error_code error;
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path(), error);
  const std::string temporary = fmt::format("{}.tmp{}", path, static_cast<long>(getpid()));
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    if (!file) {
      throw InputError(fmt::format("{}: cannot write the calibration here ({}); set BALLAST_CACHE_DIR "
                                   "or pass -o to a writable place", path,
                                   error ? error.message() : "cannot create the file"));
    }
    file << to_json(cluster).dump(2) << '\n';
  }
  std::filesystem::rename(temporary, target, error);
  if (error) {
    std::filesystem::remove(temporary, error);
    throw InputError(fmt::format("{}: cannot write the calibration ({})", path, error.message()));
  }
}

}  // namespace ballast::driver
