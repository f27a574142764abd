// The ggml tensor encodings a GGUF file written by lily may hold: F32, F16 and the 32-weight
// blocks Q4_0 (fp16 d + 16 bytes of nibbles, w = (q − 8)·d), Q4_1 (fp16 d, fp16 m + 16 bytes,
// w = q·d + m) and Q8_0 (fp16 d + 32 int8, w = q·d). In a 4-bit block, byte j holds weight j in
// its low nibble and weight j + 16 in its high nibble (ggml's layout, from the GGUF spec).
#pragma once
#include <cstddef>
#include <cstdint>

namespace lily::gguf {

// ggml_type ids as stored in a GGUF tensor info.
enum class TensorType : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 };

const char* tensor_type_name(TensorType t);
int block_weights(TensorType t);  // weights per block: 1 for F32/F16, 32 for the quantized types
size_t block_bytes(TensorType t);  // bytes per block: 4, 2, 18, 20, 34
// Bytes of n weights (n a multiple of block_weights(t)).
size_t row_bytes(TensorType t, int64_t n);

// IEEE binary16 from fp32, round to nearest even (overflow to ±inf, subnormals kept).
uint16_t f32_to_f16(float f);

// One row of n weights (n a multiple of 32 for the block types) into out (row_bytes(t, n)).
// Q4_0: d = m / −8 with m the weight of largest magnitude, so that weight is exact; the others
// round to the nearest (q − 8)·d. Q8_0: d = max|x| / 127. F16 rounds each weight.
// Q4_1 is not made from floats: use pack_q4_1 with the affine parameters themselves.
void pack_row(TensorType t, const float* x, int64_t n, uint8_t* out);

// Q4_1 blocks straight from 4-bit affine codes (w = scale·q + bias per group of `group`
// weights, group a multiple of 32): d = fp16(scale), m = fp16(bias), q unchanged. Exact
// whenever scale and bias are fp16 values (bf16 ones are, inside fp16's range).
// codes: [n] in 0..15; scale, bias: [n / group].
void pack_q4_1(const uint8_t* codes, const float* scale, const float* bias, int64_t n, int group, uint8_t* out);

}  // namespace lily::gguf
