// Test helpers of tests/cost: what InputError an action throws, and the check that it
// names every part a user needs in one line.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "ballast/error.hpp"

namespace ballast::testing {

/// The InputError message of `action`, or "" when it throws none.
template <typename Action>
std::string input_error_message(Action action) {
  try {
    action();
  } catch (const InputError& error) {
    return error.what();
  }
  return "";
}

/// Expects an InputError whose one-line message contains every string in `parts`.
template <typename Action>
void expect_input_error(Action action, std::initializer_list<std::string> parts) {
  const std::string message = input_error_message(action);
  ASSERT_FALSE(message.empty()) << "expected an InputError";
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
  EXPECT_EQ(message.find('\n'), std::string::npos) << "message must be one line: " << message;
}

}  // namespace ballast::testing
