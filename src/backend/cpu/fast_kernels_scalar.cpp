// Portable kernels (any x86-64 or other CPU): the same integer arithmetic as the SIMD paths in
// plain loops, plus prepare_x, which every path shares. Also the fallback when no AVX2 is found.
#include <algorithm>
#include <cmath>

#include "backend/cpu/fast_gdn_kernels.h"
#include "backend/cpu/fast_gemm.h"
#include "core/bf16.h"
#include "core/thread_pool.h"

namespace lily::cpu::fast {

// nearbyint for |t| < 2^22 in the default rounding mode (to nearest, ties to even), as two fp32 adds: t + 1.5·2^23
// lands where the float spacing is 1, so the sum rounds t to an integer, and the difference is exact (IEEE
// arithmetic: without -ffast-math the compiler keeps both adds). The baseline x86-64 target has no SSE4.1 round
// instruction, so std::nearbyint was a libm call, two a value and ~0.5 M values a decoded token.
inline float round_even(float t) {
  constexpr float kMagic = 12582912.0f;  // 1.5·2^23
  return (t + kMagic) - kMagic;
}

void prepare_x(const float* x, int M, int ldx, int K, PreparedX& out) {
  const int G = K / kGroup;
  out.M = M, out.K = K, out.G = G;
  out.pairs.resize(size_t(M) * G * kPairsPerGroup);
  out.lo.resize(out.pairs.size());
  out.dx.resize(size_t(M) * G);
  out.xsum.resize(size_t(M) * G);
  // Rows are independent: spread long prefills over the pool, keep decode on the caller's thread.
  ThreadPool::global().parallel_for(size_t(M), M >= 16 ? 8 : size_t(M), [&](size_t m0, size_t m1) {
    for (size_t m = m0; m < m1; ++m) {
      const float* xm = x + m * ldx;
      for (int g = 0; g < G; ++g) {
        const float* xg = xm + g * kGroup;
        float mx = 0, s = 0;
        for (int c = 0; c < kGroup; ++c) {
          mx = std::max(mx, std::fabs(xg[c]));
          s += xg[c];
        }
        const float dx = mx / 32767.0f;
        const float inv = mx > 0 ? 32767.0f / mx : 0.0f;
        int16_t qv[kGroup], ql[kGroup];
        for (int c = 0; c < kGroup; ++c) {
          const float t = xg[c] * inv;  // in [-32767, 32767]
          const float h = std::clamp(round_even(t), -32767.0f, 32767.0f);
          qv[c] = int16_t(h);
          ql[c] = int16_t(std::clamp(round_even((t - h) * 65534.0f), -32767.0f, 32767.0f));
        }
        int32_t* p = out.pairs.data() + (size_t(m) * G + g) * kPairsPerGroup;
        int32_t* pl = out.lo.data() + (size_t(m) * G + g) * kPairsPerGroup;
        for (int j = 0; j < 4; ++j)
          for (int w = 0; w < 8; ++w) {
            p[j * 8 + w] = int32_t(uint16_t(qv[8 * w + j]) | (uint32_t(uint16_t(qv[8 * w + 4 + j])) << 16));
            pl[j * 8 + w] = int32_t(uint16_t(ql[8 * w + j]) | (uint32_t(uint16_t(ql[8 * w + 4 + j])) << 16));
          }
        out.dx[size_t(m) * G + g] = dx;
        out.xsum[size_t(m) * G + g] = s;
      }
    }
  });
}

namespace {

void q4_rows(const QArgs& a) {
  const QWeight& w = *a.w;
  const int G = w.groups_per_row(), wpr = w.words_per_row();
  for (int r = a.r0; r < a.r1; ++r) {
    const uint32_t* codes = w.codes + size_t(r) * wpr;
    const bf16* sc = w.scales + size_t(r) * G;
    const bf16* bi = w.biases + size_t(r) * G;
    for (int i = 0; i < a.n; ++i) {
      const int m = a.ids[i];
      const int32_t* xp = a.x->row_pairs(m);
      const int32_t* xl = a.x->row_lo(m);
      const float* dx = a.x->row_dx(m);
      const float* xs = a.x->row_xsum(m);
      float acc = 0;
      for (int g = 0; g < G; ++g) {
        int32_t isum = 0, lsum = 0;
        for (int j = 0; j < 4; ++j)
          for (int ww = 0; ww < 8; ++ww) {
            const uint32_t word = codes[g * 8 + ww];
            const int32_t q0 = int32_t((word >> (4 * j)) & 0xF), q1 = int32_t((word >> (4 * j + 16)) & 0xF);
            const int32_t pr = xp[(g * 4 + j) * 8 + ww], pl = xl[(g * 4 + j) * 8 + ww];
            isum += q0 * int16_t(pr & 0xFFFF) + q1 * int16_t(uint32_t(pr) >> 16);
            lsum += q0 * int16_t(pl & 0xFFFF) + q1 * int16_t(uint32_t(pl) >> 16);
          }
        const float d = float(isum) + float(lsum) * kLoScale;
        acc += bf16_to_f32(sc[g]) * (dx[g] * d) + bf16_to_f32(bi[g]) * xs[g];
      }
      a.y[size_t(i) * a.ldy + r] = acc;
    }
  }
}

// 4-bit with fp32 activations (a.xf): the exact-activation variant, for measuring what the int16 step costs.
void q4_rows_f32(const QArgs& a) {
  const QWeight& w = *a.w;
  const int G = w.groups_per_row();
  for (int r = a.r0; r < a.r1; ++r)
    for (int i = 0; i < a.n; ++i) {
      const float* x = a.xf + size_t(a.ids[i]) * a.ldxf;
      float acc = 0;
      for (int g = 0; g < G; ++g) {
        float d = 0, s = 0;
        for (int c = g * kGroup; c < (g + 1) * kGroup; ++c) d += float(w.code(r, c)) * x[c], s += x[c];
        acc += bf16_to_f32(w.scales[size_t(r) * G + g]) * d + bf16_to_f32(w.biases[size_t(r) * G + g]) * s;
      }
      a.y[size_t(i) * a.ldy + r] = acc;
    }
}

}  // namespace

// One row at a time: dequantize it to fp32 (w = scale·q + bias), then a dot product per token.
void q4_gemm_scalar(const QArgs& a) {
  const QWeight& w = *a.w;
  const int G = w.groups_per_row(), K = w.cols;
  std::vector<float> wr(static_cast<size_t>(K));
  for (int r = a.r0; r < a.r1; ++r) {
    for (int g = 0; g < G; ++g) {
      const float s = bf16_to_f32(w.scales[size_t(r) * G + g]), b = bf16_to_f32(w.biases[size_t(r) * G + g]);
      for (int c = g * kGroup; c < (g + 1) * kGroup; ++c) wr[c] = std::fma(s, float(w.code(r, c)), b);
    }
    for (int i = 0; i < a.n; ++i) {
      const float* x = a.xf + size_t(a.ids[i]) * a.ldxf;
      float acc = 0;
      for (int c = 0; c < K; ++c) acc += wr[c] * x[c];
      a.y[size_t(i) * a.ldy + r] = acc;
    }
  }
}

namespace {

void q8_rows(const QArgs& a) {
  const QWeight& w = *a.w;
  const int G = w.groups_per_row(), K = w.cols;
  for (int r = a.r0; r < a.r1; ++r) {
    const uint8_t* q = reinterpret_cast<const uint8_t*>(w.codes + size_t(r) * w.words_per_row());
    for (int i = 0; i < a.n; ++i) {
      const float* x = a.xf + size_t(a.ids[i]) * a.ldxf;
      float acc = 0;
      for (int g = 0; g < G; ++g) {
        float d = 0, s = 0;
        for (int c = g * kGroup; c < (g + 1) * kGroup; ++c) d += float(q[c]) * x[c], s += x[c];
        acc += bf16_to_f32(w.scales[size_t(r) * G + g]) * d + bf16_to_f32(w.biases[size_t(r) * G + g]) * s;
      }
      (void)K;
      a.y[size_t(i) * a.ldy + r] = acc;
    }
  }
}

float dot(const float* a, const float* b, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy(float* y, float s, const float* x, int n) {
  for (int i = 0; i < n; ++i) y[i] += s * x[i];
}

void gdn_step(float* S, const float* q, const float* k, const float* v, float alpha, float beta, float* out, int dk,
              int dv, int ldS) {
  std::vector<float> kv(dv, 0.0f), oq(dv, 0.0f);
  for (int i = 0; i < dk; ++i) {
    const float* Si = S + size_t(i) * ldS;
    for (int j = 0; j < dv; ++j) kv[j] += Si[j] * k[i], oq[j] += Si[j] * q[i];
  }
  const float kq = dot(k, q, dk);
  for (int j = 0; j < dv; ++j) {
    const float delta = beta * (v[j] - alpha * kv[j]);
    kv[j] = delta;
    out[j] = alpha * oq[j] + kq * delta;
  }
  for (int i = 0; i < dk; ++i) {
    float* Si = S + size_t(i) * ldS;
    for (int j = 0; j < dv; ++j) Si[j] = alpha * Si[j] + k[i] * kv[j];
  }
}

// KernelTable::fma_flops on scalars (as compiled for the base ISA).
double fma_flops(long iters, float* sink) {
  constexpr int kChains = 12;
  float acc[kChains];
  for (int j = 0; j < kChains; ++j) acc[j] = 1.0f + 0.001f * float(j);
  for (long i = 0; i < iters; ++i)
    for (int j = 0; j < kChains; ++j) acc[j] = std::fma(acc[j], 0.99999994f, 1e-7f);
  float s = 0;
  for (float a : acc) s += a;
  *sink = s;
  return double(iters) * kChains * 2;
}

}  // namespace

const KernelTable& scalar_table() {
  static const KernelTable t{kGdnScalar, "scalar", q4_rows, q4_gemm_scalar, q8_rows, dot, axpy, gdn_step, fma_flops};
  return t;
}

const KernelTable& scalar_f32_table() {
  static const KernelTable t{kGdnScalar, "scalar-f32", q4_rows_f32, q4_gemm_scalar, q8_rows, dot, axpy, gdn_step, fma_flops};
  return t;
}

}  // namespace lily::cpu::fast
