// sampling/: the decode draw on the device (draw_rows below): logits fp32 [B][V] in device memory →
// one Drawn record per row, equal to the host's draw of the same row (the same fp32/double operations).
//
// Drawing decode tokens on the device (draw.cu): rows of fp32 logits in device memory to Drawn
// records, as model/draw.cpp's draw_row does on the host, op for op (see core/sample_math.h), so
// a row draws the same id on either: token mask, penalties, greedy, the plain and the filtered
// (top-k, min-p, top-p) draw, log-probabilities. Plain C++ header: tests and the backend include it.
#pragma once
#include <cstddef>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/draw.h"

namespace lily::cuda {

// Scratch for draw_rows over B rows of V logits (bytes). Its first draw_upload_bytes(B, V) bytes
// are where pack_draw_specs' image goes.
size_t draw_scratch_bytes(int B, int V);
size_t draw_upload_bytes(int B, int V);
// Packs B host specs, with the penalty lists and masks their pointers show, into one image to be
// copied to `device_at` (the start of draw_rows' scratch): the B specs first, their pointers
// rewritten to where their entries land. At most draw_upload_bytes(B, V) bytes; an out-of-range
// spec (kMaxDrawPenalties, kMaxDrawTop, u outside [0, 1)) is an error.
Status pack_draw_specs(std::span<const DrawSpec> spec, int V, const void* device_at, std::vector<unsigned char>& image);
// logits: device [B][V] fp32 (row stride V); spec: device [B], with device pointers inside (a
// pack_draw_specs image, or specs without a mask or penalties); out: device [B]; stream:
// cudaStream_t.
Status draw_rows(const float* logits, int B, int V, const DrawSpec* spec, Drawn* out, void* scratch, void* stream);

}  // namespace lily::cuda
