// Internal to ballast_plan: the per-rank memory breakdown behind peak_memory_bytes_per_rank()
// and the queue checks, shared with validate() (whose messages name their terms).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ballast/plan.hpp"

namespace ballast::plan_detail {

/// Where and why a rank reaches its peak memory.
struct RankPeak {
  Bytes peak_bytes = 0;          ///< model states + activation + transient at the peak
  int micro_batch = -1;          ///< micro-batch of the peak; -1 when the rank holds nothing
  Tokens activation_tokens = 0;  ///< max(attention tokens, linear tokens) at the peak
  Bytes transient_bytes = 0;     ///< the largest one-layer attention buffer at the peak
};

/// One entry per rank of plan.cluster; chunks and slices on out-of-range ranks are ignored.
std::vector<RankPeak> rank_peaks(const Plan& plan, const CostModel& cost);

/// The queue invariants of validate() (docs/plan-format.md); the first violation, if any.
/// Assumes group ranks are in range (checked before).
std::optional<std::string> check_queues(const Plan& plan);

/// Every group's index in `micro_batch` for each rank, ascending (the default queues).
std::vector<std::vector<int>> default_queues(const MicroBatch& micro_batch, int ranks);

}  // namespace ballast::plan_detail
