// run_step (step.hpp): one training step of a plan over MPI, what this rank measured, and
// the gathers of every rank's measurements and timeline to rank 0.
#include "ballast/runtime/step.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>
#include <string>

#include "ballast/error.hpp"
#include "ballast/runtime/expert_parallel.hpp"
#include "ballast/runtime/mpi.hpp"
#include "ballast/runtime/plan_engine.hpp"
#include "ballast/runtime/tensor_parallel.hpp"

namespace ballast::runtime {

namespace {

/// The linear modules' intervals of a micro-batch on this rank: [start, end) minus the
/// engine's attention calls and the TP and EP collectives (what forward_backward computes
/// between them); `excluded` is sorted by start and its intervals do not overlap.
void add_linear_events(int rank, int micro_batch, double start_s, double end_s,
                       const std::vector<WallInterval>& excluded,
                       double origin_s, std::vector<TraceEvent>& events) {
  double from = start_s;
  const auto add = [&](double to) {
    if (to > from) {
      events.push_back({rank, "compute", "linear", micro_batch, from - origin_s, to - from,
                        trace_category::kLinear});
    }
  };
  for (const auto& call : excluded) {
    add(call.start_s);
    from = call.start_s + call.duration_s;
  }
  add(end_s);
}

/// Two lists of intervals sorted by start, merged.
std::vector<WallInterval> merged(const std::vector<WallInterval>& a, const std::vector<WallInterval>& b) {
  std::vector<WallInterval> all;
  all.reserve(a.size() + b.size());
  std::merge(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(all),
             [](const WallInterval& x, const WallInterval& y) { return x.start_s < y.start_s; });
  return all;
}

}  // namespace

StepResult run_step(const Plan& plan, const ModelConfig& model, const Parameters& parameters,
                    const std::vector<std::vector<std::int32_t>>& documents, MPI_Comm comm,
                    const StepOptions& options) {
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  // Under N-way TP every member runs the plan's attention with its own heads over the
  // ranks of its member index, and the linears with its TP group (tensor_parallel.hpp).
  const TensorParallelComms comms(comm, plan.cluster.ranks(), plan.cluster.tensor_parallel.gpus);
  // An MoE model's EP groups: consecutive plan ranks (expert_parallel.hpp).
  if (options.expert_parallel > 1 && comms.tensor_parallel() > 1) {
    throw InputError(fmt::format("expert parallelism {} with tensor parallelism {}: the runtime runs an MoE "
                                 "model without TP; use tensor parallelism 1",
                                 options.expert_parallel, comms.tensor_parallel()));
  }
  check_expert_parallel(model, options.expert_parallel);
  const ExpertParallelComm expert_comm(comms.plan(), options.expert_parallel);
  std::vector<bool> expert_same_node;
  for (int m = 0; m < options.expert_parallel; ++m) {
    expert_same_node.push_back(plan.cluster.same_node(comms.plan_rank(), expert_comm.first_rank() + m));
  }
  // A corrupting fault runs the step and spoils this rank's gradients before the sync.
  const bool corrupt = options.fault != nullptr && options.fault->action == FaultInjection::Action::corrupt;
  const FaultInjection* fault = corrupt ? nullptr : options.fault;
  if (fault != nullptr && fault->phase == FaultInjection::Phase::step_start) {
    trigger_fault(*fault, "at the start of the step");
  }
  check_mpi(MPI_Barrier(comm), "MPI_Barrier");
  const double wall_start = MPI_Wtime();
  const double cpu_start = thread_cpu_s();
  StepResult result;
  result.gradients.assign(parameters.values.size(), 0.0f);
  RankMeasurement& mine = result.measurement;
  double wait_cpu_s = 0;
  const auto add_stats = [&](const CommunicationStats& stats) {
    mine.wait_s += stats.wait_s;
    wait_cpu_s += stats.wait_cpu_s;
    mine.intra_node_bytes += stats.intra_node_bytes_sent;
    mine.inter_node_bytes += stats.inter_node_bytes_sent;
  };
  for (std::size_t m = 0; m < plan.micro_batches.size(); ++m) {
    const int micro_batch = static_cast<int>(m);
    PlanAttentionEngine engine(plan, micro_batch, comms.plan());
    std::optional<MpiTensorParallelGroup> group;
    if (comms.group() != MPI_COMM_NULL) group.emplace(comms.group());
    std::optional<MpiExpertParallelGroup> experts;
    if (expert_comm.group() != MPI_COMM_NULL) experts.emplace(expert_comm.group(), expert_same_node);
    if (options.record_trace) engine.record_trace(wall_start);
    if (fault != nullptr && fault->phase == FaultInjection::Phase::attention && m == 0) {
      engine.set_fault_hook([fault](const char* where) { trigger_fault(*fault, where); });
    }
    const TokenBatch batch = engine.linear_batch(documents);
    const double start_s = MPI_Wtime();
    const StepOutput out = forward_backward(model, parameters, batch, engine, group ? &*group : nullptr,
                                            experts ? &*experts : nullptr);
    const double end_s = MPI_Wtime();
    for (std::size_t x = 0; x < result.gradients.size(); ++x) result.gradients[x] += out.gradients[x];
    result.loss_sum += out.loss_sum;
    result.targets += out.target_count;
    // The per-token ops run on this member's shard (all of the batch without TP).
    mine.tokens += tensor_parallel_shard(batch.size(), comms.tensor_parallel(),
                                         rank % comms.tensor_parallel()).count;
    add_stats(engine.stats());
    if (group) add_stats(group->stats());
    if (experts) add_stats(experts->stats());
    if (options.record_trace) {
      const std::vector<WallInterval> no_calls;
      add_linear_events(rank, micro_batch, start_s, end_s,
                        merged(merged(engine.attention_calls(), group ? group->calls() : no_calls),
                               experts ? experts->calls() : no_calls),
                        wall_start, result.events);
      for (TraceEvent event : engine.events()) {
        event.rank = rank;  // the engine's rank is the plan rank
        result.events.push_back(std::move(event));
      }
      for (const WallInterval& call : group ? group->calls() : no_calls) {
        result.events.push_back({rank, "collective", "wait tensor parallel", micro_batch,
                                 call.start_s - wall_start, call.duration_s,
                                 trace_category::kTensorParallel});
      }
      for (const WallInterval& call : experts ? experts->calls() : no_calls) {
        result.events.push_back({rank, "collective", "wait expert parallel", micro_batch,
                                 call.start_s - wall_start, call.duration_s,
                                 trace_category::kExpertParallel});
      }
    }
  }
  if (corrupt) {
    for (float& gradient : result.gradients) gradient *= 1.0f + kCorruptGradientScale;
  }
  // Gradient sync: the sum over ranks (the caller divides by the step's targets).
  const double sync_start_s = MPI_Wtime(), sync_cpu_s = thread_cpu_s();
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, result.gradients.data(), static_cast<int>(result.gradients.size()),
                          MPI_FLOAT, MPI_SUM, comm), "MPI_Allreduce (gradients)");
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &result.loss_sum, 1, MPI_DOUBLE, MPI_SUM, comm), "MPI_Allreduce (loss)");
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &result.targets, 1, MPI_INT64_T, MPI_SUM, comm),
            "MPI_Allreduce (targets)");
  const double sync_s = MPI_Wtime() - sync_start_s;
  mine.wait_s += sync_s;
  wait_cpu_s += thread_cpu_s() - sync_cpu_s;
  if (options.record_trace) {
    result.events.push_back({rank, "collective", "gradient sync", -1, sync_start_s - wall_start, sync_s,
                             trace_category::kGradientSync});
    std::stable_sort(result.events.begin(), result.events.end(), [](const TraceEvent& a, const TraceEvent& b) {
      return a.start_s < b.start_s;
    });
  }
  mine.busy_s = thread_cpu_s() - cpu_start - wait_cpu_s;
  mine.wall_s = MPI_Wtime() - wall_start;
  return result;
}

