// The byte floor of a decode step: the bytes it must move (weights read once for all rows, each row's
// recurrent state read and written and its K/V read), which `lily bench` and `lily bench-batch` set
// beside the measured step time at the measured copy bandwidth.
#pragma once
#include "io/config.h"
#include "model/cost_model.h"
#include "model/model.h"

namespace lily::cli {

// Bytes of a quantized [rows, cols] linear: codes + bf16 scale and bias per 64-group.
double qbytes(double rows, double cols, int bits);

// Bytes one decode step of `rows` sequences at context ctx reads and writes: every dense weight once (the
// layers' weight elements of model/cost_model.h at their bits), the experts the rows select (with uniform
// routing, E·(1 − (1 − k/E)^rows) distinct per layer), per row the DeltaNet state (read + write), conv window
// and K/V up to ctx, at the element sizes the backend's states have (sm: Model::state_memory).
double step_bytes(const ModelConfig& c, double ctx, const StateMemory& sm, int rows = 1);

}  // namespace lily::cli
