// nccl-tests results (CSV or the benchmarks' own text output) and the calibration of a
// cluster's collective constants from them (`ballast calibrate`, docs/cli.md).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "ballast/cluster.hpp"
#include "ballast/collectives.hpp"
#include "ballast/units.hpp"

namespace ballast {

/// One measured size of one nccl-tests run.
struct NcclTestsRow {
  CollectiveOp op = CollectiveOp::all_reduce;
  int gpus = 0;           ///< ranks of the run
  int hosts = 1;          ///< distinct host names among them (1: inside one node)
  Bytes size_bytes = 0;   ///< nccl-tests' "size" (see bus_bandwidth_factor)
  Seconds time_s = 0;     ///< out-of-place time
  std::string source;     ///< "<file>:<line>"
};

/// Reads nccl-tests results from `path`, in either form:
/// - CSV with a header naming the columns op, ngpu, size_bytes and t_us_out (the layout of
///   data/profiles/h200_8gpu_nccl_tests.csv; any other columns are ignored, an optional
///   "hosts" column gives the host count, default 1);
/// - the text all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf and
///   sendrecv_perf print: the op from "# Collective test starting: <op>_perf" (else from the
///   file name), the GPU and host counts from the "#  Rank  N Group ... on <host> ..."
///   lines, the size and the out-of-place time from the columns the "#  size  count  type
///   ... time  algbw  busbw ..." header names. Several runs in one file are read in turn.
/// Lines starting with '#' that are none of these, and lines that neither start with a
/// number nor have a result row's columns (NCCL INFO, warnings), are skipped. Throws
/// InputError naming the file and the line and what was expected, also for a row whose
/// size is over 2^40 bytes or whose time is over an hour, and for a file that is not text
/// (a control character other than whitespace; its bytes are not echoed).
std::vector<NcclTestsRow> read_nccl_tests_file(const std::string& path);
/// The same from text already read; `path` names it in messages and, for text output
/// without a "Collective test starting" line, gives the op.
std::vector<NcclTestsRow> parse_nccl_tests_text(const std::string& text, const std::string& path);

/// One row of a calibration: the measurement and what the calibrated cluster predicts.
struct CalibrationRow {
  NcclTestsRow row;
  bool fitted = false;         ///< false: listed, not used to fit (see note)
  /// Not fitted but held against the cost model: an all_reduce across hosts, predicted by
  /// the gradient sync's formula (all_reduce_link_time_s) on `hosts` nodes of gpus / hosts.
  bool checked = false;
  Seconds predicted_s = 0;     ///< when fitted or checked
  double relative_error = 0;   ///< (predicted - measured) / measured, when fitted or checked
  std::string note;            ///< why a row was not fitted
};

struct Calibration {
  Cluster cluster;                    ///< the base cluster with the fitted constants
  std::vector<CalibrationRow> rows;   ///< every input row, in input order
  double worst_relative_error = 0;    ///< largest |relative_error| over fitted rows
  std::vector<std::string> notes;     ///< one line per group of rows not fitted
};

/// Fits `base`'s collective constants to `rows` (all of them read from `files`, named in
/// the provenance):
/// - all_gather, reduce_scatter, all_reduce, alltoall on 2..gpus_per_node GPUs of one host:
///   fit_collective per (op, gpus) into intra_node_collectives; an op measured here
///   replaces all of the base's entries for it, the other ops keep theirs;
/// - sendrecv inside one host: intra_node_p2p_bw_bytes_per_s and intra_node_latency_s,
///   one fit over all its rows;
/// - sendrecv across hosts: nic_bw_bytes_per_s and inter_node_latency_s (the model of
///   CostModel::p2p_time_s across nodes), one fit over all its rows;
/// - anything else (collectives spanning hosts, runs larger than a node, one GPU) is listed
///   with a note and not fitted.
/// The cluster is named `name` (default "<base>-calibrated"); validated before returning.
Calibration calibrate_cluster(const Cluster& base, std::span<const NcclTestsRow> rows,
                              std::span<const std::string> files, const std::string& name = "");

}  // namespace ballast
