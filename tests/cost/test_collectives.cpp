// Collectives inside a node: the h200 preset against every bundled nccl-tests row, the
// interpolation and fallback rules, the fit, JSON and validation, the nccl-tests readers
// and calibrate_cluster.
#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ballast/cluster.hpp"
#include "ballast/collectives.hpp"
#include "ballast/cost_model.hpp"
#include "ballast/error.hpp"
#include "cost/input_errors.hpp"
#include "ballast/model.hpp"
#include "ballast/nccl_tests.hpp"

namespace ballast {
namespace {

using testing::expect_input_error;
using testing::input_error_message;

const std::string kSourceDir = BALLAST_SOURCE_DIR;
const std::string kBundledCsv = kSourceDir + "/data/profiles/h200_8gpu_nccl_tests.csv";
const std::string kSamples = kSourceDir + "/tests/cost/data/";


// ---- the h200 preset against every bundled measurement ----

TEST(CollectiveFidelity, H200PresetReproducesEveryBundledNcclTestsRow) {
  const Cluster h200 = cluster_preset("h200");
  const std::vector<NcclTestsRow> rows = read_nccl_tests_file(kBundledCsv);
  ASSERT_EQ(rows.size(), 99u);  // 3 ops x 3 GPU counts x 11 sizes (8 MiB .. 8 GiB)
  double worst_error = 0;
  std::string worst_row;
  for (const NcclTestsRow& row : rows) {
    const Seconds predicted = intra_node_collective_time_s(h200, row.op, row.gpus, row.size_bytes);
    const double error = (predicted - row.time_s) / row.time_s;
    const double tolerance = row.size_bytes >= 64 * kMiB ? 0.15 : 0.30;
    EXPECT_LE(std::abs(error), tolerance)
        << row.source << ": " << collective_op_name(row.op) << " on " << row.gpus << " GPUs, "
        << row.size_bytes << " bytes: measured " << row.time_s * 1e6 << " us, predicted "
        << predicted * 1e6 << " us";
    if (std::abs(error) > std::abs(worst_error)) {
      worst_error = error;
      worst_row = fmt::format("{} {} on {} GPUs, {} bytes: measured {:.2f} us, predicted {:.2f} us",
                              row.source, collective_op_name(row.op), row.gpus, row.size_bytes,
                              row.time_s * 1e6, predicted * 1e6);
    }
  }
  std::printf("worst row: %s (%+.1f%%)\n", worst_row.c_str(), 100 * worst_error);
}

TEST(CollectiveFidelity, CostModelAllGatherInsideANodeUsesTheFits) {
  // all_gather_time_s of n ranks holding size/n bytes each = layers x one nccl-tests
  // all_gather of `size` bytes; the wrapper agrees with the free function.
  const Cluster h200 = cluster_preset("h200");
  const Model model = model_preset("llama-7b");
  const AnalyticalCostModel cost(h200, model);
  for (int gpus : {2, 3, 4, 6, 8}) {
    const Bytes size = static_cast<Bytes>(gpus) * (64 << 20);
    std::vector<int> ranks(gpus);
    for (int i = 0; i < gpus; ++i) ranks[i] = i;
    const std::vector<Bytes> bytes(gpus, size / gpus);
    const Seconds one = intra_node_collective_time_s(h200, CollectiveOp::all_gather, gpus, size);
    EXPECT_NEAR(cost.all_gather_time_s(ranks, bytes), model.layers * one, 1e-12 * model.layers) << gpus;
    EXPECT_DOUBLE_EQ(cost.collective_time_s(CollectiveOp::all_gather, gpus, size), one);
    // all-to-all: each rank's whole send buffer is nccl-tests' size.
    const std::vector<Bytes> send(gpus, size);
    EXPECT_NEAR(cost.all_to_all_time_s(ranks, send),
                model.layers * intra_node_collective_time_s(h200, CollectiveOp::all_to_all, gpus, size),
                1e-12 * model.layers)
        << gpus;
  }
}

TEST(CollectiveFidelity, UncalibratedClusterKeepsTheAlphaBetaFormulas) {
  const Cluster a100 = cluster_preset("a100-ib400");
  ASSERT_TRUE(a100.intra_node_collectives.empty());
  const Model model = model_preset("llama-7b");
  const AnalyticalCostModel cost(a100, model);
  const std::vector<int> ranks = {0, 1, 2, 3};
  const std::vector<Bytes> bytes = {100, 200, 300, 400};
  // Ring all-gather: (n-1) latencies + (total - smallest own) / bus bandwidth.
  EXPECT_DOUBLE_EQ(cost.all_gather_time_s(ranks, bytes),
                   model.layers * (3 * a100.intra_node_latency_s +
                                   (1000.0 - 100.0) / a100.intra_node_bus_bw_bytes_per_s));
  EXPECT_DOUBLE_EQ(intra_node_collective_time_s(a100, CollectiveOp::all_reduce, 4, 4000),
                   6 * a100.intra_node_latency_s + 4000 * 1.5 / a100.intra_node_bus_bw_bytes_per_s);
  EXPECT_DOUBLE_EQ(intra_node_collective_time_s(a100, CollectiveOp::send_recv, 2, 1000),
                   a100.intra_node_latency_s + 1000 / a100.intra_node_p2p_bw_bytes_per_s);
  EXPECT_EQ(intra_node_collective_time_s(a100, CollectiveOp::all_reduce, 1, 4000), 0.0);
}

// ---- interpolation ----

TEST(CollectiveInterpolation, ExactBetweenAndOutside) {
  const std::vector<CollectiveFit> fits = {{2, 10e-6, 300e9}, {8, 40e-6, 360e9}};
  EXPECT_EQ(interpolate_collective_fit(fits, 2), fits[0]);
  EXPECT_EQ(interpolate_collective_fit(fits, 8), fits[1]);
  const CollectiveFit four = interpolate_collective_fit(fits, 4);  // a third of the way
  EXPECT_EQ(four.gpus, 4);
  EXPECT_DOUBLE_EQ(four.latency_s, 20e-6);
  EXPECT_DOUBLE_EQ(four.bus_bw_bytes_per_s, 320e9);
  const CollectiveFit sixteen = interpolate_collective_fit(fits, 16);  // nearest: the 8-GPU one
  EXPECT_DOUBLE_EQ(sixteen.latency_s, 40e-6);
  EXPECT_DOUBLE_EQ(sixteen.bus_bw_bytes_per_s, 360e9);
  Cluster cluster = cluster_preset("h100");
  cluster.intra_node_collectives = {{CollectiveOp::reduce_scatter, fits}};
  EXPECT_DOUBLE_EQ(intra_node_collective_time_s(cluster, CollectiveOp::reduce_scatter, 4, 4000),
                   20e-6 + 4000 * 0.75 / 320e9);
}

// ---- names and factors ----

TEST(CollectiveNames, NcclTestsSpellingsAndSuggestions) {
  for (CollectiveOp op : collective_ops()) {
    EXPECT_EQ(collective_op_from_name(collective_op_name(op), "t"), op);
  }
  EXPECT_EQ(collective_op_from_name("alltoall", "t"), CollectiveOp::all_to_all);
  EXPECT_EQ(collective_op_from_name("sendrecv", "t"), CollectiveOp::send_recv);
  expect_input_error([] { collective_op_from_name("allgather", "my.csv:3"); },
                     {"my.csv:3", "unknown collective 'allgather'", "did you mean 'all_gather'"});
  expect_input_error([] { collective_op_from_name("broadcast", "x"); }, {"known: all_gather"});
}

TEST(CollectiveNames, BusBandwidthFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::all_gather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::reduce_scatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::all_to_all, 2), 1.0 / 2);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::all_reduce, 8), 2 * 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveOp::send_recv, 8), 1.0);
}

