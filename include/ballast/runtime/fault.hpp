// Test-only fault injection for `ballast run` (docs/runtime.md, "Fault injection"):
// BALLAST_FAULT=RANK:STEP:throw|kill|corrupt[:step|attention] makes one rank fail at one
// step, so tests can check that a failing or dying rank takes the whole job down, with a
// message naming it, instead of leaving the other ranks blocked in MPI, and that a rank
// whose gradients are wrong fails `ballast run --check`.
#pragma once

#include <optional>
#include <string>

namespace ballast::runtime {

/// The environment variable the run driver (driver::prepare_run) reads once per run.
inline constexpr const char* kFaultVariable = "BALLAST_FAULT";

struct FaultInjection {
  enum class Action {
    throw_error,  ///< throw std::runtime_error: the rank's normal error path runs
    kill,         ///< SIGKILL itself: no unwinding, no message (like the OOM killer)
    corrupt,      ///< scale this rank's gradients by 1 + kCorruptGradientScale before the sync
  };
  enum class Phase {
    step_start,  ///< at the start of the step, before its first MPI call (others block in a collective)
    attention,   ///< inside the step's first attention, with point-to-point messages in flight
  };
  int rank = 0;
  int step = 0;  ///< the run's step index, counting from 0
  Action action = Action::throw_error;
  Phase phase = Phase::step_start;
  std::string spec;  ///< the variable's value, quoted in messages
};

/// What `corrupt` adds to the rank's gradients, relatively: far above --check's tolerance
/// (driver::kCheckTolerance), as a scheme that summed the wrong blocks would be.
inline constexpr float kCorruptGradientScale = 1e-3f;

/// Parses a BALLAST_FAULT value "RANK:STEP:throw|kill|corrupt[:step|attention]" (phase
/// default: step; corrupt acts after the step's last backward, whatever the phase). Throws InputError naming the variable and the expected form.
FaultInjection parse_fault(const std::string& text);

/// BALLAST_FAULT from the environment; nullopt when it is unset or empty.
std::optional<FaultInjection> fault_from_environment();

/// Fails this rank as `fault` says: throws std::runtime_error naming the fault and
/// `where` it fired (e.g. "in a ring shift, messages in flight"), or sends SIGKILL to
/// this process.
[[noreturn]] void trigger_fault(const FaultInjection& fault, const char* where);

}  // namespace ballast::runtime
