// run_training (run.hpp): sample, plan (or read plans), execute every micro-batch over
// MPI, all-reduce the gradients, AdamW; measure and optionally check each step.
#include "ballast/runtime/run.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <climits>
#include <fstream>
#include <numeric>

#include "ballast/error.hpp"
#include "ballast/runtime/corpus.hpp"
#include "ballast/runtime/fault.hpp"
#include "ballast/runtime/mpi.hpp"
#include "ballast/runtime/plan_engine.hpp"
#include "ballast/strategy.hpp"

namespace ballast::runtime {

namespace {

/// fp32 activations the runtime's model keeps per token over all layers (its forward
/// saves about this many floats per token and layer: inputs of both norms, q, k, v,
/// attention output, MLP gate/up/activation, residuals), used only for planning memory.
double activation_bytes_per_token(const ModelConfig& model) {
  const double per_layer = 6.0 * model.hidden + 2.0 * model.kv_heads * model.head_dim() +
                           3.0 * model.ffn_hidden;
  return 4.0 * (per_layer * model.layers + 2.0 * model.hidden + model.vocab);
}

/// Throws InputError naming `source` when `plan` cannot run on this job: another rank
/// count, other heads or KV heads than the model (Ulysses members own head ranges, so
/// the plan's groups were sized for its heads), or a micro-batch whose MPI messages would
/// not fit MPI's int element counts. The plan's layers, hidden size and FFN only set its
/// costs and memory, not what runs, so they may differ. Runs on every rank before any
/// communication, so every rank raises the same error and none blocks in MPI.
void check_plan_matches_job(const Plan& plan, const RunOptions& options, int ranks, const std::string& source) {
  if (plan.cluster.ranks() != ranks) {
    throw InputError(fmt::format("{}: the plan is for {} ranks but the job has {}; run with "
                                 "mpirun -np {}", source, plan.cluster.ranks(), ranks,
                                 plan.cluster.ranks()));
  }
  if (plan.model.heads != options.model.heads || plan.model.kv_heads != options.model.kv_heads) {
    throw InputError(fmt::format("{}: the plan is for {} heads / {} KV heads but the model has {} / {}; "
                                 "pass --heads {} --kv-heads {} to match", source,
                                 plan.model.heads, plan.model.kv_heads, options.model.heads,
                                 options.model.kv_heads, plan.model.heads, plan.model.kv_heads));
  }
  // The largest message of a micro-batch (a ring block's [K, V, dK, dV], a Ulysses
  // member's QKV columns, a remap of hidden-wide rows) is at most 4 x hidden floats per
  // token of the micro-batch; MPI counts and displacements are int.
  for (std::size_t m = 0; m < plan.micro_batches.size(); ++m) {
    Tokens tokens = 0;
    for (const AttentionGroup& group : plan.micro_batches[m].groups) {
      for (const SequenceChunks& sequence : group.sequences) tokens += sequence.padded_length_tokens;
    }
    const double floats = 4.0 * static_cast<double>(options.model.hidden) * static_cast<double>(tokens);
    if (floats > INT_MAX) {
      throw InputError(fmt::format("{}: micro-batch {} holds {} tokens; with hidden size {} its MPI "
                                   "messages would reach {:.3g} floats, beyond MPI's int counts ({}); "
                                   "plan fewer tokens per micro-batch or use a smaller --hidden",
                                   source, m, tokens, options.model.hidden, floats, INT_MAX));
    }
  }
}

}  // namespace

Model run_planning_model(const RunOptions& options) {
  const ModelConfig& config = options.model;
  Model model;
  model.name = "runtime";
  model.layers = config.layers;
  model.hidden = config.hidden;
  model.heads = config.heads;
  model.kv_heads = config.kv_heads;
  model.ffn_hidden = config.ffn_hidden;
  model.vocab = config.vocab;
  model.bytes_per_element = 4;
  model.activation_bytes_per_token = activation_bytes_per_token(config);
  const Parameters parameters = init_parameters(config, 0);
  model.parameters = static_cast<double>(parameters.values.size());
  model.provenance = "the runtime's model (ballast run), fp32";
  return model;
}

Cluster run_cluster(const RunOptions& options, int ranks) {
  Cluster cluster = load_cluster("h100", 1);
  const int per_node = std::max(1, std::min(options.gpus_per_node, ranks));
  if (ranks % per_node != 0) {
    throw InputError(fmt::format("--gpus-per-node {} does not divide the job's {} ranks; pick a divisor",
                                 options.gpus_per_node, ranks));
  }
  cluster.name = fmt::format("emulated-{}x{}", ranks / per_node, per_node);
  cluster.gpu_name = "CPU core (one MPI rank)";
  // Calibrated to this runtime on one core (`OPENBLAS_NUM_THREADS=1 build/bench/bench_kernels`,
  // docs/runtime.md): sgemm ~28 GFLOP/s is the peak; the blocked attention reaches ~80% of
  // it on long documents and works in 64-token tiles (64-token documents reach ~9 GFLOP/s);
  // the model's thin GEMMs (hidden 64) run at about half the ceiling (estimate). Links are
  // Open MPI's shared memory between processes of one machine (estimate: ~5 GB/s, 2 us),
  // the same for both classes: the emulated nodes only decide membership.
  cluster.peak_flops_per_s = 28e9;
  cluster.attention_efficiency = 0.8;
  cluster.matmul_efficiency = 0.5;
  cluster.attention_tile_tokens = 64;
  cluster.intra_node_bus_bw_bytes_per_s = 5e9;
  cluster.intra_node_p2p_bw_bytes_per_s = 5e9;
  cluster.nic_bw_bytes_per_s = 5e9;
  cluster.intra_node_latency_s = 2e-6;
  cluster.inter_node_latency_s = 2e-6;
  cluster.gpus_per_node = per_node;
  cluster.nics_per_node = per_node;
  cluster.nodes = ranks / per_node;
  // Memory for rank_tokens tokens of activations plus the model states, at 90% usable.
  const Model model = run_planning_model(options);
  const double states = 16.0 * model.parameters / ranks;  // ZeRO-3: weights, grads, Adam
  cluster.memory_usable_fraction = 0.9;
  cluster.gpu_memory_bytes = static_cast<Bytes>(
      (states + model.activation_bytes_per_token * static_cast<double>(options.rank_tokens)) / 0.9) + 1;
  cluster.provenance = "emulated by ballast run: one MPI rank per GPU";
  return cluster;
}

RunReport run_training(const RunOptions& options, MPI_Comm comm) {
  int rank = 0, ranks = 1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &ranks), "MPI_Comm_size");
  options.model.check();
  if (options.length_scale < 1) throw InputError("--length-scale must be at least 1");
  if (options.rank_tokens < 1) throw InputError("--rank-tokens must be at least 1");
  if (options.plan_path.empty() && options.settings.steps < 1) {
    throw InputError(fmt::format("--steps {} must be at least 1", options.settings.steps));
  }
  // Test-only (fault.hpp): read once, so a step costs one comparison when it is unset.
  const std::optional<FaultInjection> fault = fault_from_environment();

  std::vector<Plan> plans;
  std::unique_ptr<CostModel> cost;
  if (!options.plan_path.empty()) {
    plans = read_plan_file(options.plan_path);
    for (std::size_t i = 0; i < plans.size(); ++i) {
      const std::string source =
          plans.size() == 1 ? options.plan_path : fmt::format("{}[{}]", options.plan_path, i);
      check_plan_matches_job(plans[i], options, ranks, source);
      const auto plan_cost = make_cost_model(plans[i].cost_model, plans[i].cluster, plans[i].model);
      require_valid(plans[i], *plan_cost, source);
    }
  } else {
    cost = make_cost_model(load_cost_model_spec("analytical"), run_cluster(options, ranks),
                           run_planning_model(options));
    const Dataset dataset = load_dataset(options.settings.dataset);
    BatchSampler sampler(dataset, options.settings.sampler);
    const StrategySpec spec = parse_strategy_spec(options.strategy, options.settings.planner);
    for (int step = 0; step < options.settings.steps; ++step) {
      Batch batch = sampler.next();
      for (Tokens& length : batch.lengths_tokens) {
        length = (length + options.length_scale - 1) / options.length_scale;
      }
      batch = make_batch(batch.lengths_tokens, step);
      Plan plan = spec.planner->plan(batch, *cost, spec.options, SimulatorEvaluator(*cost));
      require_valid(plan, *cost, "made by " + options.strategy);
      check_plan_matches_job(plan, options, ranks, fmt::format("step {} planned by {}", step, options.strategy));
      plans.push_back(std::move(plan));
    }
  }

  if (fault && (fault->rank >= ranks || fault->step >= static_cast<int>(plans.size()))) {
    throw InputError(fmt::format("{}={}: the job has ranks 0-{} and steps 0-{}; the fault would never fire",
                                 kFaultVariable, fault->spec, ranks - 1, plans.size() - 1));
  }

  const Corpus corpus = load_corpus(options.corpus);
  Parameters parameters = init_parameters(options.model, options.settings.sampler.seed);
  if (parameters.values.size() > static_cast<std::size_t>(INT_MAX)) {
    throw InputError(fmt::format("the model has {} parameters; the gradient all-reduce is one MPI message "
                                 "with an int count (at most {}); use a smaller --hidden, --layers or --ffn",
                                 parameters.values.size(), INT_MAX));
  }
  AdamWState adam;
  RunReport report;
  report.strategy = options.plan_path.empty() ? options.strategy : plans.front().strategy;
  report.ranks = ranks;
  report.corpus_provenance = corpus.provenance;
  report.gpus_per_node = plans.front().cluster.gpus_per_node;

  for (std::size_t s = 0; s < plans.size(); ++s) {
    const Plan& plan = plans[s];
    const bool fault_now = fault && fault->rank == rank && fault->step == static_cast<int>(s);
    if (fault_now && fault->phase == FaultInjection::Phase::step_start) {
      trigger_fault(*fault, "at the start of the step");
    }
    std::vector<Tokens> lengths(plan.sequence_lengths_tokens.begin(), plan.sequence_lengths_tokens.end());
    const auto documents = cut_documents(corpus, lengths, options.settings.sampler.seed + s);
    check_mpi(MPI_Barrier(comm), "MPI_Barrier");
    const double wall_start = MPI_Wtime();
    const double cpu_start = thread_cpu_s();
    std::vector<float> gradients(parameters.values.size(), 0.0f);
    double loss_sum = 0;
    std::int64_t targets = 0;
    RankMeasurement mine;
    double wait_cpu = 0;
    std::vector<TraceEvent> events;
    for (std::size_t m = 0; m < plan.micro_batches.size(); ++m) {
      PlanAttentionEngine engine(plan, static_cast<int>(m), comm);
      if (fault_now && fault->phase == FaultInjection::Phase::attention && m == 0) {
        engine.set_fault_hook([&fault](const char* where) { trigger_fault(*fault, where); });
      }
      const TokenBatch batch = engine.linear_batch(documents);
      const double start = MPI_Wtime();
      const StepOutput out = forward_backward(options.model, parameters, batch, engine);
      for (std::size_t x = 0; x < gradients.size(); ++x) gradients[x] += out.gradients[x];
      loss_sum += out.loss_sum;
      targets += out.target_count;
      mine.tokens += batch.size();
      const CommunicationStats& stats = engine.stats();
      mine.wait_s += stats.wait_s;
      wait_cpu += stats.wait_cpu_s;
      mine.intra_node_bytes += stats.intra_node_bytes_sent;
      mine.inter_node_bytes += stats.inter_node_bytes_sent;
      if (s == 0) {
        events.push_back({rank, "compute", fmt::format("forward+backward mb {}", m), static_cast<int>(m),
                          start - wall_start, MPI_Wtime() - start});
        for (const auto& wait : stats.waits) {
          events.push_back({rank, "collective", wait.name, static_cast<int>(m), wait.start_s - wall_start,
                            wait.duration_s});
        }
      }
    }
    // Gradient sync: the sum over ranks, then the mean over the step's targets.
    const double sync_start = MPI_Wtime(), sync_cpu = thread_cpu_s();
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, gradients.data(), static_cast<int>(gradients.size()), MPI_FLOAT,
                            MPI_SUM, comm), "MPI_Allreduce (gradients)");
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &loss_sum, 1, MPI_DOUBLE, MPI_SUM, comm), "MPI_Allreduce (loss)");
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &targets, 1, MPI_INT64_T, MPI_SUM, comm), "MPI_Allreduce (targets)");
    mine.wait_s += MPI_Wtime() - sync_start;
    wait_cpu += thread_cpu_s() - sync_cpu;
    if (s == 0) events.push_back({rank, "collective", "gradient sync", -1, sync_start - wall_start, MPI_Wtime() - sync_start});
    mine.busy_s = thread_cpu_s() - cpu_start - wait_cpu;
    mine.wall_s = MPI_Wtime() - wall_start;

    StepReport step;
    step.step = static_cast<int>(plan.step);
    step.micro_batches = static_cast<int>(plan.micro_batches.size());
    step.loss = targets > 0 ? loss_sum / static_cast<double>(targets) : 0.0;
    if (options.check) {
      // Every rank computes the reference (same inputs, same result): no extra messages.
      LocalAttentionEngine local;
      const StepOutput reference = forward_backward(options.model, parameters, pack_documents(documents), local);
      const StepDifference difference = compare_with_reference(parameters, loss_sum, gradients, reference);
      step.max_relative_error = difference.max_relative_error;
      step.worst_tensor = difference.worst;
    }
    // Measurements to rank 0.
    const double values[] = {mine.busy_s, mine.wait_s, mine.wall_s, static_cast<double>(mine.intra_node_bytes),
                             static_cast<double>(mine.inter_node_bytes), static_cast<double>(mine.tokens)};
    std::vector<double> all(rank == 0 ? 6 * static_cast<std::size_t>(ranks) : 0);
    check_mpi(MPI_Gather(values, 6, MPI_DOUBLE, all.data(), 6, MPI_DOUBLE, 0, comm), "MPI_Gather (measurements)");
    if (rank == 0) {
      for (int r = 0; r < ranks; ++r) {
        const double* v = all.data() + 6 * static_cast<std::size_t>(r);
        step.ranks.push_back({v[0], v[1], v[2], static_cast<std::int64_t>(v[3]), static_cast<std::int64_t>(v[4]),
                              static_cast<std::int64_t>(v[5])});
      }
      double busiest = 0, total = 0;
      for (const RankMeasurement& r : step.ranks) {
        busiest = std::max(busiest, r.busy_s);
        total += r.busy_s;
        step.step_wall_s = std::max(step.step_wall_s, r.wall_s);
      }
      step.imbalance = total > 0 ? busiest / (total / ranks) : 1.0;
    }
    if (s == 0) {  // the first step's trace events of every rank to rank 0
      std::string text;
      for (const TraceEvent& e : events) {
        text += fmt::format("{}\t{}\t{}\t{}\t{:.9f}\t{:.9f}\n", e.rank, e.lane, e.name, e.micro_batch, e.start_s, e.duration_s);
      }
      int length = static_cast<int>(text.size());
      std::vector<int> lengths_all(static_cast<std::size_t>(ranks));
      check_mpi(MPI_Gather(&length, 1, MPI_INT, lengths_all.data(), 1, MPI_INT, 0, comm), "MPI_Gather (trace)");
      std::vector<int> displs(static_cast<std::size_t>(ranks), 0);
      std::exclusive_scan(lengths_all.begin(), lengths_all.end(), displs.begin(), 0);
      std::string gathered(rank == 0 ? static_cast<std::size_t>(displs.back() + lengths_all.back()) : 0, '\0');
      check_mpi(MPI_Gatherv(text.data(), length, MPI_CHAR, gathered.data(), lengths_all.data(), displs.data(),
                            MPI_CHAR, 0, comm), "MPI_Gatherv (trace)");
      if (rank == 0) {
        std::size_t begin = 0;
        while (begin < gathered.size()) {
          const std::size_t end = gathered.find('\n', begin);
          std::vector<std::string> fields;
          std::size_t field = begin;
          for (int f = 0; f < 5; ++f) {
            const std::size_t tab = gathered.find('\t', field);
            fields.push_back(gathered.substr(field, tab - field));
            field = tab + 1;
          }
          fields.push_back(gathered.substr(field, end - field));
          report.trace.push_back({std::stoi(fields[0]), fields[1], fields[2], std::stoi(fields[3]),
                                  std::stod(fields[4]), std::stod(fields[5])});
          begin = end + 1;
        }
      }
    }
    // The optimizer step on the mean gradient (identical on every rank).
    if (targets > 0) {
      for (float& g : gradients) g /= static_cast<float>(targets);
    }
    adamw_step(options.adamw, gradients, parameters, adam);
    report.steps.push_back(std::move(step));
  }
  return report;
}

}  // namespace ballast::runtime
