// The byte floor of a decode step: the bytes it must move (weights read once for all rows, each row's
// recurrent state read and written and its K/V read), which `lily bench` and `lily bench-batch` set
// beside the measured step time at the measured copy bandwidth.
#pragma once
#include "io/config.h"

namespace lily::cli {

// Bytes of a quantized [rows, cols] linear: codes + bf16 scale and bias per 64-group.
double qbytes(double rows, double cols, int bits);

// Bytes one decode step of `rows` sequences at context ctx reads and writes: every dense weight once,
// the experts the rows select (with uniform routing, E·(1 − (1 − k/E)^rows) distinct per layer), per
// row the DeltaNet state (fp32, read + write), conv window and K/V up to ctx. kv_es: bytes per K/V
// cache and conv-window element (CUDA: 4 unless LILY_CUDA_KV=bf16).
double step_bytes(const ModelConfig& c, double ctx, double kv_es, int rows = 1);

}  // namespace lily::cli
