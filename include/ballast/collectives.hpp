// Collective operations inside one node: their names (nccl-tests' spellings), nccl-tests'
// bus-bandwidth factors, and the per-(operation, GPU count) latency and bus bandwidth a
// cluster is calibrated with (docs/cost-model.md "Collectives inside a node").
#pragma once

#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ballast/units.hpp"

namespace ballast {

struct Cluster;

enum class CollectiveOp { all_gather, reduce_scatter, all_reduce, all_to_all, send_recv };

inline constexpr int kCollectiveOpCount = 5;

/// "all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv": the names
/// cluster JSON uses.
std::string_view collective_op_name(CollectiveOp op);
/// Every op, in enum order.
std::span<const CollectiveOp> collective_ops();
/// Accepts the names above and nccl-tests' spellings "alltoall" and "sendrecv"; throws
/// InputError "<where>: unknown collective '...' (did you mean ...?); known: ..." otherwise.
CollectiveOp collective_op_from_name(std::string_view name, const std::string& where);

/// nccl-tests' busbw / algbw for `op` on `gpus` GPUs (doc/PERFORMANCE.md of nccl-tests):
/// all_gather, reduce_scatter, all_to_all (n-1)/n; all_reduce 2(n-1)/n; send_recv 1.
/// With nccl-tests' "size" convention (all_gather: the output buffer; reduce_scatter: the
/// input buffer; all_reduce: the buffer; alltoall: one rank's whole send buffer; sendrecv:
/// one message), size * factor is the bytes each GPU moves over its link.
double bus_bandwidth_factor(CollectiveOp op, int gpus);

/// One operation on `gpus` GPUs of one node: time = latency_s + bytes * factor / bus_bw.
struct CollectiveFit {
  int gpus = 0;
  Seconds latency_s = 0;
  double bus_bw_bytes_per_s = 0;
  bool operator==(const CollectiveFit&) const = default;
};

/// Per operation, its fits sorted by gpus (distinct GPU counts).
using CollectiveFitTable = std::map<CollectiveOp, std::vector<CollectiveFit>>;

/// The constants for `gpus` from fits sorted by gpus: the entry for `gpus` when there is
/// one; between two entries, latency and bus bandwidth interpolated linearly in the GPU
/// count; below the first or above the last entry, that entry's constants. `fits` must
/// not be empty. No allocation: the planners' hot paths call it.
CollectiveFit interpolate_collective_fit(std::span<const CollectiveFit> fits, int gpus);

/// The uncalibrated alpha-beta constants described below (no table lookup).
CollectiveFit alpha_beta_collective_fit(const Cluster& cluster, CollectiveOp op, int gpus);

/// The constants intra_node_collective_time_s uses: from cluster.intra_node_collectives
/// when it has entries for `op`, else the uncalibrated alpha-beta model: bus bandwidth
/// intra_node_bus_bw_bytes_per_s (intra_node_p2p_bw_bytes_per_s for send_recv) and one
/// intra_node_latency_s per ring step (gpus - 1 for all_gather and reduce_scatter,
/// 2 (gpus - 1) for all_reduce, 1 for all_to_all and send_recv).
CollectiveFit intra_node_collective_fit(const Cluster& cluster, CollectiveOp op, int gpus);

/// Time of ONE `op` on `gpus` GPUs of one node moving `bytes` in nccl-tests' size
/// convention (see bus_bandwidth_factor), not multiplied by the model's layers:
/// latency_s + bytes * bus_bandwidth_factor(op, gpus) / bus_bw_bytes_per_s with the
/// constants of intra_node_collective_fit. 0 when gpus <= 1 or bytes <= 0.
Seconds intra_node_collective_time_s(const Cluster& cluster, CollectiveOp op, int gpus,
                                     Bytes bytes);

/// Time of one all-reduce of `bytes` (nccl-tests' size: each rank's buffer) over all the
/// cluster's ranks by the alpha-beta model of the data-parallel gradient sync
/// (docs/cost-model.md, "Gradient sync"): 2 (N-1)/N x bytes over the NVLink bus bandwidth
/// on one node, or over min(NVLink bus bandwidth, NICs per node x NIC bandwidth) across
/// nodes (NCCL's rings leave each node once per NIC channel, so a node sends 2 (N-1)/N of
/// one rank's bytes in all), plus 2 ceil(log2 N) latencies (inter-node across nodes). 0 on
/// one rank or for no bytes. Not the calibrated single-node all_reduce fits
/// (intra_node_collective_time_s has those).
Seconds all_reduce_link_time_s(const Cluster& cluster, double bytes);

/// One measurement of an operation on a fixed GPU count: `bytes` in nccl-tests' size
/// convention and the measured time.
struct CollectiveSample {
  Bytes bytes = 0;
  Seconds time_s = 0;
};

/// Latency and bus bandwidth of `op` on `gpus` GPUs by least squares on the relative
/// error: minimises sum ((a + b w) / t - 1)^2 over the samples, w = bytes * factor, which
/// is linear in (a, b = 1 / bus_bw); a negative latency is clamped to 0 and b refitted.
/// Throws InputError naming `where` when there are fewer than 2 samples with distinct
/// sizes or the fitted bandwidth is not positive.
CollectiveFit fit_collective(CollectiveOp op, int gpus, std::span<const CollectiveSample> samples,
                             const std::string& where);

/// fit_collective on timings from a loaded machine (the host calibration of `ballast run`,
/// where ranks share cores with other work). A smaller message is never really slower than
/// a larger one, so each time is first capped by the fastest time of any larger size (a
/// preempted small measurement would otherwise bend the line down to a negative bandwidth);
/// if the capped times still do not grow with size (the scheduler, not the link, set them
/// all), the bandwidth is the largest size over its time with no latency. Throws only what
/// fit_collective throws for too few sizes or a non-positive time.
CollectiveFit fit_collective_noisy(CollectiveOp op, int gpus, std::vector<CollectiveSample> samples,
                                   const std::string& where);

/// Throws InputError "<source>: cluster field 'intra_node_collectives.<op>[i].<field>' ..."
/// when an entry is impossible: gpus outside [2, kMaxGpusPerNode], a duplicate or unsorted
/// GPU count, a negative latency or a non-positive bandwidth. Entries above gpus_per_node
/// are allowed (a preset reshaped to smaller nodes keeps them); they only shape the
/// interpolation for GPU counts in between.
void validate_collective_fits(const CollectiveFitTable& table, int gpus_per_node,
                              const std::string& source);

/// {"all_gather": [{"gpus": 2, "latency_s": ..., "bus_bw_bytes_per_s": ...}, ...], ...}:
/// ops in enum order, entries in gpus order.
nlohmann::json collective_fits_to_json(const CollectiveFitTable& table);
/// The inverse of collective_fits_to_json; entries are sorted by gpus. Throws InputError
/// naming `source` and the field for an unknown op or key, a missing key or a wrong type
/// (the values themselves are checked by validate_collective_fits).
CollectiveFitTable collective_fits_from_json(const nlohmann::json& json, const std::string& source);

}  // namespace ballast
