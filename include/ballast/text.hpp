// Small text helpers shared by messages and reports.
#pragma once

#include <cstdint>
#include <string>

namespace ballast {

/// 37120 -> "37,120": a fixed separator, so messages never depend on the locale.
std::string with_thousands(std::int64_t value);

}  // namespace ballast
