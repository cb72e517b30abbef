// Error types and the always-on internal check used across ballast.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace ballast {

/// Bad input from the user: a file, a flag, a plan, a length the cluster cannot hold.
/// The message names the input and says what to do (a setting through setting_name()).
/// The CLI prints it and exits 2; the Python module raises ValueError.
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

/// Who shows ballast's messages to the user: the `ballast` command line (the default) or
/// the Python module, which names settings by their keyword arguments.
enum class Frontend { cli, python };

/// Sets the frontend for the whole process; the Python module calls it once when imported.
void set_frontend(Frontend frontend);
Frontend current_frontend();

/// How a message names the setting the CLI sets with `cli_flag` (e.g. "--max-context"):
/// the flag itself in the CLI, the keyword argument of the Python API in Python
/// ("max_context_tokens"). An unknown flag is an InternalError: every flag a library
/// message names is in the table in src/common/error.cpp.
std::string setting_name(std::string_view cli_flag);

/// What to do about a sequence too long for a strategy or cluster: in the CLI "lower
/// --max-context" (the sampler drops or splits what is longer, --over-context); in Python,
/// whose plan() plans every length it is given (max_context_tokens drops none), "give
/// shorter lengths".
std::string shorter_sequences_advice();

[[noreturn]] void fail_check(const char* condition, const char* file, int line,
                             const std::string& message);

}  // namespace ballast

/// Always-on internal invariant check (never compiled out); throws InternalError with
/// file:line. Use InputError, not this, for anything a user can cause.
#define BALLAST_CHECK(condition, message)                                     \
  do {                                                                        \
    if (!(condition)) ::ballast::fail_check(#condition, __FILE__, __LINE__, (message)); \
  } while (0)