// ---- the fit ----

TEST(CollectiveFit, RecoversExactConstantsAndClampsNegativeLatency) {
  std::vector<CollectiveSample> samples;
  for (Bytes size = 8 << 20; size <= (Bytes{1} << 33); size *= 2) {
    samples.push_back({size, 30e-6 + size * 0.875 / 350e9});
  }
  const CollectiveFit fit = fit_collective(CollectiveOp::all_gather, 8, samples, "t");
  EXPECT_EQ(fit.gpus, 8);
  EXPECT_NEAR(fit.latency_s, 30e-6, 1e-12);
  EXPECT_NEAR(fit.bus_bw_bytes_per_s, 350e9, 1e-3);
  // Times below a pure bandwidth line would need a negative latency: clamped to 0.
  const std::vector<CollectiveSample> fast = {{1000, 0.5e-9}, {2000, 2e-9}};
  const CollectiveFit clamped = fit_collective(CollectiveOp::send_recv, 2, fast, "t");
  EXPECT_EQ(clamped.latency_s, 0.0);
  EXPECT_GT(clamped.bus_bw_bytes_per_s, 0.0);
  expect_input_error([] {
    const std::vector<CollectiveSample> one = {{1000, 1e-5}, {1000, 2e-5}};
    fit_collective(CollectiveOp::all_reduce, 4, one, "rows from a.csv:2");
  }, {"rows from a.csv:2", "all_reduce on 4 GPUs", "two different sizes"});
}