std::vector<RankMeasurement> gather_measurements(const RankMeasurement& mine, MPI_Comm comm) {
  int rank = 0, ranks = 1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &ranks), "MPI_Comm_size");
  constexpr int kFields = 6;
  const double values[kFields] = {mine.busy_s, mine.wait_s, mine.wall_s,
                                  static_cast<double>(mine.intra_node_bytes),
                                  static_cast<double>(mine.inter_node_bytes),
                                  static_cast<double>(mine.tokens)};
  std::vector<double> all(rank == 0 ? kFields * static_cast<std::size_t>(ranks) : 0);
  check_mpi(MPI_Gather(values, kFields, MPI_DOUBLE, all.data(), kFields, MPI_DOUBLE, 0, comm),
            "MPI_Gather (measurements)");
  std::vector<RankMeasurement> gathered;
  for (std::size_t at = 0; at < all.size(); at += kFields) {
    const double* v = all.data() + at;
    gathered.push_back({v[0], v[1], v[2], static_cast<std::int64_t>(v[3]), static_cast<std::int64_t>(v[4]),
                        static_cast<std::int64_t>(v[5])});
  }
  return gathered;
}

std::vector<TraceEvent> gather_trace(const std::vector<TraceEvent>& mine, MPI_Comm comm) {
  int rank = 0, ranks = 1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &ranks), "MPI_Comm_size");
  const std::string text = trace_events_to_json(mine);
  if (text.size() > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw InputError(fmt::format("rank {}'s trace of the step is {} bytes, beyond one MPI message; "
                                 "drop --trace or run fewer micro-batches", rank, text.size()));
  }
  const int length = static_cast<int>(text.size());
  std::vector<int> lengths(static_cast<std::size_t>(ranks), 0);
  check_mpi(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm), "MPI_Gather (trace)");
  std::vector<long long> offsets(static_cast<std::size_t>(ranks) + 1, 0);
  std::inclusive_scan(lengths.begin(), lengths.end(), offsets.begin() + 1, std::plus<long long>(), 0LL);
  if (rank == 0 && offsets.back() > std::numeric_limits<int>::max()) {
    throw InputError(fmt::format("the step's trace is {} bytes over all ranks, beyond one MPI message; "
                                 "drop --trace or run fewer micro-batches", offsets.back()));
  }
  std::vector<int> displacements(offsets.begin(), offsets.end() - 1);
  std::string gathered(rank == 0 ? static_cast<std::size_t>(offsets.back()) : 0, '\0');
  check_mpi(MPI_Gatherv(text.data(), length, MPI_CHAR, gathered.data(), lengths.data(), displacements.data(),
                        MPI_CHAR, 0, comm), "MPI_Gatherv (trace)");
  std::vector<TraceEvent> events;
  for (int r = 0; rank == 0 && r < ranks; ++r) {
    const auto from = static_cast<std::size_t>(offsets[static_cast<std::size_t>(r)]);
    const std::vector<TraceEvent> part =
        trace_events_from_json(gathered.substr(from, static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)])));
    events.insert(events.end(), part.begin(), part.end());
  }
  return events;
}

}  // namespace ballast::runtime
