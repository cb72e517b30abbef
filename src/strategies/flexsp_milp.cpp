// FlexSP's MILP per micro-batch (SYSTEMS.md section 2, planner step 3): virtual groups
// (N/d copies of every allowed degree d), solved by CBC's standard branch and cut
// (CbcMain1) single-threaded under a node budget, warm-started with greedy plans.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

// COIN-OR CBC (coinor-libcbc-dev).
#include <CbcModel.hpp>
#include <CbcSolver.hpp>
#include <CoinPackedMatrix.hpp>
#include <OsiClpSolverInterface.hpp>

#include "ballast/error.hpp"
#include "flexsp.hpp"

namespace ballast::strategies::flexsp {

namespace {

/// Model times are in units of (the longest item's time alone in its smallest group) /
/// kReferenceUnits, so makespans are thousands of units whatever the cost model (FlexSP's
/// profiled seconds or a fake model's microseconds). CBC's absolute tolerances (cutoff
/// increment 1e-5 by default, primal feasibility 1e-7) are then a few 1e-9 of the
/// makespan or less, which keeps a proven optimum exact to that precision.
constexpr double kReferenceUnits = 1e4;

/// One copy of one degree: m_p (used) and A_qp (sequences of item q) columns.
struct VirtualGroup {
  std::size_t degree_index = 0;
  int used_column = 0;
  std::vector<std::pair<std::size_t, int>> item_columns;  ///< (item q, column of A_qp)
};

/// The MILP in the column-major arrays CBC loads.
struct MilpModel {
  std::vector<VirtualGroup> groups;  ///< by degree index, copies consecutive
  int makespan_column = 0;           ///< C
  double seconds_per_unit = 1;
  std::vector<double> column_lower, column_upper, objective;
  std::vector<bool> integer;
  std::vector<std::string> column_names;  ///< MIP starts are matched by name
  std::vector<double> row_lower, row_upper;
  std::vector<int> entry_rows, entry_columns;
  std::vector<double> entry_values;