// A loaded host (ranks sharing cores): a preempted small message must not bend the fit to a
// negative bandwidth (fit_collective throws there); times equal at every size fall back to
// the largest size's bandwidth; clean samples give fit_collective's answer unchanged.
TEST(CollectiveFit, NoisyHostSamplesAlwaysGiveAPositiveBandwidth) {
  const std::vector<CollectiveSample> preempted = {{4096, 3e-3}, {256 * 1024, 2e-3}, {4 << 20, 1e-3}};
  expect_input_error([&] { fit_collective(CollectiveOp::all_reduce, 2, preempted, "t"); },
                     {"time does not grow with size"});
  const CollectiveFit capped = fit_collective_noisy(CollectiveOp::all_reduce, 2, preempted, "t");
  EXPECT_GT(capped.bus_bw_bytes_per_s, 0.0);
  EXPECT_GE(capped.latency_s, 0.0);
  const std::vector<CollectiveSample> flat = {{4 << 20, 2e-3}, {4096, 5e-3}, {256 * 1024, 2e-3}};
  const CollectiveFit fallback = fit_collective_noisy(CollectiveOp::all_gather, 4, flat, "t");
  EXPECT_EQ(fallback.latency_s, 0.0);
  EXPECT_DOUBLE_EQ(fallback.bus_bw_bytes_per_s, (4 << 20) * bus_bandwidth_factor(CollectiveOp::all_gather, 4) / 2e-3);
  std::vector<CollectiveSample> clean;
  for (Bytes size = 4096; size <= (4 << 20); size *= 8) clean.push_back({size, 5e-6 + size / 4e9});
  const CollectiveFit exact = fit_collective(CollectiveOp::all_to_all, 2, clean, "t");
  const CollectiveFit same = fit_collective_noisy(CollectiveOp::all_to_all, 2, {clean.rbegin(), clean.rend()}, "t");
  EXPECT_DOUBLE_EQ(same.latency_s, exact.latency_s);
  EXPECT_DOUBLE_EQ(same.bus_bw_bytes_per_s, exact.bus_bw_bytes_per_s);
}

// ---- JSON and validation ----

TEST(CollectiveJson, RoundTripAndOptional) {
  const Cluster h200 = cluster_preset("h200");
  ASSERT_EQ(h200.intra_node_collectives.size(), 4u);  // all_gather, reduce_scatter, all_reduce, all_to_all
  const nlohmann::json json = to_json(h200);
  ASSERT_TRUE(json.contains("intra_node_collectives"));
  EXPECT_EQ(json["intra_node_collectives"]["all_gather"][0]["gpus"], 2);
  const Cluster back = cluster_from_json(json, "t");
  EXPECT_EQ(back.intra_node_collectives, h200.intra_node_collectives);
  EXPECT_EQ(to_json(back), json);
  // Absent: an uncalibrated cluster, and to_json writes nothing for it.
  nlohmann::json plain = json;
  plain.erase("intra_node_collectives");
  EXPECT_TRUE(cluster_from_json(plain, "t").intra_node_collectives.empty());
  EXPECT_FALSE(to_json(cluster_preset("a100-ib400")).contains("intra_node_collectives"));
  // Unsorted entries are sorted on reading; nccl-tests' op spellings are accepted.
  nlohmann::json unsorted = plain;
  unsorted["intra_node_collectives"] = {
      {"alltoall", {{{"gpus", 8}, {"latency_s", 5e-5}, {"bus_bw_bytes_per_s", 3e11}},
                    {{"gpus", 2}, {"latency_s", 2e-5}, {"bus_bw_bytes_per_s", 2e11}}}}};
  const Cluster sorted = cluster_from_json(unsorted, "t");
  EXPECT_EQ(sorted.intra_node_collectives.at(CollectiveOp::all_to_all).front().gpus, 2);
}

