// Shared by the FlexSP tests: real preset cost models and a seeded uniform draw.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ballast/cost_model.hpp"
#include "ballast/workload.hpp"

namespace ballast::strategies::flexsp::testing {

/// A cost model from presets, e.g. ("flexsp-a100-192k", "a100-ib400", 8, "gpt-7b").
inline std::unique_ptr<CostModel> preset_cost(const std::string& cost_model,
                                              const std::string& cluster, int nodes,
                                              const std::string& model) {
  return make_cost_model(load_cost_model_spec(cost_model), load_cluster(cluster, nodes),
                         load_model(model));
}

/// Uniform in [0, 1) from the sampler's splitmix64 stream (53 random bits).
inline double uniform01(std::uint64_t& state) {
  return static_cast<double>(splitmix64_next(state) >> 11) * 0x1.0p-53;
}

}  // namespace ballast::strategies::flexsp::testing
