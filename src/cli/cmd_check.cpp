// `lily check --model DIR`: runs the full checkpoint check (config, every tensor's dtype, shape
// and bit width) without loading the model; one line on success, one error line on failure.
#include <cstdio>

#include "cli/command.h"
#include "io/checkpoint.h"

namespace lily::cli {
namespace {

Registrar reg("check", "validate a checkpoint directory (config.json + safetensors) and exit", [](CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  app.add_option("--model", *dir, "checkpoint directory")->required();
  return [dir]() -> int {
    auto r = Checkpoint::open(*dir);
    if (!r.is_ok()) {
      std::fprintf(stderr, "lily check: %s\n", r.message().c_str());
      return 1;
    }
    const ModelConfig& c = (*r)->config();
    std::printf("ok: %s: %zu tensors, %.2f GB, %d layers (%d full attention), %d experts top-%d%s\n", dir->c_str(),
                (*r)->files().tensors().size(), (*r)->files().total_bytes() / 1e9, c.num_hidden_layers,
                c.n_full_attention(), c.num_experts, c.num_experts_per_tok,
                c.is_exact_qwen36_35b_a3b() ? ", exact Qwen3.6-35B-A3B shape" : "");
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli
