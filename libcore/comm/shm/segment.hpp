// A POSIX shared-memory mapping that ranks of one host attach to by name.
#pragma once

#include <cstddef>
#include <string>

namespace concord::shm {

class Segment {
 public:
  // Creates a new zero-filled segment; fails if the name exists. Its name
  // is removed when it is destroyed, unless unlink() removed it before.
  static Segment create(const std::string& name, std::size_t bytes);
  static Segment open(const std::string& name, std::size_t bytes);

  Segment() = default;
  ~Segment();
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Removes the name; existing mappings stay valid.
  void unlink() noexcept;

  void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  Segment(std::string name, void* data, std::size_t size, bool owns_name)
      : name_(std::move(name)), data_(data), size_(size), owns_name_(owns_name) {}
  void release() noexcept;

  std::string name_;
  void* data_ = nullptr;
  std::size_t size_ = 0;
  bool owns_name_ = false;  // created here and not yet unlinked
};

}  // namespace concord::shm
