// Safetensors reader (mmap, zero copy; one file or an index of shards) with strict header
// validation: every view it hands out lies inside the file, has exactly shape × dtype bytes and
// overlaps no other tensor. Errors name the file and the tensor.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/json_depth.h"

namespace lily {

using json = nlohmann::json;

namespace {
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit is 100 MB
// A header is {name: {dtype, shape: [...], data_offsets: [...]}, __metadata__: {k: v}}: depth 3.
constexpr size_t kMaxJsonDepth = 16;

struct DTypeInfo {
  DType d;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::F32, "F32", 4},   {DType::F16, "F16", 2},  {DType::BF16, "BF16", 2}, {DType::U32, "U32", 4},
    {DType::I32, "I32", 4},   {DType::U8, "U8", 1},    {DType::I8, "I8", 1},     {DType::I64, "I64", 8},
    {DType::U16, "U16", 2},   {DType::F64, "F64", 8},  {DType::BOOL, "BOOL", 1}, {DType::U64, "U64", 8},
    {DType::I16, "I16", 2},
};

std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}
}  // namespace

const char* dtype_name(DType d) {
  for (const auto& t : kDTypes)
    if (t.d == d) return t.name;
  return "?";
}

size_t dtype_size(DType d) {
  for (const auto& t : kDTypes)
    if (t.d == d) return t.size;
  return 0;
}

bool dtype_from_name(const std::string& name, DType& out) {
  for (const auto& t : kDTypes)
    if (name == t.name) {
      out = t.d;
      return true;
    }
  return false;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A read-only mapping of a whole file; unmapped on destruction.
class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errorf("{}: cannot open: {}", path, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      int e = errno;
      ::close(fd);
      return errorf("{}: cannot stat: {}", path, std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return errorf("{}: not a regular file", path);
    }
    auto f = std::unique_ptr<MappedFile>(new MappedFile());
    f->path_ = path;
    f->size_ = size_t(st.st_size);
    if (f->size_ > 0) {
      void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        int e = errno;
        ::close(fd);
        return errorf("{}: mmap failed: {}", path, std::strerror(e));
      }
      f->data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);  // the mapping stays valid
    return f;
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

SafeTensors::~SafeTensors() = default;

const TensorView* SafeTensors::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

size_t SafeTensors::total_bytes() const {
  size_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.nbytes;
  return n;
}

namespace {

// Validates one header entry and fills `t` (data pointer relative to the data section start).
Status parse_entry(const std::string& path, const std::string& name, const json& e, uint64_t data_size,
                   TensorView& t, uint64_t& begin, uint64_t& end) {
  auto fail = [&](const std::string& field, const std::string& what) {
    return errorf("{}: tensor '{}': {}: {}", path, name, field, what);
  };
  if (!e.is_object()) return fail("header entry", "expected an object, got " + show(e));
  if (!e.contains("dtype")) return fail("dtype", "missing");
  if (!e["dtype"].is_string() || !dtype_from_name(e["dtype"].get<std::string>(), t.dtype))
    return fail("dtype", "unknown dtype " + show(e["dtype"]));
  if (!e.contains("shape")) return fail("shape", "missing");
  const json& sh = e["shape"];
  if (!sh.is_array()) return fail("shape", "expected a list of sizes, got " + show(sh));
  // numel in 128 bits so that a lying header cannot overflow the size check.
  unsigned __int128 numel = 1;
  for (const auto& d : sh) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) return fail("shape", "expected non-negative integers, got " + show(sh));
    t.shape.push_back(d.get<int64_t>());
    numel *= uint64_t(d.get<int64_t>());
    if (numel > (unsigned __int128)(1) << 64) return fail("shape", "size overflows: " + show(sh));
  }
  if (!e.contains("data_offsets")) return fail("data_offsets", "missing");
  const json& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    return fail("data_offsets", "expected [begin, end] (non-negative integers), got " + show(off));
  begin = off[0].get<uint64_t>();
  end = off[1].get<uint64_t>();
  if (begin > end) return fail("data_offsets", fmt::format("begin {} is after end {}", begin, end));
  if (end > data_size)
    return fail("data_offsets",
                fmt::format("end {} is beyond the data section ({} bytes): the file is truncated or the header is wrong",
                            end, data_size));
  unsigned __int128 want = numel * dtype_size(t.dtype);
  if (want != (unsigned __int128)(end - begin))
    return fail("data_offsets", fmt::format("holds {} bytes but {} {} needs {}", end - begin, dtype_name(t.dtype),
                                            shape_str(t.shape), uint64_t(want)));
  t.nbytes = size_t(end - begin);
  return Status::ok();
}

}  // namespace

