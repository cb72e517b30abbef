// --plot FILE: extension and dependency checks, a temporary JSON input, and one run of
// tools/plot.py per plot (posix_spawn, no shell, so paths need no quoting).
#include "plot.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "ballast/error.hpp"

extern char** environ;

namespace ballast::cli {

namespace {

/// plot.py's exit code when the Python lacks matplotlib (tools/plot.py: kExitNoMatplotlib).
constexpr int kPlotExitNoMatplotlib = 4;
/// What a shell reports for a program it cannot run; used here when posix_spawn fails.
constexpr int kExitCannotRun = 127;

/// Runs argv (argv[0] looked up in PATH when it has no slash) and returns its exit code;
/// kExitCannotRun when it cannot be started, 128 + signal when killed.
int run_process(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, args[0], nullptr, nullptr, args.data(), environ) != 0) {
    return kExitCannotRun;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return kExitCannotRun;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string plot_script() { return tools_dir() + "/plot.py"; }

std::string lower_extension(const std::string& path) {
  std::string extension = std::filesystem::path(path).extension().string();
  for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return extension;
}

/// A temporary file that is removed when this goes out of scope.
class TemporaryJson {
 public:
  TemporaryJson() {
    const char* directory = std::getenv("TMPDIR");
    path_ = fmt::format("{}/ballast-plot-XXXXXX.json",
                        directory != nullptr && directory[0] != '\0' ? directory : "/tmp");
    const int fd = mkstemps(path_.data(), 5);
    if (fd < 0) {
      throw InputError(fmt::format("--plot: cannot create a temporary file {}; set TMPDIR to a "
                                   "writable folder",
                                   path_));
    }
    close(fd);
  }
  ~TemporaryJson() { std::remove(path_.c_str()); }
  TemporaryJson(const TemporaryJson&) = delete;
  TemporaryJson& operator=(const TemporaryJson&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

/// Whether `path` can be written, without creating it: an existing file that is writable,
/// or a new name in a writable folder.
bool can_write(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::exists(path, error)) {
    return !fs::is_directory(path, error) && access(path.c_str(), W_OK) == 0;
  }
  fs::path folder = fs::path(path).parent_path();
  if (folder.empty()) folder = ".";
  return fs::is_directory(folder, error) && access(folder.c_str(), W_OK) == 0;
}

std::string tools_dir() {
  const char* from_environment = std::getenv("BALLAST_TOOLS_DIR");
  if (from_environment != nullptr && from_environment[0] != '\0') return from_environment;
  return BALLAST_DEFAULT_TOOLS_DIR;
}

std::string plot_python() {
  const char* from_environment = std::getenv("BALLAST_PYTHON");
  if (from_environment != nullptr && from_environment[0] != '\0') return from_environment;
  return "/usr/bin/python3";
}

namespace {

bool python_from_environment() {
  const char* from_environment = std::getenv("BALLAST_PYTHON");
  return from_environment != nullptr && from_environment[0] != '\0';
}

/// How messages name the Python: "BALLAST_PYTHON=PATH" when the environment chose it (the
/// setting to fix), else the default's path.
std::string python_named() {
  return python_from_environment() ? "BALLAST_PYTHON=" + plot_python() : plot_python();
}

/// What to do about a Python that cannot run plot.py.
std::string python_fix() {
  return python_from_environment()
             ? "set BALLAST_PYTHON to a python3 with matplotlib, or unset it for /usr/bin/python3"
             : "set BALLAST_PYTHON to a python3 with matplotlib";
}

}  // namespace

void check_plot_target(const std::string& command, const std::string& path) {
  const std::string extension = lower_extension(path);
  if (extension != ".svg" && extension != ".png") {
    throw InputError(fmt::format("--plot {}: unknown image format '{}'; use a file name ending "
                                 "in .svg or .png",
                                 path, extension));
  }
  if (!can_write(path)) {
    throw InputError(fmt::format("--plot {}: cannot write this file; check the path", path));
  }
  if (!std::filesystem::is_regular_file(plot_script())) {
    throw InputError(fmt::format("--plot: {} not found; set BALLAST_TOOLS_DIR to the folder "
                                 "holding plot.py (ballast's tools/)",
                                 plot_script()));
  }
  const std::string python = plot_python();
  const int code = run_process({python, plot_script(), "check"});
  if (code == kExitCannotRun) {
    throw InputError(fmt::format("ballast {} --plot needs python3 with matplotlib ({} cannot "
                                 "run): sudo apt-get install python3-matplotlib, or {}",
                                 command, python_named(), python_fix()));
  }
  if (code == kPlotExitNoMatplotlib) {
    throw InputError(fmt::format("ballast {} --plot needs matplotlib ({} cannot import it): "
                                 "sudo apt-get install python3-matplotlib",
                                 command, python_named()));
  }
  if (code != 0) {  // a Python that runs but fails (BALLAST_PYTHON=/bin/false): a setting
    throw InputError(fmt::format("ballast {} --plot: {} failed to run {} check (exit code {}); {}",
                                 command, python_named(), plot_script(), code, python_fix()));
  }
}

void draw_plot(const std::string& kind, const nlohmann::ordered_json& input,
               const std::string& path) {
  const TemporaryJson json_file;
  {
    std::ofstream out(json_file.path(), std::ios::binary | std::ios::trunc);
    out << input.dump() << '\n';
    if (!out) throw InputError(fmt::format("--plot: cannot write {}", json_file.path()));
  }
  const int code = run_process({plot_python(), plot_script(), kind, json_file.path(), path});
  if (code != 0 && python_from_environment()) {  // passed the check, then failed
    throw InputError(fmt::format("--plot {}: {} failed to run {} {} (exit code {}); {}", path,
                                 python_named(), plot_script(), kind, code, python_fix()));
  }
  if (code != 0) {  // the default Python passed the check: plot.py failed on ballast's input
    throw std::runtime_error(
        fmt::format("{} {} {} exited with {}", plot_python(), plot_script(), kind, code));
  }
}

}  // namespace ballast::cli
