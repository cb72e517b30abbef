// Attention efficiency curves: interpolation, the analytical pricing against a slow
// reference, the floor, JSON, the benchmark CSV reader, the fit, and the fidelity table
// against FlashAttention-3's published forward figures (printed; docs/fidelity.md).
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ballast/attention_calibration.hpp"
#include "ballast/cost_model.hpp"
#include "ballast/error.hpp"
#include "cost/input_errors.hpp"
#include "ballast/model.hpp"

namespace ballast {
namespace {

using testing::expect_input_error;
using testing::input_error_message;


std::vector<EfficiencyPoint> three_points() {
  return {{512, 0.3, "a"}, {2048, 0.5, "b"}, {8192, 0.6, "c"}};
}

TEST(CurveEfficiency, ExactAtPointsLogLinearBetweenClampedOutside) {
  const std::vector<EfficiencyPoint> curve = three_points();
  EXPECT_DOUBLE_EQ(curve_efficiency(curve, 512), 0.3);
  EXPECT_DOUBLE_EQ(curve_efficiency(curve, 2048), 0.5);
  EXPECT_DOUBLE_EQ(curve_efficiency(curve, 8192), 0.6);
  EXPECT_DOUBLE_EQ(curve_efficiency(curve, 1024), 0.4);   // halfway in log(L)
  EXPECT_DOUBLE_EQ(curve_efficiency(curve, 4096), 0.55);
  EXPECT_NEAR(curve_efficiency(curve, 512 * std::pow(4.0, 0.25)), 0.35, 1e-15);
  EXPECT_DOUBLE_EQ(curve_efficiency(curve, 16), 0.3);     // clamped below
  EXPECT_DOUBLE_EQ(curve_efficiency(curve, 1e9), 0.6);    // clamped above
  const std::vector<EfficiencyPoint> one = {{100, 0.7, ""}};
  EXPECT_DOUBLE_EQ(curve_efficiency(one, 1), 0.7);
  EXPECT_DOUBLE_EQ(curve_efficiency(one, 1e6), 0.7);
}

TEST(EquivalentLength, InvertsCausalPairs) {
  for (Tokens length : {1, 2, 127, 128, 4096, 1 << 20}) {
    const auto pairs = static_cast<double>(causal_pairs(whole_document(length)));
    EXPECT_NEAR(equivalent_causal_length(pairs), static_cast<double>(length), 1e-6);
  }
  EXPECT_EQ(equivalent_causal_length(0), 0.0);
}

/// Tiles of the T x T grid aligned to (q_begin, kv_begin) holding an allowed pair.
Tokens brute_force_tiles(const AttentionBlock& block, Tokens tile) {
  Tokens tiles = 0;
  for (Tokens q0 = block.q_begin; q0 < block.q_end; q0 += tile) {
    for (Tokens k0 = block.kv_begin; k0 < block.kv_end; k0 += tile) {
      const Tokens last_query = std::min(q0 + tile, block.q_end) - 1;
      tiles += k0 <= last_query ? 1 : 0;
    }
  }
  return tiles;
}

/// The slow reference, part 1: each curve point's efficiency on tile work, so that a
/// whole document of its length (n = ceil(L/T) tile rows, n(n+1)/2 tiles) takes
/// pairs / efficiency.
std::vector<EfficiencyPoint> reference_tile_curve(const Cluster& cluster, Pass pass) {
  const auto tile = static_cast<double>(cluster.attention_tile_tokens);
  const auto& curve =
      pass == Pass::forward ? cluster.attention_forward_curve : cluster.attention_backward_curve;
  std::vector<EfficiencyPoint> tile_curve;
  for (const EfficiencyPoint& point : curve) {
    const auto length = static_cast<double>(point.tokens);
    const double rows = std::ceil(length / tile);
    const double pairs = length * (length + 1) / 2;
    tile_curve.push_back({point.tokens, point.efficiency * rows * (rows + 1) / 2 * tile * tile / pairs, ""});
  }
  return tile_curve;
}

/// Part 2: the block's brute-force tiles at the tile curve's efficiency at the block's
/// equivalent length, in pair-seconds at efficiency 1.
double reference_tile_work(Tokens tiles, Tokens tile, const AttentionBlock& block,
                           const std::vector<EfficiencyPoint>& tile_curve) {
  if (tiles == 0) return 0.0;
  const double length = equivalent_causal_length(static_cast<double>(causal_pairs(block)));
  return static_cast<double>(tiles) * tile * tile / curve_efficiency(tile_curve, length);
}

AttentionBlock random_block(std::mt19937_64& rng, Tokens max_tokens) {
  std::uniform_int_distribution<Tokens> position(0, max_tokens);
  AttentionBlock block{position(rng), position(rng), position(rng), position(rng)};
  if (block.q_end < block.q_begin) std::swap(block.q_begin, block.q_end);
  if (block.kv_end < block.kv_begin) std::swap(block.kv_begin, block.kv_end);
  return block;
}

/// A cluster with random curves (2..8 points, random lengths and efficiencies) and tile.
Cluster random_curve_cluster(std::mt19937_64& rng) {
  Cluster cluster = cluster_preset("h100");
  cluster.attention_tile_tokens = std::uniform_int_distribution<Tokens>(16, 128)(rng);
  std::uniform_real_distribution<double> efficiency(0.05, 1.0);
  for (auto* curve : {&cluster.attention_forward_curve, &cluster.attention_backward_curve}) {
    curve->clear();
    const int points = std::uniform_int_distribution<int>(1, 8)(rng);
    Tokens tokens = std::uniform_int_distribution<Tokens>(1, 64)(rng);
    for (int i = 0; i < points; ++i) {
      curve->push_back({tokens, efficiency(rng), "random"});
      tokens += std::uniform_int_distribution<Tokens>(1, 800)(rng);
    }
  }
  validate_cluster(cluster, "random");
  return cluster;
}

TEST(AttentionTilePricing, MatchesSlowReferenceOnRandomBlocksAndCurves) {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 300; ++trial) {
    const Cluster cluster = trial == 0 ? cluster_preset("h100") : random_curve_cluster(rng);
    const AttentionTilePricing pricing(cluster);
    const std::vector<EfficiencyPoint> forward = reference_tile_curve(cluster, Pass::forward);
    const std::vector<EfficiencyPoint> backward = reference_tile_curve(cluster, Pass::backward);
    for (int i = 0; i < 20; ++i) {
      const AttentionBlock block = random_block(rng, 4000);
      const Tokens tiles = brute_force_tiles(block, cluster.attention_tile_tokens);
      for (Pass pass : {Pass::forward, Pass::backward}) {
        const double fast = pricing.effective_pairs(block, pass) / pricing.best_tile_efficiency(pass);
        const double slow = reference_tile_work(tiles, cluster.attention_tile_tokens, block,
                                                pass == Pass::forward ? forward : backward);
        ASSERT_NEAR(fast, slow, 1e-9 * slow) << "trial " << trial << " block " << block.q_begin
                                              << " " << block.q_end << " " << block.kv_begin
                                              << " " << block.kv_end;
      }
    }
  }
}

TEST(AttentionTilePricing, RemembersPricesByShapeExactly) {
  // effective_pairs() answers from a per-thread memo by (pricing, pass, lengths, offset):
  // on random blocks, moved copies of them and many pricings alive at once sharing the
  // thread's table (several curves, so an entry of one pricing read by another would
  // show), every answer is the computed one, bit for bit.
  std::mt19937_64 rng(23);
  std::vector<AttentionTilePricing> pricings;
  for (int i = 0; i < 6; ++i) pricings.emplace_back(random_curve_cluster(rng));
  std::uniform_int_distribution<Tokens> shift(-5000, 5000);
  std::uniform_int_distribution<std::size_t> which(0, pricings.size() - 1);
  int repeats = 0;
  std::vector<AttentionBlock> seen;
  for (int i = 0; i < 20000; ++i) {
    AttentionBlock block;
    if (!seen.empty() && i % 2 == 1) {  // a shape priced before, somewhere else
      block = seen[std::uniform_int_distribution<std::size_t>(0, seen.size() - 1)(rng)];
      const Tokens by = shift(rng) + 10000;
      block = {block.q_begin + by, block.q_end + by, block.kv_begin + by, block.kv_end + by};
      ++repeats;
    } else {
      block = random_block(rng, 3000);
      seen.push_back(block);
    }
    const AttentionTilePricing& pricing = pricings[which(rng)];
    for (Pass pass : {Pass::forward, Pass::backward}) {
      const double computed = pricing.effective_pairs_computed(block, pass);
      ASSERT_EQ(pricing.effective_pairs(block, pass), computed)
          << "block " << block.q_begin << " " << block.q_end << " " << block.kv_begin << " "
          << block.kv_end;
      ASSERT_EQ(pricing.effective_pairs(block, pass), computed);  // now from the memo
    }
  }
  EXPECT_GT(repeats, 5000);
  // A pricing built where another one was (same address, other curves) gets its own.
  std::optional<AttentionTilePricing> slot(std::in_place, random_curve_cluster(rng));
  const AttentionBlock block{1000, 2000, 0, 1500};
  static_cast<void>(slot->effective_pairs(block, Pass::forward));  // fills the block's entry
  slot.emplace(random_curve_cluster(rng));
  EXPECT_EQ(slot->effective_pairs(block, Pass::forward),
            slot->effective_pairs_computed(block, Pass::forward));
}

TEST(AttentionTilePricing, FlatWithoutCurvesAsBefore) {
  Cluster cluster = cluster_preset("h100");
  cluster.attention_forward_curve.clear();
  cluster.attention_backward_curve.clear();
  const AttentionTilePricing pricing(cluster);
  EXPECT_EQ(pricing.best_tile_efficiency(Pass::backward), cluster.attention_efficiency);
  // 300 tokens: 3 query-tile rows of 1, 2, 3 tiles.
  EXPECT_EQ(pricing.effective_pairs(whole_document(300), Pass::forward), 6.0 * 128 * 128);
  const AnalyticalCostModel cost(cluster, model_preset("llama-7b"));
  const Model& model = cost.model();
  const std::vector<AttentionBlock> blocks = {whole_document(300)};
  const double expected = model.layers * 6.0 * 128 * 128 * 4 * model.head_dim() * model.heads /
                          (cluster.peak_flops_per_s * cluster.attention_efficiency);
  EXPECT_DOUBLE_EQ(cost.attention_time_s(blocks, 1, Pass::forward), expected);
}

/// LLaMA-7B's head shape with FlashAttention's benchmark hidden size: 16 heads of 128, one layer.
Model benchmark_model() {
  Model model = model_preset("llama-7b");
  model.layers = 1;
  model.heads = 16;
  model.kv_heads = 16;
  model.hidden = 2048;
  return model;
}

TEST(AnalyticalAttention, WholeDocumentAtACurvePointTakesThePublishedTime) {
  const Cluster cluster = cluster_preset("h100");
  const AnalyticalCostModel cost(cluster, benchmark_model());
  for (Pass pass : {Pass::forward, Pass::backward}) {
    const auto& curve =
        pass == Pass::forward ? cluster.attention_forward_curve : cluster.attention_backward_curve;
    for (const EfficiencyPoint& point : curve) {
      const std::vector<AttentionBlock> blocks = {whole_document(point.tokens)};
      const double flops = 4.0 * 128 * 16 * static_cast<double>(causal_pairs(blocks.front())) *
                           (pass == Pass::forward ? 1.0 : 2.5);
      EXPECT_NEAR(cost.attention_time_s(blocks, 1, pass),
                  flops / (cluster.peak_flops_per_s * point.efficiency),
                  1e-12 * flops / cluster.peak_flops_per_s)
          << point.tokens;
    }
  }
}

TEST(AnalyticalAttention, BackwardSlowerThanForwardByCurveRatio) {
  const Cluster cluster = cluster_preset("h100");
  const AnalyticalCostModel cost(cluster, benchmark_model());
  for (std::size_t i = 0; i < cluster.attention_forward_curve.size(); ++i) {
    const Tokens length = cluster.attention_forward_curve[i].tokens;
    ASSERT_EQ(cluster.attention_backward_curve[i].tokens, length);
    const std::vector<AttentionBlock> blocks = {whole_document(length)};
    const double ratio = cost.attention_time_s(blocks, 1, Pass::backward) /
                         cost.attention_time_s(blocks, 1, Pass::forward);
    EXPECT_NEAR(ratio,
                2.5 * cluster.attention_forward_curve[i].efficiency /
                    cluster.attention_backward_curve[i].efficiency,
                1e-12);
    EXPECT_GT(ratio, 2.5);  // the published backward kernels run below forward efficiency
  }
  // Longer documents run at a higher efficiency: 2x tokens costs less than 4x the time.
  const std::vector<AttentionBlock> short_doc = {whole_document(1024)};
  const std::vector<AttentionBlock> long_doc = {whole_document(2048)};
  EXPECT_LT(cost.attention_time_s(long_doc, 1, Pass::forward),
            3.5 * cost.attention_time_s(short_doc, 1, Pass::forward));
}

TEST(AttentionFloor, HoldsWithCurvesOnRandomBlocksHeadSplitsAndCurves) {
  std::mt19937_64 rng(23);
  for (int trial = 0; trial < 200; ++trial) {
    const Cluster cluster = trial < 4 ? cluster_preset(cluster_preset_names()[trial])
                                      : random_curve_cluster(rng);
    const AnalyticalCostModel cost(cluster, model_preset("llama3-8b"));
    std::vector<AttentionBlock> blocks;
    double pairs = 0;
    for (int i = 0; i < 1 + trial % 5; ++i) {
      blocks.push_back(random_block(rng, trial % 2 == 0 ? 600 : 70000));
      pairs += static_cast<double>(causal_pairs(blocks.back()));
    }
    for (int split : {1, 2, 8}) {
      for (Pass pass : {Pass::forward, Pass::backward}) {
        ASSERT_GE(cost.attention_time_s(blocks, split, pass) * split,
                  cost.attention_pair_floor_s(pairs, pass) * (1 - 1e-12))
            << "trial " << trial;
      }
    }
  }
}

TEST(ClusterCurveJson, RoundTripAndAbsentKeyIsFlat) {
  const Cluster h100 = cluster_preset("h100");
  const nlohmann::json json = to_json(h100);
  ASSERT_TRUE(json.contains("attention_efficiency_curve"));
  EXPECT_EQ(json["attention_efficiency_curve"]["forward"].size(), 6u);
  const Cluster back = cluster_from_json(json, "test");
  EXPECT_EQ(back.attention_forward_curve, h100.attention_forward_curve);
  EXPECT_EQ(back.attention_backward_curve, h100.attention_backward_curve);
  EXPECT_EQ(to_json(back).dump(), json.dump());  // deterministic text
  nlohmann::json flat = json;
  flat.erase("attention_efficiency_curve");
  const Cluster old_file = cluster_from_json(flat, "old.json");
  EXPECT_TRUE(old_file.attention_forward_curve.empty());
  EXPECT_FALSE(to_json(old_file).contains("attention_efficiency_curve"));
  // One pass only: the other stays flat.
  nlohmann::json forward_only = json;
  forward_only["attention_efficiency_curve"].erase("backward");
  const Cluster half = cluster_from_json(forward_only, "half.json");
  EXPECT_EQ(half.attention_forward_curve.size(), 6u);
  EXPECT_TRUE(half.attention_backward_curve.empty());
  EXPECT_EQ(to_json(half), forward_only);
}

TEST(ClusterCurveJson, ValidationErrorsNameSourceFieldAndFix) {
  const nlohmann::json good = to_json(cluster_preset("h100"));
  auto with = [&](auto edit) {
    nlohmann::json json = good;
    edit(json["attention_efficiency_curve"]);
    return json;
  };
  auto load = [](const nlohmann::json& json) { return [json] { cluster_from_json(json, "c.json"); }; };
  expect_input_error(load(with([](auto& c) { c["forward"][2]["tokens"] = 1024; })),
                     {"c.json", "attention_efficiency_curve.forward[2].tokens", "greater than",
                      "increasing"});
  expect_input_error(load(with([](auto& c) { c["backward"][0]["tokens"] = 0; })),
                     {"c.json", "attention_efficiency_curve.backward[0].tokens", ">= 1"});
  expect_input_error(load(with([](auto& c) { c["forward"][1]["efficiency"] = 1.5; })),
                     {"c.json", "attention_efficiency_curve.forward[1].efficiency", "(0, 1]"});
  expect_input_error(load(with([](auto& c) { c["forward"][1]["efficiency"] = 0; })),
                     {"attention_efficiency_curve.forward[1].efficiency", "(0, 1]"});
  expect_input_error(load(with([](auto& c) { c["forward"][0]["tokns"] = 5; })),
                     {"c.json", "attention_efficiency_curve.forward[0]", "\"tokns\"", "'tokens'"});
  expect_input_error(load(with([](auto& c) { c["forward"][0].erase("efficiency"); })),
                     {"c.json", "attention_efficiency_curve.forward[0]", "efficiency"});
  expect_input_error(load(with([](auto& c) { c["fwd"] = c["forward"]; })),
                     {"c.json", "attention_efficiency_curve", "\"fwd\""});
  expect_input_error(load(with([](auto& c) { c["forward"] = nlohmann::json::array(); })),
                     {"c.json", "attention_efficiency_curve.forward", "non-empty", "omit"});
  expect_input_error(load(with([](auto& c) { c = 0.5; })),
                     {"c.json", "attention_efficiency_curve", "object"});
  // The source string is optional.
  const nlohmann::json no_source = with([](auto& c) { c["forward"][0].erase("source"); });
  EXPECT_EQ(cluster_from_json(no_source, "c.json").attention_forward_curve[0].source, "");
}

// ---- the benchmark CSV and the fit -----------------------------------------------------

TEST(AttentionBenchmarkCsv, ReadsColumnsByNameAnyOrder) {
  const std::string path =
      std::string(BALLAST_SOURCE_DIR) + "/tests/cost/data/attention_benchmark_made_up.csv";
  const std::vector<AttentionBenchmarkRow> rows = read_attention_benchmark_csv(path);
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[0].seq_len_tokens, 1024);
  EXPECT_EQ(rows[0].pass, Pass::forward);
  EXPECT_EQ(rows[0].heads, 16);
  EXPECT_EQ(rows[0].head_dim, 128);
  EXPECT_EQ(rows[0].batch, 16);
  EXPECT_DOUBLE_EQ(rows[0].time_s, 0.0004);
  EXPECT_EQ(rows[0].line, 4);
  EXPECT_EQ(rows[2].pass, Pass::backward);
  EXPECT_EQ(rows[3].line, 8);  // the blank line counts
  // batch is optional (default 1).
  const auto one = parse_attention_benchmark_csv(
      "seq_len_tokens,pass,time_s,heads,head_dim\r\n2048,backward,1e-3,32,128\r\n", "x.csv");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].batch, 1);
  EXPECT_EQ(one[0].line, 2);
}

