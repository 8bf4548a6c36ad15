// A side channel for the ranks of one host that were given no store address
// or job token (torchrun --standalone, mpirun or srun on one node): rank 0
// serves its store on a free loopback port with a fresh secret and writes
// where, and the secret, into a file only this user can read, named after
// the job; the other ranks read it. Ranks of one job share the process that
// launched them (the launcher's agent or daemon on this host), so the job is
// named after it, and after the launcher's own job id when it sets one.
#pragma once

#include <string>

namespace concord {

struct StoreEndpoint {
  std::string host;
  int port = 0;
  std::string token;
};

class JobFile {
 public:
  // The file of the job this process belongs to, in CONCORD_RUNTIME_DIR,
  // else $XDG_RUNTIME_DIR/concord, else /tmp/concord-<uid>: a directory made
  // with mode 0700 and refused (Unavailable) unless this user owns it and
  // nobody else may read it.
  static JobFile of_this_job(int world_size);

  // Writes the endpoint (atomically: readers see all of it or nothing); the
  // file is removed again when this object is destroyed, unless a later
  // writer replaced it.
  void publish(const StoreEndpoint& endpoint);
  // Waits (at most timeout_s) for an endpoint published by a live process.
  StoreEndpoint read(double timeout_s) const;

  ~JobFile();
  JobFile(JobFile&& other) noexcept;
  JobFile& operator=(JobFile&&) = delete;
  JobFile(const JobFile&) = delete;
  JobFile& operator=(const JobFile&) = delete;

  const std::string& path() const noexcept { return path_; }

 private:
  explicit JobFile(std::string path) : path_(std::move(path)) {}

  std::string path_;
  bool published_ = false;
};

}  // namespace concord
