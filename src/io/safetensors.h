// Safetensors reader: mmap, zero copy. A single model.safetensors or shards listed by
// model.safetensors.index.json. The header is validated strictly (offsets inside the file,
// sizes equal to shape × dtype, no overlaps) so later code can trust every view.
#pragma once
#include <cstddef>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace lily {

enum class DType { F32, F16, BF16, U32, I32, U8, I8, I64, U16, F64, BOOL, U64, I16 };
const char* dtype_name(DType d);
size_t dtype_size(DType d);
// "BF16" -> DType::BF16; false for a name safetensors does not define.
bool dtype_from_name(const std::string& name, DType& out);
// "[2048, 64]" (for messages).
std::string shape_str(const std::vector<int64_t>& shape);

struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // points into the mmap
  size_t nbytes = 0;
  std::string file;               // which file it came from (for errors)
  int64_t numel() const;
};

class MappedFile;

class SafeTensors {
 public:
  // dir containing model.safetensors or model.safetensors.index.json (+ shards).
  static Result<std::unique_ptr<SafeTensors>> open_dir(const std::string& dir);
  // One file.
  static Result<std::unique_ptr<SafeTensors>> open_file(const std::string& path);
  ~SafeTensors();

  const TensorView* find(const std::string& name) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  size_t total_bytes() const;  // bytes of tensor data over all files

 private:
  Status add_file(const std::string& path);
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

// Writer used by `lily synth` and tests: tensors are declared first (so the header can be
// written), then their bytes are streamed in declaration order (safetensors_writer.cpp).
class SafeTensorsWriter {
 public:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  static Result<std::unique_ptr<SafeTensorsWriter>> create(const std::string& path, std::vector<Entry> entries,
                                                          const std::map<std::string, std::string>& metadata = {});
  ~SafeTensorsWriter();
  // Appends the next tensor's bytes; must match the declared size, in declaration order.
  Status write_next(const void* data, size_t nbytes);
  // Appends part of the current tensor (streaming a large tensor in chunks); the tensor is
  // complete once its declared size has been written.
  Status write_part(const void* data, size_t nbytes);
  // Fails unless every declared tensor was written; closes the file. A writer destroyed
  // before finish() removes its partial file.
  Status finish();

 private:
  SafeTensorsWriter() = default;
  Status append(const void* data, size_t n);  // through the staging buffers
  Status wait_flush();
  int fd_ = -1;
  int direct_fd_ = -1;        // same file opened O_DIRECT, or -1 where unsupported
  uint8_t* stage_ = nullptr;  // 4 KiB-aligned staging buffer being filled
  uint8_t* stage_other_ = nullptr;  // the one being written (flush_)
  std::future<Status> flush_;
  size_t stage_fill_ = 0;
  uint64_t file_off_ = 0;     // file offset of stage_[0]
  std::vector<Entry> entries_;
  size_t next_ = 0;
  size_t written_in_current_ = 0;
  std::string path_;
};

}  // namespace lily
