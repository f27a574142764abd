// Synthetic checkpoints: random weights in exactly the MLX affine format of a qwen3_5_moe
// checkpoint (config.json wrapper + model.safetensors), shaped so that a forward pass behaves
// like a real model's (bounded residual stream, spread-out routing). Deterministic per seed, and
// generated in parallel chunks so the full-size preset writes at disk speed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace lily {

struct SynthOptions {
  std::string preset = "tiny";  // "tiny" | "small" | "qwen3.6-35b-a3b"
  uint64_t seed = 0;
  std::string out_dir;          // created if absent; existing files are overwritten
};

struct SynthStats {
  size_t bytes = 0;      // bytes of model.safetensors
  double seconds = 0;    // wall time of writing it
  double gb_per_s() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
};

// Names of the presets, for help texts.
const std::vector<std::string>& synth_preset_names();

// The config.json a preset writes (MLX wrapper, quantization overrides, quantization_config
// duplicate and a "lily_synthetic": {preset, seed} marker). tiny/small read their eos ids from
// the bundled Qwen3 tokenizer.json.
Result<nlohmann::ordered_json> synth_config_json(const std::string& preset, uint64_t seed);

// Writes config.json, model.safetensors and, for tiny/small, tokenizer.json,
// tokenizer_config.json and chat_template.jinja.
Result<SynthStats> write_synthetic_checkpoint(const SynthOptions& opts);

// The demo checkpoint (small preset, seed 0) under $LILY_DEMO_DIR or <repo>/demo/small-seed0;
// created once, atomically (written to a temporary directory, then renamed). Returns its path.
Result<std::string> ensure_demo_checkpoint();

// The lily source tree (for the bundled tokenizer and chat template): the LILY_SOURCE_DIR the
// library was built from, else a parent of the running executable that holds assets/.
Result<std::string> lily_repo_root();
// Where scripts/setup.sh installs the Qwen3 tokenizer (the npm test oracle's tokenizer.json and
// tokenizer_config.json), which synthetic checkpoints carry: <repo>/tests/node/node_modules/...
Result<std::string> qwen3_tokenizer_dir();

// True when a config.json carries the "lily_synthetic" marker (random weights).
bool is_synthetic_config(const nlohmann::json& config);
// The same for the checkpoint in dir (its config.json; false when it is missing or unreadable).
bool is_synthetic_checkpoint(const std::string& dir);
// Where the checkpoint in dir keeps its tokenizer (and chat template): dir itself when it holds
// tokenizer.json; for a synthetic checkpoint without one (the full-size preset writes none: its
// vocabulary is the real model's), the Qwen3 tokenizer above. Otherwise an error naming dir.
Result<std::string> checkpoint_tokenizer_dir(const std::string& dir);

}  // namespace lily
