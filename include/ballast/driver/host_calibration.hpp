// Host calibration (`ballast calibrate --host`, and `ballast run` before it plans): measures
// this machine with the runtime's own kernels and MPI, under mpirun with the job's ranks,
// and fits the cluster constants the simulator prices `ballast run`'s plans with:
//   - peak_flops_per_s: OpenBLAS sgemm at square 256 (the best rate the GEMMs reach);
//   - matmul_efficiency: the runtime model's forward + backward of everything but attention
//     (embedding, norms, projections, RoPE, SwiGLU, LM head, loss: forward_backward with an
//     attention engine that computes nothing), per token, over the model's linear FLOPs;
//   - attention curves: the runtime's blocked attention kernel, forward and backward, on
//     whole documents of 64..2048 tokens (fit_attention_curves, as `--attention` does);
//   - links: MPI ping-pong between rank pairs (latency, bandwidth; every pair at once),
//     and all-reduce, all-to-all and all-gather on groups of 2, 4, ... ranks (every
//     group at once), fitted per (op, group size) like nccl-tests rows.
// Every rank measures at the same time, as in a run (ranks share cores and memory
// bandwidth); compute is thread CPU time (what `ballast run` reports as busy), the mean of
// the ranks' medians. docs/fidelity.md ("ballast run") records what it predicts.
#pragma once

#include <string>
#include <vector>

#include <mpi.h>

#include "ballast/cluster.hpp"
#include "ballast/runtime/model.hpp"

namespace ballast::driver {

/// What this process's job looks like, to match a calibration against (HostRecord
/// without the date). Collective over `comm` (rank 0's host and MPI library).
HostRecord current_host(const runtime::ModelConfig& model, MPI_Comm comm);

/// "hidden 64, layers 2, heads 4, kv heads 2, ffn 172, vocab 256, tied": the runtime
/// model's shape as HostRecord::model writes it.
std::string model_shape(const runtime::ModelConfig& model);

/// One measured row of the calibration, for the table `ballast calibrate --host` prints.
struct HostCalibrationRow {
  std::string what;        ///< "sgemm 256", "linear fwd+bwd", "attention fwd", "all_reduce", ...
  std::string size;        ///< tokens, bytes or shape, in words
  double measured_s = 0;
  double fitted_s = 0;     ///< what the calibrated cluster predicts; 0 when not comparable
};

struct HostCalibration {
  Cluster cluster;  ///< one node of `ranks` "GPUs" (the job's ranks), measured_on set
  std::vector<HostCalibrationRow> rows;
  double seconds = 0;  ///< how long the calibration took (wall, rank 0)
};

/// Measures and fits (collective over every rank of `comm`; at least 2 ranks, else
/// InputError). Every rank returns the same cluster (rank 0's fits, broadcast).
HostCalibration calibrate_host(const runtime::ModelConfig& model, MPI_Comm comm);

/// Throws InputError naming `source` when `cluster` was not measured on this host for this
/// job: no measured_on record (a preset or a GPU cluster file), another host, CPU, rank
/// count, BLAS thread count or model shape; the message says how to recalibrate.
void check_host_calibration(const Cluster& cluster, const HostRecord& here,
                            const std::string& source);

/// Where `ballast run` keeps this job's calibration: $BALLAST_CACHE_DIR, else
/// $XDG_CACHE_HOME/ballast, else $HOME/.cache/ballast; the file is named after the host,
/// the rank count, the BLAS threads and the model shape.
std::string host_calibration_cache_path(const HostRecord& here);

/// Pins OpenBLAS to one thread per rank unless the user chose (OPENBLAS_NUM_THREADS): ranks
/// are the emulated GPUs, and BLAS threads of several ranks on shared cores inflate busy
/// time and make repeats differ. Call before any GEMM; returns the sentence reports print.
std::string pin_blas_threads();

/// The median of `values` (the mean of the middle two for an even count); 0 when empty.
double median(std::vector<double> values);

/// Rank 0's `text` on every rank of `comm` (collective).
void broadcast_string(std::string& text, MPI_Comm comm);

/// Writes `cluster` as JSON to `path` atomically (a temporary file renamed into place), so
/// concurrent jobs never read half a file; creates the directory. Throws InputError naming
/// the path when it cannot.
void write_cluster_file(const Cluster& cluster, const std::string& path);

}  // namespace ballast::driver
