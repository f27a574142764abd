// `lily gguf`'s conversion: one of our MLX checkpoints as a GGUF that llama.cpp's `qwen35moe`
// architecture loads (names, shapes, metadata and value transforms read from llama.cpp's
// src/models/qwen35moe.cpp, src/llama-arch.cpp and its converter conversion/qwen.py).
// Key decision: weights are dequantized (w = scale·q + bias, fp32) and re-encoded per tensor,
// in parallel over rows, one tensor in memory at a time, so the 19 GB model converts in a few
// GB of RAM.
#pragma once
#include <string>

#include "core/status.h"
#include "io/gguf_quant.h"

namespace lily::cli {

struct GgufConvertOptions {
  std::string model_dir;
  std::string tokenizer_dir;  // holds tokenizer.json (+ tokenizer_config.json)
  std::string out_path;
  // Q4_0: 4.5 bits per weight like the MLX 4-bit checkpoint (re-quantized, so not exact); the
  // routers become Q8_0. Q4_1: the MLX affine (scale, bias) kept exactly as (d, m), 5 bits per
  // weight; the routers become F32. For checking numerics against lily, not for speed.
  gguf::TensorType weight_type = gguf::TensorType::Q4_0;
};

// Writes the GGUF (progress on stderr). Errors name the field or tensor.
Status convert_to_gguf(const GgufConvertOptions& o);

}  // namespace lily::cli
