// Drawing decode tokens on the device (draw.cu): rows of fp32 logits in device memory to Drawn
// records, as model/draw.cpp's draw_row does on the host, op for op (see core/sample_math.h), so
// a row draws the same id on either. Plain C++ header: tests and the backend include it.
#pragma once
#include <cstddef>

#include "core/status.h"
#include "model/draw.h"

namespace lily::cuda {

// Scratch for draw_rows over B rows of V logits (bytes).
size_t draw_scratch_bytes(int B, int V);
// logits: device [B][V] fp32 (row stride V); spec: device [B]; out: device [B]; stream: cudaStream_t.
Status draw_rows(const float* logits, int B, int V, const DrawSpec* spec, Drawn* out, void* scratch, void* stream);

}  // namespace lily::cuda
