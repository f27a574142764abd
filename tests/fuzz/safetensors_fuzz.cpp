// Fuzz target: a safetensors file (8-byte header length, JSON header, data section). Whatever
// the bytes, open_file either fails with a message or hands out views that lie inside the file
// with exactly shape × dtype bytes each.
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lily;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  fuzz::MemFile f(bytes);
  auto r = SafeTensors::open_file(f.path());
  if (!r.is_ok()) {
    LILY_FUZZ_ASSERT(!r.message().empty(), "an error without a message");
    return 0;
  }
  const SafeTensors& st = *r.value();
  size_t total = 0;
  volatile uint8_t sink = 0;
  for (const auto& [name, t] : st.tensors()) {
    LILY_FUZZ_ASSERT(name == t.name, name);
    unsigned __int128 want = dtype_size(t.dtype);
    for (int64_t d : t.shape) want *= uint64_t(d);
    LILY_FUZZ_ASSERT(want == t.nbytes, name);
    LILY_FUZZ_ASSERT(t.nbytes <= size, name);
    total += t.nbytes;
    // Read the whole view: ASan does not watch the mmap, but a view running past the mapping
    // faults on the page after it, and the sum over views is bounded by the file size below.
    for (size_t i = 0; i < t.nbytes; ++i) sink = sink + t.data[i];
    LILY_FUZZ_ASSERT(st.find(name) == &t, name);
  }
  LILY_FUZZ_ASSERT(total == st.total_bytes(), "total_bytes");
  LILY_FUZZ_ASSERT(total <= size, "views overlap or exceed the file");
  return 0;
}
