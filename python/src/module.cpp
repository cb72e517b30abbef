// ballast._ballast: the pybind11 bindings behind the Python package `ballast`
// (python/ballast/__init__.py adds the Pythonic front: argument coercion, docstrings with
// examples, type hints). Only this file includes pybind11 (docs/design.md).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ballast/cluster.hpp"
#include "ballast/cost_model.hpp"
#include "ballast/emulated_cluster.hpp"
#include "ballast/error.hpp"
#include "ballast/model.hpp"
#include "ballast/plan.hpp"
#include "ballast/plan_layout.hpp"
#include "ballast/report.hpp"
#include "ballast/simulator.hpp"
#include "ballast/strategy.hpp"
#include "ballast/tensor_parallel.hpp"
#include "ballast/version.hpp"
#include "ballast/workload.hpp"

namespace py = pybind11;

namespace ballast::python {
namespace {

/// A plan with the cost model it was made (or is checked) with.
struct PyPlan {
  Plan plan;
  std::shared_ptr<const CostModel> cost;
};

/// The cluster a plan runs on: `cluster` grouped into TP groups of `tensor_parallel` GPUs
/// (tensor_parallel_units()), or `cluster` itself when it already is a cluster of TP groups
/// (a plan's cluster) and `tensor_parallel` is 1 or its own degree.
Cluster planning_cluster(const Cluster& cluster, const Model& model, int tensor_parallel) {
  const int existing = cluster.tensor_parallel.gpus;
  if (existing <= 1) return tensor_parallel_units(cluster, model, tensor_parallel);
  if (tensor_parallel == 1 || tensor_parallel == existing) return cluster;
  throw InputError(fmt::format(
      "cluster '{}' already is a cluster of TP groups of {} GPUs (a plan's cluster); pass "
      "tensor_parallel=1 or {} to plan on it as it is, or give the cluster of GPUs "
      "(ballast.Cluster.load) with tensor_parallel={}",
      cluster.name, existing, existing, tensor_parallel));
}

std::shared_ptr<const CostModel> cost_of(const Plan& plan) {
  return make_cost_model(plan.cost_model, plan.cluster, plan.model);
}

/// One micro-batch as one rank sees it (docs/python.md, "Per-rank views").
struct RankGroupView {
  int index = 0;
  std::string scheme;
  std::vector<int> ranks;
  int position = 0;
  std::vector<std::int64_t> sequence_ids;
  std::vector<TokenRange> chunks;  ///< this rank's ranges of the group, padding dropped
  int routing_proxies = 1;
  int routing_chunks = 1;
};

struct RankMicroBatchView {
  int index = 0;
  std::vector<TokenRange> linear;
  std::vector<TokenRange> attention;
  std::vector<RankGroupView> groups;
  bool remapped = false;
  std::vector<LayoutTransfer> sends;     ///< linear -> attention, to other ranks
  std::vector<LayoutTransfer> receives;  ///< linear -> attention, from other ranks
  Tokens linear_tokens() const {
    Tokens total = 0;
    for (const TokenRange& r : linear) total += r.size();
    return total;
  }
};

struct RankView {
  int rank = 0;
  std::vector<RankMicroBatchView> micro_batches;
};

RankView rank_view(const Plan& plan, int rank) {
  if (rank < 0 || rank >= plan.cluster.ranks()) {
    throw InputError(fmt::format("rank {} is not in the plan's cluster of {} ranks (0..{})", rank,
                                 plan.cluster.ranks(), plan.cluster.ranks() - 1));
  }
  RankView view;
  view.rank = rank;
  for (std::size_t m = 0; m < plan.micro_batches.size(); ++m) {
    const MicroBatch& batch = plan.micro_batches[m];
    const int mi = static_cast<int>(m);
    RankMicroBatchView mv;
    mv.index = mi;
    mv.linear = linear_layout(plan, mi, rank);
    mv.attention = attention_layout(plan, mi, rank);
    mv.remapped = !batch.linear_layout.empty();
    const auto queues = effective_queues(batch, plan.cluster.ranks());
    for (int g : queues[static_cast<std::size_t>(rank)]) {
      const AttentionGroup& group = batch.groups[static_cast<std::size_t>(g)];
      RankGroupView gv;
      gv.index = g;
      gv.scheme = to_string(group.scheme);
      gv.ranks = group.ranks;
      for (std::size_t i = 0; i < group.ranks.size(); ++i) {
        if (group.ranks[i] == rank) gv.position = static_cast<int>(i);
      }
      for (const SequenceChunks& sequence : group.sequences) gv.sequence_ids.push_back(sequence.sequence_id);
      for (const TokenRange& range : mv.attention) {
        if (range.group == g) gv.chunks.push_back(range);
      }
      gv.routing_proxies = group.routing_proxies;
      gv.routing_chunks = group.routing_chunks;
      mv.groups.push_back(std::move(gv));
    }
    if (mv.remapped) {
      for (const LayoutTransfer& t : remap_transfers(plan, mi)) {
        if (t.src_rank == t.dst_rank) continue;
        if (t.src_rank == rank) mv.sends.push_back(t);
        if (t.dst_rank == rank) mv.receives.push_back(t);
      }
    }
    view.micro_batches.push_back(std::move(mv));
  }
  return view;
}

std::string dump(const nlohmann::json& json) { return json.dump(2) + "\n"; }

nlohmann::json parse_json_text(const std::string& text, const std::string& what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    throw InputError(fmt::format("{} is not valid JSON: {}", what, error.what()));
  }
}

std::vector<Tokens> lengths_from(const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& lengths) {
  if (lengths.ndim() != 1) {
    throw InputError(fmt::format("lengths must be one-dimensional (one length per sequence); got "
                                 "an array of {} dimensions",
                                 lengths.ndim()));
  }
  const std::int64_t* data = lengths.data();
  return std::vector<Tokens>(data, data + lengths.shape(0));
}

py::array_t<std::int64_t> to_array(const std::vector<Tokens>& values) {
  py::array_t<std::int64_t> array(static_cast<py::ssize_t>(values.size()));
  std::copy(values.begin(), values.end(), array.mutable_data());
  return array;
}

PyPlan make_plan(const py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>& lengths,
                 const Cluster& gpus, const Model& model, const std::string& cost_model,
                 const std::string& strategy, std::int64_t step,
                 std::optional<Tokens> max_context_tokens, int tensor_parallel) {
  std::vector<Tokens> values = lengths_from(lengths);
  py::gil_scoped_release release;  // planning is pure C++: data-loader threads keep running
  validate_cluster(gpus, "cluster " + gpus.name);
  validate_model(model, "model " + model.name);
  const Cluster cluster = planning_cluster(gpus, model, tensor_parallel);
  const nlohmann::json spec = load_cost_model_spec(cost_model);
  std::shared_ptr<const CostModel> cost = make_cost_model(spec, cluster, model);
  if (max_context_tokens && *max_context_tokens < 1) {
    throw InputError(fmt::format("max_context_tokens={} must be at least 1 (or None: the batch's "
                                 "longest sequence)",
                                 *max_context_tokens));
  }
  PlannerOptions options;
  options.context_tokens = max_context_tokens;  // the static strategies' degree (strategy.hpp)
  const StrategySpec parsed = parse_strategy_spec(strategy, options);
  const Batch batch = make_batch(std::move(values), step);
  Plan plan = parsed.planner->plan(batch, *cost, parsed.options, SimulatorEvaluator(*cost));
  require_valid(plan, *cost, "made by " + strategy);
  return {std::move(plan), std::move(cost)};
}

PyPlan plan_from_text(const std::string& text, const std::string& source) {
  Plan plan = plan_from_json(parse_json_text(text, source), source);
  auto cost = cost_of(plan);
  return {std::move(plan), std::move(cost)};
}

struct PyReport {
  SimulationReport report;
  std::string json() const { return report_to_json(report).dump(2) + "\n"; }
};

PyReport simulate_plan(const PyPlan& plan, bool trace, const std::string& grad_sync) {
  const GradientSync mode = parse_gradient_sync(grad_sync, setting_name("--grad-sync"));
  py::gil_scoped_release release;
  SimulationOptions options;
  options.record_trace = trace;
  options.gradient_sync = mode;
  return {simulate(plan.plan, *plan.cost, options)};
}

}  // namespace
}  // namespace ballast::python

