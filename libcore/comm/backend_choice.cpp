#include "comm/backend_choice.hpp"

#include <array>
#include <string>

#include "base/format.hpp"

namespace concord {
namespace {

struct Named {
  BackendChoice choice;
  const char* name;
};
constexpr std::array<Named, 4> kChoices{{{BackendChoice::kAuto, "auto"},
                                         {BackendChoice::kShm, "shm"},
                                         {BackendChoice::kGloo, "gloo"},
                                         {BackendChoice::kNccl, "nccl"}}};

}  // namespace

BackendChoice backend_choice_from_name(std::string_view name) {
  for (const Named& named : kChoices)
    if (name == named.name) return named.choice;
  invalid_argument("unknown backend '", std::string(name),
                   "'; choose 'auto', 'shm', 'gloo' or 'nccl'");
}

const char* backend_choice_name(BackendChoice choice) noexcept {
  for (const Named& named : kChoices)
    if (choice == named.choice) return named.name;
  return "unknown";
}

}  // namespace concord