TEST(AttentionBenchmarkCsv, ErrorsNameFileLineAndWhatWasExpected) {
  const std::string header = "seq_len_tokens,pass,time_s,heads,head_dim\n";
  auto parse = [](std::string text) {
    return [text] { parse_attention_benchmark_csv(text, "bench.csv"); };
  };
  expect_input_error(parse("seq_len_tokens,pass,time_s,heads\n1,fwd,1,1\n"),
                     {"bench.csv:1", "no column 'head_dim'", "seq_len_tokens,pass,time_s"});
  expect_input_error(parse("seq_len,pass,time_s,heads,head_dim\n"),
                     {"bench.csv:1", "unknown column 'seq_len'", "did you mean 'seq_len_tokens'"});
  expect_input_error(parse("pass,pass,seq_len_tokens,time_s,heads,head_dim\n"),
                     {"bench.csv:1", "'pass' appears twice"});
  expect_input_error(parse(header + "1024,sideways,1e-3,16,128\n"),
                     {"bench.csv:2", "'sideways'", "forward, backward, fwd or bwd"});
  expect_input_error(parse(header + "1024,fwd,fast,16,128\n"),
                     {"bench.csv:2", "time_s", "'fast'", "seconds > 0"});
  expect_input_error(parse(header + "\n1024,fwd,-1,16,128\n"), {"bench.csv:3", "time_s", "> 0"});
  expect_input_error(parse(header + "1024.5,fwd,1,16,128\n"),
                     {"bench.csv:2", "seq_len_tokens", "'1024.5'", "an integer"});
  expect_input_error(parse(header + "0,fwd,1,16,128\n"), {"bench.csv:2", "seq_len_tokens 0"});
  expect_input_error(parse(header + "1024,fwd,1,0,128\n"), {"bench.csv:2", "heads (0)", ">= 1"});
  expect_input_error(parse(header + "1024,fwd,1,16\n"),
                     {"bench.csv:2", "4 fields", "expected 5"});
  expect_input_error(parse(header), {"bench.csv", "no benchmark rows"});
  expect_input_error(parse(""), {"bench.csv", "no benchmark rows"});
}

