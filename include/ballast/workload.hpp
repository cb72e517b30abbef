// Workloads: document-length datasets, their file readers, and the seeded batch sampler.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ballast/units.hpp"

namespace ballast {

/// One histogram bin: documents with lengths in [min_tokens, max_tokens] (inclusive).
struct LengthBin {
  Tokens min_tokens = 0;
  Tokens max_tokens = 0;
  std::int64_t documents = 0;
};

/// A document-length distribution: either explicit lengths (one per document) or a
/// histogram. Exactly one of `lengths_tokens` / `histogram` is non-empty.
struct Dataset {
  std::string name;    ///< short name (`wlbllm`) or the file path it was read from
  std::string source;  ///< file path it was read from
  std::vector<Tokens> lengths_tokens;
  std::vector<LengthBin> histogram;

  bool is_histogram() const { return !histogram.empty(); }
  std::int64_t documents() const;   ///< number of documents (sum of bin counts for histograms)
  Tokens max_length_tokens() const;
  double mean_length_tokens() const;
};

/// Reads a length file. Format by content: a JSON array of positive integers
/// (`[1, 2, 3]`), a histogram CSV with a header and rows `"[lo, hi]",count,...`, or
/// one positive integer per line (blank lines and `#` comments ignored).
/// Throws InputError naming the file, line and fix on anything malformed, empty,
/// zero or negative.
Dataset read_lengths_file(const std::string& path);

/// A bundled dataset shipped in `data/lengths/`.
struct DatasetInfo {
  std::string name;         ///< short name used with --dataset
  std::string file;         ///< file name inside data/lengths
  std::string description;  ///< one line: what it is and where it comes from
};

/// The bundled datasets, in a fixed order.
const std::vector<DatasetInfo>& bundled_datasets();

/// The folder holding bundled data: $BALLAST_DATA_DIR if set, else the source tree's
/// `data/` compiled in at build time.
std::string data_dir();

/// A bundled dataset by short name, or a length file by path. Unknown names that are
/// not files throw InputError listing the known names.
Dataset load_dataset(const std::string& name_or_path);

/// What the sampler does with documents longer than max_context_tokens.
enum class OverContextPolicy {
  split,     ///< cut them into limit-length pieces, each its own sequence (what training
             ///< pipelines do; the default): no token is lost
  drop,      ///< skip them (the papers' evaluations; their scenarios say so explicitly)
  truncate,  ///< keep the first limit tokens, lose the rest
  error,     ///< stop with an InputError naming the document
};
OverContextPolicy parse_over_context_policy(const std::string& text);  // "split|drop|truncate|error"
std::string to_string(OverContextPolicy policy);

/// How documents are drawn from the dataset.
enum class SamplingOrder {
  random,      ///< i.i.d. draws (with replacement) seeded by `seed`
  sequential,  ///< consecutive documents of the file, step k continuing where k-1 stopped
               ///< (FlexSP's "512 consecutive sequences"); `seed` picks the start offset
};
SamplingOrder parse_sampling_order(const std::string& text);  // "random|sequential"
std::string to_string(SamplingOrder order);

struct SamplerOptions {
  /// Exactly one of the two budgets must be set.
  std::optional<Tokens> tokens_per_step;       ///< add documents while the total stays <= this
  std::optional<std::int64_t> batch_size;      ///< documents per step
  Tokens max_context_tokens = 131072;
  OverContextPolicy over_context = OverContextPolicy::split;
  SamplingOrder order = SamplingOrder::random;
  std::uint64_t seed = 0;
};

/// Documents longer than this go to the over-context policy: --max-context, or the token
/// budget when it is smaller (such a document can never fit a step).
Tokens document_limit_tokens(const SamplerOptions& options);

/// One global batch (one training step). Sequence id = index into lengths_tokens.
struct Batch {
  std::int64_t step = 0;
  std::vector<Tokens> lengths_tokens;
  Tokens total_tokens() const;
  Tokens max_length_tokens() const;
};

/// Throws InputError naming the limit and the fix when a batch is empty, has a length
/// <= 0 or > kMaxSequenceTokens, more than kMaxBatchSequences sequences or more than
/// kMaxBatchTokens tokens in all (limits.hpp). Every planner checks its batch with it.
void check_batch_limits(std::span<const Tokens> lengths_tokens);

/// Builds a batch from explicit lengths; throws InputError as check_batch_limits does.
Batch make_batch(std::vector<Tokens> lengths_tokens, std::int64_t step = 0);

/// What the sampler has skipped or cut so far (reported in the output).
struct SamplerStats {
  std::int64_t dropped_documents = 0;
  Tokens dropped_tokens = 0;
  std::int64_t truncated_documents = 0;
  Tokens truncated_tokens = 0;  ///< tokens cut off the truncated documents (lost)
  std::int64_t split_documents = 0;  ///< documents cut into pieces (no token lost)
  std::int64_t split_pieces = 0;     ///< the pieces they became (sequences of the batches)
};

/// One line for a person, or "" when the sampler dropped, truncated and split nothing:
/// "7 documents longer than --max-context 131,072 were split into 17 pieces (1,253,417
/// tokens kept; --over-context split)". Callers print it as a warning.
std::string over_context_warning(const SamplerOptions& options, const SamplerStats& stats);

/// The sampler's random source, exposed for tests and for any part that needs draws that
/// are identical on every platform: splitmix64 (Steele, Lea, Flood 2014) advancing `state`.
std::uint64_t splitmix64_next(std::uint64_t& state);

/// A uniform integer in [0, bound) for bound > 0, without modulo bias (Lemire 2019:
/// multiply-shift with rejection), drawn from splitmix64_next(state).
std::uint64_t uniform_below(std::uint64_t& state, std::uint64_t bound);

/// Throws InputError unless 1 <= steps <= kMaxSteps (limits.hpp): every step's batch is
/// sampled and held before planning, so the count is checked before any is drawn. The one
/// check of --steps that plan, simulate, compare and run share.
void check_step_count(int steps);

/// Draws global batches from a dataset. Deterministic: the same dataset, options and
/// seed give the same batches on every platform (it uses its own integer mapping, not
/// std::uniform_int_distribution, whose output is implementation-defined).
class BatchSampler {
 public:
  /// Throws InputError for inconsistent options (no budget or both, budget <= 0, a
  /// token budget smaller than one document can ever be, max_context <= 0).
  BatchSampler(const Dataset& dataset, SamplerOptions options);
  Batch next();
  const SamplerStats& stats() const { return stats_; }
  const SamplerOptions& options() const { return options_; }

 private:
  Tokens draw_document_tokens();
  const Dataset& dataset_;
  /// Tokens of a split document not yet placed: its next pieces (of the document limit,
  /// the last one shorter) come before any new draw; a piece that does not fit a step's
  /// token budget opens the next step.
  Tokens pending_tokens_ = 0;
  SamplerOptions options_;
  SamplerStats stats_;
  std::uint64_t rng_state_ = 0;
  std::int64_t cursor_ = 0;
  std::int64_t step_ = 0;
};

}  // namespace ballast
