// BALLAST_FAULT (fault.hpp): test-only injection of a throwing or SIGKILLed rank.
#include "ballast/runtime/fault.hpp"

#include <fmt/format.h>

#include <charconv>
#include <csignal>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include <unistd.h>

#include "ballast/error.hpp"

namespace ballast::runtime {

namespace {

std::vector<std::string> split_colons(const std::string& text) {
  std::vector<std::string> fields(1);
  for (char c : text) {
    if (c == ':') {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  return fields;
}

int parse_index(const std::string& field, const std::string& text, const char* what) {
  int value = -1;
  const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (field.empty() || error != std::errc() || end != field.data() + field.size() || value < 0) {
    throw InputError(fmt::format("{}={}: {} '{}' is not a non-negative integer; expected "
                                 "RANK:STEP:throw|kill[:step|attention]",
                                 kFaultVariable, text, what, field));
  }
  return value;
}

}  // namespace

FaultInjection parse_fault(const std::string& text) {
  const std::vector<std::string> fields = split_colons(text);
  if (fields.size() != 3 && fields.size() != 4) {
    throw InputError(fmt::format("{}={}: expected RANK:STEP:throw|kill|corrupt[:step|attention] "
                                 "(test-only fault injection, docs/runtime.md)",
                                 kFaultVariable, text));
  }
  FaultInjection fault;
  fault.spec = text;
  fault.rank = parse_index(fields[0], text, "rank");
  fault.step = parse_index(fields[1], text, "step");
  if (fields[2] == "throw") {
    fault.action = FaultInjection::Action::throw_error;
  } else if (fields[2] == "kill") {
    fault.action = FaultInjection::Action::kill;
  } else if (fields[2] == "corrupt") {
    fault.action = FaultInjection::Action::corrupt;
  } else {
    throw InputError(fmt::format("{}={}: action '{}' is not throw, kill or corrupt", kFaultVariable, text,
                                 fields[2]));
  }
  if (fields.size() == 4) {
    if (fields[3] == "step") {
      fault.phase = FaultInjection::Phase::step_start;
    } else if (fields[3] == "attention") {
      fault.phase = FaultInjection::Phase::attention;
    } else {
      throw InputError(fmt::format("{}={}: phase '{}' is not step or attention", kFaultVariable,
                                   text, fields[3]));
    }
  }
  return fault;
}

std::optional<FaultInjection> fault_from_environment() {
  const char* value = std::getenv(kFaultVariable);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return parse_fault(value);
}

void trigger_fault(const FaultInjection& fault, const char* where) {
  if (fault.action == FaultInjection::Action::kill) {
    kill(getpid(), SIGKILL);
    std::_Exit(137);  // not reached: SIGKILL cannot be caught
  }
  throw std::runtime_error(fmt::format("fault injected by {}={} (rank {}, step {}, {})", kFaultVariable,
                                       fault.spec, fault.rank, fault.step, where));
}

}  // namespace ballast::runtime
