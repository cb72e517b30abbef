// Error types and the always-on internal check used across ballast.
#pragma once

#include <stdexcept>
#include <string>

namespace ballast {

/// Bad input from the user: a file, a flag, a plan, a length the cluster cannot hold.
/// The message names the input and says what to do. The CLI prints it and exits 2;
/// the Python module raises ValueError.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A strategy cannot run a batch (for example a sequence that does not fit its fixed
/// degree). The message names the sequence and why.
class PlanningError : public InputError {
 public:
  using InputError::InputError;
};

/// A broken internal invariant (a bug in ballast, not bad input). Carries file:line.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void fail_check(const char* condition, const char* file, int line,
                             const std::string& message);

}  // namespace ballast

/// Always-on internal invariant check (never compiled out); throws InternalError with
/// file:line. Use InputError, not this, for anything a user can cause.
#define BALLAST_CHECK(condition, message)                                     \
  do {                                                                        \
    if (!(condition)) ::ballast::fail_check(#condition, __FILE__, __LINE__, (message)); \
  } while (0)
