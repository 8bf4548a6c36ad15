#include "comm/shm/segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "base/format.hpp"

namespace concord::shm {

namespace {

void* map_fd(int fd, std::size_t bytes, const std::string& name) {
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (data == MAP_FAILED)
    fail(StatusCode::kOutOfMemory, "cannot map shared memory segment ", name, " of ", bytes,
         " bytes: ", std::strerror(err));
  return data;
}

}  // namespace

Segment Segment::create(const std::string& name, std::size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    fail(StatusCode::kUnavailable, "cannot create shared memory segment ", name, ": ",
         std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    fail(StatusCode::kOutOfMemory, "cannot size shared memory segment ", name, " to ", bytes,
         " bytes: ", std::strerror(err));
  }
  try {
    return Segment(name, map_fd(fd, bytes, name), bytes, /*owns_name=*/true);
  } catch (...) {
    shm_unlink(name.c_str());
    throw;
  }
}

Segment Segment::open(const std::string& name, std::size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0)
    fail(StatusCode::kUnavailable, "cannot open shared memory segment ", name, ": ",
         std::strerror(errno));
  return Segment(name, map_fd(fd, bytes, name), bytes, /*owns_name=*/false);
}

Segment::~Segment() { release(); }

void Segment::release() noexcept {
  unlink();
  if (data_ != nullptr) munmap(data_, size_);
}

Segment::Segment(Segment&& other) noexcept
    : name_(std::move(other.name_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      owns_name_(std::exchange(other.owns_name_, false)) {}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owns_name_ = std::exchange(other.owns_name_, false);
  }
  return *this;
}

void Segment::unlink() noexcept {
  if (owns_name_) shm_unlink(name_.c_str());
  owns_name_ = false;
}

}  // namespace concord::shm
