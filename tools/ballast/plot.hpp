// --plot FILE of `ballast compare` and `ballast simulate`: the checks made before any
// long work, and drawing through tools/plot.py (matplotlib, run by /usr/bin/python3),
// which keeps the plotting dependency out of the library and the unit tests.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace ballast::cli {

/// The folder holding plot.py: $BALLAST_TOOLS_DIR if set, else the source tree's tools/.
std::string tools_dir();

/// The Python that runs plot.py: $BALLAST_PYTHON if set, else /usr/bin/python3.
std::string plot_python();

/// Whether `path` can be written, without creating it: an existing file that is
/// writable, or a new name in a writable folder.
bool can_write(const std::string& path);

/// Checks `--plot path` of `ballast <command>` before the command's work starts: the
/// extension (.svg or .png), that the file can be written, that plot.py exists and that
/// the Python imports matplotlib. Throws InputError (exit code 2) naming the fix, e.g.
/// "ballast compare --plot needs matplotlib: sudo apt-get install python3-matplotlib".
void check_plot_target(const std::string& command, const std::string& path);

/// Writes `input` to a temporary JSON file and runs `python3 plot.py kind IN path`
/// (kind "compare": input is compare's JSON; kind "timeline": timeline_json()).
/// Throws std::runtime_error when plot.py fails after check_plot_target() passed.
void draw_plot(const std::string& kind, const nlohmann::ordered_json& input,
               const std::string& path);

}  // namespace ballast::cli
