// Datasets and batches: the bundled dataset table, data_dir/load_dataset, Dataset and
// Batch statistics, make_batch, and the text forms of the sampler's enums.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ballast/error.hpp"
#include "ballast/text.hpp"
#include "ballast/workload.hpp"

#ifndef BALLAST_DEFAULT_DATA_DIR
#error "BALLAST_DEFAULT_DATA_DIR must be defined by src/workload/CMakeLists.txt"
#endif

namespace ballast {

// ---- Dataset --------------------------------------------------------------------------

std::int64_t Dataset::documents() const {
  if (!is_histogram()) return static_cast<std::int64_t>(lengths_tokens.size());
  std::int64_t total = 0;
  for (const LengthBin& bin : histogram) total += bin.documents;
  return total;
}

Tokens Dataset::max_length_tokens() const {
  Tokens longest = 0;
  if (!is_histogram()) {
    for (Tokens length : lengths_tokens) longest = std::max(longest, length);
    return longest;
  }
  // Empty bins hold no document, so they cannot bound the longest one.
  for (const LengthBin& bin : histogram) {
    if (bin.documents > 0) longest = std::max(longest, bin.max_tokens);
  }
  return longest;
}

double Dataset::mean_length_tokens() const {
  const std::int64_t count = documents();
  if (count == 0) return 0.0;
  if (!is_histogram()) {
    const Tokens total = std::accumulate(lengths_tokens.begin(), lengths_tokens.end(), Tokens{0});
    return static_cast<double>(total) / static_cast<double>(count);
  }
  // Approximation: a histogram only knows each bin's count, so every document counts at
  // its bin's midpoint (lo + hi) / 2.
  double weighted_tokens = 0.0;
  for (const LengthBin& bin : histogram) {
    weighted_tokens += static_cast<double>(bin.documents) *
                       (static_cast<double>(bin.min_tokens) + static_cast<double>(bin.max_tokens)) /
                       2.0;
  }
  return weighted_tokens / static_cast<double>(count);
}

// ---- bundled data ---------------------------------------------------------------------

const std::vector<DatasetInfo>& bundled_datasets() {
  // Numbers are those of the bundled files (checked by tests/workload); provenance in
  // data/README.md.
  static const std::vector<DatasetInfo> datasets = {
      {"wlbllm", "wlbllm.json",
       "WLB-LLM 128K-context pre-training lengths: 99,519 docs, mean 3,962, max 124,913 "
       "tokens (hao-ai-lab/distca)"},
      {"prolong", "prolong.json",
       "ProLong long-context data mix: 77,932 docs, mean 3,052, max 340,149 tokens "
       "(hao-ai-lab/distca)"},
      {"wikipedia", "wikipedia.txt",
       "Wikipedia documents (FlexSP workload): 1,000,000 docs, mean 1,014, max 1,823,777 "
       "tokens (PKU-DAIR/Hetu-Galvatron)"},
      {"magi", "magi.csv",
       "histogram of a real training set: 13,463,214 docs in 14 bins, mean ~1,783 (bin "
       "midpoints), max 196,608 tokens (SandAI-org/MagiAttention)"},
  };
  return datasets;
}

std::string data_dir() {
  const char* from_environment = std::getenv("BALLAST_DATA_DIR");
  if (from_environment != nullptr && from_environment[0] != '\0') return from_environment;
  return BALLAST_DEFAULT_DATA_DIR;
}

namespace {

std::vector<std::string> dataset_names() {
  std::vector<std::string> names;
  for (const DatasetInfo& info : bundled_datasets()) names.push_back(info.name);
  return names;
}

std::string known_dataset_names() { return fmt::format("{}", fmt::join(dataset_names(), ", ")); }

}  // namespace

Dataset load_dataset(const std::string& name_or_path) {
  for (const DatasetInfo& info : bundled_datasets()) {
    if (info.name != name_or_path) continue;
    Dataset dataset = read_lengths_file(data_dir() + "/lengths/" + info.file);
    dataset.name = info.name;
    return dataset;
  }
  std::error_code ignored;
  if (std::filesystem::is_directory(name_or_path, ignored)) {
    throw InputError(fmt::format("dataset '{}' is a directory; pass a length file or one of: {}",
                                 name_or_path, known_dataset_names()));
  }
  if (std::filesystem::exists(name_or_path, ignored)) return read_lengths_file(name_or_path);
  // A path (a directory part or an extension) is a file the user meant: say it is missing.
  // A bare word is a dataset name, perhaps misspelt.
  if (name_or_path.find_first_of("/\\.") != std::string::npos) {
    throw InputError(fmt::format("file not found: {} (a length file: one length per line, a "
                                 "JSON array, or a histogram CSV); check the path",
                                 name_or_path));
  }
  throw InputError(fmt::format("unknown dataset '{}'{}; known: {} (or the path of a length file; "
                               "there is no file '{}')",
                               name_or_path, did_you_mean(name_or_path, dataset_names()),
                               known_dataset_names(), name_or_path));
}

// ---- Batch ----------------------------------------------------------------------------

Tokens Batch::total_tokens() const {
  return std::accumulate(lengths_tokens.begin(), lengths_tokens.end(), Tokens{0});
}

Tokens Batch::max_length_tokens() const {
  Tokens longest = 0;
  for (Tokens length : lengths_tokens) longest = std::max(longest, length);
  return longest;
}

void check_batch_limits(std::span<const Tokens> lengths_tokens) {
  if (lengths_tokens.empty()) {
    throw InputError("the batch is empty; give at least one sequence length");
  }
  const auto count = static_cast<std::int64_t>(lengths_tokens.size());
  if (count > kMaxBatchSequences) {
    throw InputError(fmt::format(
        "the batch has {} sequences, over ballast's limit of {} per batch; split it into "
        "several steps (lower {} or {})",
        with_thousands(count), with_thousands(kMaxBatchSequences), setting_name("--batch-size"),
        setting_name("--tokens-per-step")));
  }
  Tokens total_tokens = 0;  // <= 10^6 x 2^31 < 2^51 while the lengths are checked
  for (std::size_t index = 0; index < lengths_tokens.size(); ++index) {
    const Tokens length = lengths_tokens[index];
    if (length <= 0) {
      throw InputError(fmt::format(
          "sequence {} of the batch has length {}; every sequence length must be a positive "
          "number of tokens",
          index, length));
    }
    if (length > kMaxSequenceTokens) {
      throw InputError(fmt::format(
          "sequence {} of the batch has length {}, over ballast's limit of 2^31 = {} tokens",
          index, length, kMaxSequenceTokens));
    }
    total_tokens += length;
  }
  if (total_tokens > kMaxBatchTokens) {
    throw InputError(fmt::format(
        "the batch holds {} tokens, over ballast's limit of 2^40 = {} tokens per batch; split "
        "it into several steps (lower {} or {})",
        with_thousands(total_tokens), with_thousands(kMaxBatchTokens), setting_name("--batch-size"),
        setting_name("--tokens-per-step")));
  }
}

Batch make_batch(std::vector<Tokens> lengths_tokens, std::int64_t step) {
  check_batch_limits(lengths_tokens);
  return Batch{step, std::move(lengths_tokens)};
}

// ---- enum text forms ------------------------------------------------------------------

OverContextPolicy parse_over_context_policy(const std::string& text) {
  if (text == "split") return OverContextPolicy::split;
  if (text == "drop") return OverContextPolicy::drop;
  if (text == "truncate") return OverContextPolicy::truncate;
  if (text == "error") return OverContextPolicy::error;
  throw InputError(
      fmt::format("unknown over-context policy '{}'; expected split, drop, truncate or error", text));
}

std::string to_string(OverContextPolicy policy) {
  switch (policy) {
    case OverContextPolicy::split: return "split";
    case OverContextPolicy::drop: return "drop";
    case OverContextPolicy::truncate: return "truncate";
    case OverContextPolicy::error: return "error";
  }
  BALLAST_CHECK(false, "unhandled OverContextPolicy");
}

SamplingOrder parse_sampling_order(const std::string& text) {
  if (text == "random") return SamplingOrder::random;
  if (text == "sequential") return SamplingOrder::sequential;
  throw InputError(fmt::format("unknown sampling order '{}'; expected random or sequential", text));
}

std::string to_string(SamplingOrder order) {
  switch (order) {
    case SamplingOrder::random: return "random";
    case SamplingOrder::sequential: return "sequential";
  }
  BALLAST_CHECK(false, "unhandled SamplingOrder");
}

}  // namespace ballast
