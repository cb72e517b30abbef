// with_thousands: integer formatting for messages and reports.
#include "ballast/text.hpp"

#include <cstdint>

namespace ballast {

std::string with_thousands(std::int64_t value) {
  // Unsigned negation: well defined even for the most negative value.
  const auto magnitude = value < 0 ? 0 - static_cast<std::uint64_t>(value)
                                   : static_cast<std::uint64_t>(value);
  const std::string digits = std::to_string(magnitude);
  std::string grouped = value < 0 ? "-" : "";
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) grouped += ',';
    grouped += digits[i];
  }
  return grouped;
}

}  // namespace ballast