/// Rows that a cluster's own curves predict exactly: one per curve point and pass.
std::vector<AttentionBenchmarkRow> rows_from_curves(const Cluster& cluster) {
  std::vector<AttentionBenchmarkRow> rows;
  int line = 2;
  for (Pass pass : {Pass::forward, Pass::backward}) {
    const auto& curve =
        pass == Pass::forward ? cluster.attention_forward_curve : cluster.attention_backward_curve;
    for (const EfficiencyPoint& point : curve) {
      AttentionBenchmarkRow row{point.tokens, pass, 0.0, 16, 128, 16384 / point.tokens, line++};
      row.time_s = attention_call_flops(row) / (cluster.peak_flops_per_s * point.efficiency);
      rows.push_back(row);
    }
  }
  return rows;
}

TEST(FitAttentionCurves, RowsGeneratedFromACurveFitBackToIt) {
  for (const std::string& name : cluster_preset_names()) {
    const Cluster base = cluster_preset(name);
    const std::vector<AttentionBenchmarkRow> rows = rows_from_curves(base);
    Cluster flat = base;  // fit starting from a cluster without curves
    flat.attention_forward_curve.clear();
    flat.attention_backward_curve.clear();
    const AttentionCalibration fit = fit_attention_curves(flat, rows, "gen.csv");
    EXPECT_TRUE(fit.forward_fitted && fit.backward_fitted);
    for (Pass pass : {Pass::forward, Pass::backward}) {
      const auto& expected =
          pass == Pass::forward ? base.attention_forward_curve : base.attention_backward_curve;
      const auto& got = pass == Pass::forward ? fit.cluster.attention_forward_curve
                                              : fit.cluster.attention_backward_curve;
      ASSERT_EQ(got.size(), expected.size()) << name;
      for (std::size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].tokens, expected[i].tokens);
        EXPECT_NEAR(got[i].efficiency, expected[i].efficiency, 1e-12) << name;
        EXPECT_EQ(got[i].source.rfind("gen.csv line ", 0), 0u) << got[i].source;
      }
    }
    ASSERT_EQ(fit.rows.size(), rows.size());
    for (const AttentionCalibrationRow& row : fit.rows) {
      EXPECT_NEAR(row.fitted_predicted_s / row.measured.time_s, 1.0, 1e-12);
      EXPECT_NEAR(predicted_attention_call_s(base, row.measured) / row.measured.time_s, 1.0, 1e-12);
    }
  }
}

