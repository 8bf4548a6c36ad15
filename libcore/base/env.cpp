#include "base/env.hpp"

#include <cstdlib>

#include "base/format.hpp"

namespace concord::env {

std::optional<std::string> get(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::optional<long long> get_int(const char* name) {
  auto text = get(name);
  if (!text) return std::nullopt;
  char* end = nullptr;
  long long value = std::strtoll(text->c_str(), &end, 10);
  if (end == text->c_str() || *end != '\0')
    invalid_argument("environment variable ", name, "='", *text, "' is not an integer");
  return value;
}

std::optional<double> get_double(const char* name) {
  auto text = get(name);
  if (!text) return std::nullopt;
  char* end = nullptr;
  double value = std::strtod(text->c_str(), &end);
  if (end == text->c_str() || *end != '\0')
    invalid_argument("environment variable ", name, "='", *text, "' is not a number");
  return value;
}

}  // namespace concord::env
