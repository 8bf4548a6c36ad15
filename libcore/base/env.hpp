// Typed reads of environment variables.
#pragma once

#include <optional>
#include <string>

namespace concord::env {

std::optional<std::string> get(const char* name);        // unset or empty -> nullopt
std::optional<long long> get_int(const char* name);     // throws InvalidArgument if not an integer
std::optional<double> get_double(const char* name);     // throws InvalidArgument if not a number

}  // namespace concord::env
