// GGUF v3 writer: "GGUF", version 3, tensor and key/value counts, typed metadata key/values
// (scalars and arrays), tensor infos (name, dims innermost first, ggml type, data offset), then
// the tensor data, each tensor aligned to 32 bytes. Everything is little-endian.
// Key decision: tensors are declared before the file is opened, so the header is written once
// and the data is streamed in declaration order; a 19 GB model never sits in memory.
#pragma once
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/gguf_quant.h"

namespace lily::gguf {

// Metadata value types as stored in the file.
enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8, ARRAY = 9, U64 = 10,
  I64 = 11, F64 = 12
};

constexpr uint32_t kAlignment = 32;  // general.alignment's default; lily never writes another

struct TensorInfo {
  std::string name;            // < 64 bytes (ggml's name limit)
  TensorType type = TensorType::F32;
  std::vector<uint64_t> ne;    // dims, innermost (row length) first; 1 to 4 of them
  uint64_t nbytes() const;
};

class Writer {
 public:
  ~Writer();

  // Metadata, in the order added. Keys must be unique.
  void add_u8(const std::string& key, uint8_t v);
  void add_i8(const std::string& key, int8_t v);
  void add_u16(const std::string& key, uint16_t v);
  void add_i16(const std::string& key, int16_t v);
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_u64(const std::string& key, uint64_t v);
  void add_i64(const std::string& key, int64_t v);
  void add_f32(const std::string& key, float v);
  void add_f64(const std::string& key, double v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_array_i32(const std::string& key, std::span<const int32_t> v);
  void add_array_u32(const std::string& key, std::span<const uint32_t> v);
  void add_array_f32(const std::string& key, std::span<const float> v);
  void add_array_bool(const std::string& key, const std::vector<bool>& v);
  void add_array_string(const std::string& key, const std::vector<std::string>& v);

  // Declares the next tensor. Checked at open(): name length and uniqueness, dims, block size.
  void add_tensor(TensorInfo info);
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  // Writes header, metadata and tensor infos to path.
  Status open(const std::string& path);
  // The next tensor's bytes, whole or in consecutive parts, in declaration order.
  Status write(const void* data, size_t nbytes);
  // Fails unless every declared tensor was written in full; closes the file.
  Status finish();

 private:
  void add_raw(const std::string& key, ValueType type, const void* payload, size_t n);
  Status validate() const;
  Status put(const void* data, size_t n);
  Status pad_to_alignment();

  std::vector<uint8_t> kv_;  // serialized key/value pairs
  uint64_t n_kv_ = 0;
  std::vector<std::string> keys_;
  std::vector<TensorInfo> tensors_;
  std::FILE* f_ = nullptr;
  std::string path_;
  uint64_t pos_ = 0;          // bytes written so far
  size_t next_ = 0;           // tensor being written
  uint64_t written_ = 0;      // bytes of it written
};

}  // namespace lily::gguf
