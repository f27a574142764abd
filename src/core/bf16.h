// bfloat16 storage type: round-to-nearest-even from fp32, exact widening to fp32.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace lily {

struct bf16 {
  uint16_t bits = 0;
};

inline float bf16_to_f32(bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return bf16{uint16_t(u >> 16)};
}

// Round an fp32 value to the nearest bf16 value, returned as fp32.
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

}  // namespace lily
