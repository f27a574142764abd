// Helpers of the CudaOps.* tests (gemv_test.cpp, common_test.cpp, moe_test.cpp, deltanet_test.cpp,
// attention_test.cpp): every CUDA decode op against the CPU reference (ref_ops + small scalar
// references in the tests for the pieces that live inside the CPU forward), on seeded random inputs,
// at the real Qwen3.6-35B-A3B shapes, at the golden checkpoints' shapes (expert width 64, shared width ≠
// expert width, GDN head dims 32/64, GQA group 3, K = 320) and at edge shapes. Activations are
// fp32 on both sides (the reference's default storage), so tolerances are fp32-summation-order
// tight (a bf16 rounding anywhere would exceed them). Each check prints one table row: op, shape,
// max |err|, tolerance (atol + rtol·|ref|), first bad index. Skips loudly without a GPU.
// Only for translation units built with CUDA.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ref_ops.h"
#include "backend/cuda/common/ops.h"
#include "core/bf16.h"
#include "device_util.h"

namespace lily::test_ops {

using cuda::QW;

using testcuda::as_bf16;
using testcuda::dims;
using testcuda::from_bits;
using testcuda::to_bits;

// The reference keeps activations in fp32, as the kernels do.
struct Fp32Storage {
  bool prev = cpu::bf16_storage();
  Fp32Storage() { cpu::set_bf16_storage(false); }
  ~Fp32Storage() { cpu::set_bf16_storage(prev); }
};
// Skips without a GPU; the reference keeps fp32 activations for the rest of the test.
#define LILY_OPS_REQUIRE_GPU()                                                \
  std::string why_;                                                           \
  if (!::lily::cuda_device_present(why_)) GTEST_SKIP() << "no CUDA device: " << why_;  \
  ::lily::test_ops::Fp32Storage fp32_storage_guard_

using testcuda::DBuf;

inline std::mt19937_64& rng() {
  static std::mt19937_64 r(1234);
  return r;
}
inline float randn() { return std::normal_distribution<float>(0.f, 1.f)(rng()); }
inline float randu() { return std::uniform_real_distribution<float>(0.f, 1.f)(rng()); }

// Host quantized weight with storage, drawn from this suite's generator.
struct HostQ : testcuda::HostQ {
  HostQ(int rows, int cols, int bits, float gain = 1.f) : testcuda::HostQ(rng(), rows, cols, bits, gain) {}
};

using testcuda::DevQ;

inline std::vector<float> rand_bf16(size_t n, float scale = 1.f, float mean = 0.f) {
  std::vector<float> v(n);
  for (auto& x : v) x = round_bf16(mean + scale * randn());
  return v;
}

// One row of the table; returns pass. Tolerance: |got − ref| ≤ atol + rtol·|ref| (+ extra[i] when given: a
// per-output term for sums whose terms cancel, where |ref| says nothing of the rounding).
inline std::string g_tag;  // appended to every row's shape while set (e.g. " tc" for the tensor-core GEMV rows)
inline bool check(const std::string& op, const std::string& shape_in, const std::vector<float>& got, const std::vector<float>& ref,
                  float atol, float rtol, const std::vector<float>* extra = nullptr) {
  const std::string shape = shape_in + g_tag;
  EXPECT_EQ(got.size(), ref.size());
  double max_err = 0;
  long first_bad = -1;
  size_t nbad = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    const double err = std::fabs(double(got[i]) - double(ref[i]));
    const double tol = atol + rtol * std::fabs(ref[i]) + (extra ? double((*extra)[i]) : 0.0);
    const bool bad = !(err <= tol);  // NaN fails
    if (bad) {
      if (first_bad < 0) first_bad = long(i);
      ++nbad;
    }
    if (err > max_err || std::isnan(err)) max_err = std::isnan(err) ? INFINITY : err;
  }
  std::printf("| %-26s | %-30s | %10.3e | atol %.0e + rtol %.0e%s | %s", op.c_str(), shape.c_str(), max_err, atol, rtol,
              extra ? " + cond" : "", nbad ? "FAIL" : "ok");
  if (nbad)
    std::printf(" (%zu bad; first [%ld] got %.6g ref %.6g)", nbad, first_bad, got[size_t(first_bad)], ref[size_t(first_bad)]);
  std::printf(" |\n");
  EXPECT_EQ(nbad, 0u) << op << " " << shape;
  return nbad == 0;
}

}  // namespace lily::test_ops
