// The strategy registry: one line per strategy (BALLAST_STRATEGIES), in a fixed order; spec
// parsing ("name:key=value") and the parameter helpers planners read their options with.
#include <algorithm>
#include <charconv>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ballast/error.hpp"
#include "ballast/strategy.hpp"
#include "ballast/text.hpp"

// Every strategy, one line each, in registration order (the order of `ballast list
// strategies`, of compare's tables and of every test that loops over the registry). X(name)
// stands for `std::unique_ptr<Planner> ballast::strategies::make_<name>_planner()`, defined
// in the strategy's own file in src/strategies/ (which CMake picks up by itself). Adding a
// strategy: write that file and add its line here; nothing else.
#define BALLAST_STRATEGIES(X) \
  X(packed_dp)                \
  X(static_cp)                \
  X(static_cp_allgather)      \
  X(static_ulysses)           \
  X(batch_adaptive)           \
  X(hybrid_dp)                \
  X(flexsp)                   \
  X(flexsp_fast)              \
  X(zeppelin)                 \
  X(ballast)

namespace ballast {

namespace strategies {
#define BALLAST_DECLARE_FACTORY(name) std::unique_ptr<Planner> make_##name##_planner();
BALLAST_STRATEGIES(BALLAST_DECLARE_FACTORY)
#undef BALLAST_DECLARE_FACTORY
}  // namespace strategies

namespace {

using PlannerFactory = std::unique_ptr<Planner> (*)();

constexpr PlannerFactory kFactories[] = {
#define BALLAST_LIST_FACTORY(name) strategies::make_##name##_planner,
    BALLAST_STRATEGIES(BALLAST_LIST_FACTORY)
#undef BALLAST_LIST_FACTORY
};

/// `text` as an integer in [min_value, max_value]; InputError naming key=text otherwise.
long long parse_integer_parameter(const std::string& key, const std::string& text,
                                  long long min_value, long long max_value) {
  long long value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < min_value ||
      value > max_value) {
    throw InputError(fmt::format("strategy parameter {}={}: expected an integer from {} to {}",
                                 key, text, min_value, max_value));
  }
  return value;
}

/// A spec's degree=N: N in [1, 2^20]; InputError naming the spec and both accepted forms.
long long parse_degree(const std::string& spec_text, const std::string& value) {
  constexpr long long kMaxDegree = 1 << 20;
  try {
    return parse_integer_parameter("degree", value, 1, kMaxDegree);
  } catch (const InputError&) {
    throw InputError(fmt::format("strategy '{}': degree={} is neither a fixed degree (an integer "
                                 "from 1 to {}) nor {} (the degree of each step's longest "
                                 "sequence)",
                                 spec_text, value, kMaxDegree, kDegreePerStep));
  }
}

}  // namespace

bool Planner::takes_common_degree(const PlannerOptions& /*options*/) const {
  const auto keys = parameters();
  return std::any_of(keys.begin(), keys.end(), [](const PlannerParameter& p) { return p.key == "degree"; });
}

const std::vector<std::unique_ptr<Planner>>& planners() {
  static const std::vector<std::unique_ptr<Planner>> all = [] {
    std::vector<std::unique_ptr<Planner>> made;
    for (PlannerFactory factory : kFactories) made.push_back(factory());
    return made;
  }();
  return all;
}

std::vector<std::string> planner_names() {
  std::vector<std::string> names;
  for (const auto& planner : planners()) names.push_back(planner->name());
  return names;
}

const Planner& find_planner(const std::string& name) {
  for (const auto& planner : planners()) {
    if (planner->name() == name) return *planner;
  }
  throw InputError(
      fmt::format("unknown strategy '{}'{}; known: {}", name, did_you_mean(name, planner_names()),
                  fmt::join(planner_names(), ", ")));
}

namespace {

/// Applies the "key=value" items of `text` after position `begin` to spec.options; returns
/// the keys given. Throws InputError naming the spec for a malformed, unknown or repeated one.
std::set<std::string> apply_spec_parameters(const std::string& text, std::size_t begin,
                                            StrategySpec& spec) {
  std::vector<std::string> keys;
  for (const PlannerParameter& parameter : spec.planner->parameters()) keys.push_back(parameter.key);
  const std::string known =
      keys.empty() ? fmt::format("{} takes no parameters", spec.planner->name())
                   : fmt::format("{} takes {}", spec.planner->name(), fmt::join(keys, ", "));
  std::set<std::string> seen;
  while (true) {
    const std::size_t end = text.find(':', begin);
    const std::string item = text.substr(begin, end == std::string::npos ? end : end - begin);
    const std::size_t equals = item.find('=');
    if (equals == std::string::npos || equals == 0 || equals + 1 == item.size()) {
      throw InputError(fmt::format("strategy '{}': parameter '{}' is not key=value; write "
                                   "name:key=value[:key=value] ({})",
                                   text, item, known));
    }
    const std::string key = item.substr(0, equals);
    const std::string value = item.substr(equals + 1);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      throw InputError(fmt::format("strategy '{}': unknown parameter '{}'{}; {}", text, key,
                                   did_you_mean(key, keys), known));
    }
    if (!seen.insert(key).second) {
      throw InputError(fmt::format("strategy '{}': parameter '{}' given twice", text, key));
    }
    if (key == "degree" && value == kDegreePerStep) {
      spec.options.degree.reset();
      spec.options.degree_per_step = true;
    } else if (key == "degree") {
      spec.options.degree = static_cast<int>(parse_degree(text, value));
      spec.options.degree_per_step = false;
    } else {
      spec.options.parameters[key] = value;
    }
    if (end == std::string::npos) return seen;
    begin = end + 1;
  }
}

}  // namespace

StrategySpec parse_strategy_spec(const std::string& text, const PlannerOptions& base) {
  StrategySpec spec;
  spec.text = text;
  spec.options = base;
  const std::size_t colon = text.find(':');
  spec.planner = &find_planner(text.substr(0, colon));
  const std::set<std::string> given =
      colon == std::string::npos ? std::set<std::string>{} : apply_spec_parameters(text, colon + 1, spec);
  // A degree set for every strategy (--degree) is for those that run at a fixed degree;
  // the others keep choosing theirs. A degree in the spec is judged by check_options().
  if (!given.count("degree") && spec.options.degree &&
      !spec.planner->takes_common_degree(spec.options)) {
    spec.options.degree.reset();
  }
  spec.planner->check_options(spec.options);
  return spec;
}

void check_strategy_spec(const StrategySpec& spec, const CostModel& cost) {
  try {
    spec.planner->longest_sequence_tokens(cost, spec.options);
  } catch (const PlanningError&) {
    throw;
  } catch (const InputError& error) {
    if (spec.text == spec.planner->name()) throw;  // the message names the strategy
    throw InputError(fmt::format("strategy '{}': {}", spec.text, error.what()));
  }
}

std::string parameter_or(const PlannerOptions& options, const std::string& key,
                         const std::string& fallback) {
  const auto found = options.parameters.find(key);
  return found == options.parameters.end() ? fallback : found->second;
}

long long integer_parameter_or(const PlannerOptions& options, const std::string& key,
                               long long fallback, long long min_value, long long max_value) {
  const auto found = options.parameters.find(key);
  if (found == options.parameters.end()) return fallback;
  return parse_integer_parameter(key, found->second, min_value, max_value);
}

}  // namespace ballast
