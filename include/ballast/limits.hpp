// Scale limits: the largest inputs ballast accepts, in one place. Each is enforced where
// the input enters (readers, make_batch, the sampler, validate_cluster / load_cluster,
// plan files and plan_from_json, validate(), the planners) with an InputError that names
// the input, the limit and the fix; docs/hardening.md ("Limits") has the table.
#pragma once

#include <cstdint>

namespace ballast {

/// The longest sequence (tokens): 2^31. Keeps every derived count in 64 bits: one
/// sequence's causal pairs are at most 2^61, and 2^31 x any per-token byte count of a
/// real model stays far below 2^63.
inline constexpr std::int64_t kMaxSequenceTokens = std::int64_t{1} << 31;

/// The most sequences in one batch: 10^6, ten times the 10^5-sequence batches that
/// bench_scale plans in seconds; a plan of unsplit sequences costs ~0.3 KB per sequence
/// in memory, ~0.11 KB of JSON text and ~1 KB while that JSON is written.
inline constexpr std::int64_t kMaxBatchSequences = 1'000'000;

/// The most tokens in one batch: 2^40 (1.1 x 10^12), 10^4 times the largest published
/// global batches (~10^8 tokens). Token sums stay below 2^41 and sums times per-token
/// bytes below 2^63; a rank never needs to hold more.
inline constexpr std::int64_t kMaxBatchTokens = std::int64_t{1} << 40;

/// The most steps (global batches) in one command: 10,000, 2,500 times compare's default
/// of 4 and far beyond a study's tens. Every step's batch is sampled and held before
/// planning, so `--steps 100000000` took tens of GB and was killed for memory.
inline constexpr int kMaxSteps = 10'000;

/// The most GPUs (ranks) in a cluster: 65,536 = 2^16, 16 times the 4,096-GPU clusters
/// bench_scale plans; ranks are `int` and per-rank tables are O(ranks) per micro-batch.
inline constexpr int kMaxRanks = 65'536;

/// The most GPUs in one node: 1,024 (NVLink domains are 8 to 72 GPUs today, 576 planned);
/// a node's GPUs are scanned for every intra-node placement.
inline constexpr int kMaxGpusPerNode = 1'024;

/// The most micro-batches in one plan: 65,536. Reached only by batches far beyond what a
/// cluster holds in one step; split such a batch into several steps.
inline constexpr std::int64_t kMaxMicroBatches = 65'536;

/// The most rank-micro-batches (micro-batches x ranks) in one plan: 2^22 = 4.2 million,
/// e.g. 1,024 micro-batches on 4,096 GPUs. The simulator schedules a handful of tasks per
/// rank-micro-batch, ~0.7 KB with their links (measured: 50,000 micro-batches on 8 GPUs
/// simulate in 0.3 GB), so this part of a simulation stays under ~3 GB.
inline constexpr std::int64_t kMaxRankMicroBatches = std::int64_t{1} << 22;

/// The most ring steps in one plan: the sum over its ring groups of size^2, 2^23 = 8.4
/// million. A ring of g GPUs is simulated as g steps of g members (~0.45 KB each: one ring
/// of 1,024 GPUs takes 0.48 GB), so this part stays under ~4 GB; it caps one ring at
/// 2,048 GPUs (a 4,096-GPU ring alone would take ~8 GB).
inline constexpr std::int64_t kMaxRingSteps = std::int64_t{1} << 23;

/// The most attention chunks plus linear slices in one plan: 2^24 = 16.8 million (10^6
/// sequences on rings of 8 GPUs). A chunk is 24 bytes in a Plan and ~110 bytes as parsed
/// JSON, so the largest plan file parses in ~2 GB.
inline constexpr std::int64_t kMaxPlanChunks = std::int64_t{1} << 24;

/// The largest file ballast reads (length files, plans, presets): 1 GiB. Read whole into
/// memory; the largest plan (kMaxPlanChunks chunks) is ~0.4 GB of JSON.
inline constexpr std::int64_t kMaxInputFileBytes = std::int64_t{1} << 30;

/// The most JSON values (numbers, strings, arrays, objects) in one plan file: 2^27. A
/// chunk is 4 values, so the largest plan fits; counted before the document is built, so
/// a 1 GiB file of tiny values (~3 x 10^8) is rejected before it takes ~10 GB to parse.
inline constexpr std::int64_t kMaxPlanJsonValues = std::int64_t{1} << 27;

}  // namespace ballast
