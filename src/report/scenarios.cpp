// Named scenarios: documented bundles of compare settings read from data/scenarios.json.
#include <algorithm>

#include <fmt/format.h>

#include "ballast/compare.hpp"
#include "ballast/error.hpp"
#include "ballast/json_file.hpp"
#include "ballast/text.hpp"

namespace ballast {

namespace {

std::vector<Scenario> read_scenarios() {
  const std::string path = data_dir() + "/scenarios.json";
  const nlohmann::json file = read_json_file(path);
  std::vector<Scenario> list;
  for (const auto& entry : required_field<nlohmann::json>(file, "scenarios", path)) {
    Scenario scenario;
    scenario.name = required_field<std::string>(entry, "name", path);
    scenario.description = required_field<std::string>(entry, "description", path);
    scenario.settings = required_field<nlohmann::json>(entry, "settings", path + ": " + scenario.name);
    list.push_back(std::move(scenario));
  }
  return list;
}

}  // namespace

const std::vector<Scenario>& scenarios() {
  static const std::vector<Scenario> list = read_scenarios();
  return list;
}

const Scenario& find_scenario(const std::string& name) {
  const std::vector<Scenario>& list = scenarios();
  const auto it = std::find_if(list.begin(), list.end(), [&](const auto& s) { return s.name == name; });
  if (it == list.end()) {
    std::vector<std::string> names;
    for (const auto& s : list) names.push_back(s.name);
    throw InputError(fmt::format("unknown scenario '{}'{}; known: {} (see `ballast list scenarios`)",
                                 name, did_you_mean(name, names), fmt::join(names, ", ")));
  }
  return *it;
}

void apply_scenario(const Scenario& scenario, RunSettings& settings) {
  const auto& json = scenario.settings;
  const std::string source = "scenario " + scenario.name;
  static constexpr std::string_view kSettingKeys[] = {
      "dataset", "cluster",    "nodes",  "model",      "cost_model", "strategies",
      "baseline", "steps",     "seed",   "tokens_per_step", "batch_size", "max_context",
      "over_context", "sampling", "degree", "grad_sync", "recompute", "tp"};
  reject_unknown_keys(json, kSettingKeys, source + ": settings");  settings.dataset = optional_field<std::string>(json, "dataset", settings.dataset, source);
  settings.cluster = optional_field<std::string>(json, "cluster", settings.cluster, source);
  if (json.contains("nodes")) settings.nodes = required_field<int>(json, "nodes", source);
  settings.model = optional_field<std::string>(json, "model", settings.model, source);
  settings.cost_model = optional_field<std::string>(json, "cost_model", settings.cost_model, source);
  settings.strategies =
      optional_field<std::vector<std::string>>(json, "strategies", settings.strategies, source);
  settings.baseline = optional_field<std::string>(json, "baseline", settings.baseline, source);
  settings.steps = optional_field<int>(json, "steps", settings.steps, source);
  auto& sampler = settings.sampler;
  sampler.seed = optional_field<std::uint64_t>(json, "seed", sampler.seed, source);
  if (json.contains("tokens_per_step")) {
    sampler.tokens_per_step = required_field<Tokens>(json, "tokens_per_step", source);
    sampler.batch_size.reset();
  }
  if (json.contains("batch_size")) {
    sampler.batch_size = required_field<std::int64_t>(json, "batch_size", source);
    sampler.tokens_per_step.reset();
  }
  sampler.max_context_tokens =
      optional_field<Tokens>(json, "max_context", sampler.max_context_tokens, source);
  if (json.contains("grad_sync")) {
    settings.gradient_sync = parse_gradient_sync(
        required_field<std::string>(json, "grad_sync", source), source + ": grad_sync");
  }
  if (json.contains("over_context")) {
    sampler.over_context =
        parse_over_context_policy(required_field<std::string>(json, "over_context", source));
  }
  if (json.contains("sampling")) {
    sampler.order = parse_sampling_order(required_field<std::string>(json, "sampling", source));
  }
  if (json.contains("recompute")) {
    settings.recompute = parse_recompute(required_field<std::string>(json, "recompute", source),
                                         source + ": recompute");
  }
  if (json.contains("degree")) settings.planner.degree = required_field<int>(json, "degree", source);
  settings.tensor_parallel = optional_field<int>(json, "tp", settings.tensor_parallel, source);
}

}  // namespace ballast
