// `lily gguf --model DIR --out FILE.gguf [--type q4_0|q4_1]`: writes the checkpoint as a GGUF
// that llama.cpp's qwen35moe architecture loads (gguf_convert.h), for side-by-side benchmarks
// (bench/vs_llama.mjs) and numerics checks against llama.cpp.
#include <cstdio>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include "cli/command.h"
#include "cli/gguf_convert.h"
#include "core/thread_pool.h"
#include "io/synth.h"

namespace lily::cli {
namespace {

namespace fs = std::filesystem;

struct GgufArgs {
  std::string model, out, tokenizer, type = "q4_0";
  int threads = 0;
};

// --tokenizer, else the checkpoint's own (the Qwen3 one for a synthetic checkpoint without any).
Result<std::string> tokenizer_dir(const GgufArgs& a) {
  if (!a.tokenizer.empty()) return a.tokenizer;
  auto dir = checkpoint_tokenizer_dir(a.model);
  if (!dir) return errorf("{}; give --tokenizer DIR", dir.message());
  if (*dir != a.model) fmt::print(stderr, "gguf: synthetic checkpoint without a tokenizer: using the Qwen3 tokenizer in {}\n", *dir);
  return dir;
}

int run(const GgufArgs& a) {
  if (a.threads > 0) ThreadPool::set_global_threads(a.threads);
  auto tok = tokenizer_dir(a);
  if (!tok.is_ok()) return std::fprintf(stderr, "lily gguf: %s\n", tok.message().c_str()), 1;
  GgufConvertOptions o;
  o.model_dir = a.model;
  o.tokenizer_dir = *tok;
  o.out_path = a.out;
  o.weight_type = a.type == "q4_1" ? gguf::TensorType::Q4_1 : gguf::TensorType::Q4_0;
  const Status s = convert_to_gguf(o);
  if (!s.is_ok()) return std::fprintf(stderr, "lily gguf: %s\n", s.message().c_str()), 1;
  return 0;
}

Registrar reg("gguf", "write the checkpoint as a GGUF for llama.cpp (qwen35moe; Q4_0, or exact Q4_1)", [](CLI::App& app) {
  auto a = std::make_shared<GgufArgs>();
  app.add_option("--model", a->model, "checkpoint directory")->required();
  app.add_option("--out", a->out, "output .gguf file (written as FILE.partial, then renamed)")->required();
  app.add_option("--type", a->type,
                 "q4_0: 4.5 bits/weight like the checkpoint, re-quantized, routers Q8_0 (default); "
                 "q4_1: the affine scale/bias kept exactly, 5 bits/weight, routers F32")
      ->check(CLI::IsMember({"q4_0", "q4_1"}));
  app.add_option("--tokenizer", a->tokenizer, "directory with tokenizer.json (default: the checkpoint's)");
  app.add_option("--threads", a->threads, "threads (0 = all cores)");
  return [a]() { return run(*a); };
});

}  // namespace
}  // namespace lily::cli
