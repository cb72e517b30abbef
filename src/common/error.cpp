// fail_check (the throwing half of BALLAST_CHECK) and the frontend-dependent names of
// settings in messages (setting_name).
#include "ballast/error.hpp"

#include <array>
#include <atomic>
#include <utility>

#include <fmt/format.h>

namespace ballast {

namespace {

// Process-wide: one frontend per process (the CLI's main, or the Python module's import).
std::atomic<Frontend> current_frontend_value{Frontend::cli};

/// Each CLI flag a library message names, and what sets it from Python: the keyword
/// argument of ballast.sample_batches / plan / tensor_parallel_units / Cluster.load /
/// Cluster.emulated, or the strategy spec's parameter ("static-cp:degree=4") where Python
/// has no keyword.
constexpr std::array<std::pair<std::string_view, std::string_view>, 14> kPythonSettingNames{{
    {"--steps", "steps"},
    {"--seed", "seed"},
    {"--max-context", "max_context_tokens"},
    {"--tokens-per-step", "tokens_per_step"},
    {"--batch-size", "batch_size"},
    {"--sampling", "order"},
    {"--over-context", "over_context"},
    {"--nodes", "nodes"},
    {"--cost-model", "cost_model"},
    {"--gpus-per-node", "gpus_per_node"},
    {"--degree", "strategy parameter degree"},
    {"--grad-sync", "grad_sync"},
    {"--recompute", "Model.recompute"},
    {"--tp", "tensor_parallel"},
}};

}  // namespace

void set_frontend(Frontend frontend) { current_frontend_value.store(frontend); }

Frontend current_frontend() { return current_frontend_value.load(); }

std::string setting_name(std::string_view cli_flag) {
  for (const auto& [flag, python_name] : kPythonSettingNames) {
    if (flag == cli_flag) {
      return std::string(current_frontend() == Frontend::python ? python_name : flag);
    }
  }
  fail_check("cli_flag is in kPythonSettingNames", __FILE__, __LINE__,
             fmt::format("no Python name for the flag '{}'", cli_flag));
}

std::string shorter_sequences_advice() {
  if (current_frontend() == Frontend::python) {
    return "give shorter lengths (plan() plans every length it is given; max_context_tokens "
           "drops none)";
  }
  return "lower --max-context";
}

void fail_check(const char* condition, const char* file, int line, const std::string& message) {
  throw InternalError(fmt::format("internal error at {}:{}: check `{}` failed: {}", file, line,
                                  condition, message));
}

}  // namespace ballast
