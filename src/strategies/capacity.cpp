// Per-scheme usable tokens per rank (solved from validate()'s memory check) and the
// choice and validation of static SP/CP degrees.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "ballast/error.hpp"
#include "ballast/tensor_parallel.hpp"
#include "builders.hpp"

namespace ballast::strategies {

Scheme scheme_at_degree(Scheme scheme, int degree) { return degree == 1 ? Scheme::local : scheme; }

Tokens usable_tokens_per_rank(const CostModel& cost, Scheme scheme, int degree) {
  // Throws InputError naming cluster and model when not even one token fits.
  const Tokens local_tokens = cost.token_capacity_per_rank();
  const Bytes free_bytes = cost.memory_limit_bytes() - cost.model_state_bytes_per_rank();
  const Bytes activation_bytes = cost.activation_bytes_per_token();
  const Scheme effective = scheme_at_degree(scheme, degree);
  if (effective == Scheme::local) return local_tokens;
  // plan.hpp's one-layer attention buffer per token a member holds when every member of
  // the group holds the same count (one token each).
  const Bytes transient_bytes_per_token =
      attention_buffer_bytes(cost.model(), cost.cluster().tensor_parallel.gpus, effective,
                             degree, 1, degree);
  return free_bytes / (activation_bytes + transient_bytes_per_token);
}

Tokens footprint_tokens(Tokens length_tokens, Scheme scheme, int degree) {
  const Scheme effective = scheme_at_degree(scheme, degree);
  if (effective == Scheme::ring || effective == Scheme::all_gather) {
    return zigzag_padded_length(length_tokens, degree);
  }
  return length_tokens;
}

namespace {

/// The longest sequence one group of `degree` ranks holds.
Tokens max_sequence_tokens_at(const CostModel& cost, Scheme scheme, int degree) {
  const Tokens group_tokens = degree * usable_tokens_per_rank(cost, scheme, degree);
  const Scheme effective = scheme_at_degree(scheme, degree);
  if (effective == Scheme::ring || effective == Scheme::all_gather) {
    return group_tokens / (2 * degree) * (2 * degree);  // padding rounds up to 2 * degree
  }
  return group_tokens;
}

/// Id of the longest sequence (ties: lowest id).
std::int64_t longest_sequence_id(const Batch& batch) {
  const auto& lengths = batch.lengths_tokens;
  BALLAST_CHECK(!lengths.empty(), "the batch must not be empty");
  return std::max_element(lengths.begin(), lengths.end()) - lengths.begin();
}

std::string join_ints(const std::vector<int>& values) {
  return fmt::format("{}", fmt::join(values, ", "));
}

/// What the baselines' Ulysses degree must divide: the KV heads per TP group's GPU
/// (ulysses_kv_heads; they do not replicate KV heads).
int ulysses_head_limit(const CostModel& cost) {
  return ulysses_kv_heads(cost.model(), cost.cluster());
}

/// "the model's 8 KV heads" (with TP: "... at --tp 2, so degree x 2 must divide 8").
std::string kv_heads_text(const CostModel& cost) {
  const int tp = cost.cluster().tensor_parallel.gpus;
  const int kv_heads = cost.model().kv_heads;
  if (tp == 1) return fmt::format("the model's {} KV heads", kv_heads);
  return fmt::format("the model's {} KV heads at {} {} (degree x {} must divide {})", kv_heads,
                     setting_name("--tp"), tp, tp, kv_heads);
}

/// Why no larger degree exists, for the PlanningError message.
std::string degree_limit_reason(const CostModel& cost, Scheme scheme, int largest_degree) {
  const int ranks = cost.cluster().ranks();
  if (scheme == Scheme::ulysses && ulysses_head_limit(cost) % (2 * largest_degree) != 0 &&
      ranks % (2 * largest_degree) == 0) {
    return fmt::format("Ulysses degree is limited to {} by {}", largest_degree,
                       kv_heads_text(cost));
  }
  return fmt::format("{} is the largest power-of-two degree dividing the {} ranks", largest_degree,
                     ranks);
}

/// `shorten`: what makes the sequences shorter (shorter_sequences_advice(), or lowering the
/// run's context where the context, not a sequence, is too long).
std::string what_to_do(Scheme scheme, const std::string& shorten = shorter_sequences_advice()) {
  if (scheme == Scheme::ulysses) {
    return fmt::format("use a strategy that splits further (static-cp, hybrid-dp), {} or add {}",
                       shorten, setting_name("--nodes"));
  }
  return fmt::format("{} or add {}", shorten, setting_name("--nodes"));
}

/// Divisors of the rank count (ulysses: also of the KV heads per TP GPU), ascending.
std::vector<int> valid_override_degrees(const CostModel& cost, Scheme scheme) {
  const int ranks = cost.cluster().ranks();
  const int limit = scheme == Scheme::ulysses ? std::gcd(ranks, ulysses_head_limit(cost)) : ranks;
  std::vector<int> degrees;
  for (int d = 1; d <= limit; ++d) {
    if (limit % d == 0) degrees.push_back(d);
  }
  return degrees;
}

void check_override_valid(int degree, const CostModel& cost, Scheme scheme,
                          const std::string& strategy) {
  const std::vector<int> valid = valid_override_degrees(cost, scheme);
  if (std::find(valid.begin(), valid.end(), degree) != valid.end()) return;
  const std::string heads = scheme == Scheme::ulysses ? " and " + kv_heads_text(cost) : "";
  throw InputError(
      fmt::format("{} {} is not valid for {}: it must divide the {} ranks{}; "
                  "valid values: {}",
                  setting_name("--degree"), degree, strategy, cost.cluster().ranks(), heads,
                  join_ints(valid)));
}

}  // namespace

std::vector<int> allowed_degrees(const CostModel& cost, Scheme scheme) {
  const int ranks = cost.cluster().ranks();
  std::vector<int> degrees;
  for (int d = 1; d <= ranks && ranks % d == 0; d *= 2) {
    if (scheme == Scheme::ulysses && ulysses_head_limit(cost) % d != 0) break;
    degrees.push_back(d);
  }
  return degrees;
}

bool fits_group(Tokens length_tokens, const CostModel& cost, Scheme scheme, int degree) {
  return length_tokens <= max_sequence_tokens_at(cost, scheme, degree);
}

Tokens max_sequence_tokens(const CostModel& cost, Scheme scheme) {
  Tokens longest = 0;
  for (int d : allowed_degrees(cost, scheme)) {
    longest = std::max(longest, max_sequence_tokens_at(cost, scheme, d));
  }
  return longest;
}

Tokens longest_sequence_tokens_at_degree(const CostModel& cost, const PlannerOptions& options,
                                         Scheme scheme, const std::string& strategy) {
  if (!options.degree) return max_sequence_tokens(cost, scheme);
  check_override_valid(*options.degree, cost, scheme, strategy);
  return max_sequence_tokens_at(cost, scheme, *options.degree);
}
int default_degree(const Batch& batch, const CostModel& cost, Scheme scheme,
                   const std::string& strategy) {
  const std::int64_t id = longest_sequence_id(batch);
  const Tokens length = batch.lengths_tokens[static_cast<std::size_t>(id)];
  const std::vector<int> degrees = allowed_degrees(cost, scheme);
  for (int d : degrees) {
    if (fits_group(length, cost, scheme, d)) return d;
  }
  const int largest = degrees.back();
  throw PlanningError(fmt::format(
      "{} cannot run sequence {} ({} tokens): degree {} groups hold {} tokens and {}; {}", strategy,
      id, with_thousands(length), largest,
      with_thousands(max_sequence_tokens_at(cost, scheme, largest)),
      degree_limit_reason(cost, scheme, largest), what_to_do(scheme)));
}

PlannerParameter degree_parameter() {
  return {"degree", "a fixed SP/CP degree dividing the GPU count (as --degree), or per-step: "
                    "the smallest power of two holding each step's longest sequence [default: "
                    "the smallest power of two whose groups hold the run's context "
                    "(--max-context), for every step]"};
}

int resolve_degree(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
                   Scheme scheme, const std::string& strategy) {
  if (!options.degree) return default_degree(batch, cost, scheme, strategy);
  const int degree = *options.degree;
  check_override_valid(degree, cost, scheme, strategy);
  const std::int64_t id = longest_sequence_id(batch);
  const Tokens length = batch.lengths_tokens[static_cast<std::size_t>(id)];
  if (fits_group(length, cost, scheme, degree)) return degree;
  std::vector<int> fitting;
  for (int d : valid_override_degrees(cost, scheme)) {
    if (fits_group(length, cost, scheme, d)) fitting.push_back(d);
  }
  const std::string fix = fitting.empty() ? "no valid degree holds it; " + what_to_do(scheme)
                                          : fmt::format("use {} {} (or any of: {})",
                                                        setting_name("--degree"), fitting.front(),
                                                        join_ints(fitting));
  throw PlanningError(fmt::format(
      "{} cannot run sequence {} ({} tokens) at {} {}: degree-{} groups hold {} tokens; {}",
      strategy, id, with_thousands(length), setting_name("--degree"), degree, degree,
      with_thousands(max_sequence_tokens_at(cost, scheme, degree)), fix));
}

// ---- the static strategies' degree for a run (static_degree and its helpers) ----

int context_degree(Tokens context_tokens, const CostModel& cost, Scheme scheme,
                   const std::string& strategy) {
  const std::vector<int> degrees = allowed_degrees(cost, scheme);
  for (int d : degrees) {
    if (fits_group(context_tokens, cost, scheme, d)) return d;
  }
  const int largest = degrees.back();
  throw InputError(fmt::format(
      "{} cannot hold the run's context of {} tokens ({}): degree-{} groups hold {} tokens and "
      "{}; {}, or give {}:degree={} (each step sized for its own longest sequence)",
      strategy, with_thousands(context_tokens), setting_name("--max-context"), largest,
      with_thousands(max_sequence_tokens_at(cost, scheme, largest)),
      degree_limit_reason(cost, scheme, largest),
      what_to_do(scheme, fmt::format("lower {}", setting_name("--max-context"))), strategy, kDegreePerStep));
}

int static_degree(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
                  Scheme scheme, const std::string& strategy) {
  if (options.degree || options.degree_per_step || !options.context_tokens) {
    return resolve_degree(batch, cost, options, scheme, strategy);
  }
  const Tokens context_tokens = *options.context_tokens;
  const int degree = context_degree(context_tokens, cost, scheme, strategy);
  const std::int64_t id = longest_sequence_id(batch);
  const Tokens length = batch.lengths_tokens[static_cast<std::size_t>(id)];
  if (fits_group(length, cost, scheme, degree)) return degree;
  throw PlanningError(fmt::format(
      "{} cannot run sequence {} ({} tokens): it is longer than the run's context ({} {}), "
      "whose degree-{} groups hold {} tokens; raise {} to at least {}",
      strategy, id, with_thousands(length), setting_name("--max-context"),
      with_thousands(context_tokens), degree,
      with_thousands(max_sequence_tokens_at(cost, scheme, degree)), setting_name("--max-context"),
      length));
}

Tokens static_longest_sequence_tokens(const CostModel& cost, const PlannerOptions& options,
                                      Scheme scheme, const std::string& strategy) {
  if (options.degree || options.degree_per_step || !options.context_tokens) {
    return longest_sequence_tokens_at_degree(cost, options, scheme, strategy);
  }
  const int degree = context_degree(*options.context_tokens, cost, scheme, strategy);
  return max_sequence_tokens_at(cost, scheme, degree);
}

}  // namespace ballast::strategies
