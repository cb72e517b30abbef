// Over-context policies of the sampler: split (the default), drop, truncate, error, and
// the warning line the CLI prints when any tokens were dropped or cut.
#include <gtest/gtest.h>

#include "ballast/workload.hpp"
#include "workload/workload_fixtures.hpp"

namespace ballast {
namespace {

TEST(SamplerPolicies, SplitIsTheDefault) {
  EXPECT_EQ(SamplerOptions{}.over_context, OverContextPolicy::split);
}

TEST(SamplerPolicies, SplitCutsLongDocumentsIntoContextLengthPieces) {
  const Dataset dataset = lengths_dataset({10, 250, 20, 300, 40});
  SamplerOptions options = sequential_documents(9);
  options.max_context_tokens = 100;
  BatchSampler sampler(dataset, options);
  // 250 -> 100 + 100 + 50 and 300 -> 3 x 100, in place and in order; no token lost.
  EXPECT_EQ(sampler.next().lengths_tokens,
            (std::vector<Tokens>{10, 100, 100, 50, 20, 100, 100, 100, 40}));
  EXPECT_EQ(sampler.stats().split_documents, 2);
  EXPECT_EQ(sampler.stats().split_pieces, 6);
  EXPECT_EQ(sampler.stats().dropped_documents, 0);
  EXPECT_EQ(sampler.stats().truncated_documents, 0);
}

TEST(SamplerPolicies, SplitPiecesThatDoNotFitOpenTheNextStep) {
  // Token budget 250, context 100: the 330-token document's pieces are 100, 100, 100, 30.
  const Dataset dataset = lengths_dataset({40, 330});
  SamplerOptions options;
  options.tokens_per_step = 250;
  options.max_context_tokens = 100;
  options.order = SamplingOrder::sequential;
  BatchSampler sampler(dataset, options);
  EXPECT_EQ(sampler.next().lengths_tokens, (std::vector<Tokens>{40, 100, 100}));
  EXPECT_EQ(sampler.next().lengths_tokens, (std::vector<Tokens>{100, 30, 40}));
  EXPECT_EQ(sampler.stats().split_documents, 1);
  EXPECT_EQ(sampler.stats().split_pieces, 4);

  // Random order too: a started document's pieces carry over (a fresh draw that does not
  // fit is discarded whole, as without splitting).
  options.order = SamplingOrder::random;
  const Dataset one_long = lengths_dataset({330});
  BatchSampler random(one_long, options);
  EXPECT_EQ(random.next().lengths_tokens, (std::vector<Tokens>{100, 100}));
  EXPECT_EQ(random.next().lengths_tokens, (std::vector<Tokens>{100, 30, 100}));
  EXPECT_EQ(random.next().lengths_tokens, (std::vector<Tokens>{100, 100, 30}));  // 4th: no fit
}

TEST(SamplerPolicies, SplitKeepsEveryTokenOnRandomDraws) {
  // Random order over a long-tailed file, context far below its longest documents: every
  // piece is within the context and the budget, and the pieces of each step plus the
  // ones carried over account for every kept token (nothing is dropped).
  SamplerOptions options;
  options.tokens_per_step = 65'536;
  options.max_context_tokens = 8'192;
  options.seed = 3;
  BatchSampler sampler(bundled("prolong"), options);
  for (int step = 0; step < 30; ++step) {
    const Batch batch = sampler.next();
    EXPECT_LE(batch.total_tokens(), 65'536);
    EXPECT_LE(batch.max_length_tokens(), 8'192);
  }
  EXPECT_GT(sampler.stats().split_documents, 0);
  EXPECT_GT(sampler.stats().split_pieces, 2 * sampler.stats().split_documents);
  EXPECT_EQ(sampler.stats().dropped_documents, 0);
}

TEST(SamplerPolicies, SplitHugeDocumentsInBoundedMemory) {
  // A 2^31-token document at --max-context 1 is two billion pieces: they are produced one
  // at a time, and the batch's sequence limit stops the step with a clear error.
  const Dataset dataset = lengths_dataset({Tokens{1} << 31});
  SamplerOptions options;
  options.tokens_per_step = Tokens{1} << 31;
  options.max_context_tokens = 1;
  BatchSampler sampler(dataset, options);
  EXPECT_CONTAINS(input_error_message([&] { sampler.next(); }), "more than 1000000 sequences");
}

TEST(SamplerPolicies, SplitIsDeterministic) {
  SamplerOptions options;
  options.tokens_per_step = 300'000;
  options.max_context_tokens = 16'384;
  BatchSampler a(bundled("prolong"), options), b(bundled("prolong"), options);
  for (int step = 0; step < 5; ++step) EXPECT_EQ(a.next().lengths_tokens, b.next().lengths_tokens);
}

TEST(SamplerPolicies, SplitAcceptsADatasetOfOnlyLongDocuments) {
  const Dataset dataset = lengths_dataset({500, 600});
  SamplerOptions options = sequential_documents(3);
  options.max_context_tokens = 100;
  BatchSampler sampler(dataset, options);
  EXPECT_EQ(sampler.next().lengths_tokens, (std::vector<Tokens>{100, 100, 100}));
  options.over_context = OverContextPolicy::drop;
  EXPECT_CONTAINS(input_error_message([&] { BatchSampler(dataset, options); }),
                  "pass --over-context split");
}

TEST(SamplerPolicies, WarningLineSaysWhatHappened) {
  const Dataset dataset = lengths_dataset({10, 250, 20, 300, 40});
  SamplerOptions options = sequential_documents(9);
  options.max_context_tokens = 100;
  EXPECT_EQ(over_context_warning(options, SamplerStats{}), "");
  BatchSampler split(dataset, options);
  split.next();
  EXPECT_EQ(over_context_warning(options, split.stats()),
            "2 documents longer than --max-context 100 were split into 6 pieces of at most 100 "
            "tokens (--over-context split; drop or truncate to change)");
  options.over_context = OverContextPolicy::drop;
  options.batch_size = 3;
  BatchSampler dropped(dataset, options);
  dropped.next();
  EXPECT_CONTAINS(over_context_warning(options, dropped.stats()),
                  "2 documents longer than --max-context 100 were dropped (550 tokens lost");
  options.over_context = OverContextPolicy::truncate;
  options.batch_size = 5;
  BatchSampler truncated(dataset, options);
  truncated.next();
  EXPECT_CONTAINS(over_context_warning(options, truncated.stats()),
                  "2 documents longer than --max-context 100 were truncated (350 tokens lost");
}

// ---- sampler: over-context policies -----------------------------------------------------

TEST(SamplerPolicies, Drop) {
  const Dataset dataset = lengths_dataset({10, 500, 20, 30, 600, 40});
  SamplerOptions options = sequential_documents(4);
  options.max_context_tokens = 100;
  options.over_context = OverContextPolicy::drop;
  BatchSampler sampler(dataset, options);
  EXPECT_EQ(sampler.next().lengths_tokens, (std::vector<Tokens>{10, 20, 30, 40}));
  EXPECT_EQ(sampler.stats().dropped_documents, 2);
  EXPECT_EQ(sampler.stats().dropped_tokens, 1'100);
  EXPECT_EQ(sampler.stats().truncated_documents, 0);
}

TEST(SamplerPolicies, Truncate) {
  const Dataset dataset = lengths_dataset({10, 500, 20, 30, 600, 40});
  SamplerOptions options = sequential_documents(6);
  options.max_context_tokens = 100;
  options.over_context = OverContextPolicy::truncate;
  BatchSampler sampler(dataset, options);
  EXPECT_EQ(sampler.next().lengths_tokens, (std::vector<Tokens>{10, 100, 20, 30, 100, 40}));
  EXPECT_EQ(sampler.stats().truncated_documents, 2);
  EXPECT_EQ(sampler.stats().dropped_documents, 0);
}

TEST(SamplerPolicies, TruncateToTokenBudgetCountsOnlyKeptDocuments) {
  SamplerOptions options;
  options.tokens_per_step = 200;
  options.order = SamplingOrder::sequential;
  options.over_context = OverContextPolicy::truncate;
  const Dataset dataset = lengths_dataset({50, 300});
  BatchSampler sampler(dataset, options);
  EXPECT_EQ(sampler.next().lengths_tokens, (std::vector<Tokens>{50}));
  EXPECT_EQ(sampler.stats().truncated_documents, 0);  // 300 overflowed, was not kept
  EXPECT_EQ(sampler.next().lengths_tokens, (std::vector<Tokens>{200}));
  EXPECT_EQ(sampler.stats().truncated_documents, 1);
}

TEST(SamplerPolicies, ErrorNamesTheDocument) {
  const Dataset dataset = lengths_dataset({10, 500, 20});
  SamplerOptions options = sequential_documents(3);
  options.max_context_tokens = 100;
  options.over_context = OverContextPolicy::error;
  BatchSampler sampler(dataset, options);
  const std::string message = input_error_message([&] { sampler.next(); });
  EXPECT_CONTAINS(message,
                  "document 1 of 'test' has 500 tokens, more than --max-context "
                  "100");
  EXPECT_CONTAINS(message, "--over-context split");

  SamplerOptions budget;
  budget.tokens_per_step = 200;
  budget.over_context = OverContextPolicy::error;
  budget.order = SamplingOrder::sequential;
  BatchSampler budget_sampler(dataset, budget);
  EXPECT_CONTAINS(input_error_message([&] { budget_sampler.next(); }),
                  "more than --tokens-per-step 200");
}

TEST(SamplerPolicies, StarvedRandomStepStops) {
  // One document in 10^15 fits the context: the sampler gives up instead of spinning.
  Dataset dataset;
  dataset.name = "skewed";
  dataset.histogram = {{1, 1, 1}, {1'000, 2'000, 1'000'000'000'000'000}};
  SamplerOptions options;
  options.batch_size = 1;
  options.max_context_tokens = 100;
  options.over_context = OverContextPolicy::drop;
  BatchSampler sampler(dataset, options);
  EXPECT_CONTAINS(input_error_message([&] { sampler.next(); }),
                  "documents of 'skewed' in a row were longer than --max-context 100");
}

}  // namespace
}  // namespace ballast
