// setting_name: messages name a setting by the CLI flag in the CLI (the default) and by
// the keyword argument in Python, through one table; a sampler message under both.
#include <gtest/gtest.h>

#include <string>

#include "ballast/error.hpp"
#include "ballast/workload.hpp"

namespace ballast {
namespace {

/// Sets the frontend for one test and puts the CLI back after it.
class FrontendScope {
 public:
  explicit FrontendScope(Frontend frontend) { set_frontend(frontend); }
  ~FrontendScope() { set_frontend(Frontend::cli); }
  FrontendScope(const FrontendScope&) = delete;
  FrontendScope& operator=(const FrontendScope&) = delete;
};

std::string zero_context_message() {
  SamplerOptions options;
  options.batch_size = 1;
  options.max_context_tokens = 0;
  Dataset dataset;
  dataset.name = "test";
  dataset.lengths_tokens = {5, 10};
  try {
    BatchSampler sampler(dataset, options);
  } catch (const InputError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected an InputError";
  return "";
}

TEST(SettingName, TheCliFlagByDefault) {
  EXPECT_EQ(current_frontend(), Frontend::cli);
  EXPECT_EQ(setting_name("--max-context"), "--max-context");
  EXPECT_EQ(setting_name("--degree"), "--degree");
  EXPECT_EQ(zero_context_message(), "--max-context must be positive, got 0");
}

TEST(SettingName, ThePythonKeywordInPython) {
  const FrontendScope python(Frontend::python);
  EXPECT_EQ(setting_name("--max-context"), "max_context_tokens");
  EXPECT_EQ(setting_name("--tokens-per-step"), "tokens_per_step");
  EXPECT_EQ(setting_name("--sampling"), "order");
  EXPECT_EQ(setting_name("--nodes"), "nodes");
  EXPECT_EQ(setting_name("--degree"), "strategy parameter degree");
  EXPECT_EQ(setting_name("--tp"), "tensor_parallel");
  EXPECT_EQ(zero_context_message(), "max_context_tokens must be positive, got 0");
}

TEST(SettingName, AnUnknownFlagIsABug) {
  EXPECT_THROW(setting_name("--no-such-flag"), InternalError);
  const FrontendScope python(Frontend::python);
  EXPECT_THROW(setting_name("max_context_tokens"), InternalError);
}

}  // namespace
}  // namespace ballast
