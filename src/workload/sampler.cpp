// BatchSampler: draws seeded, reproducible global batches from a dataset under a token or
// document budget, plus the platform-independent random source it uses.
#include <algorithm>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ballast/error.hpp"
#include "ballast/limits.hpp"
#include "ballast/text.hpp"
#include "ballast/workload.hpp"

namespace ballast {
Tokens document_limit_tokens(const SamplerOptions& options) {
  if (!options.tokens_per_step) return options.max_context_tokens;
  return std::min(options.max_context_tokens, *options.tokens_per_step);
}

namespace {

// A step that drops this many documents in a row is almost surely starved (nearly every
// document is over the limit); stop instead of spinning.
constexpr std::int64_t kMaxConsecutiveDrops = 1'000'000;
/// Turns a near-impossible request (say --max-context 1 with a 1M-token budget) into a
/// clear error instead of an hours-long loop: documents drawn for one step. (Sequences per
/// batch are bounded by kMaxBatchSequences, limits.hpp.)
constexpr std::int64_t kMaxDrawsPerStep = 10'000'000;

/// The high and low 64-bit halves of a * b, portably (no __int128 under -Wpedantic).
void multiply_64x64_to_128(std::uint64_t a, std::uint64_t b, std::uint64_t& high,
                           std::uint64_t& low) {
  constexpr std::uint64_t kLow32 = 0xffffffffULL;
  const std::uint64_t a_low = a & kLow32, a_high = a >> 32;
  const std::uint64_t b_low = b & kLow32, b_high = b >> 32;
  const std::uint64_t low_low = a_low * b_low;
  const std::uint64_t low_high = a_low * b_high;
  const std::uint64_t high_low = a_high * b_low;
  const std::uint64_t middle = (low_low >> 32) + (low_high & kLow32) + (high_low & kLow32);
  high = a_high * b_high + (low_high >> 32) + (high_low >> 32) + (middle >> 32);
  low = (middle << 32) | (low_low & kLow32);
}

/// The shortest length any document of the dataset can have (before the context policy).
Tokens shortest_document_tokens(const Dataset& dataset) {
  Tokens shortest = std::numeric_limits<Tokens>::max();
  if (!dataset.is_histogram()) {
    for (Tokens length : dataset.lengths_tokens) shortest = std::min(shortest, length);
    return shortest;
  }
  for (const LengthBin& bin : dataset.histogram) {
    if (bin.documents > 0) shortest = std::min(shortest, std::max<Tokens>(bin.min_tokens, 1));
  }
  return shortest;
}

/// The flag a user should raise when a document is over document_limit_tokens.
std::string binding_limit_flag(const SamplerOptions& options) {
  if (document_limit_tokens(options) == options.max_context_tokens) {
    return fmt::format("{} {}", setting_name("--max-context"), options.max_context_tokens);
  }
  return fmt::format("{} {}", setting_name("--tokens-per-step"), *options.tokens_per_step);
}

void validate_budgets(const SamplerOptions& options) {
  if (options.tokens_per_step.has_value() == options.batch_size.has_value()) {
    throw InputError(fmt::format("set exactly one of {} and {} (got {})",
                                 setting_name("--tokens-per-step"), setting_name("--batch-size"),
                                 options.batch_size ? "both" : "neither"));
  }
  if (options.tokens_per_step && *options.tokens_per_step <= 0) {
    throw InputError(
        fmt::format("{} must be positive, got {}", setting_name("--tokens-per-step"),
                    *options.tokens_per_step));
  }
  if (options.batch_size && *options.batch_size <= 0) {
    throw InputError(fmt::format("{} must be positive, got {}", setting_name("--batch-size"),
                                 *options.batch_size));
  }
  if (options.max_context_tokens <= 0) {
    throw InputError(
        fmt::format("{} must be positive, got {}", setting_name("--max-context"),
                    options.max_context_tokens));
  }
  if (options.max_context_tokens > kMaxSequenceTokens) {
    throw InputError(fmt::format(
        "{} {} is over ballast's sequence length limit of 2^31 = {} tokens; use at "
        "most {}",
        setting_name("--max-context"), options.max_context_tokens, kMaxSequenceTokens,
        kMaxSequenceTokens));
  }
  if (options.batch_size && *options.batch_size > kMaxBatchSequences) {
    throw InputError(fmt::format(
        "{} {} is over ballast's limit of {} sequences per batch; use at most {} "
        "(or several steps)",
        setting_name("--batch-size"), *options.batch_size, kMaxBatchSequences, kMaxBatchSequences));
  }
  if (options.tokens_per_step && *options.tokens_per_step > kMaxBatchTokens) {
    throw InputError(fmt::format(
        "{} {} is over ballast's limit of 2^40 = {} tokens per batch; use at "
        "most {} (or several steps)",
        setting_name("--tokens-per-step"), *options.tokens_per_step, kMaxBatchTokens,
        kMaxBatchTokens));
  }
}

/// Rejects options under which no step could ever be filled.
void validate_against_dataset(const Dataset& dataset, const SamplerOptions& options) {
  if (dataset.documents() <= 0) {
    throw InputError(fmt::format("dataset '{}' holds no documents", dataset.name));
  }
  if (dataset.is_histogram() && options.order == SamplingOrder::sequential) {
    throw InputError(
        fmt::format("dataset '{}' is a histogram, which has no document order; use {} random "
                    "(sequential order needs a file of individual lengths)",
                    dataset.name, setting_name("--sampling")));
  }
  const Tokens shortest = shortest_document_tokens(dataset);
  const bool truncating = options.over_context == OverContextPolicy::truncate ||
                          options.over_context == OverContextPolicy::split;
  if (!truncating && shortest > options.max_context_tokens) {
    throw InputError(fmt::format(
        "every document of '{}' is longer than {} {} (the shortest has {} tokens); "
        "raise {} or pass {} split",
        dataset.name, setting_name("--max-context"), options.max_context_tokens, shortest,
        setting_name("--max-context"), setting_name("--over-context")));
  }
  const Tokens smallest_possible =
      truncating ? std::min(shortest, options.max_context_tokens) : shortest;
  if (options.tokens_per_step && *options.tokens_per_step < smallest_possible) {
    throw InputError(fmt::format(
        "{} {} is smaller than the shortest document of '{}' ({} tokens); "
        "raise {} to at least {}",
        setting_name("--tokens-per-step"), *options.tokens_per_step, dataset.name,
        smallest_possible, setting_name("--tokens-per-step"), smallest_possible));
  }
}

/// Picks a histogram bin with probability proportional to its count.
std::size_t draw_histogram_bin(const Dataset& dataset, std::uint64_t& rng_state) {
  const auto total = static_cast<std::uint64_t>(dataset.documents());
  std::uint64_t rank = uniform_below(rng_state, total);
  for (std::size_t bin = 0; bin < dataset.histogram.size(); ++bin) {
    const auto count = static_cast<std::uint64_t>(dataset.histogram[bin].documents);
    if (rank < count) return bin;
    rank -= count;
  }
  BALLAST_CHECK(false, "histogram draw past the last bin");
}

}  // namespace

std::uint64_t splitmix64_next(std::uint64_t& state) {
  state += 0x9e3779b97f4a7c15ULL;
  std::uint64_t mixed = state;
  mixed = (mixed ^ (mixed >> 30)) * 0xbf58476d1ce4e5b9ULL;
  mixed = (mixed ^ (mixed >> 27)) * 0x94d049bb133111ebULL;
  return mixed ^ (mixed >> 31);
}

void check_step_count(int steps) {
  if (steps < 1) throw InputError(fmt::format("{} {} must be at least 1", setting_name("--steps"), steps));
  if (steps > kMaxSteps) {
    throw InputError(fmt::format("{} {} is over ballast's limit of {} steps per command; use "
                                 "at most {} (more batches: another run with a different {})",
                                 setting_name("--steps"), steps, with_thousands(kMaxSteps), kMaxSteps,
                                 setting_name("--seed")));
  }
}

std::uint64_t uniform_below(std::uint64_t& state, std::uint64_t bound) {
  BALLAST_CHECK(bound > 0, "uniform_below needs a positive bound");
  std::uint64_t high = 0, low = 0;
  multiply_64x64_to_128(splitmix64_next(state), bound, high, low);
  if (low < bound) {
    // 2^64 mod bound: the low products below it belong to an over-represented value.
    const std::uint64_t threshold = (0 - bound) % bound;
    while (low < threshold) multiply_64x64_to_128(splitmix64_next(state), bound, high, low);
  }
  return high;
}

BatchSampler::BatchSampler(const Dataset& dataset, SamplerOptions options)
    : dataset_(dataset), options_(options), rng_state_(options.seed) {
  validate_budgets(options_);
  validate_against_dataset(dataset_, options_);
  if (options_.order == SamplingOrder::sequential) {
    cursor_ =
        static_cast<std::int64_t>(options_.seed % static_cast<std::uint64_t>(dataset_.documents()));
  }
}

// Sequential order: the document at cursor_, not yet consumed (next() advances cursor_).
// Random order: a fresh draw; cursor_ then records the drawn document (or histogram bin)
// only so that error messages can name it.
Tokens BatchSampler::draw_document_tokens() {
  if (options_.order == SamplingOrder::sequential) {
    return dataset_.lengths_tokens[static_cast<std::size_t>(cursor_)];
  }
  if (!dataset_.is_histogram()) {
    const auto documents = static_cast<std::uint64_t>(dataset_.lengths_tokens.size());
    cursor_ = static_cast<std::int64_t>(uniform_below(rng_state_, documents));
    return dataset_.lengths_tokens[static_cast<std::size_t>(cursor_)];
  }
  const std::size_t bin_index = draw_histogram_bin(dataset_, rng_state_);
  cursor_ = static_cast<std::int64_t>(bin_index);
  const LengthBin& bin = dataset_.histogram[bin_index];
  // A bin like [0, 10] includes 0, but documents have at least one token.
  const Tokens lowest = std::max<Tokens>(bin.min_tokens, 1);
  const auto width = static_cast<std::uint64_t>(bin.max_tokens - lowest + 1);
  return lowest + static_cast<Tokens>(uniform_below(rng_state_, width));
}

namespace {

std::string describe_document(const Dataset& dataset, std::int64_t cursor) {
  if (!dataset.is_histogram()) return fmt::format("document {} of '{}'", cursor, dataset.name);
  const LengthBin& bin = dataset.histogram[static_cast<std::size_t>(cursor)];
  return fmt::format("a document of '{}' (bin [{}, {}])", dataset.name, bin.min_tokens,
                     bin.max_tokens);
}

}  // namespace

// Token budget: a document that would overflow ends the step. In sequential order it is
// not consumed and opens the next step; in random order it is discarded (the next step
// draws afresh), which keeps steps independent of each other. A split document's pieces
// are sequences of their own: once its first piece is in a step, the others follow in
// order, and those that do not fit open the next step (in either order), as a training
// pipeline carries the rest of a cut document into the next batch.
Batch BatchSampler::next() {
  Batch batch;
  batch.step = step_++;
  const Tokens limit_tokens = document_limit_tokens(options_);
  const bool sequential = options_.order == SamplingOrder::sequential;
  const auto consume = [&] {
    if (sequential) cursor_ = (cursor_ + 1) % dataset_.documents();
  };
  Tokens total_tokens = 0;
  std::int64_t consecutive_drops = 0;
  std::int64_t draws = 0;
  while (!options_.batch_size ||
         static_cast<std::int64_t>(batch.lengths_tokens.size()) < *options_.batch_size) {
    if (++draws > kMaxDrawsPerStep) {
      throw InputError(fmt::format(
          "step {}: drew {} documents of '{}' without filling the batch (kept {}, dropped {} so "
          "far): most documents are longer than {}; raise it or lower the token budget",
          batch.step, kMaxDrawsPerStep, dataset_.name, batch.lengths_tokens.size(),
          stats_.dropped_documents, binding_limit_flag(options_)));
    }
    if (static_cast<std::int64_t>(batch.lengths_tokens.size()) >= kMaxBatchSequences) {
      throw InputError(fmt::format(
          "step {}: the batch would hold more than {} sequences; lower {} or "
          "{}, or raise {}",
          batch.step, kMaxBatchSequences, setting_name("--tokens-per-step"),
          setting_name("--batch-size"), setting_name("--max-context")));
    }
    const bool from_pending = pending_tokens_ > 0;
    Tokens length = from_pending ? std::min(pending_tokens_, limit_tokens) : draw_document_tokens();
    bool truncated = false;
    Tokens rest_tokens = 0;  // a split document's tokens after its first piece
    if (!from_pending && length > limit_tokens) {
      switch (options_.over_context) {
        case OverContextPolicy::split:
          rest_tokens = length - limit_tokens;
          length = limit_tokens;
          break;
        case OverContextPolicy::drop:
          ++stats_.dropped_documents;
          stats_.dropped_tokens += length;
          consume();
          if (++consecutive_drops >= kMaxConsecutiveDrops) {
            throw InputError(fmt::format(
                "step {}: {} documents of '{}' in a row were longer than {} and dropped; "
                "raise the limit or pass {} split",
                batch.step, kMaxConsecutiveDrops, dataset_.name, binding_limit_flag(options_),
                setting_name("--over-context")));
          }
          continue;
        case OverContextPolicy::truncate:
          stats_.truncated_tokens += length - limit_tokens;
          length = limit_tokens;
          truncated = true;
          break;
        case OverContextPolicy::error:
          throw InputError(fmt::format(
              "step {}: {} has {} tokens, more than {}; raise it or pass {} split "
              "(or drop, or truncate)",
              batch.step, describe_document(dataset_, cursor_), length,
              binding_limit_flag(options_), setting_name("--over-context")));
      }
    }
    // Never true for the first sequence of a step: length <= limit_tokens <= tokens_per_step.
    // A pending piece stays pending and opens the next step; a fresh draw that does not fit
    // is handled as above (a split document then keeps none of its pieces).
    if (options_.tokens_per_step && total_tokens + length > *options_.tokens_per_step) break;
    if (from_pending) {
      pending_tokens_ -= length;
    } else {
      consume();
      if (rest_tokens > 0) {
        ++stats_.split_documents;
        stats_.split_pieces += 1 + (rest_tokens + limit_tokens - 1) / limit_tokens;
        pending_tokens_ = rest_tokens;
      }
    }
    consecutive_drops = 0;
    if (truncated) ++stats_.truncated_documents;
    total_tokens += length;
    batch.lengths_tokens.push_back(length);
  }
  // --batch-size documents of up to 2^31 tokens can still exceed kMaxBatchTokens.
  if (total_tokens > kMaxBatchTokens) {
    throw InputError(fmt::format(
        "step {}: the batch holds {} tokens, over ballast's limit of 2^40 = {} tokens per "
        "batch; lower {} or {}",
        batch.step, total_tokens, kMaxBatchTokens, setting_name("--batch-size"),
        setting_name("--max-context")));
  }
  return batch;
}

std::string over_context_warning(const SamplerOptions& options, const SamplerStats& stats) {
  const std::string limit = binding_limit_flag(options);
  std::vector<std::string> parts;
  if (stats.dropped_documents > 0) {
    parts.push_back(fmt::format("{} documents longer than {} were dropped ({} tokens lost; "
                                "--over-context split keeps them as pieces)",
                                with_thousands(stats.dropped_documents), limit,
                                with_thousands(stats.dropped_tokens)));
  }
  if (stats.truncated_documents > 0) {
    parts.push_back(fmt::format("{} documents longer than {} were truncated ({} tokens lost; "
                                "--over-context split keeps them as pieces)",
                                with_thousands(stats.truncated_documents), limit,
                                with_thousands(stats.truncated_tokens)));
  }
  if (stats.split_documents > 0) {
    parts.push_back(fmt::format("{} documents longer than {} were split into {} pieces of at "
                                "most {} tokens (--over-context split; drop or truncate to "
                                "change)",
                                with_thousands(stats.split_documents), limit,
                                with_thousands(stats.split_pieces),
                                with_thousands(document_limit_tokens(options))));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace ballast
