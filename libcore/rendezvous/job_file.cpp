#include "rendezvous/job_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/deadline.hpp"
#include "base/digest.hpp"
#include "base/env.hpp"
#include "base/format.hpp"
#include "base/interrupt.hpp"

namespace concord {
namespace {

// The launcher variables that name a job, when one sets them.
constexpr const char* kJobIdVariables[] = {
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID", "SLURM_STEP_ID",
    "PMIX_NAMESPACE",      "OMPI_MCA_ess_base_jobid",    "MASTER_ADDR",  "MASTER_PORT",
};

// When a process started, in clock ticks since boot (field 22 of
// /proc/<pid>/stat): with the pid, it names the process for the uptime.
std::string start_time_of(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const auto paren = text.rfind(')');
  if (paren == std::string::npos) return "?";
  std::istringstream fields(text.substr(paren + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
  }
  return field;
}

std::string runtime_dir() {
  if (auto dir = env::get("CONCORD_RUNTIME_DIR")) return *dir;
  if (auto xdg = env::get("XDG_RUNTIME_DIR")) return *xdg + "/concord";
  return concat("/tmp/concord-", getuid());
}

// Makes `dir` (mode 0700) unless it exists, then checks that it is a real
// directory of this user that nobody else can read or write.
void secure_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    fail(StatusCode::kUnavailable, "cannot make the directory ", dir, ": ", std::strerror(errno));
  struct stat info {};
  if (::lstat(dir.c_str(), &info) != 0)
    fail(StatusCode::kUnavailable, "cannot read ", dir, ": ", std::strerror(errno));
  if (!S_ISDIR(info.st_mode) || info.st_uid != ::getuid() || (info.st_mode & 077) != 0)
    fail(StatusCode::kUnavailable, dir, " is not a directory that only this user (uid ",
         ::getuid(), ") can use; remove it or set CONCORD_RUNTIME_DIR to one that is");
}

bool process_alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

struct Published {
  pid_t pid = 0;
  StoreEndpoint endpoint;
};

// The file's content, when it exists, belongs to this user and parses.
std::optional<Published> load(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat info {};
  std::string text(512, '\0');
  const bool mine = ::fstat(fd, &info) == 0 && info.st_uid == ::getuid();
  const ssize_t got = mine ? ::read(fd, text.data(), text.size()) : -1;
  ::close(fd);
  if (got <= 0) return std::nullopt;
  text.resize(static_cast<std::size_t>(got));
  std::istringstream fields(text);
  Published published;
  if (!(fields >> published.pid >> published.endpoint.host >> published.endpoint.port >>
        published.endpoint.token))
    return std::nullopt;
  return published;
}

}  // namespace

JobFile JobFile::of_this_job(int world_size) {
  const std::string dir = runtime_dir();
  secure_dir(dir);
  const pid_t launcher = ::getppid();
  Digest digest;
  auto mix_text = [&digest](const std::string& text) {
    for (unsigned char c : text) digest.mix(c);
    digest.mix(0x100);
  };
  mix_text(std::to_string(launcher));
  mix_text(start_time_of(launcher));
  mix_text(std::to_string(world_size));
  for (const char* name : kJobIdVariables) mix_text(env::get(name).value_or(""));
  char name[64];
  std::snprintf(name, sizeof name, "/job-%016llx.endpoint",
                static_cast<unsigned long long>(digest.value()));
  return JobFile(dir + name);
}

void JobFile::publish(const StoreEndpoint& endpoint) {
  const std::string temporary = concat(path_, ".", ::getpid(), ".tmp");
  const std::string text =
      concat(::getpid(), " ", endpoint.host, " ", endpoint.port, " ", endpoint.token, "\n");
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                        0600);
  if (fd < 0)
    fail(StatusCode::kUnavailable, "cannot write ", temporary, ": ", std::strerror(errno));
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!written || ::rename(temporary.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    fail(StatusCode::kUnavailable, "cannot publish the store's endpoint in ", path_, ": ",
         std::strerror(error));
  }
  published_ = true;
}

StoreEndpoint JobFile::read(double timeout_s) const {
  const auto deadline = deadline_after(timeout_s);
  for (;;) {
    // A file left by a launch whose rank 0 is gone is stale: wait for this one's.
    if (auto published = load(path_); published && process_alive(published->pid))
      return published->endpoint;
    throw_if_interrupted("waiting for rank 0's store");
    if (SteadyClock::now() >= deadline)
      fail(StatusCode::kTimeout, "timed out after ", timeout_s, " s waiting for rank 0 to publish ",
           "its store in ", path_,
           " (ranks of one job on one host that were given no store address and job token "
           "meet there)");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

JobFile::JobFile(JobFile&& other) noexcept
    : path_(std::move(other.path_)), published_(std::exchange(other.published_, false)) {}

JobFile::~JobFile() {
  if (!published_) return;
  if (auto published = load(path_); published && published->pid == ::getpid())
    ::unlink(path_.c_str());
}

}  // namespace concord
