#include "comm/gloo/store_adapter.hpp"

#include <cctype>

#include "base/format.hpp"
#include "base/interrupt.hpp"
#include "rendezvous/store.hpp"

namespace concord::gloo {

StoreAdapter::StoreAdapter(SharedStore& store, std::string prefix, double timeout_s,
                           const SetupAgreement& setup, std::vector<int> names)
    : store_(store), prefix_(std::move(prefix)), timeout_s_(timeout_s), setup_(setup),
      names_(std::move(names)) {}

void StoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  std::lock_guard lock(store_.mutex);
  store_.client->set(full(key), std::string(data.begin(), data.end()));
}

std::vector<char> StoreAdapter::get(const std::string& key) {
  wait({key});
  std::lock_guard lock(store_.mutex);
  const std::string value = store_.client->get(full(key), std::chrono::duration<double>(0));
  return {value.begin(), value.end()};
}

void StoreAdapter::wait(const std::vector<std::string>& keys) {
  std::vector<std::string> full_keys;
  for (const auto& key : keys) full_keys.push_back(full(key));
  const bool found = wait_for_keys(store_, full_keys, deadline_after(timeout_s_), [&] {
    setup_.check_peers();
    throw_if_interrupted("gloo set-up");
  });
  if (found) return;
  // Gloo's keys end in the rank that publishes them ("rank_3", "3").
  std::vector<int> missing;
  for (const auto& key : keys) {
    std::size_t digits = key.size();
    while (digits > 0 && std::isdigit(static_cast<unsigned char>(key[digits - 1]))) --digits;
    if (digits < key.size()) missing.push_back(names_.at(std::stoul(key.substr(digits))));
  }
  fail(StatusCode::kTimeout, "gloo set-up timed out after ", timeout_s_,
       " s; not heard from ranks [", rank_list(missing), "]");
}

// Gloo passes the context's timeout, which is the communicator's.
void StoreAdapter::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) {
  wait(keys);
}

}  // namespace concord::gloo