  int add_column(std::string name, double lower, double upper, bool is_integer) {
    column_names.push_back(std::move(name));
    column_lower.push_back(lower);
    column_upper.push_back(upper);
    objective.push_back(0);
    integer.push_back(is_integer);
    return static_cast<int>(column_names.size()) - 1;
  }
  /// A row lower <= sum value * column <= upper.
  void add_row(double lower, double upper, const std::vector<std::pair<int, double>>& terms) {
    const int row = static_cast<int>(row_lower.size());
    row_lower.push_back(lower);
    row_upper.push_back(upper);
    for (const auto& [column, value] : terms) {
      entry_rows.push_back(row);
      entry_columns.push_back(column);
      entry_values.push_back(value);
    }
  }
};

double time_unit_s(const GroupCosts& costs, const Problem& problem) {
  const auto longest =
      std::max_element(problem.lengths_tokens.begin(), problem.lengths_tokens.end());
  const std::size_t k = costs.min_degree_index(*longest);
  const Seconds alone_s = costs.at(k).fixed_s + costs.sequence_s(*longest, k);
  BALLAST_CHECK(alone_s > 0, "a sequence takes time");
  return alone_s / kReferenceUnits;
}

/// Group p's time as row terms, times `scale`: fixed * m_p + sum_q A_qp * t_qk, in units.
std::vector<std::pair<int, double>> load_terms(const MilpModel& model, const GroupCosts& costs,
                                               const Problem& problem, const VirtualGroup& group,
                                               double scale) {
  const double per_unit = scale / model.seconds_per_unit;
  std::vector<std::pair<int, double>> terms = {
      {group.used_column, costs.at(group.degree_index).fixed_s * per_unit}};
  for (const auto& [q, column] : group.item_columns) {
    terms.emplace_back(column,
                       costs.sequence_s(problem.lengths_tokens[q], group.degree_index) * per_unit);
  }
  return terms;
}

/// Columns: C, then per virtual group (degree index ascending, copies consecutive) m_p
/// and A_qp for every item the group can hold.
void add_columns(MilpModel& model, const GroupCosts& costs, const Problem& problem) {
  model.makespan_column = model.add_column("C", 0, COIN_DBL_MAX, false);
  model.objective[static_cast<std::size_t>(model.makespan_column)] = 1;
  for (std::size_t k = 0; k < costs.degree_count(); ++k) {
    const DegreeCost& degree = costs.at(k);
    for (int copy = 0; copy < costs.ranks() / degree.degree; ++copy) {
      VirtualGroup group;
      group.degree_index = k;
      const std::string name = "g" + std::to_string(k) + "_" + std::to_string(copy);
      group.used_column = model.add_column("m" + name, 0, 1, true);
      for (std::size_t q = 0; q < problem.lengths_tokens.size(); ++q) {
        // A_qp * length <= capacity bounds A_qp tighter than the count alone. A degree
        // above the item's minimum can still hold fewer tokens (a Ulysses group needs
        // room for Q, K and V that a local one does not), so some get no column at all.
        const Tokens fit = degree.capacity_tokens / problem.lengths_tokens[q];
        if (costs.min_degree_index(problem.lengths_tokens[q]) > k || fit == 0) continue;
        const auto upper = static_cast<double>(std::min<std::int64_t>(problem.counts[q], fit));
        group.item_columns.emplace_back(
            q, model.add_column("A" + std::to_string(q) + name, 0, upper, true));
      }
      model.groups.push_back(std::move(group));
    }
  }
}

/// Time, memory, non-empty and symmetry rows of every virtual group.
void add_group_rows(MilpModel& model, const GroupCosts& costs, const Problem& problem) {
  for (std::size_t p = 0; p < model.groups.size(); ++p) {
    const VirtualGroup& group = model.groups[p];
    // Time: fixed * m_p + sum_q A_qp * t_qk - C <= 0.
    std::vector<std::pair<int, double>> time = load_terms(model, costs, problem, group, 1);
    time.emplace_back(model.makespan_column, -1);
    model.add_row(-COIN_DBL_MAX, 0, time);
    // Memory, which also ties A to m: sum_q A_qp * len_q / capacity - m_p <= 0 (divided
    // by the capacity so that the coefficients are at most 1).
    const auto capacity = static_cast<double>(costs.at(group.degree_index).capacity_tokens);
    std::vector<std::pair<int, double>> memory = {{group.used_column, -1}};
    for (const auto& [q, column] : group.item_columns) {
      memory.emplace_back(column, static_cast<double>(problem.lengths_tokens[q]) / capacity);
    }
    model.add_row(-COIN_DBL_MAX, 0, memory);
    // A used group is non-empty: sum_q A_qp - m_p >= 0.
    std::vector<std::pair<int, double>> non_empty = {{group.used_column, -1}};
    for (const auto& [q, column] : group.item_columns) non_empty.emplace_back(column, 1);
    model.add_row(0, COIN_DBL_MAX, non_empty);
    // Copies of one degree are interchangeable, so any solution can be permuted to use the
    // first copies: m_p >= m_{p+1} keeps the optimum and prunes the permutations. (Also
    // ordering the copies' loads is exact too, but measured slower: it stops CBC's
    // heuristics from finding good solutions on 64 GPUs.)
    if (p + 1 < model.groups.size() && model.groups[p + 1].degree_index == group.degree_index) {
      model.add_row(0, COIN_DBL_MAX,
                    {{group.used_column, 1}, {model.groups[p + 1].used_column, -1}});
    }
  }
}

/// Placement, GPU count, and two valid inequalities that the LP relaxation lacks
/// (fractional m_p and A_qp spread a sequence thinly over many groups) but every integer
/// solution obeys. Without the GPU-time row the root bound of FlexSP's 64-GPU
/// micro-batches is ~35% lower (and CBC slower).
void add_global_rows(MilpModel& model, const GroupCosts& costs, const Problem& problem) {
  // Every sequence placed once: sum_p A_qp == count_q.
  std::vector<std::vector<std::pair<int, double>>> placed(problem.lengths_tokens.size());
  for (const VirtualGroup& group : model.groups) {
    for (const auto& [q, column] : group.item_columns) placed[q].emplace_back(column, 1);
  }
  for (std::size_t q = 0; q < placed.size(); ++q) {
    const auto count = static_cast<double>(problem.counts[q]);
    model.add_row(count, count, placed[q]);
  }
  // GPUs: sum_p d_p * m_p == N, or <= N when too few sequences exist to fill every GPU.
  std::vector<std::pair<int, double>> gpus;
  for (const VirtualGroup& group : model.groups) {
    gpus.emplace_back(group.used_column, costs.at(group.degree_index).degree);
  }
  const auto ranks = static_cast<double>(costs.ranks());
  model.add_row(every_gpu_used(costs, problem) ? ranks : 0, ranks, gpus);
  // GPU-time: a used group's time is at most C and an unused one's is 0, so
  // sum_p d_p * time_p <= C * sum_p d_p * m_p <= N * C.
  std::vector<std::pair<int, double>> work;
  for (const VirtualGroup& group : model.groups) {
    const double degree = costs.at(group.degree_index).degree;
    for (const auto& term : load_terms(model, costs, problem, group, degree)) work.push_back(term);
  }
  work.emplace_back(model.makespan_column, -ranks);
  model.add_row(-COIN_DBL_MAX, 0, work);
  // Every sequence runs in some group: C >= its least time alone in a group that holds it.
  std::vector<double> least_alone(problem.lengths_tokens.size(), COIN_DBL_MAX);
  for (const VirtualGroup& group : model.groups) {
    const std::size_t k = group.degree_index;
    for (const auto& [q, column] : group.item_columns) {
      least_alone[q] = std::min(
          least_alone[q], (costs.at(k).fixed_s + costs.sequence_s(problem.lengths_tokens[q], k)) /
                              model.seconds_per_unit);
    }
  }
  model.column_lower[static_cast<std::size_t>(model.makespan_column)] =
      *std::max_element(least_alone.begin(), least_alone.end());
}

MilpModel build_model(const GroupCosts& costs, const Problem& problem) {
  MilpModel model;
  model.seconds_per_unit = time_unit_s(costs, problem);
  add_columns(model, costs, problem);
  add_group_rows(model, costs, problem);
  add_global_rows(model, costs, problem);
  return model;
}

/// The warm start in the model's variables, by column name: each group takes the next
/// unused copy of its degree (so the used copies come first, as the symmetry rows ask).
std::vector<std::pair<std::string, double>> mip_start(const MilpModel& model,
                                                      const Solution& start) {
  std::vector<std::pair<std::string, double>> values = {
      {"C", start.makespan_s / model.seconds_per_unit}};
  std::vector<bool> taken(model.groups.size(), false);
  for (const SolvedGroup& group : start.groups) {
    std::size_t p = 0;
    while (taken[p] || model.groups[p].degree_index != group.degree_index) ++p;
    taken[p] = true;
    const VirtualGroup& copy = model.groups[p];
    values.emplace_back(model.column_names[static_cast<std::size_t>(copy.used_column)], 1);
    for (const auto& [q, column] : copy.item_columns) {
      const auto count = std::count(group.items.begin(), group.items.end(), q);
      if (count > 0) {
        values.emplace_back(model.column_names[static_cast<std::size_t>(column)],
                            static_cast<double>(count));
      }
    }
  }
  return values;
}

/// Groups of a CBC column solution (integers rounded), items ascending.
std::vector<SolvedGroup> groups_of(const MilpModel& model, const double* solution) {
  std::vector<SolvedGroup> groups;
  for (const VirtualGroup& group : model.groups) {
    if (std::llround(solution[group.used_column]) == 0) continue;
    SolvedGroup solved{group.degree_index, {}};
    for (const auto& [q, column] : group.item_columns) {  // ascending in q
      solved.items.insert(solved.items.end(),
                          static_cast<std::size_t>(std::llround(solution[column])), q);
    }
    groups.push_back(std::move(solved));
  }
  return groups;
}

/// The best warm start that obeys the rules, its makespan recomputed rather than trusted.
std::optional<Solution> best_warm_start(const GroupCosts& costs, const Problem& problem,
                                        std::span<const Solution> warm_starts) {
  std::optional<Solution> best;
  for (const Solution& start : warm_starts) {
    if (!check_solution(costs, problem, start).empty()) continue;
    const Seconds start_makespan_s = makespan_s(costs, problem, start.groups);
    if (!best || start_makespan_s < best->makespan_s) {
      best = start;
      best->makespan_s = start_makespan_s;
    }
  }
  return best;
}

/// The model loaded into CBC's LP solver, columns named for the MIP start.
OsiClpSolverInterface make_solver(const MilpModel& model) {
  OsiClpSolverInterface solver;
  const CoinPackedMatrix matrix(true, model.entry_rows.data(), model.entry_columns.data(),
                                model.entry_values.data(),
                                static_cast<CoinBigIndex>(model.entry_values.size()));
  solver.loadProblem(matrix, model.column_lower.data(), model.column_upper.data(),
                     model.objective.data(), model.row_lower.data(), model.row_upper.data());
  for (std::size_t column = 0; column < model.integer.size(); ++column) {
    const auto index = static_cast<int>(column);
    if (model.integer[column]) solver.setInteger(index);
    solver.setColName(index, model.column_names[column]);
  }
  // The first LP by dual simplex: Clp's automatic choice for larger models is the
  // "idiot" crash, whose crossover segfaults in ClpPresolve (Clp 1.17.7, Debian 12) on
  // per-sequence 64-GPU micro-batches (FlexSpMilp.PerSequenceSixtyFourGpus).
  ClpSolve initial;
  initial.setSolveType(ClpSolve::useDual);
  solver.setSolveOptions(initial);
  solver.messageHandler()->setLogLevel(0);
  return solver;
}

/// CbcMain1 parses its arguments through process-wide state (CbcOrClpParam.cpp's
/// statics), so solves are serialised.
std::mutex cbc_mutex;

/// An OpenBLAS function of this process, or nullptr: the global scope first (the CLI and
/// tests link libopenblas.so.0), then the library already loaded for LAPACK (Debian's
/// liblapack.so.3 alternative is OpenBLAS's wrapper around libopenblas.so.0; a Python
/// extension loads it with RTLD_LOCAL, out of the global scope). Nothing is loaded here.
void* openblas_function(const char* name) {
  if (void* found = dlsym(RTLD_DEFAULT, name)) return found;
  void* library = dlopen("libopenblas.so.0", RTLD_LAZY | RTLD_NOLOAD);
  if (library == nullptr) return nullptr;
  void* found = dlsym(library, name);
  dlclose(library);  // the NOLOAD handle's reference; LAPACK's keeps the library loaded
  return found;
}

/// One OpenBLAS thread while it lives, then the count before. Clp factorises through
/// LAPACK, and a threaded OpenBLAS sums in another order: `ballast compare --cluster
/// a100-ib400 --strategies flexsp` simulated 10.219446 s with 2 threads (the 2-core
/// machine's default) and 10.220161 s with OPENBLAS_NUM_THREADS=1 (step 1's last
/// micro-batch: the same groups on other ranks), so the MILP's plan depended on the
/// machine's cores. A LAPACK that is not OpenBLAS has no threads to pin.
class SingleBlasThread {
 public:
  SingleBlasThread()
      : get_(reinterpret_cast<int (*)()>(openblas_function("openblas_get_num_threads"))),
        set_(reinterpret_cast<void (*)(int)>(openblas_function("openblas_set_num_threads"))) {
    if (get_ == nullptr || set_ == nullptr) return;
    previous_ = get_();
    if (previous_ != 1) set_(1);
  }
  ~SingleBlasThread() {
    if (set_ != nullptr && previous_ > 1) set_(previous_);
  }
  SingleBlasThread(const SingleBlasThread&) = delete;
  SingleBlasThread& operator=(const SingleBlasThread&) = delete;

