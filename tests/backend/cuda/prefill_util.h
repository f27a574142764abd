// Helpers of the CudaPrefill.* tests (gemm_test.cpp, moe_test.cpp, deltanet_test.cpp,
// attention_test.cpp, model_test.cpp): the CUDA prefill kernels (src/backend/cuda/step/prefill_ops.h)
// against the CPU reference (ref_ops and the reference forward), on seeded random inputs at prompt
// lengths that cross every tile (64) and chunk boundary, including prefill continuing from a non-empty
// state; then the whole model: CUDA prefill (+ decode) vs the CPU reference on the tiny synthetic model,
// chunked and in pieces. Each check prints one table row (op, shape, max |err|, tolerance). Skips
// loudly without a GPU. Only for translation units built with CUDA.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/ref_ops.h"
#include "backend/cuda/step/prefill_ops.h"
#include "core/bf16.h"
#include "device_util.h"

namespace lily::test_prefill {

using cuda::QW;

using testcuda::as_bf16;
using testcuda::dims;
using testcuda::from_bits;
using testcuda::to_bits;

// Skips without a GPU; the reference must keep fp32 activations (its default).
#define LILY_PREFILL_REQUIRE_GPU()                                   \
  std::string why_;                                                  \
  if (!::lily::cuda_device_present(why_)) GTEST_SKIP() << "no CUDA device: " << why_;   \
  ASSERT_FALSE(::lily::cpu::bf16_storage()) << "reference must keep fp32 activations"

using testcuda::DBuf;

inline std::mt19937_64& rng() {
  static std::mt19937_64 r(4321);
  return r;
}
inline float randn() { return std::normal_distribution<float>(0.f, 1.f)(rng()); }
inline float randu() { return std::uniform_real_distribution<float>(0.f, 1.f)(rng()); }
inline std::vector<float> randv(size_t n, float scale = 1.f, float mean = 0.f) {
  std::vector<float> v(n);
  for (auto& x : v) x = mean + scale * randn();
  return v;
}
inline std::vector<float> rand_bf16(size_t n, float scale = 1.f, float mean = 0.f) {
  auto v = randv(n, scale, mean);
  for (auto& x : v) x = round_bf16(x);
  return v;
}

// Host quantized weight with storage, drawn from this suite's generator.
struct HostQ : testcuda::HostQ {
  HostQ(int rows, int cols, int bits, float gain = 1.f) : testcuda::HostQ(rng(), rows, cols, bits, gain) {}
};
using testcuda::DevQ;

inline bool check(const std::string& op, const std::string& shape, const std::vector<float>& got, const std::vector<float>& ref,
                  float atol, float rtol, const std::vector<char>* skip = nullptr, size_t row = 1) {
  EXPECT_EQ(got.size(), ref.size());
  double max_err = 0;
  long first_bad = -1;
  size_t nbad = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    if (skip && (*skip)[i / row]) continue;
    const double err = std::fabs(double(got[i]) - double(ref[i]));
    const bool bad = !(err <= atol + rtol * std::fabs(ref[i]));
    if (bad) {
      if (first_bad < 0) first_bad = long(i);
      ++nbad;
    }
    if (err > max_err || std::isnan(err)) max_err = std::isnan(err) ? INFINITY : err;
  }
  std::printf("| %-24s | %-34s | %10.3e | atol %.0e + rtol %.0e | %s", op.c_str(), shape.c_str(), max_err, atol, rtol,
              nbad ? "FAIL" : "ok");
  if (nbad) std::printf(" (%zu bad; first [%ld] got %.6g ref %.6g)", nbad, first_bad, got[size_t(first_bad)], ref[size_t(first_bad)]);
  std::printf(" |\n");
  std::fflush(stdout);
  EXPECT_EQ(nbad, 0u) << op << " " << shape;
  return nbad == 0;
}

// A split into fp16 hi/lo planes + group sums on the device (pf::split_rows), for the pipelined GEMM.
struct DevSplit {
  DBuf<uint16_t> hi, lo;
  DBuf<float> xs;
  DevSplit(const float* a, int lda, int rows, int K)
      : hi(size_t(rows) * K), lo(size_t(rows) * K), xs(size_t(rows) * K / 64) {
    EXPECT_TRUE(cuda::pf::split_rows(a, lda, rows, K, hi.p, lo.p, xs.p, nullptr).is_ok());
  }
  void use(cuda::pf::GemmArgs& g) const { g.ah = hi.p, g.al = lo.p, g.axs = xs.p; }
};

// Mean ms of `reps` calls of run() after one untimed call; -1 if a call failed.
template <typename F> float mean_ms(int reps, F run) {
  if (!run()) return -1;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  cudaEventRecord(e0);
  bool ok = true;
  for (int i = 0; i < reps && ok; ++i) ok = run();
  cudaEventRecord(e1);
  float ms = -1;
  if (ok && cudaEventSynchronize(e1) == cudaSuccess) {
    cudaEventElapsedTime(&ms, e0, e1);
    ms /= float(reps);
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  return ms;
}
// {max |y − base|, max |base|}: a variant's output against the first variant's.
inline std::pair<double, double> max_diff(const std::vector<float>& y, const std::vector<float>& base) {
  double md = 0, my = 0;
  for (size_t i = 0; i < y.size(); ++i) md = std::max(md, double(std::fabs(y[i] - base[i]))), my = std::max(my, double(std::fabs(base[i])));
  return {md, my};
}

}  // namespace lily::test_prefill
