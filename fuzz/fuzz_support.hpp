// Shared by the libFuzzer targets: what counts as a clean rejection and what is a finding.
// InputError (and PlanningError, which derives from it) is ballast telling the user that
// the input is bad: a clean rejection. Anything else escaping (InternalError, another
// std::exception, a JSON library error) or a broken property checked by FUZZ_REQUIRE is a
// finding: it is printed and the process aborts, so libFuzzer saves the reproducer.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <typeinfo>

#include <unistd.h>

#include "ballast/error.hpp"

namespace ballast::fuzz {

[[noreturn]] inline void report_finding(const std::string& what) {
  std::fprintf(stderr, "\n==== ballast fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

/// Runs one input's work: InputError returns normally, anything else is a finding.
template <typename Body>
int run_one_input(Body&& body) {
  try {
    body();
  } catch (const InputError&) {
    // A clean rejection: the input is bad and ballast said so.
  } catch (const InternalError& error) {
    report_finding(std::string("InternalError (broken invariant): ") + error.what());
  } catch (const std::exception& error) {
    report_finding(std::string("unexpected exception ") + typeid(error).name() + ": " +
                   error.what());
  } catch (...) {
    report_finding("unexpected non-std exception");
  }
  return 0;
}

/// The input written to a per-process file for readers that take a path
/// ("ballast-fuzz-<kind>-<pid>" in /dev/shm when it exists, else the temporary folder),
/// removed when this goes out of scope (libFuzzer ends with _Exit: no atexit cleanup).
class ScratchFile {
 public:
  ScratchFile(const std::string& kind, const std::uint8_t* data, std::size_t size) {
    std::error_code ignored;
    const std::filesystem::path folder = std::filesystem::is_directory("/dev/shm", ignored)
                                             ? std::filesystem::path("/dev/shm")
                                             : std::filesystem::temp_directory_path();
    path_ = (folder / ("ballast-fuzz-" + kind + "-" + std::to_string(getpid()))).string();
    std::FILE* file = std::fopen(path_.c_str(), "wb");
    if (file == nullptr) report_finding("cannot create the scratch file " + path_);
    const std::size_t written = size == 0 ? 0 : std::fwrite(data, 1, size, file);
    if (std::fclose(file) != 0 || written != size) report_finding("cannot write " + path_);
  }
  ~ScratchFile() { std::remove(path_.c_str()); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace ballast::fuzz

/// A property every accepted input must have; its violation is a finding.
#define FUZZ_REQUIRE(condition, message)                                                  \
  do {                                                                                    \
    if (!(condition)) {                                                                   \
      ::ballast::fuzz::report_finding(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                                      ": " #condition ": " + (message));                  \
    }                                                                                     \
  } while (0)
