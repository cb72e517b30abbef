// golden_figures: every scenario's simulated figures (data/scenarios.json), each step of it,
// as text that tests/golden/figures/ holds. `--check FOLDER` exits 1 when a figure moved
// (printing what moved and how to regenerate); `--write FOLDER` regenerates the files
// (scripts/golden). Per strategy: the step time, the lower bound and its binding term, and a
// digest of the plan (FNV-1a 64 of its canonical text), so that a change that moves a
// simulated figure or a plan shows in the diff of the commit that made it.
#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "ballast/compare.hpp"
#include "ballast/error.hpp"
#include "ballast/plan.hpp"
#include "ballast/simulator.hpp"
#include "ballast/strategy.hpp"

namespace {

using namespace ballast;

/// Each scenario's own steps (4 each: docs/RESULTS.md's runs), every planner FlexSP's MILP
/// included: about three minutes of one core in all.

std::uint64_t fnv1a_64(const std::string& text) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (const unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

std::string scenario_figures(const Scenario& scenario) {
  RunSettings settings;
  apply_scenario(scenario, settings);
  const std::vector<std::string> names = settings.strategies.empty() ? planner_names() : settings.strategies;
  const RunInputs inputs = resolve_inputs(settings);
  std::string text = fmt::format(
      "# {}: {} step(s); per strategy and step: simulated step (s), lower bound (s), its "
      "binding term, plan digest (FNV-1a 64 of plan_to_string); then the strategy's mean\n",
      scenario.name, inputs.batches.size());
  for (const std::string& name : names) {
    const StrategySpec spec = parse_strategy_spec(name, settings.planner_options());
    const SimulatorEvaluator evaluator(*inputs.cost, settings.gradient_sync);
    double step_sum_s = 0, bound_sum_s = 0;
    bool planned_all = true;
    for (const Batch& batch : inputs.batches) {
      try {
        const Plan plan = spec.planner->plan(batch, *inputs.cost, spec.options, evaluator);
        const SimulationReport report = simulate(plan, *inputs.cost, {.gradient_sync = settings.gradient_sync});
        step_sum_s += report.step_time_s;
        bound_sum_s += report.lower_bound.time_s;
        text += fmt::format("{} step {} ({} sequences, {} tokens): step_s {:.12g} bound_s {:.12g} ({}) plan {:016x}\n",
                            name, batch.step, batch.lengths_tokens.size(), batch.total_tokens(),
                            report.step_time_s, report.lower_bound.time_s, report.lower_bound.binding,
                            fnv1a_64(plan_to_string(plan)));
      } catch (const InputError& error) {
        planned_all = false;
        text += fmt::format("{} step {}: cannot plan: {}\n", name, batch.step, error.what());
      }
    }
    if (planned_all) {
      const auto steps = static_cast<double>(inputs.batches.size());
      text += fmt::format("{} mean: step_s {:.12g} bound_s {:.12g} gap {:.4f}%\n", name, step_sum_s / steps,
                          bound_sum_s / steps, 100.0 * gap_to_lower_bound(step_sum_s / steps, bound_sum_s / steps));
    }
  }
  return text;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return {};
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

int usage() {
  std::fprintf(stderr,
               "usage: golden_figures --check FOLDER | --write FOLDER [--only NAME]\n"
               "  --check: exit 1 when a scenario's figures differ from FOLDER/NAME.txt\n"
               "  --write: regenerate FOLDER/NAME.txt for every scenario\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 5) return usage();
  const std::string mode = argv[1];
  const std::filesystem::path folder = argv[2];
  std::string only;
  if (argc == 5) {
    if (std::string(argv[3]) != "--only") return usage();
    only = argv[4];
  }
  if (mode != "--check" && mode != "--write") return usage();
  try {
    int moved = 0, checked = 0;
    for (const Scenario& scenario : scenarios()) {
      if (!only.empty() && scenario.name != only) continue;
      const std::string figures = scenario_figures(scenario);
      const std::filesystem::path path = folder / (scenario.name + ".txt");
      ++checked;
      if (mode == "--write") {
        std::filesystem::create_directories(folder);
        std::ofstream(path) << figures;
        continue;
      }
      const std::string golden = read_text(path);
      if (golden == figures) continue;
      ++moved;
      std::printf("golden_figures: %s moved (%s):\n", scenario.name.c_str(), path.c_str());
      const std::vector<std::string> old_lines = lines_of(golden), new_lines = lines_of(figures);
      for (std::size_t i = 0; i < std::max(old_lines.size(), new_lines.size()); ++i) {
        const std::string a = i < old_lines.size() ? old_lines[i] : "(none)";
        const std::string b = i < new_lines.size() ? new_lines[i] : "(none)";
        if (a != b) std::printf("  - %s\n  + %s\n", a.c_str(), b.c_str());
      }
    }
    if (mode == "--write") {
      std::printf("golden_figures: wrote %d scenario file(s) to %s\n", checked, folder.c_str());
      return 0;
    }
    if (moved > 0) {
      std::printf(
          "golden_figures: %d of %d scenarios' figures moved. If the change meant to move them, "
          "regenerate the golden files with scripts/golden and commit them with the change, "
          "saying in the message why the figures moved.\n",
          moved, checked);
      return 1;
    }
    std::printf("golden_figures: %d scenarios' figures as in %s\n", checked, folder.c_str());
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "golden_figures: error: %s\n", error.what());
    return 2;
  }
}