TEST(FitAttentionCurves, AveragesDuplicatesKeepsUnfittedPassAndRejectsAbovePeak) {
  const Cluster base = cluster_preset("h100");
  const std::string path =
      std::string(BALLAST_SOURCE_DIR) + "/tests/cost/data/attention_benchmark_made_up.csv";
  const AttentionCalibration fit = fit_attention_curves(base, read_attention_benchmark_csv(path), path);
  // Forward 1024: rows at 0.4 and 0.6 ms; the point is the mean of their efficiencies.
  const double flops = 4.0 * 128 * 16 * (1024.0 * 1025 / 2) * 16;
  const double mean = (flops / 0.0004 + flops / 0.0006) / 2 / base.peak_flops_per_s;
  ASSERT_EQ(fit.cluster.attention_forward_curve.size(), 2u);
  EXPECT_NEAR(fit.cluster.attention_forward_curve[0].efficiency, mean, 1e-15);
  EXPECT_EQ(fit.cluster.attention_forward_curve[0].source, path + " lines 4, 5");
  EXPECT_EQ(fit.cluster.attention_backward_curve[1].tokens, 4096);
  EXPECT_NEAR(fit.rows[2].efficiency, 2.5 * flops / 0.002 / base.peak_flops_per_s, 1e-15);
  // The average predicts between the two measurements.
  EXPECT_GT(fit.rows[0].fitted_predicted_s, 0.0004);
  EXPECT_LT(fit.rows[1].fitted_predicted_s, 0.0006);

  const std::vector<AttentionBenchmarkRow> forward_only = {{4096, Pass::forward, 1e-3, 16, 128, 4, 2}};
  const AttentionCalibration half = fit_attention_curves(base, forward_only, "f.csv");
  EXPECT_TRUE(half.forward_fitted);
  EXPECT_FALSE(half.backward_fitted);
  EXPECT_EQ(half.cluster.attention_backward_curve, base.attention_backward_curve);

  const std::vector<AttentionBenchmarkRow> too_fast = {{16384, Pass::forward, 1e-9, 16, 128, 1, 7}};
  expect_input_error([&] { fit_attention_curves(base, too_fast, "fast.csv"); },
                     {"fast.csv:7", "peak", "time_s"});
  expect_input_error([&] { fit_attention_curves(base, {}, "none.csv"); }, {"none.csv", "no"});
}

