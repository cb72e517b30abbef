// bound_adversary: the lower bound's long adversarial run (docs/simulator.md section 7,
// "Checked by an adversary"). Usage: bound_adversary [--simulations N] [--seed S]
// [--findings FOLDER]. Prints what it simulated and the closest a plan came to its bound;
// exits 1 when a valid plan simulated below its bound (each printed, plans in FOLDER).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "sim/bound_adversary.hpp"

int main(int argc, char** argv) {
  ballast::testing::AdversaryOptions options;
  options.simulations = 100'000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    try {
      if (flag == "--simulations") {
        options.simulations = std::stoll(value);
      } else if (flag == "--seed") {
        options.seed = std::stoull(value);
      } else if (flag == "--findings") {
        options.findings_folder = value;
      } else {
        std::fprintf(stderr, "bound_adversary: unknown flag %s; use --simulations N, --seed S, --findings FOLDER\n", flag.c_str());
        return 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "bound_adversary: %s %s is not a number\n", flag.c_str(), value.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "bound_adversary: %s needs a value\n", argv[argc - 1]);
    return 2;
  }
  const ballast::testing::AdversaryResult result = ballast::testing::search_below_bounds(options);
  std::printf("bound_adversary: seed %llu: %lld valid plans simulated (%lld starts from strategies' plans, "
              "%lld settings without a plan, %lld mutated plans invalid), %zu below their bound\n",
              static_cast<unsigned long long>(options.seed), static_cast<long long>(result.simulated),
              static_cast<long long>(result.starts), static_cast<long long>(result.starts_rejected),
              static_cast<long long>(result.invalid), result.findings.size());
  std::printf("closest to its bound: step / bound = %.6f, %s\n", result.closest_ratio, result.closest.c_str());
  for (const std::string& finding : result.findings) std::printf("FINDING: %s\n", finding.c_str());
  return result.findings.empty() ? 0 : 1;
}
