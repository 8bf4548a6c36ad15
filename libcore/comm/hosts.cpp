#include "comm/hosts.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iomanip>

#include "base/digest.hpp"
#include "base/env.hpp"
#include "base/status.hpp"
#include "base/format.hpp"
#include "rendezvous/store.hpp"

namespace concord {
namespace {

void mix_file_identity(Digest& digest, const char* path) {
  struct stat st {};
  if (stat(path, &st) == 0) digest.mix(st.st_dev).mix(st.st_ino);
}

// The list travels as one value: each identity as its length, ':', itself
// (an identity set through CONCORD_HOST_ID may hold any byte).
std::string encode_hosts(const std::vector<std::string>& hosts) {
  std::string out;
  for (const auto& host : hosts) out += concat(host.size(), ":", host);
  return out;
}

std::vector<std::string> decode_hosts(const std::string& value, int size) {
  std::vector<std::string> hosts;
  std::size_t at = 0;
  while (at < value.size()) {
    const std::size_t colon = value.find(':', at);
    if (colon == std::string::npos) break;
    const std::size_t length = std::stoul(value.substr(at, colon - at));
    if (colon + 1 + length > value.size()) break;
    hosts.push_back(value.substr(colon + 1, length));
    at = colon + 1 + length;
  }
  if (at != value.size() || hosts.size() != static_cast<std::size_t>(size))
    throw Error(StatusCode::kInternal,
                concat("the list of hosts read from the store is malformed (", hosts.size(),
                       " of ", size, " ranks' hosts decoded)"));
  return hosts;
}

}  // namespace

std::string host_identity() {
  if (auto id = env::get("CONCORD_HOST_ID")) return *id;
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) name[0] = '\0';
  Digest digest;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  for (std::string boot_id; std::getline(boot, boot_id);)
    for (char c : boot_id) digest.mix(static_cast<unsigned char>(c));
  mix_file_identity(digest, "/dev/shm");
  mix_file_identity(digest, "/proc/self/ns/pid");
  return concat(name[0] ? name : "localhost", "/", std::hex, std::setw(8), std::setfill('0'),
                digest.value() >> 32);
}

std::vector<std::string> exchange_hosts(StoreClient& store, const std::string& name, int rank,
                                        int size, double timeout_s, const std::string& mine) {
  // Rank 0 gathers the others' identities and publishes the list: about 3
  // requests per rank, where every rank reading every other's would make
  // size * (size - 1) (a million at 1,024 ranks).
  const auto timeout = std::chrono::duration<double>(timeout_s);
  const std::string list_key = concat(name, "/hosts");
  if (rank != 0) {
    store.set(concat(name, "/host/", rank), mine);
    return decode_hosts(store.get(list_key, timeout), size);
  }
  std::vector<std::string> hosts(static_cast<std::size_t>(size));
  hosts[0] = mine;
  for (int q = 1; q < size; ++q) hosts[q] = store.get(concat(name, "/host/", q), timeout);
  store.set(list_key, encode_hosts(hosts));
  return hosts;
}

int local_rank_of(const std::vector<std::string>& hosts, int rank) {
  int local = 0;
  for (int q = 0; q < rank; ++q) local += hosts[q] == hosts[rank];
  return local;
}

}  // namespace concord
