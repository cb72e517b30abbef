// The ballast search's memory of the candidates it has simulated (ballast.hpp,
// RememberingEvaluator): a digest of a plan's micro-batches and the evaluator that answers
// a repeated evaluate_below from it.
#include <algorithm>
#include <cstdint>

#include "ballast.hpp"

namespace ballast::strategies::ballast_search {

namespace {

/// Two 64-bit mixes of a stream of integers: FNV-1a's step over each value as one 64-bit
/// word (xor, multiply by the FNV prime; byte by byte it cost 8 multiplies a value, 2% of
/// the planning at 64 GPUs / 512 sequences), and a multiply-xorshift (splitmix64's
/// finalizer) of the running sum.
class Digester {
 public:
  void add(std::int64_t value) {
    const auto bits = static_cast<std::uint64_t>(value);
    first_ = (first_ ^ bits) * 0x100000001b3ULL;
    std::uint64_t mixed = second_ + bits + 0x9e3779b97f4a7c15ULL;
    mixed = (mixed ^ (mixed >> 30)) * 0xbf58476d1ce4e5b9ULL;
    mixed = (mixed ^ (mixed >> 27)) * 0x94d049bb133111ebULL;
    second_ = mixed ^ (mixed >> 31);
  }
  PlanDigest digest() const { return {first_, second_}; }

 private:
  std::uint64_t first_ = 0xcbf29ce484222325ULL;
  std::uint64_t second_ = 0;
};

}  // namespace

PlanDigest digest_of(const std::vector<MicroBatch>& micro_batches) {
  Digester digester;
  // Each list's length first, so no two different plans give the same stream.
  digester.add(static_cast<std::int64_t>(micro_batches.size()));
  for (const MicroBatch& micro_batch : micro_batches) {
    digester.add(static_cast<std::int64_t>(micro_batch.groups.size()));
    for (const AttentionGroup& group : micro_batch.groups) {
      digester.add(static_cast<std::int64_t>(group.scheme));
      digester.add(group.routing_proxies);
      digester.add(group.routing_chunks);
      digester.add(group.ulysses_degree);
      digester.add(static_cast<std::int64_t>(group.ranks.size()));
      for (int rank : group.ranks) digester.add(rank);
      digester.add(static_cast<std::int64_t>(group.sequences.size()));
      for (const SequenceChunks& sequence : group.sequences) {
        digester.add(sequence.sequence_id);
        digester.add(sequence.padded_length_tokens);
        digester.add(static_cast<std::int64_t>(sequence.chunks.size()));
        for (const Chunk& chunk : sequence.chunks) {
          digester.add(chunk.rank);
          digester.add(chunk.begin_tokens);
          digester.add(chunk.end_tokens);
        }
      }
    }
    digester.add(static_cast<std::int64_t>(micro_batch.queues.size()));
    for (const std::vector<int>& queue : micro_batch.queues) {
      digester.add(static_cast<std::int64_t>(queue.size()));
      for (int group : queue) digester.add(group);
    }
    digester.add(static_cast<std::int64_t>(micro_batch.linear_layout.size()));
    for (const LinearSlice& slice : micro_batch.linear_layout) {
      digester.add(slice.rank);
      digester.add(slice.sequence_id);
      digester.add(slice.begin_tokens);
      digester.add(slice.end_tokens);
    }
  }
  return digester.digest();
}

PlanEvaluation RememberingEvaluator::evaluate_below(const Plan& plan, Seconds bound_s) const {
  const PlanDigest digest = digest_of(plan.micro_batches);
  const auto known = std::find_if(entries_.begin(), entries_.end(),
                                  [&](const Entry& entry) { return entry.digest == digest; });
  if (known != entries_.end() &&
      (known->evaluation.step_time_s < known->bound_s || known->evaluation.step_time_s >= bound_s)) {
    ++remembered_;
    return known->evaluation;
  }
  ++passed_;
  PlanEvaluation evaluation = inner_.evaluate_below(plan, bound_s);
  if (known != entries_.end()) {
    *known = {digest, bound_s, evaluation};  // simulated under a higher bound than before
  } else {
    entries_.push_back({digest, bound_s, evaluation});
  }
  return evaluation;
}

}  // namespace ballast::strategies::ballast_search
