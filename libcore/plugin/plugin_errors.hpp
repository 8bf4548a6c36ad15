// The plugin side of the error protocol of plugin/cuda_plugin_abi.hpp: an
// entry point runs its body through guarded(), which turns any exception
// into a StatusCode value and keeps the message for last_error().
#pragma once

#include <exception>
#include <string>

#include "base/status.hpp"

namespace concord::plugin {

// The calling thread's last failure message in this plugin.
const char* last_error() noexcept;
void set_last_error(std::string message) noexcept;

template <class Body>
int guarded(Body&& body) noexcept {
  try {
    body();
    return 0;
  } catch (const Error& e) {
    set_last_error(e.what());
    return static_cast<int>(e.code());
  } catch (const std::bad_alloc&) {
    set_last_error("out of host memory");
    return static_cast<int>(StatusCode::kOutOfMemory);
  } catch (const std::exception& e) {
    set_last_error(e.what());
    return static_cast<int>(StatusCode::kInternal);
  } catch (...) {
    set_last_error("unknown exception in the CUDA plugin");
    return static_cast<int>(StatusCode::kInternal);
  }
}

}  // namespace concord::plugin
