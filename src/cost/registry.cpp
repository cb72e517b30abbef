// Cost model specs: the names ballast knows ("analytical", FlexSP's profiled presets),
// the profiled spec JSON (written by ProfiledCostModel::spec, parsed here) and the factory.
#include <algorithm>
#include <array>
#include <filesystem>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ballast/cost_model.hpp"
#include "ballast/error.hpp"
#include "ballast/json_file.hpp"
#include "ballast/text.hpp"

namespace ballast {

namespace {

constexpr const char* kAnalytical = "analytical";
constexpr const char* kProfiledFamily = "profiled";

// The members each spec object may hold: what profiled_spec() and
// AnalyticalCostModel::spec() write; any other is an error.
constexpr std::array<std::string_view, 1> kAnalyticalSpecKeys = {"family"};
constexpr std::array<std::string_view, 6> kProfiledSpecKeys = {
    "family", "name", "memory_limit_gib", "all_to_all_gb_per_s", "models", "provenance"};
constexpr std::array<std::string_view, 2> kBandwidthRowKeys = {"degree", "gb_per_s"};
constexpr std::array<std::string_view, 6> kCoefficientKeys = {
    "model_name", "a1_ms_per_token2", "a2_ms_per_token", "b1_ms", "activation_mib_per_token",
    "parameters_gi"};

/// Per-model part of a profiled spec.
struct ModelCoefficients {
  const char* model_name;
  double a1_ms_per_token2;
  double a2_ms_per_token;
  double b1_ms;
  double activation_mib_per_token;
  double parameters_gi;
};

// FlexSP (ASPLOS'25) coefficients published with its code, SYSTEMS.md section 2:
// A100-40GB, 8 nodes x 8 GPUs, 400 Gb/s InfiniBand; whole model, fwd+bwd, ms. The
// parameter counts (2^30 numel) depend on the context (learned position embeddings).
constexpr ModelCoefficients kFlexSP192K[] = {
    {"gpt-7b", 5.128e-6, 0.1839576, 629.3563, 4.480, 7.117},
    {"gpt-13b", 9.2852e-6, 0.3060189, 1132.5632, 4.220, 13.116},
    {"gpt-30b", 15.4262e-6, 0.8035742, 2789.3644, 3.417, 31.525},
};
constexpr ModelCoefficients kFlexSP384K[] = {
    {"gpt-7b", 5.128e-6, 0.1839576, 629.3563, 4.480, 7.850},
    {"gpt-13b", 9.2852e-6, 0.3060189, 1132.5632, 4.220, 14.032},
    {"gpt-30b", 15.4262e-6, 0.8035742, 2789.3644, 3.417, 32.715},
};
// FlexSP's per-device all-to-all bandwidth bw[d] in GB/s (SYSTEMS.md section 2).
const std::vector<std::pair<int, double>> kFlexSPAllToAllGBPerS = {
    {2, 119.54}, {4, 104.07}, {8, 96.5}, {16, 10.33}, {32, 5.94}, {64, 4.87}};
constexpr double kFlexSPMemoryLimitGiB = 30.0;  // FlexSP: 30 * 1024 MB per GPU

std::vector<ProfiledCoefficients> flexsp_preset(const std::string& name,
                                                std::span<const ModelCoefficients> rows,
                                                const std::string& context) {
  std::vector<ProfiledCoefficients> sets;
  for (const ModelCoefficients& row : rows) {
    ProfiledCoefficients set;
    set.name = name;
    set.model_name = row.model_name;
    set.a1_ms_per_token2 = row.a1_ms_per_token2;
    set.a2_ms_per_token = row.a2_ms_per_token;
    set.b1_ms = row.b1_ms;
    set.activation_mib_per_token = row.activation_mib_per_token;
    set.parameters_gi = row.parameters_gi;
    set.memory_limit_gib = kFlexSPMemoryLimitGiB;
    set.all_to_all_gb_per_s = kFlexSPAllToAllGBPerS;
    set.provenance = fmt::format(
        "FlexSP (ASPLOS'25) profiled coefficients published with its code (SYSTEMS.md "
        "section 2): A100-40GB, 8 nodes x 8 GPUs, 400 Gb/s InfiniBand, max context {}; "
        "a1, a2, b1 are whole-model forward+backward ms, split 1:2 between the passes by "
        "ballast; memory limit 30 GB; bw[d] per-device all-to-all GB/s",
        context);
    sets.push_back(std::move(set));
  }
  return sets;
}

std::vector<std::string> profiled_preset_names() { return {"flexsp-a100-192k", "flexsp-a100-384k"}; }

std::vector<ProfiledCoefficients> profiled_preset(const std::string& name) {
  if (name == "flexsp-a100-192k") return flexsp_preset(name, kFlexSP192K, "192K");
  if (name == "flexsp-a100-384k") return flexsp_preset(name, kFlexSP384K, "384K");
  BALLAST_CHECK(false, "profiled_preset called with an unknown name");
  return {};
}

/// The spec JSON of one or more coefficient sets sharing name, memory limit and bw[d].
nlohmann::json profiled_spec(const std::vector<ProfiledCoefficients>& sets) {
  BALLAST_CHECK(!sets.empty(), "a profiled spec needs at least one coefficient set");
  const ProfiledCoefficients& first = sets.front();
  nlohmann::json table = nlohmann::json::array();
  for (const auto& [degree, gb_per_s] : first.all_to_all_gb_per_s) {
    table.push_back({{"degree", degree}, {"gb_per_s", gb_per_s}});
  }
  nlohmann::json models = nlohmann::json::array();
  for (const ProfiledCoefficients& set : sets) {
    models.push_back({{"model_name", set.model_name},
                      {"a1_ms_per_token2", set.a1_ms_per_token2},
                      {"a2_ms_per_token", set.a2_ms_per_token},
                      {"b1_ms", set.b1_ms},
                      {"activation_mib_per_token", set.activation_mib_per_token},
                      {"parameters_gi", set.parameters_gi}});
  }
  return {{"family", kProfiledFamily},
          {"name", first.name},
          {"memory_limit_gib", first.memory_limit_gib},
          {"all_to_all_gb_per_s", table},
          {"models", models},
          {"provenance", first.provenance}};
}

void require_positive(double value, const std::string& source, const std::string& field) {
  if (!(value > 0)) {
    throw InputError(fmt::format("{}: field '{}' must be > 0 (got {})", source, field, value));
  }
}

std::vector<std::pair<int, double>> parse_bandwidth_table(const nlohmann::json& spec,
                                                          const std::string& source) {
  const auto rows = required_field<nlohmann::json>(spec, "all_to_all_gb_per_s", source);
  if (!rows.is_array() || rows.empty()) {
    throw InputError(fmt::format(
        "{}: field 'all_to_all_gb_per_s' must be a non-empty array of "
        "{{\"degree\": d, \"gb_per_s\": bw}}", source));
  }
  std::vector<std::pair<int, double>> table;
  for (const nlohmann::json& row : rows) {
    const std::string row_source = source + ": all_to_all_gb_per_s entry";
    const int degree = required_field<int>(row, "degree", row_source);
    const double gb_per_s = required_field<double>(row, "gb_per_s", row_source);
    if (degree < 2) {
      throw InputError(fmt::format("{}: 'degree' must be >= 2 (got {})", row_source, degree));
    }
    require_positive(gb_per_s, row_source, "gb_per_s");
    if (!table.empty() && degree <= table.back().first) {
      throw InputError(fmt::format("{}: degrees must be increasing ({} after {})", row_source,
                                   degree, table.back().first));
    }
    table.emplace_back(degree, gb_per_s);
  }
  return table;
}

ProfiledCoefficients parse_model_coefficients(const nlohmann::json& row,
                                              ProfiledCoefficients shared,
                                              const std::string& source) {
  shared.model_name = required_field<std::string>(row, "model_name", source);
  const std::string row_source = source + " (model '" + shared.model_name + "')";
  shared.a1_ms_per_token2 = required_field<double>(row, "a1_ms_per_token2", row_source);
  shared.a2_ms_per_token = required_field<double>(row, "a2_ms_per_token", row_source);
  shared.b1_ms = required_field<double>(row, "b1_ms", row_source);
  shared.activation_mib_per_token = required_field<double>(row, "activation_mib_per_token", row_source);
  shared.parameters_gi = required_field<double>(row, "parameters_gi", row_source);
  require_positive(shared.a1_ms_per_token2, row_source, "a1_ms_per_token2");
  require_positive(shared.a2_ms_per_token, row_source, "a2_ms_per_token");
  if (!(shared.b1_ms >= 0)) {
    throw InputError(fmt::format("{}: field 'b1_ms' must be >= 0 (got {})", row_source, shared.b1_ms));
  }
  require_positive(shared.activation_mib_per_token, row_source, "activation_mib_per_token");
  require_positive(shared.parameters_gi, row_source, "parameters_gi");
  return shared;
}

/// Parses a profiled spec into one coefficient set per model; throws InputError.
std::vector<ProfiledCoefficients> parse_profiled_spec(const nlohmann::json& spec,
                                                      const std::string& source) {
  ProfiledCoefficients shared;
  shared.name = required_field<std::string>(spec, "name", source);
  shared.memory_limit_gib = required_field<double>(spec, "memory_limit_gib", source);
  require_positive(shared.memory_limit_gib, source, "memory_limit_gib");
  shared.all_to_all_gb_per_s = parse_bandwidth_table(spec, source);
  shared.provenance = optional_field<std::string>(spec, "provenance", "", source);
  const auto models = required_field<nlohmann::json>(spec, "models", source);
  if (!models.is_array() || models.empty()) {
    throw InputError(fmt::format("{}: field 'models' must be a non-empty array of coefficient "
                                 "sets, one per model", source));
  }
  std::vector<ProfiledCoefficients> sets;
  for (const nlohmann::json& row : models) sets.push_back(parse_model_coefficients(row, shared, source));
  return sets;
}

/// Checks the members of every object of the array spec[key] (other values are left to
/// the parser), naming each by its JSON path: "<source>: models[1]".
void reject_unknown_keys_in_rows(const nlohmann::json& spec, const char* key,
                                 std::span<const std::string_view> known_keys,
                                 const std::string& source) {
  const auto rows = spec.find(key);
  if (rows == spec.end() || !rows->is_array()) return;
  for (std::size_t i = 0; i < rows->size(); ++i) {
    reject_unknown_keys((*rows)[i], known_keys, fmt::format("{}: {}[{}]", source, key, i));
  }
}

/// "analytical" or "profiled"; throws InputError for anything else and for unknown keys.
std::string spec_family(const nlohmann::json& spec, const std::string& source) {
  reject_unknown_cost_model_keys(spec, source);
  const auto family = required_field<std::string>(spec, "family", source);
  if (family != kAnalytical && family != kProfiledFamily) {
    throw InputError(fmt::format("{}: field 'family' must be \"analytical\" or \"profiled\" "
                                 "(got \"{}\")", source, family));
  }
  return family;
}

}  // namespace

void reject_unknown_cost_model_keys(const nlohmann::json& spec, const std::string& source) {
  if (!spec.is_object()) return;
  const auto family = spec.find("family");
  if (family == spec.end() || *family == kProfiledFamily) {
    reject_unknown_keys(spec, kProfiledSpecKeys, source);
    reject_unknown_keys_in_rows(spec, "all_to_all_gb_per_s", kBandwidthRowKeys, source);
    reject_unknown_keys_in_rows(spec, "models", kCoefficientKeys, source);
  } else if (*family == kAnalytical) {
    reject_unknown_keys(spec, kAnalyticalSpecKeys, source);
  }
}

nlohmann::json ProfiledCostModel::spec() const { return profiled_spec({coefficients_}); }

std::vector<std::string> cost_model_names() {
  std::vector<std::string> names = {kAnalytical};
  for (const std::string& name : profiled_preset_names()) names.push_back(name);
  return names;
}

std::string cost_model_description(const std::string& name) {
  if (name == kAnalytical) {
    return "roofline from the cluster's GPU and link figures and the model's shapes: attention "
           "by causal tiles, linear layers by FLOPs, collectives by bandwidth and latency "
           "(docs/cost-model.md); any cluster, any model";
  }
  if (name == "flexsp-a100-192k" || name == "flexsp-a100-384k") {
    return fmt::format("FlexSP's published A100-40GB coefficients ({} context): quadratic "
                       "attention + linear per-token time, all-to-all bandwidth per degree, 30 GB "
                       "per GPU; for the models gpt-7b, gpt-13b and gpt-30b",
                       name == "flexsp-a100-192k" ? "192K" : "384K");
  }
  throw InputError(fmt::format("unknown cost model '{}'{}; known: {}", name,
                               did_you_mean(name, cost_model_names()),
                               fmt::join(cost_model_names(), ", ")));
}

nlohmann::json load_cost_model_spec(const std::string& name_or_file) {
  if (name_or_file == kAnalytical) return {{"family", kAnalytical}};
  const auto presets = profiled_preset_names();
  if (std::find(presets.begin(), presets.end(), name_or_file) != presets.end()) {
    return profiled_spec(profiled_preset(name_or_file));
  }
  if (std::filesystem::is_regular_file(name_or_file)) {
    nlohmann::json spec = read_json_file(name_or_file);
    if (spec_family(spec, name_or_file) == kProfiledFamily) parse_profiled_spec(spec, name_or_file);
    return spec;
  }
  throw InputError(fmt::format(
      "unknown cost model '{}'{}: not one of {} and not a JSON file; pick one of those or give "
      "the path of a cost model spec file",
      name_or_file, did_you_mean(name_or_file, cost_model_names()), fmt::join(cost_model_names(), ", ")));
}

std::unique_ptr<CostModel> make_cost_model(const nlohmann::json& spec, const Cluster& cluster,
                                           const Model& model) {
  const std::string source =
      "cost model spec" + (spec.is_object() && spec.contains("name") && spec["name"].is_string()
                               ? " '" + spec["name"].get<std::string>() + "'"
                               : std::string());
  if (spec_family(spec, source) == kAnalytical) {
    return std::make_unique<AnalyticalCostModel>(cluster, model);
  }
  const std::vector<ProfiledCoefficients> sets = parse_profiled_spec(spec, source);
  if (model.recompute == Recompute::full) {
    // The coefficients (time and activation bytes) were profiled without it.
    throw InputError(fmt::format(
        "profiled cost model {} was measured without full recomputation; use {} selective "
        "or {} analytical",
        sets.front().name, setting_name("--recompute"), setting_name("--cost-model")));
  }
  if (cluster.tensor_parallel.gpus > 1) {  // FlexSP profiled whole GPUs, without TP
    throw InputError(fmt::format(
        "{} {}: profiled cost model {} was measured without tensor parallelism, so it cannot "
        "price TP groups; use {} analytical or drop {}",
        setting_name("--tp"), cluster.tensor_parallel.gpus, sets.front().name,
        setting_name("--cost-model"), setting_name("--tp")));
  }
  std::vector<std::string> model_names;
  for (const ProfiledCoefficients& set : sets) {
    if (set.model_name == model.name) return std::make_unique<ProfiledCostModel>(cluster, model, set);
    model_names.push_back(set.model_name);
  }
  throw InputError(fmt::format(
      "profiled cost model {} has coefficients for {}, not {}; use {} analytical",
      sets.front().name, fmt::join(model_names, ", "), model.name, setting_name("--cost-model")));
}

}  // namespace ballast
