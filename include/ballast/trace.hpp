// Trace: one schema for predicted (simulator) and measured (`ballast run`) timelines, and
// its writers: Chrome trace-event JSON for ui.perfetto.dev, and a compact JSON form that
// MPI ranks exchange.
#pragma once

#include <iosfwd>
#include <span>
#include <string>
#include <vector>

#include "ballast/units.hpp"

namespace ballast {

/// The lanes of a rank's timeline, in display order.
inline constexpr const char* kTraceLanes[] = {"compute", "send", "recv", "collective"};
/// Position of `lane` in kTraceLanes; unknown lanes sort with "collective".
int trace_lane_index(const std::string& lane);

/// What an interval serves (TraceEvent::category), for plots and for comparing predicted
/// with measured time per category. Attention groups use group_category() (plan.hpp):
/// "local", "ring intra-node", "ring inter-node", "ulysses intra-node", ... .
namespace trace_category {
inline constexpr const char* kLinear = "linear";
inline constexpr const char* kOverhead = "overhead";
inline constexpr const char* kRemap = "remap";
inline constexpr const char* kGradientSync = "gradient sync";
/// Tensor-parallel all-gathers and reduce-scatters of the linear modules (--tp).
inline constexpr const char* kTensorParallel = "tensor parallel";
/// An MoE model's expert-parallel all-to-alls (dispatch and combine of routed tokens).
inline constexpr const char* kExpertParallel = "expert parallel";
}  // namespace trace_category

/// One interval of a rank's timeline (simulated or measured).
struct TraceEvent {
  int rank = 0;
  std::string lane;  ///< one of kTraceLanes
  std::string name;  ///< e.g. "attention fwd ring g3 step 2", "all-to-all qkv"
  int micro_batch = -1;  ///< -1 for per-step work (gradient sync)
  Seconds start_s = 0;   ///< from the start of the step
  Seconds duration_s = 0;
  /// What the interval serves (trace_category, group_category()); "" where unknown. The
  /// explicit initializer keeps positional {rank, lane, ...} initializations warning-free.
  std::string category{};
};

/// Chrome trace-event JSON (open in ui.perfetto.dev): one process per rank named "rank r
/// (node n)", one thread per lane, times in microseconds, the category in args. With
/// tensor_parallel N > 1 a rank is a TP group: "TP group r (GPUs rN-rN+N-1, node n)".
void write_chrome_trace(std::span<const TraceEvent> events, int ranks, int gpus_per_node,
                        std::ostream& out, int tensor_parallel = 1);

/// One labelled timeline of a run ("measured", "predicted").
struct TraceTimeline {
  std::string label;
  std::span<const TraceEvent> events;
};
/// Several timelines of the same ranks in one Chrome trace: timeline t's rank r is process
/// t * ranks + r named "<label> rank r (node n)", so the timelines sit one above the other
/// (ui.perfetto.dev) and a person sees where they part.
void write_chrome_trace(std::span<const TraceTimeline> timelines, int ranks, int gpus_per_node,
                        std::ostream& out, int tensor_parallel = 1);

/// Events as compact JSON text and back (what ranks send to rank 0); throws InputError on
/// text that is not such a list.
std::string trace_events_to_json(std::span<const TraceEvent> events);
std::vector<TraceEvent> trace_events_from_json(const std::string& text);

}  // namespace ballast