 private:
  int (*get_)();
  void (*set_)(int);
  int previous_ = 1;
};

}  // namespace

MilpResult solve_milp(const GroupCosts& costs, const Problem& problem, const MilpOptions& options) {
  BALLAST_CHECK(problem.lengths_tokens.size() == problem.counts.size(),
                "one count per item length");
  BALLAST_CHECK(options.max_nodes >= 0, "node budget >= 0");
  constexpr double kInfinite = std::numeric_limits<double>::infinity();
  MilpResult result;
  result.objective_s = kInfinite;
  result.best_bound_s = kInfinite;
  if (problem.lengths_tokens.empty()) return result;
  for (std::size_t q = 0; q < problem.lengths_tokens.size(); ++q) {
    BALLAST_CHECK(problem.lengths_tokens[q] >= 1 && problem.counts[q] >= 1,
                  "item lengths and counts >= 1");
    if (costs.min_degree_index(problem.lengths_tokens[q]) == GroupCosts::kNone) return result;
  }
  const std::optional<Solution> warm_start = best_warm_start(costs, problem, options.warm_starts);
  const MilpModel model = build_model(costs, problem);
  const OsiClpSolverInterface solver = make_solver(model);

  const std::lock_guard lock(cbc_mutex);
  const SingleBlasThread single_blas_thread;  // the same plan on any machine's core count
  CbcModel cbc(solver);
  CbcSolverUsefulData cbc_data;
  cbc_data.noPrinting_ = true;
  CbcMain0(cbc, cbc_data);
  cbc.messageHandler()->setLogLevel(0);
  if (warm_start) cbc.setMIPStart(mip_start(model, *warm_start));
  // Deterministic: one thread, a node budget, no time limit (CBC's random seeds are fixed
  // by default). Zero gaps, so that small instances end proven optimal and large ones at
  // the budget. Measured on FlexSP's 64-GPU micro-batches and the oracle instances:
  // proximity search (local branching around the incumbent) improves on the greedy warm
  // starts where CBC's default heuristics do not (one micro-batch solved to proven
  // optimality at the root, which the defaults left 2% above after 500 nodes); 10 root
  // cut passes instead of up to 100 halve the time of small models at no loss.
  const std::string max_nodes = std::to_string(options.max_nodes);
  const char* arguments[] = {"ballast-flexsp",
                             "-log",
                             "0",
                             "-slog",
                             "0",
                             "-threads",
                             "0",
                             "-maxNodes",
                             max_nodes.c_str(),
                             "-ratioGap",
                             "0",
                             "-allowableGap",
                             "0",
                             "-passCuts",
                             "10",
                             "-proximity",
                             "on",
                             "-solve",
                             "-quit"};
  CbcMain1(
      static_cast<int>(std::size(arguments)), arguments, cbc, [](CbcModel*, int) { return 0; },
      cbc_data);

  result.nodes = cbc.getNodeCount();
  if (!cbc.isProvenInfeasible()) {
    result.best_bound_s = cbc.getBestPossibleObjValue() * model.seconds_per_unit;
  }
  if (const double* cbc_solution = cbc.bestSolution()) {
    result.proven_optimal = cbc.isProvenOptimal();
    result.objective_s = cbc.getObjValue() * model.seconds_per_unit;
    result.solution.groups = groups_of(model, cbc_solution);
    result.solution.makespan_s = makespan_s(costs, problem, result.solution.groups);
    const std::string violation = check_solution(costs, problem, result.solution);
    BALLAST_CHECK(violation.empty(), "CBC's solution breaks FlexSP's rules: " + violation);
  }
  // CBC's incumbent is never worse than the MIP start in its own objective; this also
  // covers a start CBC rejected and a search that ended without any solution.
  if (warm_start && !(result.solution.makespan_s < warm_start->makespan_s)) {
    result.solution = *warm_start;
  }
  return result;
}

}  // namespace ballast::strategies::flexsp