PYBIND11_MODULE(_ballast, m) {
  using namespace ballast;
  using namespace ballast::python;
  m.doc() = "ballast's C++ core; use the `ballast` package, not this module";
  m.attr("__version__") = version();  // project(VERSION), as `ballast --version` and plan files

  // Messages name settings by this API's keyword arguments (max_context_tokens, not the
  // CLI's --max-context): set once, before any call can raise.
  set_frontend(Frontend::python);

  // Errors: bad input is ValueError (PlanningError a subclass), broken invariants are
  // RuntimeError; the message is the one the CLI prints after "ballast: error: ", with
  // settings named as above.
  static py::exception<PlanningError> planning_error(m, "PlanningError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr pointer) {
    try {
      if (pointer) std::rethrow_exception(pointer);
    } catch (const PlanningError& error) {
      planning_error(error.what());
    } catch (const InputError& error) {
      PyErr_SetString(PyExc_ValueError, error.what());
    } catch (const InternalError& error) {
      PyErr_SetString(PyExc_RuntimeError, fmt::format("internal error (please report): {}", error.what()).c_str());
    }
  });

  m.def("cluster_presets", &cluster_preset_names);
  m.def("model_presets", &model_preset_names);
  m.def("cost_models", &cost_model_names);
  m.def("strategies", &planner_names);
  m.def("strategy_info", [] {
    std::vector<py::dict> rows;
    for (const auto& planner : planners()) {
      py::dict parameters;
      for (const PlannerParameter& p : planner->parameters()) parameters[py::str(p.key)] = p.help;
      py::dict row;
      row["name"] = planner->name();
      row["description"] = planner->description();
      row["parameters"] = parameters;
      rows.push_back(row);
    }
    return rows;
  });
  m.def("check_strategy", [](const std::string& spec) { parse_strategy_spec(spec); });
  m.def("datasets", [] {
    std::vector<std::pair<std::string, std::string>> rows;
    for (const DatasetInfo& info : bundled_datasets()) rows.emplace_back(info.name, info.description);
    return rows;
  });
  m.def("data_dir", &data_dir);
  m.def(
      "sample_batches",
      [](const std::string& dataset, std::optional<Tokens> tokens_per_step,
         std::optional<std::int64_t> batch_size, int steps, std::uint64_t seed, Tokens max_context_tokens,
         const std::string& order, const std::string& over_context) {
        check_step_count(steps);  // every batch is held: --steps' limit
        const Dataset data = load_dataset(dataset);
        SamplerOptions options;
        options.tokens_per_step = tokens_per_step;
        options.batch_size = batch_size;
        options.seed = seed;
        options.max_context_tokens = max_context_tokens;
        options.order = parse_sampling_order(order);
        options.over_context = parse_over_context_policy(over_context);
        BatchSampler sampler(data, options);
        std::vector<py::array_t<std::int64_t>> batches;
        for (int i = 0; i < steps; ++i) batches.push_back(to_array(sampler.next().lengths_tokens));
        return batches;
      },
      py::arg("dataset"), py::arg("tokens_per_step"), py::arg("batch_size"), py::arg("steps"),
      py::arg("seed"), py::arg("max_context_tokens"), py::arg("order"), py::arg("over_context"));

  py::class_<Cluster>(m, "Cluster", "A homogeneous GPU cluster (docs/cost-model.md). Cluster.load(preset_or_file, nodes=None); fields are settable; ranks = nodes * gpus_per_node, numbered node-major; on a cluster of TP groups (tensor_parallel N > 1, a plan's cluster) a rank is a TP group of N GPUs and gpus_per_node counts TP groups.")
      .def(py::init<>())
      .def_static("load", &load_cluster, py::arg("preset_or_file"), py::arg("nodes") = std::nullopt)
      .def_static("emulated",
                  py::overload_cast<const Model&, int, int, Tokens>(&emulated_cluster), py::arg("model"), py::arg("ranks"), py::arg("gpus_per_node"),
                  py::arg("rank_tokens"),
                  "The cluster CPU processes emulate, one per GPU (gloo processes of ballast.torch; its compute "
                  "and link figures are fixed estimates, while `ballast run` plans on `ballast calibrate --host`'s "
                  "measurements): ranks GPUs in nodes of gpus_per_node, memory for rank_tokens tokens of model's "
                  "activations next to its ZeRO-3 model states.")
      .def_static("from_json",
                  [](const std::string& text, const std::string& source) {
                    return cluster_from_json(parse_json_text(text, source), source);
                  },
                  py::arg("text"), py::arg("source") = "<string>")
      .def("to_json", [](const Cluster& c) { return dump(to_json(c)); })
      .def("validate", [](const Cluster& c) { validate_cluster(c, "cluster " + c.name); })
      .def_property_readonly("ranks", &Cluster::ranks)
      .def_property_readonly("gpus", &Cluster::gpus, "GPUs of the cluster: ranks x tensor_parallel.")
      .def_property_readonly("tensor_parallel", [](const Cluster& c) { return c.tensor_parallel.gpus; },
                             "GPUs per rank: the TP degree of a cluster of TP groups (ballast.plan's "
                             "tensor_parallel), 1 on a cluster of GPUs.")
      .def_readwrite("name", &Cluster::name)
      .def_readwrite("gpu_name", &Cluster::gpu_name)
      .def_readwrite("nodes", &Cluster::nodes)
      .def_readwrite("gpus_per_node", &Cluster::gpus_per_node)
      .def_readwrite("gpu_memory_bytes", &Cluster::gpu_memory_bytes)
      .def_readwrite("peak_flops_per_s", &Cluster::peak_flops_per_s)
      .def_readwrite("matmul_efficiency", &Cluster::matmul_efficiency)
      .def_readwrite("attention_efficiency", &Cluster::attention_efficiency)
      .def_readwrite("attention_tile_tokens", &Cluster::attention_tile_tokens)
      .def_readwrite("attention_tiles_packed", &Cluster::attention_tiles_packed)
      .def_readwrite("memory_usable_fraction", &Cluster::memory_usable_fraction)
      .def_readwrite("intra_node_bus_bw_bytes_per_s", &Cluster::intra_node_bus_bw_bytes_per_s)
      .def_readwrite("intra_node_p2p_bw_bytes_per_s", &Cluster::intra_node_p2p_bw_bytes_per_s)
      .def_readwrite("intra_node_latency_s", &Cluster::intra_node_latency_s)
      .def_readwrite("nics_per_node", &Cluster::nics_per_node)
      .def_readwrite("nic_bw_bytes_per_s", &Cluster::nic_bw_bytes_per_s)
      .def_readwrite("inter_node_latency_s", &Cluster::inter_node_latency_s)
      .def_readwrite("provenance", &Cluster::provenance);

  py::class_<Model>(m, "Model", "A decoder-only transformer's shape (docs/cost-model.md). Model.load(preset_or_file); fields are settable.")
      .def(py::init<>())
      .def_static("load", &load_model, py::arg("preset_or_file"))
      .def_static("from_json",
                  [](const std::string& text, const std::string& source) {
                    return model_from_json(parse_json_text(text, source), source);
                  },
                  py::arg("text"), py::arg("source") = "<string>")
      .def("to_json", [](const Model& model) { return dump(to_json(model)); })
      .def("validate", [](const Model& model) { validate_model(model, "model " + model.name); })
      .def_property_readonly("head_dim", &Model::head_dim)
      .def_readwrite("name", &Model::name)
      .def_readwrite("layers", &Model::layers)
      .def_readwrite("hidden", &Model::hidden)
      .def_readwrite("heads", &Model::heads)
      .def_readwrite("kv_heads", &Model::kv_heads)
      .def_readwrite("ffn_hidden", &Model::ffn_hidden)
      .def_readwrite("vocab", &Model::vocab)
      .def_readwrite("gated_mlp", &Model::gated_mlp)
      .def_readwrite("bytes_per_element", &Model::bytes_per_element)
      .def_readwrite("activation_bytes_per_token", &Model::activation_bytes_per_token)
      .def_readwrite("parameters", &Model::parameters)
      .def_property(
          "recompute", [](const Model& model) { return std::string(recompute_name(model.recompute)); },
          [](Model& model, const std::string& text) {
            model.recompute = parse_recompute(text, "Model.recompute");
          },
          "activation recomputation: 'selective' (default), 'full' or 'none' (docs/cost-model.md)")
      .def_readwrite("provenance", &Model::provenance);

  py::class_<Chunk>(m, "Chunk", "Tokens [begin, end) of a sequence on `rank` during attention (end may include padding).")
      .def_readonly("rank", &Chunk::rank)
      .def_readonly("begin", &Chunk::begin_tokens)
      .def_readonly("end", &Chunk::end_tokens)
      .def("__repr__", [](const Chunk& c) { return fmt::format("Chunk(rank={}, begin={}, end={})", c.rank, c.begin_tokens, c.end_tokens); });
  py::class_<SequenceChunks>(m, "SequenceChunks", "A sequence's chunks in one attention group; they cover [0, padded_length) once.")
      .def_readonly("sequence_id", &SequenceChunks::sequence_id)
      .def_readonly("padded_length", &SequenceChunks::padded_length_tokens)
      .def_readonly("chunks", &SequenceChunks::chunks)
      .def("__repr__", [](const SequenceChunks& s) {
        return fmt::format("SequenceChunks(sequence_id={}, padded_length={}, chunks={})", s.sequence_id,
                           s.padded_length_tokens, s.chunks.size());
      });
  py::class_<AttentionGroup>(m, "Group", "An attention group: scheme (local, ring, all_gather, ulysses, usp), ranks (ring order; usp: stages of ulysses_degree consecutive ranks) and the chunks of its sequences.")
      .def_property_readonly("scheme", [](const AttentionGroup& g) { return to_string(g.scheme); })
      .def_readonly("ranks", &AttentionGroup::ranks)
      .def_readonly("sequences", &AttentionGroup::sequences)
      .def_readonly("routing_proxies", &AttentionGroup::routing_proxies)
      .def_readonly("routing_chunks", &AttentionGroup::routing_chunks)
      .def_readonly("ulysses_degree", &AttentionGroup::ulysses_degree)
      .def("__repr__", [](const AttentionGroup& g) {
        return fmt::format("Group(scheme='{}', ranks={}, sequences={})", to_string(g.scheme),
                           fmt::join(g.ranks, ","), g.sequences.size());
      });
  py::class_<LinearSlice>(m, "LinearSlice", "Tokens [begin, end) of a sequence held by `rank` during the linear modules (a remapped plan).")
      .def_readonly("rank", &LinearSlice::rank)
      .def_readonly("sequence_id", &LinearSlice::sequence_id)
      .def_readonly("begin", &LinearSlice::begin_tokens)
      .def_readonly("end", &LinearSlice::end_tokens);
  py::class_<MicroBatch>(m, "MicroBatch", "One micro-batch of a plan: its attention groups and, when remapped, the linear layout.")
      .def_readonly("groups", &MicroBatch::groups)
      .def_readonly("linear_layout", &MicroBatch::linear_layout)
      .def("__repr__", [](const MicroBatch& b) {
        return fmt::format("MicroBatch(groups={}, remapped={})", b.groups.size(), !b.linear_layout.empty());
      });

  py::class_<TokenRange>(m, "TokenRange", "Tokens [begin, end) of sequence `sequence_id` (never empty, never padding); `group` is the attention group index in attention layouts, -1 in linear ones.")
      .def_readonly("sequence_id", &TokenRange::sequence_id)
      .def_readonly("begin", &TokenRange::begin_tokens)
      .def_readonly("end", &TokenRange::end_tokens)
      .def_readonly("group", &TokenRange::group)
      .def_property_readonly("tokens", &TokenRange::size)
      .def("__repr__", [](const TokenRange& r) {
        return fmt::format("TokenRange(sequence_id={}, begin={}, end={}, group={})", r.sequence_id,
                           r.begin_tokens, r.end_tokens, r.group);
      });
  py::class_<LayoutTransfer>(m, "Transfer", "Tokens [begin, end) of a sequence that src_rank holds for the linear modules and dst_rank needs for attention (the remap).")
      .def_readonly("src_rank", &LayoutTransfer::src_rank)
      .def_readonly("dst_rank", &LayoutTransfer::dst_rank)
      .def_readonly("sequence_id", &LayoutTransfer::sequence_id)
      .def_readonly("begin", &LayoutTransfer::begin_tokens)
      .def_readonly("end", &LayoutTransfer::end_tokens)
      .def_property_readonly("tokens", &LayoutTransfer::size)
      .def("__repr__", [](const LayoutTransfer& t) {
        return fmt::format("Transfer(src_rank={}, dst_rank={}, sequence_id={}, begin={}, end={})",
                           t.src_rank, t.dst_rank, t.sequence_id, t.begin_tokens, t.end_tokens);
      });
  py::class_<RankGroupView>(m, "RankGroup", "An attention group as one rank sees it: index in the micro-batch, scheme, ranks, this rank's position, sequence ids and this rank's chunks (padding dropped).")
      .def_readonly("index", &RankGroupView::index)
      .def_readonly("scheme", &RankGroupView::scheme)
      .def_readonly("ranks", &RankGroupView::ranks)
      .def_readonly("position", &RankGroupView::position)
      .def_readonly("sequence_ids", &RankGroupView::sequence_ids)
      .def_readonly("chunks", &RankGroupView::chunks)
      .def_readonly("routing_proxies", &RankGroupView::routing_proxies)
      .def_readonly("routing_chunks", &RankGroupView::routing_chunks)
      .def("__repr__", [](const RankGroupView& g) {
        return fmt::format("RankGroup(index={}, scheme='{}', ranks=[{}], position={}, chunks={})", g.index,
                           g.scheme, fmt::join(g.ranks, ", "), g.position, g.chunks.size());
      });
  py::class_<RankMicroBatchView>(m, "RankMicroBatch", "One micro-batch as one rank sees it. linear: the ranges to load and pack (embeddings, linear layers, loss); attention: the ranges held during attention; both in packing order. groups: this rank's attention groups in the order it runs them. sends / receives: the linear -> attention remap pieces to and from other ranks (empty unless remapped).")
      .def_readonly("index", &RankMicroBatchView::index)
      .def_readonly("linear", &RankMicroBatchView::linear)
      .def_readonly("attention", &RankMicroBatchView::attention)
      .def_readonly("groups", &RankMicroBatchView::groups)
      .def_readonly("remapped", &RankMicroBatchView::remapped)
      .def_readonly("sends", &RankMicroBatchView::sends)
      .def_readonly("receives", &RankMicroBatchView::receives)
      .def_property_readonly("tokens", &RankMicroBatchView::linear_tokens)
      .def("__repr__", [](const RankMicroBatchView& v) {
        return fmt::format("RankMicroBatch(index={}, tokens={}, ranges={}, groups={}, remapped={})", v.index,
                           v.linear_tokens(), v.linear.size(), v.groups.size(), v.remapped ? "True" : "False");
      });
  py::class_<RankView>(m, "RankView", "Everything one rank does in a planned step: one RankMicroBatch per micro-batch (every rank has the same count; some may hold no tokens).")
      .def_readonly("rank", &RankView::rank)
      .def_readonly("micro_batches", &RankView::micro_batches)
      .def("__repr__", [](const RankView& v) {
        return fmt::format("RankView(rank={}, micro_batches={})", v.rank, v.micro_batches.size());
      });

  py::class_<PyPlan>(m, "Plan", "A validated plan for one global batch (docs/plan-format.md), with the cost model it was made for. Make one with ballast.plan(); plan.rank(r) is rank r's view; to_json() is the canonical text `ballast plan` writes.")
      .def_static("from_json", &plan_from_text, py::arg("text"), py::arg("source") = "<string>")
      .def_static("read", [](const std::string& path) {
        std::vector<PyPlan> plans;
        for (Plan& plan : read_plan_file(path)) {
          auto cost = cost_of(plan);
          plans.push_back({std::move(plan), std::move(cost)});
        }
        return plans;
      })
      .def("to_json", [](const PyPlan& p) { return plan_to_string(p.plan); }, "The canonical JSON text (byte-identical to `ballast plan` for the same inputs).")
      .def("validate", [](const PyPlan& p) {
        const ValidationResult result = validate(p.plan, *p.cost);
        return std::pair(result.ok, result.message);
      }, "(True, '') or (False, the first violated invariant in plain words).")
      .def("rank", [](const PyPlan& p, int rank) { return rank_view(p.plan, rank); }, py::arg("rank"), "Rank `rank`'s view of the step (ValueError outside 0..ranks-1).")
      .def("attention_layout", [](const PyPlan& p, int mb, int rank) { return attention_layout(p.plan, mb, rank); },
           py::arg("micro_batch"), py::arg("rank"))
      .def("linear_layout", [](const PyPlan& p, int mb, int rank) { return linear_layout(p.plan, mb, rank); },
           py::arg("micro_batch"), py::arg("rank"))
      .def("remap_transfers", [](const PyPlan& p, int mb) { return remap_transfers(p.plan, mb); },
           py::arg("micro_batch"),
           "Every piece the linear -> attention remap moves (src == dst included), ordered by dst_rank and then by the destination's attention packing order.")
      .def_property_readonly("strategy", [](const PyPlan& p) { return p.plan.strategy; })
      .def_property_readonly("step", [](const PyPlan& p) { return p.plan.step; })
      .def_property_readonly("ranks", [](const PyPlan& p) { return p.plan.cluster.ranks(); })
      .def_property_readonly("gpus", [](const PyPlan& p) { return p.plan.cluster.gpus(); })
      .def_property_readonly("tensor_parallel", [](const PyPlan& p) { return p.plan.cluster.tensor_parallel.gpus; })
      .def_property_readonly("cluster", [](const PyPlan& p) { return p.plan.cluster; })
      .def_property_readonly("model", [](const PyPlan& p) { return p.plan.model; })
      .def_property_readonly("cost_model", [](const PyPlan& p) { return dump(p.plan.cost_model); })
      .def_property_readonly("lengths", [](const PyPlan& p) { return to_array(p.plan.sequence_lengths_tokens); })
      .def_property_readonly("micro_batches", [](const PyPlan& p) { return p.plan.micro_batches; })
      .def_property_readonly("notes", [](const PyPlan& p) { return p.plan.notes; })
      .def_property_readonly("num_micro_batches", [](const PyPlan& p) { return p.plan.micro_batches.size(); });

  m.def("make_plan", &make_plan, py::arg("lengths"), py::arg("cluster"), py::arg("model"),
        py::arg("cost_model"), py::arg("strategy"), py::arg("step"), py::arg("max_context_tokens"),
        py::arg("tensor_parallel"));
  m.def("tensor_parallel_units", &planning_cluster, py::arg("cluster"), py::arg("model"),
        py::arg("tensor_parallel"),
        "The cluster whose ranks are TP groups of tensor_parallel consecutive GPUs of a node "
        "(docs/python.md, \"Tensor parallelism\"); a cluster of TP groups of that degree as it is.");
  m.def("valid_tensor_parallel_degrees", &valid_tensor_parallel_degrees, py::arg("cluster"), py::arg("model"),
        "TP degrees the cluster of GPUs and the model allow (ascending; 1 always).");

  py::class_<LowerBound>(m, "LowerBound", "A bound no plan beats (docs/simulator.md): time_s and its terms.")
      .def_readonly("time_s", &LowerBound::time_s)
      .def_readonly("compute_per_rank_s", &LowerBound::compute_per_rank_s)
      .def_readonly("overhead_s", &LowerBound::overhead_s)
      .def_readonly("gradient_sync_s", &LowerBound::gradient_sync_s)
      .def_readonly("min_micro_batches", &LowerBound::min_micro_batches)
      .def_readonly("expert_imbalance_s", &LowerBound::expert_imbalance_s)
      .def_readonly("longest_sequence_s", &LowerBound::longest_sequence_s)
      .def_readonly("gradient_buckets_s", &LowerBound::gradient_buckets_s)
      .def_readonly("first_bucket_ready_s", &LowerBound::first_bucket_ready_s)
      .def_readonly("binding", &LowerBound::binding);
  py::class_<RankTimes>(m, "RankTimes", "One rank's simulated step: busy, communication, exposed communication, idle, peak memory.")
      .def_readonly("busy_s", &RankTimes::busy_s)
      .def_readonly("communication_s", &RankTimes::communication_s)
      .def_readonly("exposed_communication_s", &RankTimes::exposed_communication_s)
      .def_readonly("idle_s", &RankTimes::idle_s)
      .def_readonly("peak_memory_bytes", &RankTimes::peak_memory_bytes);
  py::class_<PyReport>(m, "Report", "A simulated step (docs/simulator.md); to_json() is one step of `ballast simulate --format json`.")
      .def_property_readonly("strategy", [](const PyReport& r) { return r.report.strategy; })
      .def_property_readonly("step_time_s", [](const PyReport& r) { return r.report.step_time_s; })
      .def_property_readonly("lower_bound", [](const PyReport& r) { return r.report.lower_bound; })
      .def_property_readonly("lower_bound_s", [](const PyReport& r) { return r.report.lower_bound.time_s; })
      .def_property_readonly("imbalance", [](const PyReport& r) { return r.report.imbalance; })
      .def_property_readonly("exposed_communication_fraction",
                             [](const PyReport& r) { return r.report.exposed_communication_fraction; })
      .def_property_readonly("peak_memory_bytes", [](const PyReport& r) { return r.report.peak_memory_bytes; })
      .def_property_readonly("gradient_sync_s", [](const PyReport& r) { return r.report.gradient_sync_s; })
      .def_property_readonly("gradient_sync_exposed_s",
                             [](const PyReport& r) { return r.report.gradient_sync_exposed_s; })
      .def_property_readonly("micro_batches", [](const PyReport& r) { return r.report.micro_batches; })
      .def_property_readonly("ranks", [](const PyReport& r) { return r.report.ranks; })
      .def("to_json", &PyReport::json)
      .def("text", [](const PyReport& r, const Cluster& cluster) {
        std::ostringstream out;
        write_report_text(r.report, cluster, out);
        return out.str();
      })
      .def("chrome_trace", [](const PyReport& r) {
        if (r.report.trace.empty()) {
          throw InputError("the report has no trace; simulate with trace=True to record one");
        }
        std::ostringstream out;
        write_chrome_trace(r.report, out);
        return out.str();
      });
  m.def("simulate", &simulate_plan, py::arg("plan"), py::arg("trace"), py::arg("grad_sync"));
}