// ---- fidelity: the simulator against FlashAttention-3's published forward figures -------

/// Prints, for the h100 preset, simulated against published causal forward TFLOP/s on
/// FlashAttention-3's benchmark shape (batch x length = 16K tokens, 16 heads of 128, FLOPs
/// counted as FlashAttention counts them, 4 * 128 * 16 * L^2 / 2 per document), for the
/// curve model and for the flat model it replaced (680/989, every tile). Rerun with
/// `ctest --test-dir build -R AttentionFidelity -V`; docs/fidelity.md quotes the table.
TEST(AttentionFidelity, Fa3ForwardSimulatedOverPublished) {
  const std::vector<std::pair<Tokens, double>> published = {
      {512, 290}, {1024, 420}, {2048, 520}, {4096, 580}, {8192, 600}, {16384, 616}};
  const Cluster curves = cluster_preset("h100");
  Cluster flat = curves;
  flat.attention_forward_curve.clear();
  flat.attention_efficiency = 680.0 / 989.0;  // the model before attention curves
  const AnalyticalCostModel curve_cost(curves, benchmark_model());
  const AnalyticalCostModel flat_cost(flat, benchmark_model());
  std::printf("length  published  curve-model  ratio  flat-model  ratio   (TFLOP/s, causal fwd)\n");
  for (const auto& [length, tflops] : published) {
    const std::vector<AttentionBlock> batch(static_cast<std::size_t>(16384 / length),
                                            whole_document(length));
    const double fa_flops = 4.0 * 128 * 16 * static_cast<double>(length) * length / 2 *
                            static_cast<double>(batch.size());
    const double curve_tflops = fa_flops / curve_cost.attention_time_s(batch, 1, Pass::forward) / 1e12;
    const double flat_tflops = fa_flops / flat_cost.attention_time_s(batch, 1, Pass::forward) / 1e12;
    std::printf("%6lld  %9.0f  %11.1f  %5.3f  %10.1f  %5.3f\n", static_cast<long long>(length),
                tflops, curve_tflops, curve_tflops / tflops, flat_tflops, flat_tflops / tflops);
    // At the curve's own points the model reproduces the figure up to the FLOP-count
    // convention: L(L+1)/2 pairs against FlashAttention's L^2/2.
    EXPECT_NEAR(curve_tflops / tflops, static_cast<double>(length) / (length + 1), 1e-9);
  }
}

}  // namespace
}  // namespace ballast