TEST(CollectiveJson, ValidationErrorsNameSourceFieldAndFix) {
  nlohmann::json base = to_json(cluster_preset("h100"));
  base.erase("intra_node_collectives");
  const auto with = [&](nlohmann::json entries) {
    nlohmann::json json = base;
    json["intra_node_collectives"] = {{"all_gather", std::move(entries)}};
    return json;
  };
  const nlohmann::json good = {{"gpus", 4}, {"latency_s", 3e-5}, {"bus_bw_bytes_per_s", 3.6e11}};
  nlohmann::json entry = good;
  entry["gpus"] = 1;
  expect_input_error([&] { cluster_from_json(with(nlohmann::json::array({entry})), "c.json"); },
                     {"c.json", "intra_node_collectives.all_gather[0].gpus", "is 1", "2 to"});
  entry["gpus"] = 100000;
  expect_input_error([&] { cluster_from_json(with(nlohmann::json::array({entry})), "c.json"); },
                     {"[0].gpus", "is 100000"});
  // Above gpus_per_node is allowed: h100 reshaped to 4-GPU nodes keeps its 8-GPU entries.
  Cluster reshaped = cluster_preset("h100");
  reshaped.gpus_per_node = 4;
  reshaped.nics_per_node = 4;
  EXPECT_NO_THROW(validate_cluster(reshaped, "reshaped"));
  EXPECT_NO_THROW(cluster_from_json(to_json(reshaped), "reshaped.json"));
  expect_input_error(
      [&] {
        cluster_from_json(with(nlohmann::json::array({good, good})), "c.json");
      },
      {"all_gather[1].gpus", "give each GPU count once"});
  entry = good;
  entry["latency_s"] = -1e-6;
  expect_input_error([&] { cluster_from_json(with(nlohmann::json::array({entry})), "c.json"); },
                     {"[0].latency_s", ">= 0"});
  entry = good;
  entry["bus_bw_bytes_per_s"] = 0;
  expect_input_error([&] { cluster_from_json(with(nlohmann::json::array({entry})), "c.json"); },
                     {"[0].bus_bw_bytes_per_s", "> 0"});
  entry = good;
  entry["latency"] = 1e-6;
  expect_input_error([&] { cluster_from_json(with(nlohmann::json::array({entry})), "c.json"); },
                     {"c.json: intra_node_collectives.all_gather[0]", "unknown key \"latency\"",
                      "did you mean 'latency_s'"});
  entry = good;
  entry.erase("gpus");
  expect_input_error([&] { cluster_from_json(with(nlohmann::json::array({entry})), "c.json"); },
                     {"missing field 'gpus'"});
  nlohmann::json json = base;
  json["intra_node_collectives"] = {{"allreduce", nlohmann::json::array({good})}};
  expect_input_error([&] { cluster_from_json(json, "c.json"); },
                     {"c.json: intra_node_collectives", "'allreduce'", "did you mean 'all_reduce'"});
  json["intra_node_collectives"] = {{"all_reduce", good}};
  expect_input_error([&] { cluster_from_json(json, "c.json"); }, {"all_reduce must be an array"});
  json["intra_node_collectives"] = nlohmann::json::array();
  expect_input_error([&] { cluster_from_json(json, "c.json"); }, {"must be an object"});
}

// ---- nccl-tests readers ----

