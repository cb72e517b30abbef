// fuzz_lengths: the length-file reader (JSON array, histogram CSV, one length per line,
// detected by content) and the batch sampler on whatever it accepts.
// The reader has no public string entry point, so each input is written to a scratch file
// (in /dev/shm when it exists) and read back with read_lengths_file().
#include <cstdint>
#include <string>

#include "ballast/workload.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace ballast;

/// What read_lengths_file() promises about any dataset it returns.
void check_dataset(const Dataset& dataset) {
  FUZZ_REQUIRE(dataset.lengths_tokens.empty() != dataset.histogram.empty(),
               "exactly one of lengths / histogram must be set");
  for (Tokens length : dataset.lengths_tokens) {
    FUZZ_REQUIRE(length >= 1 && length <= kMaxSequenceTokens, std::to_string(length));
  }
  for (const LengthBin& bin : dataset.histogram) {
    FUZZ_REQUIRE(bin.min_tokens >= 0 && bin.min_tokens <= bin.max_tokens &&
                     bin.max_tokens >= 1 && bin.max_tokens <= kMaxSequenceTokens &&
                     bin.documents >= 0,
                 "bad bin");
  }
  FUZZ_REQUIRE(dataset.documents() > 0, "a dataset without documents was accepted");
  FUZZ_REQUIRE(dataset.max_length_tokens() >= 1, "max length < 1");
  FUZZ_REQUIRE(dataset.mean_length_tokens() > 0, "mean length <= 0");
}

/// Draws one batch under `options` and checks it against the budgets.
void sample_one_batch(const Dataset& dataset, const SamplerOptions& options) {
  try {
    BatchSampler sampler(dataset, options);
    const Batch batch = sampler.next();
    FUZZ_REQUIRE(!batch.lengths_tokens.empty(), "empty batch");
    const Tokens limit = document_limit_tokens(options);
    for (Tokens length : batch.lengths_tokens) {
      FUZZ_REQUIRE(length >= 1 && length <= limit, "length outside [1, limit]");
    }
    if (options.tokens_per_step) {
      FUZZ_REQUIRE(batch.total_tokens() <= *options.tokens_per_step, "over the token budget");
    } else {
      FUZZ_REQUIRE(static_cast<std::int64_t>(batch.lengths_tokens.size()) == *options.batch_size,
                   "batch size differs from the requested one");
    }
    (void)make_batch(batch.lengths_tokens, batch.step);
  } catch (const InputError&) {
    // e.g. every document is over the context limit: a clean rejection for this option set.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return ballast::fuzz::run_one_input([&] {
    const Dataset dataset = [&] {
      const ballast::fuzz::ScratchFile file("lengths", data, size);
      return read_lengths_file(file.path());
    }();
    check_dataset(dataset);

    // A token budget with the drop policy (random order) ...
    SamplerOptions by_tokens;
    by_tokens.tokens_per_step = 65536;
    by_tokens.max_context_tokens = 32768;
    by_tokens.over_context = OverContextPolicy::drop;
    by_tokens.seed = size;
    sample_one_batch(dataset, by_tokens);

    // ... and a document budget with truncation (sequential order where the file has one).
    SamplerOptions by_documents;
    by_documents.batch_size = 8;
    by_documents.max_context_tokens = 131072;
    by_documents.over_context = OverContextPolicy::truncate;
    by_documents.order = dataset.is_histogram() ? SamplingOrder::random : SamplingOrder::sequential;
    by_documents.seed = size * 7919;
    sample_one_batch(dataset, by_documents);
  });
}
