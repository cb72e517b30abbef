// ballast's version: project(VERSION) in the top-level CMakeLists.txt, the one place it is
// written. `ballast --version`, ballast.__version__ and every plan file's "ballast_version"
// carry this string.
#pragma once

namespace ballast {

/// "0.1.0": the version of this build.
const char* version();

}  // namespace ballast