TEST(NcclTestsReader, BundledCsv) {
  const std::vector<NcclTestsRow> rows = read_nccl_tests_file(kBundledCsv);
  ASSERT_EQ(rows.size(), 99u);
  EXPECT_EQ(rows.front().op, CollectiveOp::all_gather);
  EXPECT_EQ(rows.front().gpus, 2);
  EXPECT_EQ(rows.front().hosts, 1);
  EXPECT_EQ(rows.front().size_bytes, 8388608);
  EXPECT_DOUBLE_EQ(rows.front().time_s, 35.54e-6);
  EXPECT_EQ(rows.front().source, kBundledCsv + ":2");
}

struct SampleExpectation {
  std::string file;
  CollectiveOp op;
  int gpus, hosts;
  std::size_t rows;
  Bytes first_size;
  Seconds first_time_s;
};

TEST(NcclTestsReader, TextSamplesOfEveryOp) {
  const std::vector<SampleExpectation> samples = {
      {"all_reduce_perf_8gpu.txt", CollectiveOp::all_reduce, 8, 1, 11, 8388608, 90.77e-6},
      {"all_gather_perf_4gpu.txt", CollectiveOp::all_gather, 4, 1, 11, 8388608, 56.11e-6},
      {"reduce_scatter_perf_2gpu.txt", CollectiveOp::reduce_scatter, 2, 1, 11, 8388608, 46.97e-6},
      {"alltoall_perf_8gpu.txt", CollectiveOp::all_to_all, 8, 1, 6, 8388608, 66.59e-6},
      {"sendrecv_perf_2gpu.txt", CollectiveOp::send_recv, 2, 1, 6, 8388608, 43.30e-6},
      {"sendrecv_perf_2node.txt", CollectiveOp::send_recv, 2, 2, 6, 8388608, 208.48e-6},
  };
  for (const SampleExpectation& sample : samples) {
    const std::vector<NcclTestsRow> rows = read_nccl_tests_file(kSamples + sample.file);
    ASSERT_EQ(rows.size(), sample.rows) << sample.file;
    EXPECT_EQ(rows.front().op, sample.op) << sample.file;
    EXPECT_EQ(rows.front().gpus, sample.gpus) << sample.file;
    EXPECT_EQ(rows.front().hosts, sample.hosts) << sample.file;
    EXPECT_EQ(rows.front().size_bytes, sample.first_size) << sample.file;
    EXPECT_NEAR(rows.front().time_s, sample.first_time_s, 1e-12) << sample.file;
    EXPECT_NE(rows.front().source.find(sample.file + ":"), std::string::npos);
  }
  // The 8-GPU all_reduce sample holds the bundled CSV's rows for it.
  const auto text_rows = read_nccl_tests_file(kSamples + "all_reduce_perf_8gpu.txt");
  std::vector<NcclTestsRow> csv_rows;
  for (const NcclTestsRow& row : read_nccl_tests_file(kBundledCsv)) {
    if (row.op == CollectiveOp::all_reduce && row.gpus == 8) csv_rows.push_back(row);
  }
  ASSERT_EQ(text_rows.size(), csv_rows.size());
  for (std::size_t i = 0; i < csv_rows.size(); ++i) {
    EXPECT_EQ(text_rows[i].size_bytes, csv_rows[i].size_bytes);
    EXPECT_DOUBLE_EQ(text_rows[i].time_s, csv_rows[i].time_s);
  }
}

constexpr const char* kHeader =
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     "
    "time   algbw   busbw #wrong\n";
constexpr const char* kTwoRanks =
    "#  Rank  0 Group  0 Pid   1000 on node-a device  0 [0x18] NVIDIA H200\n"
    "#  Rank  1 Group  0 Pid   1001 on node-a device  1 [0x2a] NVIDIA H200\n";

