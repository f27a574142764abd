// In-memory synthetic weights of the qwen3_5_moe family (seeded random codes, scales and
// biases sized so activations stay O(1)), for tests and `lily bench --synthetic` without a
// checkpoint on disk. Presets: "tiny" (small dims, every code path) and "qwen3.6-35b-a3b"
// (the real shapes, ~19.4 GB).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/weights.h"

namespace lily {

struct SyntheticWeights {
  ModelWeights w;  // views into `blobs`
  std::vector<std::vector<uint8_t>> blobs;
};

Result<ModelConfig> synthetic_config(const std::string& preset);
// Deterministic for (cfg, seed); generation runs on the global thread pool.
std::unique_ptr<SyntheticWeights> make_synthetic_weights(const ModelConfig& cfg, uint64_t seed);

}  // namespace lily
