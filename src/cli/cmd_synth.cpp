// `lily synth`: writes a synthetic checkpoint (random weights in the exact MLX format) for
// tests, demos and benchmarks without the real 19 GB download.
#include <cstdio>

#include <spdlog/spdlog.h>

#include "cli/command.h"
#include "io/synth.h"

namespace lily::cli {
namespace {

struct SynthArgs {
  std::string preset = "tiny";
  uint64_t seed = 0;
  std::string out;
};

Registrar reg("synth", "write a synthetic checkpoint with random weights (MLX 4-bit format)", [](CLI::App& app) {
  auto a = std::make_shared<SynthArgs>();
  app.add_option("--preset", a->preset, "tiny | small | qwen3.6-35b-a3b (the full 19 GB shape)")
      ->check(CLI::IsMember(synth_preset_names()));
  app.add_option("--seed", a->seed, "PRNG seed (same seed, same bytes)");
  app.add_option("--out", a->out, "output directory")->required();
  return [a]() -> int {
    auto r = write_synthetic_checkpoint({a->preset, a->seed, a->out});
    if (!r.is_ok()) {
      std::fprintf(stderr, "lily synth: %s\n", r.message().c_str());
      return 1;
    }
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli
