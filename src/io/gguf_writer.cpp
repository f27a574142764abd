// GGUF v3 container writer (see gguf_writer.h). Metadata is serialized as it is added; the file
// is written through a large stdio buffer.
#include "io/gguf_writer.h"

#include <bit>
#include <cstring>
#include <set>

namespace lily::gguf {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF is little-endian; lily writes host order");

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kVersion = 3;
constexpr size_t kMaxName = 63;          // ggml keeps names in char[64]

void append(std::vector<uint8_t>& out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}
template <typename T>
void append_pod(std::vector<uint8_t>& out, T v) {
  append(out, &v, sizeof v);
}
void append_string(std::vector<uint8_t>& out, const std::string& s) {
  append_pod<uint64_t>(out, s.size());
  append(out, s.data(), s.size());
}
template <typename T>
std::vector<uint8_t> array_payload(ValueType elem, std::span<const T> v) {
  std::vector<uint8_t> p;
  append_pod(p, uint32_t(elem));
  append_pod<uint64_t>(p, v.size());
  append(p, v.data(), v.size_bytes());
  return p;
}
uint64_t align_up(uint64_t x) { return (x + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

uint64_t TensorInfo::nbytes() const {
  uint64_t rows = 1;
  for (size_t i = 1; i < ne.size(); ++i) rows *= ne[i];
  return ne.empty() ? 0 : rows * row_bytes(type, int64_t(ne[0]));
}

Writer::~Writer() {
  if (f_) {
    std::fclose(f_);
    std::remove(path_.c_str());  // never leave a partial file that looks like a model
  }
}

void Writer::add_raw(const std::string& key, ValueType type, const void* payload, size_t n) {
  keys_.push_back(key);
  append_string(kv_, key);
  append_pod(kv_, uint32_t(type));
  append(kv_, payload, n);
  ++n_kv_;
}

void Writer::add_u8(const std::string& k, uint8_t v) { add_raw(k, ValueType::U8, &v, sizeof v); }
void Writer::add_i8(const std::string& k, int8_t v) { add_raw(k, ValueType::I8, &v, sizeof v); }
void Writer::add_u16(const std::string& k, uint16_t v) { add_raw(k, ValueType::U16, &v, sizeof v); }
void Writer::add_i16(const std::string& k, int16_t v) { add_raw(k, ValueType::I16, &v, sizeof v); }
void Writer::add_u32(const std::string& k, uint32_t v) { add_raw(k, ValueType::U32, &v, sizeof v); }
void Writer::add_i32(const std::string& k, int32_t v) { add_raw(k, ValueType::I32, &v, sizeof v); }
void Writer::add_u64(const std::string& k, uint64_t v) { add_raw(k, ValueType::U64, &v, sizeof v); }
void Writer::add_i64(const std::string& k, int64_t v) { add_raw(k, ValueType::I64, &v, sizeof v); }
void Writer::add_f32(const std::string& k, float v) { add_raw(k, ValueType::F32, &v, sizeof v); }
void Writer::add_f64(const std::string& k, double v) { add_raw(k, ValueType::F64, &v, sizeof v); }
void Writer::add_bool(const std::string& k, bool v) {
  const uint8_t b = v ? 1 : 0;
  add_raw(k, ValueType::BOOL, &b, 1);
}
void Writer::add_string(const std::string& k, const std::string& v) {
  std::vector<uint8_t> p;
  append_string(p, v);
  add_raw(k, ValueType::STRING, p.data(), p.size());
}
void Writer::add_array_i32(const std::string& k, std::span<const int32_t> v) {
  const auto p = array_payload(ValueType::I32, v);
  add_raw(k, ValueType::ARRAY, p.data(), p.size());
}
void Writer::add_array_u32(const std::string& k, std::span<const uint32_t> v) {
  const auto p = array_payload(ValueType::U32, v);
  add_raw(k, ValueType::ARRAY, p.data(), p.size());
}
void Writer::add_array_f32(const std::string& k, std::span<const float> v) {
  const auto p = array_payload(ValueType::F32, v);
  add_raw(k, ValueType::ARRAY, p.data(), p.size());
}
void Writer::add_array_bool(const std::string& k, const std::vector<bool>& v) {
  std::vector<uint8_t> bytes(v.begin(), v.end());
  const auto p = array_payload(ValueType::BOOL, std::span<const uint8_t>(bytes));
  add_raw(k, ValueType::ARRAY, p.data(), p.size());
}
void Writer::add_array_string(const std::string& k, const std::vector<std::string>& v) {
  std::vector<uint8_t> p;
  append_pod(p, uint32_t(ValueType::STRING));
  append_pod<uint64_t>(p, v.size());
  for (const auto& s : v) append_string(p, s);
  add_raw(k, ValueType::ARRAY, p.data(), p.size());
}

void Writer::add_tensor(TensorInfo info) { tensors_.push_back(std::move(info)); }

Status Writer::validate() const {
  std::set<std::string> keys(keys_.begin(), keys_.end());
  if (keys.size() != keys_.size()) return Status::error("gguf: a metadata key was added twice");
  std::set<std::string> names;
  for (const auto& t : tensors_) {
    if (t.name.empty() || t.name.size() > kMaxName)
      return errorf("gguf: tensor name '{}' must have 1 to {} bytes", t.name, kMaxName);
    if (!names.insert(t.name).second) return errorf("gguf: tensor '{}' declared twice", t.name);
    if (t.ne.empty() || t.ne.size() > 4) return errorf("gguf: tensor '{}' has {} dims (1 to 4)", t.name, t.ne.size());
    for (uint64_t d : t.ne)
      if (d == 0) return errorf("gguf: tensor '{}' has a zero dim", t.name);
    if (t.ne[0] % uint64_t(block_weights(t.type)) != 0)
      return errorf("gguf: tensor '{}': row of {} is not a multiple of the {} block ({})", t.name, t.ne[0],
                    tensor_type_name(t.type), block_weights(t.type));
  }
  return Status::ok();
}

Status Writer::put(const void* data, size_t n) {
  if (n && std::fwrite(data, 1, n, f_) != n) return errorf("gguf: writing {} failed", path_);
  pos_ += n;
  return Status::ok();
}

Status Writer::pad_to_alignment() {
  static const uint8_t zeros[kAlignment] = {};
  return put(zeros, size_t(align_up(pos_) - pos_));
}

Status Writer::open(const std::string& path) {
  LILY_TRY(validate());
  if (f_) return Status::error("gguf: writer already open");
  path_ = path;
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) return errorf("gguf: cannot create {}", path);
  std::setvbuf(f_, nullptr, _IOFBF, size_t(8) << 20);
  std::vector<uint8_t> head;
  append_pod(head, kMagic);
  append_pod(head, kVersion);
  append_pod<uint64_t>(head, tensors_.size());
  append_pod<uint64_t>(head, n_kv_);
  append(head, kv_.data(), kv_.size());
  uint64_t offset = 0;  // within the data section
  for (const auto& t : tensors_) {
    append_string(head, t.name);
    append_pod(head, uint32_t(t.ne.size()));
    for (uint64_t d : t.ne) append_pod(head, d);
    append_pod(head, uint32_t(t.type));
    append_pod(head, offset);
    offset += align_up(t.nbytes());
  }
  LILY_TRY(put(head.data(), head.size()));
  return pad_to_alignment();
}

Status Writer::write(const void* data, size_t nbytes) {
  if (!f_) return Status::error("gguf: write before open");
  if (next_ >= tensors_.size()) return Status::error("gguf: more tensor data than declared");
  const TensorInfo& t = tensors_[next_];
  if (written_ + nbytes > t.nbytes())
    return errorf("gguf: tensor '{}' is {} bytes; {} written", t.name, t.nbytes(), written_ + nbytes);
  LILY_TRY(put(data, nbytes));
  written_ += nbytes;
  if (written_ == t.nbytes()) {
    LILY_TRY(pad_to_alignment());
    ++next_;
    written_ = 0;
  }
  return Status::ok();
}

Status Writer::finish() {
  if (!f_) return Status::error("gguf: finish before open");
  if (next_ != tensors_.size())
    return errorf("gguf: {} of {} tensors written (next: '{}')", next_, tensors_.size(), tensors_[next_].name);
  const bool ok = std::fflush(f_) == 0;
  const bool closed = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok || !closed) {
    std::remove(path_.c_str());
    return errorf("gguf: closing {} failed", path_);
  }
  return Status::ok();
}

}  // namespace lily::gguf