TEST(NcclTestsReader, TextVariants) {
  // The op from the file name; rows without redop/root (older alltoall/sendrecv); noise.
  const std::string text = std::string("NCCL INFO some banner\n") + kTwoRanks + kHeader +
                           "     1048576        262144     float     32.10   32.67   32.67      0"
                           "    31.90   32.87   32.87      0\n"
                           "     2097152        524288     float     50.00   41.94   41.94      0"
                           "    50.10   41.86   41.86      0\n";
  const auto rows = parse_nccl_tests_text(text, "logs/alltoall_perf-run3.log");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].op, CollectiveOp::all_to_all);
  EXPECT_DOUBLE_EQ(rows[1].time_s, 50e-6);
  EXPECT_EQ(rows[1].source, "logs/alltoall_perf-run3.log:6");
  // Two runs in one file, each with its start line.
  const std::string two_runs =
      std::string("# Collective test starting: all_reduce_perf\n") + kTwoRanks + kHeader +
      "     1048576        262144     float     sum      -1    20.00   52.43   52.43      0    20.00   52.43   52.43      0\n"
      "# Collective test starting: all_gather_perf_mpi\n" +
      "#  Rank  0 Group  0 Pid 1 on node-a device 0 [0x18] H200\n"
      "#  Rank  1 Group  0 Pid 2 on node-b device 0 [0x18] H200\n"
      "#  Rank  2 Group  0 Pid 3 on node-b device 1 [0x2a] H200\n" +
      kHeader +
      "     1048576        262144     float    none      -1    30.00   34.95   23.30      0    30.00   34.95   23.30    N/A\n";
  const auto both = parse_nccl_tests_text(two_runs, "mixed.txt");
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0].op, CollectiveOp::all_reduce);
  EXPECT_EQ(both[0].gpus, 2);
  EXPECT_EQ(both[1].op, CollectiveOp::all_gather);
  EXPECT_EQ(both[1].gpus, 3);
  EXPECT_EQ(both[1].hosts, 2);
}

TEST(NcclTestsReader, BadFilesNameTheLine) {
  const std::string start = "# Collective test starting: all_reduce_perf\n";
  const std::string row = "     1048576        262144     float     sum      -1    20.00   52.43   52.43      0    20.00   52.43   52.43      0\n";
  expect_input_error([&] { parse_nccl_tests_text(start + kTwoRanks + row, "a.txt"); },
                     {"a.txt:4", "before the column header"});
  expect_input_error([&] { parse_nccl_tests_text(start + kHeader + row, "a.txt"); },
                     {"a.txt:3", "'#  Rank  N Group"});
  expect_input_error([&] { parse_nccl_tests_text(std::string(kTwoRanks) + kHeader + row, "run.txt"); },
                     {"run.txt:4", "which collective?", "Collective test starting"});
  const std::string bad_time = "     1048576        262144     float     sum      -1    fast   52.43   52.43      0    20.00   52.43   52.43      0\n";
  expect_input_error([&] { parse_nccl_tests_text(start + kTwoRanks + kHeader + bad_time, "a.txt"); },
                     {"a.txt:5", "out-of-place time in us in column 6 ('time')", "'fast'"});
  expect_input_error([&] { parse_nccl_tests_text(start + kTwoRanks + kTwoRanks, "a.txt"); },
                     {"a.txt:4", "rank 0 is listed twice", "MPI=1"});
  expect_input_error([&] { parse_nccl_tests_text("# Collective test starting: broadcast_perf\n", "b.txt"); },
                     {"b.txt:1", "'broadcast'", "all_gather_perf"});
  expect_input_error([&] { parse_nccl_tests_text("hello\n", "empty.txt"); },
                     {"empty.txt", "no nccl-tests results found"});
  // CSV
  expect_input_error([&] { parse_nccl_tests_text("op,ngpu,size_bytes\nall_reduce,8,1024\n", "c.csv"); },
                     {"c.csv:1", "t_us_out"});
  expect_input_error([&] {
    parse_nccl_tests_text("op,ngpu,size_bytes,t_us_out\nall_reduce,8,1024,10\nall_reduce,8,x,10\n", "c.csv");
  }, {"c.csv:3", "size_bytes", "'x'"});
  expect_input_error([&] { parse_nccl_tests_text("op,ngpu,size_bytes,t_us_out\nallreduce,8,1024,10\n", "c.csv"); },
                     {"c.csv:2", "did you mean 'all_reduce'"});
  expect_input_error([&] { parse_nccl_tests_text("op,ngpu,size_bytes,t_us_out\nall_reduce,8,1024\n", "c.csv"); },
                     {"c.csv:2", "expected 4 comma-separated fields"});
}

// ---- calibrate_cluster ----

