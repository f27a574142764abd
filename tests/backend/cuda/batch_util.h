// Helpers of the CudaBatch.* and CudaBatchTc.* tests (gemv_test.cpp, gemm_test.cpp, moe_test.cpp,
// deltanet_test.cpp, attention_test.cpp). CudaBatch.*: the batched decode kernels (step/batch_ops.h)
// against the batch-1 decode kernels (common/ops.h) row by row, on seeded random inputs at the real
// Qwen3.6-35B-A3B shapes and edge shapes, B = 1, 2, 3, 8, 16, 17, 64, rows at different positions (one at
// position 0). The batched kernels copy the batch-1 arithmetic, so the expected difference is 0
// (bit-identical); the batch-1 kernels are checked against the CPU reference by CudaOps.*. Where the
// decode step takes another kernel (the chunked attention split kernel), the rows against it have a
// stated tolerance, printed. Prints one row per check: op, shape, B, max |Δ|. Skips loudly
// without a GPU. CudaBatchTc.*: the qgemm step (gemm/qgemm.h and the kernels around it, not
// bit-identical to batch-1) against the scalar CPU reference (cpu::qmatmul, the reference MoE formula)
// with stated normwise tolerances, and batch invariance (the same source row at B = 64 and at other B /
// positions: |Δ| = 0). Only for translation units built with CUDA.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ref_ops.h"
#include "backend/cuda/common/ops.h"
#include "core/bf16.h"
#include "device_util.h"

namespace lily::test_batch {

using cuda::QW;

using testcuda::bf16_of;
using testcuda::D;
using testcuda::GraphTimer;

inline std::mt19937_64& rng() {
  static std::mt19937_64 r(77);
  return r;
}
inline float randn() { return std::normal_distribution<float>(0.f, 1.f)(rng()); }

inline std::vector<float> randv(size_t n, float s = 1.f) {
  std::vector<float> v(n);
  for (auto& x : v) x = s * randn();
  return v;
}
inline std::vector<uint16_t> randbf(size_t n, float mean, float s) {
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = bf16_of(mean + s * randn());
  return v;
}

// Random quantized matrix in the device layout (codes, interleaved bf16 scale/bias per group).
struct Q {
  D<uint32_t> codes;
  D<uint16_t> sb;
  QW q;
  Q(int rows, int cols, int bits)
      : codes([&] {
          std::vector<uint32_t> c(size_t(rows) * cols * bits / 32);
          for (auto& w : c) w = uint32_t(rng()());
          return c;
        }()),
        sb([&] {
          std::vector<uint16_t> s(size_t(rows) * cols / 64 * 2);
          const float lv = float((1 << bits) - 1), s0 = 1.f / (lv * std::sqrt(float(cols)));
          for (size_t i = 0; i < s.size(); i += 2) {
            const float sc = s0 * (0.5f + 0.5f * std::fabs(randn()));
            s[i] = bf16_of(sc), s[i + 1] = bf16_of(-sc * lv * 0.5f);
          }
          return s;
        }()) {
    q.codes = codes.p, q.sb = sb.p, q.rows = rows, q.cols = cols, q.bits = bits;
  }
};

inline float max_diff(const std::vector<float>& a, const std::vector<float>& b, size_t* first_bad = nullptr, float tol = 0.f) {
  float m = 0.f;
  for (size_t i = 0; i < a.size(); ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (!(d <= tol) && first_bad && *first_bad == size_t(-1)) *first_bad = i;
    if (d > m || d != d) m = d != d ? INFINITY : d;
  }
  return m;
}
inline void row(const char* op, const std::string& shape, int B, float err) {
  std::printf("[cuda-batch] | %s | %s | B=%d | max |d| %.3g |\n", op, shape.c_str(), B, err);
}

const int kBs[] = {1, 2, 3, 8, 16, 17, 64};

// Host quantized weight (random codes, scale/bias as the test Q above) and its device copy.
struct HQ {
  std::vector<uint32_t> codes;
  std::vector<bf16> sc, bi;
  QWeight w;
  D<uint32_t> dcodes;
  D<uint16_t> dsb;
  QW q;
  HQ(int rows, int cols, int bits)
      : codes(size_t(rows) * cols * bits / 32), sc(size_t(rows) * cols / 64), bi(sc.size()), dcodes(codes.size()),
        dsb(2 * sc.size()) {
    for (auto& c : codes) c = uint32_t(rng()());
    const float lv = float((1 << bits) - 1), s0 = 1.f / (lv * std::sqrt(float(cols)) / 3.f);
    std::vector<uint16_t> sb(2 * sc.size());
    for (size_t i = 0; i < sc.size(); ++i) {
      const float s = s0 * (0.5f + 0.5f * std::fabs(randn()));
      sc[i] = f32_to_bf16(s), bi[i] = f32_to_bf16(-s * lv * (0.5f + 0.1f * randn()));
      sb[2 * i] = sc[i].bits, sb[2 * i + 1] = bi[i].bits;
    }
    cudaMemcpy(dcodes.p, codes.data(), codes.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dsb.p, sb.data(), sb.size() * 2, cudaMemcpyHostToDevice);
    w.codes = codes.data(), w.scales = sc.data(), w.biases = bi.data(), w.rows = rows, w.cols = cols, w.bits = bits;
    w.group_size = 64;
    q.codes = dcodes.p, q.sb = dsb.p, q.rows = rows, q.cols = cols, q.bits = bits;
  }
};

// Activation rows: mostly N(0,1), some rows scaled by 1e-3 or 30, a few large outliers (group exponents).
inline std::vector<float> act_rows(int R, int K) {
  std::vector<float> x = randv(size_t(R) * K);
  for (int r = 0; r < R; ++r) {
    const float f = r % 5 == 3 ? 1e-3f : r % 7 == 2 ? 30.f : 1.f;
    for (int c = 0; c < K; ++c) x[size_t(r) * K + c] *= f;
    x[size_t(r) * K + size_t(r * 131) % K] *= 40.f;
  }
  return x;
}

// Normwise error of row r: max_c |got − ref| / rms(ref row).
struct NormErr {
  double worst = 0;
  void add(const float* got, const float* ref, int n) {
    double ss = 0, m = 0;
    for (int i = 0; i < n; ++i) ss += double(ref[i]) * ref[i], m = std::max(m, std::fabs(double(got[i]) - ref[i]));
    const double e = m / std::max(std::sqrt(ss / n), 1e-30);
    if (e > worst || e != e) worst = e != e ? INFINITY : e;
  }
};

// Stated tolerances (normwise, see NormErr), two-pass activations (fp16 hi + lo, ~22 bits): GEMM 3e-5,
// MoE 5e-5 (two GEMMs and a SwiGLU deep). The arithmetic itself is checked to 1e-5 of Σ|terms| in
// cuda/qgemm_test.cpp; the precision budget of the whole model is the goldens' envelope.
constexpr double kTolGemm = 3e-5, kTolMoe = 5e-5;

// Device rows packed for qgemm (with the remainders).
struct Packed16 {
  D<uint16_t> X, Xlo;
  D<float> XS;
  Packed16(size_t R, int K) : X(R * K), Xlo(R * K), XS(R * K / 32) {}
};

}  // namespace lily::test_batch
