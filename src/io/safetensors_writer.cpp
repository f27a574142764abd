// SafeTensorsWriter: header first, then tensor bytes streamed in declaration order. Bytes go
// through two 32 MiB staging buffers written with O_DIRECT at aligned offsets when the filesystem
// allows it (no page-cache copy: the 19 GB synth preset would otherwise spend most of its CPU
// in the kernel), else with plain large writes; the unaligned tail is written at finish().
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <future>
#include <set>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace lily {

namespace {
constexpr size_t kStageBytes = size_t(32) << 20;  // multiple of the 4 KiB O_DIRECT alignment
constexpr size_t kAlign = 4096;

Status pwrite_all(int fd, const uint8_t* p, size_t n, uint64_t off, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, std::min<size_t>(n, size_t(1) << 30), off_t(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errorf("{}: write failed: {}", path, std::strerror(errno));
    }
    p += w;
    n -= size_t(w);
    off += uint64_t(w);
  }
  return Status::ok();
}

size_t entry_bytes(const SafeTensorsWriter::Entry& e) {
  size_t n = dtype_size(e.dtype);
  for (int64_t d : e.shape) n *= size_t(d);
  return n;
}
}  // namespace

Result<std::unique_ptr<SafeTensorsWriter>> SafeTensorsWriter::create(const std::string& path, std::vector<Entry> entries,
                                                                    const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the declaration order in the header (easy to inspect; readers don't care).
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t off = 0;
  for (const auto& e : entries) {
    if (!seen.insert(e.name).second) return errorf("{}: tensor '{}' declared twice", path, e.name);
    if (e.name == "__metadata__") return errorf("{}: '__metadata__' is not a tensor name", path);
    for (int64_t d : e.shape)
      if (d < 0) return errorf("{}: tensor '{}': negative dimension", path, e.name);
    uint64_t n = entry_bytes(e);
    h[e.name] = {{"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string hs = h.dump();
  while (hs.size() % 8 != 0) hs.push_back(' ');  // data section 8-byte aligned

  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errorf("{}: cannot create: {}", path, std::strerror(errno));
  auto w = std::unique_ptr<SafeTensorsWriter>(new SafeTensorsWriter());
  w->fd_ = fd;
  w->direct_fd_ = ::open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);  // -1: not supported here
  w->path_ = path;
  w->entries_ = std::move(entries);
  w->stage_ = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kStageBytes));
  w->stage_other_ = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kStageBytes));
  if (!w->stage_ || !w->stage_other_) return errorf("{}: out of memory for the write buffers", path);
  while (w->next_ < w->entries_.size() && entry_bytes(w->entries_[w->next_]) == 0) ++w->next_;
  uint8_t len[8];
  const uint64_t hl = hs.size();
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(hl >> (8 * i));
  LILY_TRY(w->append(len, 8));
  LILY_TRY(w->append(hs.data(), hs.size()));
  return w;
}

SafeTensorsWriter::~SafeTensorsWriter() {
  (void)wait_flush();
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (fd_ >= 0) {  // not finished: do not leave a half-written file behind
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  std::free(stage_);
  std::free(stage_other_);
}

// Waits for the staging buffer in flight (if any) to reach the file.
Status SafeTensorsWriter::wait_flush() {
  if (!flush_.valid()) return Status::ok();
  return flush_.get();
}

// Staged write: fills the current buffer; a full one is written in the background (at file_off_,
// always a multiple of kStageBytes, so O_DIRECT alignment holds) while the other fills, so the
// disk never waits for the copy.
Status SafeTensorsWriter::append(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const size_t take = std::min(n, kStageBytes - stage_fill_);
    std::memcpy(stage_ + stage_fill_, p, take);
    stage_fill_ += take;
    p += take;
    n -= take;
    if (stage_fill_ == kStageBytes) {
      LILY_TRY(wait_flush());
      const int fd = direct_fd_ >= 0 ? direct_fd_ : fd_;
      const uint8_t* buf = stage_;
      const uint64_t off = file_off_;
      flush_ = std::async(std::launch::async, [this, fd, buf, off] { return pwrite_all(fd, buf, kStageBytes, off, path_); });
      std::swap(stage_, stage_other_);
      file_off_ += kStageBytes;
      stage_fill_ = 0;
    }
  }
  return Status::ok();
}

Status SafeTensorsWriter::write_part(const void* data, size_t nbytes) {
  if (fd_ < 0) return errorf("{}: writer is closed", path_);
  if (next_ >= entries_.size()) return errorf("{}: more data than the {} declared tensors", path_, entries_.size());
  const Entry& e = entries_[next_];
  const size_t want = entry_bytes(e);
  if (written_in_current_ + nbytes > want)
    return errorf("{}: tensor '{}': {} bytes written, declared {}", path_, e.name, written_in_current_ + nbytes, want);
  LILY_TRY(append(data, nbytes));
  written_in_current_ += nbytes;
  if (written_in_current_ == want) {
    ++next_;
    written_in_current_ = 0;
    while (next_ < entries_.size() && entry_bytes(entries_[next_]) == 0) ++next_;  // empty ones are done
  }
  return Status::ok();
}

Status SafeTensorsWriter::write_next(const void* data, size_t nbytes) {
  if (next_ < entries_.size() && written_in_current_ == 0 && nbytes != entry_bytes(entries_[next_]))
    return errorf("{}: tensor '{}': got {} bytes, declared {}", path_, entries_[next_].name, nbytes,
                  entry_bytes(entries_[next_]));
  return write_part(data, nbytes);
}

Status SafeTensorsWriter::finish() {
  if (fd_ < 0) return errorf("{}: writer is closed", path_);
  if (next_ != entries_.size())
    return errorf("{}: finish() after {} of {} tensors (next: '{}')", path_, next_, entries_.size(), entries_[next_].name);
  LILY_TRY(wait_flush());
  // The tail is unaligned: plain write through the page cache.
  LILY_TRY(pwrite_all(fd_, stage_, stage_fill_, file_off_, path_));
  file_off_ += stage_fill_;
  stage_fill_ = 0;
  if (direct_fd_ >= 0) {
    ::close(direct_fd_);
    direct_fd_ = -1;
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return errorf("{}: close failed: {}", path_, std::strerror(errno));
  return Status::ok();
}

}  // namespace lily