TEST(Calibration, BundledCsvGivesTheH200PresetConstants) {
  // The presets' literals were printed by this calibration (presets.cpp); they must agree.
  const Cluster h200 = cluster_preset("h200");
  const auto rows = read_nccl_tests_file(kBundledCsv);
  const std::vector<std::string> files = {"data/profiles/h200_8gpu_nccl_tests.csv"};
  const Calibration calibration = calibrate_cluster(h200, rows, files);
  EXPECT_EQ(calibration.cluster.name, "h200-calibrated");
  ASSERT_EQ(calibration.rows.size(), rows.size());
  EXPECT_TRUE(std::all_of(calibration.rows.begin(), calibration.rows.end(),
                          [](const CalibrationRow& r) { return r.fitted; }));
  EXPECT_TRUE(calibration.notes.empty());
  for (CollectiveOp op : {CollectiveOp::all_gather, CollectiveOp::reduce_scatter, CollectiveOp::all_reduce}) {
    const auto& fitted = calibration.cluster.intra_node_collectives.at(op);
    const auto& preset = h200.intra_node_collectives.at(op);
    ASSERT_EQ(fitted.size(), 3u);
    ASSERT_EQ(preset.size(), 3u);
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(fitted[i].gpus, preset[i].gpus);
      EXPECT_NEAR(fitted[i].latency_s, preset[i].latency_s, 1e-9) << collective_op_name(op);
      EXPECT_NEAR(fitted[i].bus_bw_bytes_per_s / preset[i].bus_bw_bytes_per_s, 1.0, 1e-5)
          << collective_op_name(op);
    }
  }
  // all_to_all is not measured: the base's estimate stays.
  EXPECT_EQ(calibration.cluster.intra_node_collectives.at(CollectiveOp::all_to_all),
            h200.intra_node_collectives.at(CollectiveOp::all_to_all));
  EXPECT_LT(calibration.worst_relative_error, 0.2);
  EXPECT_NE(calibration.cluster.provenance.find("data/profiles/h200_8gpu_nccl_tests.csv (99 rows, 99 fitted)"),
            std::string::npos)
      << calibration.cluster.provenance;
}

TEST(Calibration, SendRecvFitsPointToPointAndNicConstants) {
  std::vector<NcclTestsRow> rows;
  for (const char* file : {"sendrecv_perf_2gpu.txt", "sendrecv_perf_2node.txt", "alltoall_perf_8gpu.txt"}) {
    const auto file_rows = read_nccl_tests_file(kSamples + file);
    rows.insert(rows.end(), file_rows.begin(), file_rows.end());
  }
  // A collective across hosts other than all_reduce is listed, not fitted.
  NcclTestsRow spanning = rows.front();
  spanning.op = CollectiveOp::all_gather;
  spanning.gpus = 16;
  spanning.hosts = 2;
  rows.push_back(spanning);
  const std::vector<std::string> files = {"x"};
  const Calibration calibration = calibrate_cluster(cluster_preset("a100-ib400"), rows, files, "mine");
  EXPECT_EQ(calibration.cluster.name, "mine");
  // The samples are 20 us + size / 360 GB/s and 30 us + size / 47 GB/s, rounded as printed.
  EXPECT_NEAR(calibration.cluster.intra_node_p2p_bw_bytes_per_s / 360e9, 1.0, 1e-3);
  EXPECT_NEAR(calibration.cluster.intra_node_latency_s, 20e-6, 0.2e-6);
  EXPECT_NEAR(calibration.cluster.nic_bw_bytes_per_s / 47e9, 1.0, 1e-3);
  EXPECT_NEAR(calibration.cluster.inter_node_latency_s, 30e-6, 0.5e-6);
  const auto& all_to_all = calibration.cluster.intra_node_collectives.at(CollectiveOp::all_to_all);
  ASSERT_EQ(all_to_all.size(), 1u);
  EXPECT_NEAR(all_to_all[0].bus_bw_bytes_per_s / 340e9, 1.0, 1e-3);
  EXPECT_FALSE(calibration.rows.back().fitted);
  EXPECT_FALSE(calibration.rows.back().checked);
  ASSERT_EQ(calibration.notes.size(), 1u);
  EXPECT_NE(calibration.notes[0].find("all_gather across 2 hosts"), std::string::npos);
  EXPECT_LT(calibration.worst_relative_error, 0.01);
}

