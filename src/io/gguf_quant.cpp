// ggml block encodings (see gguf_quant.h). Written from the format definitions; the scale of a
// block is rounded to fp16 first and the weights are quantized against that rounded scale, so
// the stored (q, d) pair is the nearest the format can hold.
#include "io/gguf_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/status.h"

namespace lily::gguf {
namespace {

constexpr int kBlock = 32;

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float mag;
  if (exp == 0) mag = std::ldexp(float(mant), -24);
  else if (exp == 31) mag = mant ? NAN : INFINITY;
  else mag = std::ldexp(float(mant | 0x400), int(exp) - 25);
  uint32_t u;
  std::memcpy(&u, &mag, 4);
  u |= sign;
  std::memcpy(&mag, &u, 4);
  return mag;
}

void put_f16(uint8_t* p, uint16_t h) {
  p[0] = uint8_t(h & 0xff);
  p[1] = uint8_t(h >> 8);
}

// Weight of largest magnitude in xb[0..32) (the first one on ties).
float largest(const float* xb) {
  float m = 0.0f;
  for (int j = 0; j < kBlock; ++j)
    if (std::fabs(xb[j]) > std::fabs(m)) m = xb[j];
  return m;
}

void pack_q4_0_block(const float* xb, uint8_t* out) {
  const uint16_t dh = f32_to_f16(largest(xb) / -8.0f);
  const float d = f16_to_f32(dh), inv = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(out, dh);
  // x·inv ≥ −8 (up to d's rounding), so the truncation of x·inv + 8.5 rounds to nearest.
  auto code = [&](float x) { return std::clamp(int(x * inv + 8.5f), 0, 15); };
  for (int j = 0; j < kBlock / 2; ++j) out[2 + j] = uint8_t(code(xb[j]) | (code(xb[j + 16]) << 4));
}

void pack_q8_0_block(const float* xb, uint8_t* out) {
  const uint16_t dh = f32_to_f16(std::fabs(largest(xb)) / 127.0f);
  const float d = f16_to_f32(dh), inv = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(out, dh);
  for (int j = 0; j < kBlock; ++j) {
    const float v = xb[j] * inv;
    const int q = std::clamp(v >= 0.0f ? int(v + 0.5f) : -int(0.5f - v), -127, 127);  // to nearest
    out[2 + j] = uint8_t(int8_t(q));
  }
}

}  // namespace

const char* tensor_type_name(TensorType t) {
  switch (t) {
    case TensorType::F32: return "F32";
    case TensorType::F16: return "F16";
    case TensorType::Q4_0: return "Q4_0";
    case TensorType::Q4_1: return "Q4_1";
    case TensorType::Q8_0: return "Q8_0";
  }
  return "?";
}

int block_weights(TensorType t) { return t == TensorType::F32 || t == TensorType::F16 ? 1 : kBlock; }

size_t block_bytes(TensorType t) {
  switch (t) {
    case TensorType::F32: return 4;
    case TensorType::F16: return 2;
    case TensorType::Q4_0: return 2 + kBlock / 2;
    case TensorType::Q4_1: return 4 + kBlock / 2;
    case TensorType::Q8_0: return 2 + kBlock;
  }
  return 0;
}

size_t row_bytes(TensorType t, int64_t n) { return size_t(n / block_weights(t)) * block_bytes(t); }

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;     // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00;    // ≥ 65520 rounds past 65504: inf
  if (a >= 0x38800000u) {                        // normal half (≥ 2^-14)
    uint32_t h = ((((a >> 23) - 127 + 15) << 10) | ((a & 0x7fffff) >> 13));
    const uint32_t rest = a & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // a carry into the exponent is right
    return uint16_t(sign | h);
  }
  float mag;
  std::memcpy(&mag, &a, 4);
  return uint16_t(sign | uint32_t(std::nearbyint(mag * 16777216.0f)));  // units of 2^-24, ties to even
}

void pack_row(TensorType t, const float* x, int64_t n, uint8_t* out) {
  switch (t) {
    case TensorType::F32:
      std::memcpy(out, x, size_t(n) * 4);
      return;
    case TensorType::F16:
      for (int64_t i = 0; i < n; ++i) put_f16(out + 2 * i, f32_to_f16(x[i]));
      return;
    case TensorType::Q4_0:
      for (int64_t b = 0; b < n / kBlock; ++b) pack_q4_0_block(x + b * kBlock, out + b * block_bytes(t));
      return;
    case TensorType::Q8_0:
      for (int64_t b = 0; b < n / kBlock; ++b) pack_q8_0_block(x + b * kBlock, out + b * block_bytes(t));
      return;
    case TensorType::Q4_1:
      break;
  }
  LILY_CHECK(false && "pack_row: Q4_1 is packed from affine codes (pack_q4_1)");
}

void pack_q4_1(const uint8_t* codes, const float* scale, const float* bias, int64_t n, int group, uint8_t* out) {
  LILY_CHECK(group % kBlock == 0);
  for (int64_t b = 0; b < n / kBlock; ++b) {
    const int64_t g = b * kBlock / group;
    const uint8_t* q = codes + b * kBlock;
    uint8_t* o = out + b * block_bytes(TensorType::Q4_1);
    put_f16(o, f32_to_f16(scale[g]));
    put_f16(o + 2, f32_to_f16(bias[g]));
    for (int j = 0; j < kBlock / 2; ++j) o[4 + j] = uint8_t((q[j] & 0xf) | ((q[j + 16] & 0xf) << 4));
  }
}

}  // namespace lily::gguf
