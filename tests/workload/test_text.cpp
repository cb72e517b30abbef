// Text helpers shared by messages: closest_match / did_you_mean against a brute-force
// reference on random words, and the cases users hit; unknown JSON keys
// (reject_unknown_keys), whose message is built on did_you_mean.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <random>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ballast/error.hpp"
#include "ballast/json_file.hpp"
#include "ballast/text.hpp"

namespace ballast {
namespace {

const std::vector<std::string> kClusterKeys = {"name", "nodes", "gpus_per_node", "nics_per_node",
                                               "nic_bw_bytes_per_s", "gpu_memory_bytes"};

TEST(ClosestMatch, TyposUsersMake) {
  EXPECT_EQ(closest_match("nics_per_nodes", kClusterKeys), "nics_per_node");
  EXPECT_EQ(closest_match("GPUS_PER_NODE", kClusterKeys), "gpus_per_node");
  EXPECT_EQ(closest_match("datset", {"dataset", "lengths", "cluster"}), "dataset");
  EXPECT_EQ(closest_match("zepelin", {"static-cp", "hybrid-dp", "zeppelin"}), "zeppelin");
  EXPECT_EQ(closest_match("strategy", {"strategies", "baseline", "scenario"}), "strategies");
  EXPECT_EQ(closest_match("hybird-dp", {"packed-dp", "hybrid-dp"}), "hybrid-dp");  // a swap
  EXPECT_EQ(closest_match("zepp", {"static-cp", "zeppelin"}), "zeppelin");  // a unique prefix
  EXPECT_EQ(closest_match("h1000", {"a100-ib400", "a800-roce", "h100", "h200"}), "h100");
  // Nothing close: no suggestion rather than a wrong one.
  EXPECT_EQ(closest_match("nosuch.txt", {"wlbllm", "prolong", "wikipedia", "magi"}), "");
  EXPECT_EQ(closest_match("static", {"static-cp", "static-ulysses"}), "static-cp");  // the nearer
  EXPECT_EQ(closest_match("st", {"static-cp", "static-ulysses"}), "");  // two prefixes, far
  EXPECT_EQ(closest_match("", kClusterKeys), "");
  EXPECT_EQ(closest_match("x", {}), "");
  EXPECT_EQ(did_you_mean("nics_per_nodes", kClusterKeys), " (did you mean 'nics_per_node'?)");
  EXPECT_EQ(did_you_mean("qqqqqqqq", kClusterKeys), "");
}

// Reference: full Damerau-Levenshtein (optimal string alignment) by recursion with memo.
std::size_t reference_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) {
    for (std::size_t j = 0; j <= b.size(); ++j) {
      if (i == 0 || j == 0) {
        d[i][j] = i + j;
        continue;
      }
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

TEST(ClosestMatch, AgreesWithReferenceOnRandomWords) {
  std::mt19937 random(7);
  auto word = [&](std::size_t max_length) {
    std::string w(1 + random() % max_length, 'a');
    for (char& c : w) c = static_cast<char>('a' + random() % 4);
    return w;
  };
  for (int trial = 0; trial < 2000; ++trial) {
    const std::string query = word(10);
    std::vector<std::string> candidates;
    for (int i = 0; i < 5; ++i) candidates.push_back(word(10));
    std::string expected;
    std::size_t best = 1000;
    for (const auto& c : candidates) {
      const std::size_t distance = reference_distance(query, c);
      const std::size_t allowed = std::max<std::size_t>(1, std::max(query.size(), c.size()) / 3);
      if (distance <= allowed && distance < best) {
        best = distance;
        expected = c;
      }
    }
    if (expected.empty()) {
      std::vector<std::string> prefixed;
      for (const auto& c : candidates) {
        if (c.size() > query.size() && c.compare(0, query.size(), query) == 0) prefixed.push_back(c);
      }
      if (prefixed.size() == 1) expected = prefixed.front();
    }
    ASSERT_EQ(closest_match(query, candidates), expected) << query;
  }
}

constexpr std::array<std::string_view, 3> kKnownKeys = {"nodes", "nics_per_node", "provenance"};

/// reject_unknown_keys(object) with source "c.json"; the InputError message, or "" if none.
std::string unknown_key_error(const nlohmann::json& object) {
  try {
    reject_unknown_keys(object, kKnownKeys, "c.json");
  } catch (const InputError& error) {
    return error.what();
  }
  return "";
}

TEST(UnknownKeys, KnownKeysAndNonObjectsPass) {
  EXPECT_EQ(unknown_key_error(nlohmann::json::parse(R"({"nodes": 2, "provenance": ""})")), "");
  EXPECT_EQ(unknown_key_error(nlohmann::json::object()), "");
  EXPECT_EQ(unknown_key_error(nlohmann::json::array({1, 2})), "");  // the caller reports the type
  EXPECT_EQ(first_unknown_key(nlohmann::json::parse(R"({"nodes": 2})"), kKnownKeys), nullptr);
}

TEST(UnknownKeys, NameTheKeyAndSuggestTheNearest) {
  EXPECT_EQ(unknown_key_error(nlohmann::json::parse(R"({"nodes": 2, "nics_per_nodes": 4})")),
            "c.json: unknown key \"nics_per_nodes\" (did you mean 'nics_per_node'?)");
  // Nothing close: the known keys instead of a wrong guess.
  EXPECT_EQ(unknown_key_error(nlohmann::json::parse(R"({"color": "red"})")),
            "c.json: unknown key \"color\"; the known keys are nodes, nics_per_node, provenance");
  // The first unknown key in the object's (alphabetical) order.
  const auto two = nlohmann::json::parse(R"({"zz": 1, "nodes": 2, "aa": 3})");
  ASSERT_NE(first_unknown_key(two, kKnownKeys), nullptr);
  EXPECT_EQ(*first_unknown_key(two, kKnownKeys), "aa");
}

TEST(UnknownKeys, OddKeysGiveOneShortLine) {
  nlohmann::json object;
  object["a\nb"] = 1;
  EXPECT_EQ(unknown_key_error(object),
            "c.json: unknown key \"a\\nb\"; the known keys are nodes, nics_per_node, provenance");
  object = nlohmann::json::object();
  object[std::string(100000, 'x')] = 1;  // no O(|key|) edit distance, a cut key
  EXPECT_EQ(unknown_key_error(object),
            "c.json: unknown key \"" + std::string(60, 'x') +
                "...\"; the known keys are nodes, nics_per_node, provenance");
}

}  // namespace
}  // namespace ballast