// An all_reduce across hosts is not fitted but held against the gradient sync's formula
// (docs/cost-model.md, "Gradient sync"): a row at the busbw nccl-tests#309 reports for 4
// nodes of 8 H100s with 8 NDR NICs each (365.84 GB/s) is predicted at the h100 preset's
// min(370, 8 x 47) GB/s, within 1%; the cluster is unchanged. With the sendrecv rows
// across hosts in the same run, the fitted NIC constants predict it (one 47 GB/s NIC on
// a100-ib400's nodes: 8x slower). An all_reduce whose GPUs do not split evenly over its
// hosts is only listed.
TEST(Calibration, AllReduceAcrossHostsIsCheckedAgainstTheGradientSync) {
  const Cluster h100 = cluster_preset("h100");
  NcclTestsRow row;
  row.op = CollectiveOp::all_reduce;
  row.gpus = 32;
  row.hosts = 4;
  row.size_bytes = Bytes{8} << 30;
  const double volume_bytes = 2.0 * 31 / 32 * static_cast<double>(row.size_bytes);
  row.time_s = volume_bytes / 365.84e9;
  row.source = "nccl-tests#309";
  NcclTestsRow uneven = row;
  uneven.gpus = 30;
  const std::vector<NcclTestsRow> rows = {row, uneven};
  const std::vector<std::string> files = {"x"};
  const Calibration calibration = calibrate_cluster(h100, rows, files, "");
  ASSERT_EQ(calibration.rows.size(), 2u);
  const CalibrationRow& checked = calibration.rows[0];
  EXPECT_FALSE(checked.fitted);
  EXPECT_TRUE(checked.checked);
  const Seconds expected_s = volume_bytes / 370e9 + 2 * 5 * h100.inter_node_latency_s;
  EXPECT_NEAR(checked.predicted_s, expected_s, 1e-12);
  EXPECT_NEAR(checked.relative_error, expected_s / row.time_s - 1, 1e-12);
  // 1.1% faster in bandwidth, 0.3 ms of latency (10 hops of 30 us) slower.
  EXPECT_LT(checked.relative_error, -0.004);
  EXPECT_GT(checked.relative_error, -0.006);
  EXPECT_FALSE(calibration.rows[1].checked);
  EXPECT_FALSE(calibration.rows[1].fitted);
  EXPECT_EQ(to_json(calibration.cluster).dump(), [&] {
    Cluster same = h100;
    same.name = "h100-calibrated";
    same.provenance = calibration.cluster.provenance;
    return to_json(same).dump();
  }());
  const auto has_note = [&](const std::string& text) {
    return std::any_of(calibration.notes.begin(), calibration.notes.end(),
                       [&](const std::string& note) { return note.find(text) != std::string::npos; });
  };
  EXPECT_TRUE(has_note(fmt::format("checked against the cost model: largest error {:+.1f}%",
                                   100 * checked.relative_error)));
  EXPECT_TRUE(has_note("all_reduce across 4 hosts: collectives spanning nodes are not fitted"));

  // The NIC constants fitted from sendrecv across hosts in the same run are the ones used.
  std::vector<NcclTestsRow> with_nics = read_nccl_tests_file(kSamples + std::string("sendrecv_perf_2node.txt"));
  NcclTestsRow two_nodes = row;
  two_nodes.gpus = 16;
  two_nodes.hosts = 2;
  with_nics.push_back(two_nodes);
  const Calibration fitted = calibrate_cluster(cluster_preset("a100-ib400"), with_nics, files, "");
  const CalibrationRow& on_one_nic = fitted.rows.back();
  ASSERT_TRUE(on_one_nic.checked);
  EXPECT_NEAR(on_one_nic.predicted_s,
              2.0 * 15 / 16 * static_cast<double>(two_nodes.size_bytes) / fitted.cluster.nic_bw_bytes_per_s +
                  2 * 4 * fitted.cluster.inter_node_latency_s,
              1e-12);
}

}  // namespace
}  // namespace ballast
