// Shared by the workload tests: temp files, InputError messages, small datasets.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "ballast/error.hpp"
#include "ballast/workload.hpp"

namespace ballast {

// Checks that `text` contains `part`, printing the whole text when it does not.
#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

/// Writes `contents` to a fresh file in the test temp folder and returns its path. The
/// process id keeps concurrent test runs (ctest -j, other build folders) apart.
inline std::string write_temp_file(const std::string& name, const std::string& contents) {
  const std::string path =
      ::testing::TempDir() + "ballast_workload_" + std::to_string(getpid()) + "_" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  return path;
}

/// The message of the InputError `action` throws, or "" (and a test failure) if none.
inline std::string input_error_message(const std::function<void()>& action) {
  try {
    action();
  } catch (const InputError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected an InputError";
  return "";
}

inline std::string read_error(const std::string& name, const std::string& contents) {
  const std::string path = write_temp_file(name, contents);
  return input_error_message([&] { read_lengths_file(path); });
}

inline const std::string kBundledLengths = std::string(BALLAST_SOURCE_DIR) + "/data/lengths/";

/// Bundled datasets are read once per test binary (wikipedia has 1M lines).
inline const Dataset& bundled(const std::string& name) {
  static std::map<std::string, Dataset> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, load_dataset(name)).first;
  return it->second;
}

inline Dataset lengths_dataset(std::vector<Tokens> lengths) {
  Dataset dataset;
  dataset.name = "test";
  dataset.lengths_tokens = std::move(lengths);
  return dataset;
}

inline SamplerOptions sequential_documents(std::int64_t batch_size, std::uint64_t seed = 0) {
  SamplerOptions options;
  options.batch_size = batch_size;
  options.order = SamplingOrder::sequential;
  options.seed = seed;
  return options;
}

}  // namespace ballast
