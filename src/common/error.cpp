// fail_check: the throwing half of BALLAST_CHECK.
#include "ballast/error.hpp"

#include <fmt/format.h>

namespace ballast {

void fail_check(const char* condition, const char* file, int line, const std::string& message) {
  throw InternalError(fmt::format("internal error at {}:{}: check `{}` failed: {}", file, line,
                                  condition, message));
}

}  // namespace ballast