Status SafeTensors::add_file(const std::string& path) {
  LILY_ASSIGN_OR_RETURN(auto mf, MappedFile::open(path));
  const size_t size = mf->size();
  if (size < 8) return errorf("{}: file is {} bytes, too short for a safetensors header", path, size);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | mf->data()[i];  // little endian
  if (hlen > kMaxHeaderBytes) return errorf("{}: header length {} is not sane (limit {})", path, hlen, kMaxHeaderBytes);
  if (hlen > size - 8)
    return errorf("{}: header length {} runs past the end of the file ({} bytes): truncated or not safetensors", path,
                  hlen, size);
  const char* hbegin = reinterpret_cast<const char*>(mf->data() + 8);
  if (json_nesting_depth(std::string_view(hbegin, hlen)) > kMaxJsonDepth)
    return errorf("{}: the header nests deeper than {} levels: not safetensors", path, kMaxJsonDepth);
  // A name given twice would silently keep only the last entry: catch it while parsing.
  std::set<std::string> top_keys;
  std::string duplicate;
  json::parser_callback_t on_event = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && depth == 1 && !top_keys.insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json h = json::parse(hbegin, hbegin + hlen, on_event, /*allow_exceptions=*/false);
  if (h.is_discarded()) return errorf("{}: the header is not valid JSON", path);
  if (!h.is_object()) return errorf("{}: the header is not a JSON object", path);
  if (!duplicate.empty()) return errorf("{}: tensor '{}': listed twice in the header", path, duplicate);

  const uint64_t data_size = size - 8 - hlen;
  const uint8_t* data = mf->data() + 8 + hlen;
  struct Range {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  std::vector<TensorView> views;
  for (const auto& [name, e] : h.items()) {
    if (name == "__metadata__") {
      if (!e.is_object()) return errorf("{}: __metadata__: expected an object, got {}", path, show(e));
      continue;
    }
    TensorView t;
    t.name = name;
    t.file = path;
    uint64_t b = 0, en = 0;
    LILY_TRY(parse_entry(path, name, e, data_size, t, b, en));
    t.data = data + b;
    ranges.push_back({b, en, name});
    views.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  const Range* last = nullptr;  // the non-empty range reaching furthest so far
  for (const Range& c : ranges) {
    if (c.end == c.begin) continue;
    if (last && c.begin < last->end)
      return errorf("{}: tensor '{}': data_offsets: [{}, {}] overlaps tensor '{}' at [{}, {}]", path, c.name, c.begin,
                    c.end, last->name, last->begin, last->end);
    if (!last || c.end > last->end) last = &c;
  }
  for (auto& t : views) {
    if (tensors_.count(t.name))
      return errorf("{}: tensor '{}' is also in {}", path, t.name, tensors_.at(t.name).file);
    std::string n = t.name;
    tensors_.emplace(std::move(n), std::move(t));
  }
  files_.push_back(std::move(mf));
  return Status::ok();
}

Result<std::unique_ptr<SafeTensors>> SafeTensors::open_file(const std::string& path) {
  auto st = std::unique_ptr<SafeTensors>(new SafeTensors());
  LILY_TRY(st->add_file(path));
  return st;
}

Result<std::unique_ptr<SafeTensors>> SafeTensors::open_dir(const std::string& dir) {
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::ifstream in(index_path, std::ios::binary);
  if (!in) {
    struct stat sb {};
    std::string single = dir + "/model.safetensors";
    if (::stat(single.c_str(), &sb) != 0)
      return errorf("{}: neither model.safetensors nor model.safetensors.index.json found", dir);
    return open_file(single);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (json_nesting_depth(ss.str()) > kMaxJsonDepth)
    return errorf("{}: nests deeper than {} levels: not a safetensors index", index_path, kMaxJsonDepth);
  json idx = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (idx.is_discarded() || !idx.is_object()) return errorf("{}: not a valid JSON object", index_path);
  if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
    return errorf("{}: weight_map: missing or not an object", index_path);
  std::set<std::string> shards;
  for (const auto& [name, f] : idx["weight_map"].items()) {
    if (!f.is_string()) return errorf("{}: weight_map.{}: expected a file name, got {}", index_path, name, show(f));
    std::string fn = f.get<std::string>();
    if (fn.empty() || fn.find('/') != std::string::npos || fn == "." || fn == "..")
      return errorf("{}: weight_map.{}: \"{}\" is not a plain file name in the checkpoint directory", index_path, name, fn);
    shards.insert(fn);
  }
  if (shards.empty()) return errorf("{}: weight_map is empty", index_path);
  auto st = std::unique_ptr<SafeTensors>(new SafeTensors());
  for (const auto& fn : shards) LILY_TRY(st->add_file(dir + "/" + fn));
  // The index and the shards must agree tensor by tensor.
  for (const auto& [name, f] : idx["weight_map"].items()) {
    const TensorView* t = st->find(name);
    std::string want = dir + "/" + f.get<std::string>();
    if (!t) return errorf("{}: tensor '{}' is listed in {} but absent from it", want, name, index_path);
    if (t->file != want) return errorf("{}: tensor '{}' is in {}, not in {} as the index says", index_path, name, t->file, want);
  }
  for (const auto& [name, t] : st->tensors())
    if (!idx["weight_map"].contains(name))
      return errorf("{}: tensor '{}' is not listed in {}", t.file, name, index_path);
  return st;
}

}  // namespace lily
