// ballast list: the names of every dataset, cluster, model, strategy, cost model and
// scenario, or one kind's (or all) with their descriptions.
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include "ballast/error.hpp"
#include "ballast/report.hpp"
#include "ballast/text.hpp"
#include "commands.hpp"

namespace ballast::cli {

namespace {

using ListRows = std::vector<std::pair<std::string, std::string>>;

/// One section of `ballast list`: its name on the command line, its title, its rows.
struct ListSection {
  std::string name;
  std::string title;
  std::function<ListRows()> rows;
};

std::vector<ListSection> list_sections() {
  return {
      {"datasets", "datasets (--dataset; or --lengths FILE)",
       [] {
         ListRows rows;
         for (const auto& info : bundled_datasets()) rows.emplace_back(info.name, info.description);
         return rows;
       }},
      {"clusters", "clusters (--cluster; --nodes N changes the node count; or a JSON file)",
       [] {
         ListRows rows;
         for (const auto& name : cluster_preset_names()) {
           const Cluster c = cluster_preset(name);
           rows.emplace_back(name, fmt::format("{} nodes x {} {} ({:.0f} GiB), {} x {:.0f} GB/s NICs per node",
                                               c.nodes, c.gpus_per_node, c.gpu_name,
                                               c.gpu_memory_bytes / kGiB, c.nics_per_node,
                                               c.nic_bw_bytes_per_s / kGB));
         }
         return rows;
       }},
      {"models", "models (--model; or a JSON file)",
       [] {
         ListRows rows;
         for (const auto& name : model_preset_names()) {
           const Model m = model_preset(name);
           rows.emplace_back(name, fmt::format("{:.1f}B params, {} layers, hidden {}, {} heads / {} KV heads",
                                               m.parameters / 1e9, m.layers, m.hidden, m.heads, m.kv_heads));
         }
         return rows;
       }},
      {"strategies", "strategies (--strategy / --strategies)",
       [] {
         ListRows rows;
         for (const auto& planner : planners()) {
           rows.emplace_back(planner->name(), planner->description());
           for (const PlannerParameter& parameter : planner->parameters()) {
             rows.emplace_back(fmt::format("  :{}=", parameter.key), parameter.help);
           }
         }
         return rows;
       }},
      {"cost-models", "cost models (--cost-model; or a JSON file)",
       [] {
         ListRows rows;
         for (const auto& name : cost_model_names()) rows.emplace_back(name, cost_model_description(name));
         return rows;
       }},
      {"scenarios", "scenarios (ballast compare --scenario NAME)",
       [] {
         ListRows rows;
         for (const auto& scenario : scenarios()) rows.emplace_back(scenario.name, scenario.description);
         return rows;
       }},
  };
}

/// The columns a line of the short list fills before it wraps.
constexpr std::size_t kListLineChars = 96;

/// Bare `ballast list`: the names of each section, wrapped under its title, and where the
/// details are (every description took ~22 KB).
void write_list_index(std::ostream& out) {
  std::vector<std::string> names;
  for (const ListSection& section : list_sections()) {
    names.push_back(section.name);
    std::string line = fmt::format("{:<13}", section.name + ":");
    const std::string indent(line.size(), ' ');
    bool first = true;
    for (const auto& [name, description] : section.rows()) {
      if (name.empty() || name.front() == ' ') continue;  // a strategy's ":key=" row
      const std::string item = first ? name : ", " + name;
      if (line.size() + item.size() > kListLineChars && !first) {
        fmt::print(out, "{},\n", line);
        line = indent + name;
      } else {
        line += item;
      }
      first = false;
    }
    fmt::print(out, "{}\n", line);
  }
  fmt::print(out, "descriptions: ballast list {}|all (e.g. ballast list scenarios)\n",
             fmt::join(names, "|"));
}

}  // namespace

int run_list(const std::string& what, std::ostream& out) {
  if (what.empty()) {
    write_list_index(out);
    return 0;
  }
  const bool all = what == "all";
  bool known = all;
  for (const ListSection& section : list_sections()) {
    if (!all && what != section.name) continue;
    known = true;
    fmt::print(out, "{}:\n", section.title);
    for (const auto& [name, description] : section.rows()) {
      fmt::print(out, "  {:<24} {}\n", name, description);
    }
  }
  if (!known) {
    std::vector<std::string> names;
    for (const ListSection& section : list_sections()) names.push_back(section.name);
    throw InputError(fmt::format("ballast list {}: unknown list{}; use datasets, clusters, models, "
                                 "strategies, cost-models or scenarios",
                                 what, did_you_mean(what, names)));
  }
  return 0;
}

}  // namespace ballast::cli
