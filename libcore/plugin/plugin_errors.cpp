#include "plugin/plugin_errors.hpp"

#include <utility>

namespace concord::plugin {

namespace {
thread_local std::string t_last_error;
}

const char* last_error() noexcept { return t_last_error.c_str(); }

void set_last_error(std::string message) noexcept {
  try {
    t_last_error = std::move(message);
  } catch (...) {
    t_last_error.clear();
  }
}

}  // namespace concord::plugin
