#include "comm/hosts.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iomanip>

#include "base/digest.hpp"
#include "base/env.hpp"
#include "base/format.hpp"
#include "rendezvous/store.hpp"

namespace concord {
namespace {

void mix_file_identity(Digest& digest, const char* path) {
  struct stat st {};
  if (stat(path, &st) == 0) digest.mix(st.st_dev).mix(st.st_ino);
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
  const auto timeout = std::chrono::duration<double>(timeout_s);
  std::vector<std::string> hosts(static_cast<std::size_t>(size));
  hosts[rank] = mine;
  store.set(concat(name, "/host/", rank), hosts[rank]);
  for (int q = 0; q < size; ++q)
    if (q != rank) hosts[q] = store.get(concat(name, "/host/", q), timeout);
  return hosts;
}

int local_rank_of(const std::vector<std::string>& hosts, int rank) {
  int local = 0;
  for (int q = 0; q < rank; ++q) local += hosts[q] == hosts[rank];
  return local;
}

}  // namespace concord
