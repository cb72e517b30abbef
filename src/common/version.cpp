// version(): BALLAST_VERSION_STRING comes from project(VERSION) (src/common/CMakeLists.txt).
#include "ballast/version.hpp"

namespace ballast {

const char* version() { return BALLAST_VERSION_STRING; }

}  // namespace ballast
