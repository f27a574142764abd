// Fuzz target: the strict checkpoint check from bytes. The input is config.json, then
// model.safetensors, then optionally model.safetensors.index.json, separated by kSep; they are
// written to a private tmpfs directory and opened with Checkpoint::open.
#include <filesystem>
#include <fstream>

#include "fuzz_util.h"
#include "io/checkpoint.h"

namespace {

constexpr std::string_view kSep = "\n#--lily-fuzz-part--#\n";

// Leaked on purpose: the cleanup below runs at exit, after ordinary statics may be gone.
const std::string& work_dir() {
  static const std::string& dir = *new std::string([] {
    spdlog::set_level(spdlog::level::warn);
    std::string base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path().string();
    std::string d = base + "/lily-checkpoint-fuzz-" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(work_dir(), ec);
    });
    return d;
  }());
  return dir;
}

void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) lily::fuzz::die("cannot write " + path);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lily;
  auto parts = fuzz::split(std::string_view(reinterpret_cast<const char*>(data), size), kSep);
  const std::string& dir = work_dir();
  std::filesystem::remove(dir + "/model.safetensors.index.json");
  write_file(dir + "/config.json", parts[0]);
  write_file(dir + "/model.safetensors", parts.size() > 1 ? parts[1] : std::string_view());
  if (parts.size() > 2) write_file(dir + "/model.safetensors.index.json", parts[2]);
  auto r = Checkpoint::open(dir);
  if (!r.is_ok()) {
    LILY_FUZZ_ASSERT(!r.message().empty(), "an error without a message");
    return 0;
  }
  // Every tensor of the inventory is there with the declared shape.
  const Checkpoint& ck = *r.value();
  for (const auto& e : expected_tensors(ck.config())) {
    const TensorView& t = ck.tensor(e.name);
    LILY_FUZZ_ASSERT(t.shape == e.shape, e.name);
  }
  return 0;
}
