// Helpers of the CUDA op tests: device buffers, seeded random inputs, random quantized matrices in the
// device layout (codes as on disk, {scale, bias} bf16 pairs per 64-group), bf16/fp16 conversions as
// the hardware rounds, and the skip when there is no GPU. Only for translation units built with CUDA.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/common/ops.h"
#include "core/bf16.h"
#include "model/weights.h"
#include "../cuda_test_env.h"

namespace lily::testcuda {

#define LILY_REQUIRE_GPU()                                         \
  std::string why_;                                                \
  if (!::lily::cuda_device_present(why_)) GTEST_SKIP() << "no CUDA device: " << why_

inline std::mt19937_64& rng() {
  static std::mt19937_64 r(1234);
  return r;
}
inline float randn() { return std::normal_distribution<float>(0.f, 1.f)(rng()); }
inline uint16_t bf16_of(float f) { return f32_to_bf16(f).bits; }
inline float f_of_bf16(uint16_t b) { return bf16_to_f32(bf16{b}); }
// fp16 bits of f, rounded to nearest even as the hardware (__float2half_rn) does, subnormals included.
inline uint16_t half_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t s = (u >> 16) & 0x8000u, fe = (u >> 23) & 0xFFu;
  uint32_t m = u & 0x7FFFFFu;
  if (fe == 0xFFu) return uint16_t(s | 0x7C00u | (m ? 0x200u : 0u));
  const int e = int(fe) - 127 + 15;
  if (e >= 31) return uint16_t(s | 0x7C00u);
  if (e <= 0) {  // a subnormal half (or zero): m·2^(e − 14 − 23 + 1) in units of 2^-24
    if (e < -10) return uint16_t(s);
    m |= 0x800000u;
    const int shift = 14 - e;
    uint32_t hm = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (hm & 1u))) ++hm;
    return uint16_t(s | hm);
  }
  uint32_t r = s | (uint32_t(e) << 10) | (m >> 13);
  const uint32_t rem = m & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // a carry runs into the exponent (to inf at the top)
  return uint16_t(r);
}
// Entries of h (fp16 bits a kernel wrote) that are not half_of the fp32 values f (the kernel's fp32 output).
inline size_t count_not_half_of(const std::vector<uint16_t>& h, const std::vector<float>& f) {
  size_t bad = h.size() == f.size() ? 0 : std::max(h.size(), f.size());
  for (size_t i = 0; i < std::min(h.size(), f.size()); ++i) bad += h[i] != half_of(f[i]);
  return bad;
}
inline float f_of_half(uint16_t h) {
  const uint32_t s = uint32_t(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
  if (e == 0) return (s ? -1.f : 1.f) * std::ldexp(float(m), -24);
  uint32_t u = e == 31 ? s | 0x7F800000u | (m << 13) : s | ((e + 112) << 23) | (m << 13);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float round_half(float f) { return f_of_half(half_of(f)); }
inline std::vector<uint16_t> halves(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = half_of(v[i]);
  return h;
}
inline std::vector<float> from_halves(const std::vector<uint16_t>& h) {
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = f_of_half(h[i]);
  return v;
}

template <typename T> struct D {
  T* p = nullptr;
  size_t n = 0;
  explicit D(size_t n_) : n(n_) {
    cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T));
    cudaMemset(p, 0, std::max<size_t>(n, 1) * sizeof(T));
  }
  explicit D(const std::vector<T>& v) : D(v.size()) { cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice); }
  ~D() { cudaFree(p); }
  D(const D&) = delete;
  D& operator=(const D&) = delete;
  std::vector<T> get() const {
    std::vector<T> v(n);
    cudaDeviceSynchronize();
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
};

// A device buffer poisoned with 0xFF bytes (NaN for floats): a kernel that leaves an output element
// unwritten shows as a NaN in the table (D above starts zeroed, for outputs that accumulate).
template <typename T> struct DBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DBuf(size_t n_) : n(n_) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
    cudaMemset(p, 0xFF, std::max<size_t>(n, 1) * sizeof(T));
  }
  DBuf(const std::vector<T>& v) : DBuf(v.size()) { up(v); }
  ~DBuf() { cudaFree(p); }
  DBuf(const DBuf&) = delete;
  DBuf& operator=(const DBuf&) = delete;
  void up(const std::vector<T>& v) { cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> down() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
};

inline std::vector<float> randv(size_t n, float s = 1.f) {
  std::vector<float> v(n);
  for (auto& x : v) x = s * randn();
  return v;
}

// bf16 bits of fp32 values and back (core/bf16.h's rounding), and "AxBxC" of a shape.
inline std::vector<uint16_t> to_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]).bits;
  return b;
}
inline std::vector<float> from_bits(const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = bf16_to_f32(bf16{b[i]});
  return v;
}
inline std::vector<bf16> as_bf16(const std::vector<float>& v) {
  std::vector<bf16> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}
inline std::string dims(std::initializer_list<long> d) {
  std::string s;
  for (long v : d) s += (s.empty() ? "" : "x") + std::to_string(v);
  return s;
}

// Random quantized matrix, host copies kept for the reference. Scales ~1/(levels·√cols), biases
// centring the codes, so a row·x is O(1) for unit x.
struct QMat {
  int rows = 0, cols = 0, bits = 4;
  std::vector<uint32_t> codes;  // [rows][cols·bits/32]
  std::vector<uint16_t> sb;     // [rows][cols/64][2]
  D<uint32_t> dcodes;
  D<uint16_t> dsb;
  cuda::QW q;
  QMat(int r, int c, int b)
      : rows(r), cols(c), bits(b), codes(gen_codes(r, c, b)), sb(gen_sb(r, c, b)), dcodes(codes), dsb(sb) {
    q.codes = dcodes.p, q.sb = dsb.p, q.rows = rows, q.cols = cols, q.bits = bits;
  }
  int code(int r, int k) const {
    const int per = 32 / bits;
    const uint32_t w = codes[size_t(r) * (cols / per) + k / per];
    return int((w >> (bits * (k % per))) & ((1u << bits) - 1));
  }
  float scale(int r, int g) const { return f_of_bf16(sb[(size_t(r) * (cols / 64) + g) * 2]); }
  float bias(int r, int g) const { return f_of_bf16(sb[(size_t(r) * (cols / 64) + g) * 2 + 1]); }
  float w(int r, int k) const { return scale(r, k / 64) * float(code(r, k)) + bias(r, k / 64); }

 private:
  static std::vector<uint32_t> gen_codes(int r, int c, int b) {
    std::vector<uint32_t> v(size_t(r) * c * b / 32);
    for (auto& w : v) w = uint32_t(rng()());
    return v;
  }
  static std::vector<uint16_t> gen_sb(int r, int c, int b) {
    std::vector<uint16_t> s(size_t(r) * c / 64 * 2);
    const float lv = float((1 << b) - 1), s0 = 1.f / (lv * std::sqrt(float(c)));
    for (size_t i = 0; i < s.size(); i += 2) {
      const float sc = s0 * (0.5f + 0.5f * std::fabs(randn()));
      s[i] = bf16_of(sc), s[i + 1] = bf16_of(-sc * lv * 0.5f * (1.f + 0.1f * randn()));
    }
    return s;
  }
};

// A random quantized weight [rows, cols] of `bits` (MLX affine, groups of 64) with its storage: codes
// uniform, scales around gain / (levels / √12 · √cols), biases centring the codes. Drawn from `gen`, in
// the order each suite's seeded tests expect.
struct HostQ {
  std::vector<uint32_t> codes;
  std::vector<bf16> sc, bi;
  QWeight w;
  HostQ(std::mt19937_64& gen, int rows, int cols, int bits, float gain) {
    auto randu = [&] { return std::uniform_real_distribution<float>(0.f, 1.f)(gen); };
    codes.resize(size_t(rows) * cols * bits / 32);
    for (auto& c : codes) c = uint32_t(gen());
    const size_t ng = size_t(rows) * cols / 64;
    sc.resize(ng), bi.resize(ng);
    const float levels = float((1 << bits) - 1), s0 = gain / (levels / std::sqrt(12.f) * std::sqrt(float(cols)));
    for (size_t i = 0; i < ng; ++i) {
      const float s = s0 * (0.5f + randu());
      sc[i] = f32_to_bf16(s);
      bi[i] = f32_to_bf16(-s * (levels * 0.5f + randu() - 0.5f));
    }
    w.codes = codes.data(), w.scales = sc.data(), w.biases = bi.data();
    w.rows = rows, w.cols = cols, w.bits = bits, w.group_size = 64;
  }
};

// Device copy of a quantized weight, or of several stacked by rows (same cols and bits), in the backend's
// layout: codes as on disk, {scale, bias} bf16 pairs per 64-group.
struct DevQ {
  DBuf<uint32_t> codes;
  DBuf<uint16_t> sb;
  cuda::QW q;
  explicit DevQ(const QWeight& w) : DevQ(std::vector<const QWeight*>{&w}) {}
  explicit DevQ(std::vector<const QWeight*> parts)
      : codes(count_words(parts)), sb(count_groups(parts) * 2) {
    std::vector<uint32_t> c;
    std::vector<uint16_t> s;
    for (auto* p : parts) {
      c.insert(c.end(), p->codes, p->codes + size_t(p->rows) * p->words_per_row());
      for (size_t i = 0; i < size_t(p->rows) * p->groups_per_row(); ++i) s.push_back(p->scales[i].bits), s.push_back(p->biases[i].bits);
      q.rows += p->rows;
    }
    codes.up(c), sb.up(s);
    q.codes = codes.p, q.sb = sb.p, q.cols = parts[0]->cols, q.bits = parts[0]->bits;
  }
  static size_t count_words(const std::vector<const QWeight*>& ps) {
    size_t n = 0;
    for (auto* p : ps) n += size_t(p->rows) * p->words_per_row();
    return n;
  }
  static size_t count_groups(const std::vector<const QWeight*>& ps) {
    size_t n = 0;
    for (auto* p : ps) n += size_t(p->rows) * p->groups_per_row();
    return n;
  }
};

// Microseconds a call: a CUDA graph of n calls of f(stream) on a created stream, replayed once to warm up
// and once timed (as the step runs kernels: no host launch cost, PDL between consecutive calls).
struct GraphTimer {
  cudaStream_t st{};
  cudaEvent_t e0{}, e1{};
  GraphTimer() {
    cudaStreamCreate(&st);
    cudaEventCreate(&e0), cudaEventCreate(&e1);
  }
  ~GraphTimer() {
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaStreamDestroy(st);
  }
  GraphTimer(const GraphTimer&) = delete;
  GraphTimer& operator=(const GraphTimer&) = delete;
  template <typename F> double us(F&& f, int n = 20) {
    cudaGraph_t gr;
    cudaGraphExec_t ex;
    cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    for (int i = 0; i < n; ++i) f(st);
    cudaStreamEndCapture(st, &gr);
    cudaGraphInstantiate(&ex, gr, 0);
    cudaGraphLaunch(ex, st);
    cudaEventRecord(e0, st);
    cudaGraphLaunch(ex, st);
    cudaEventRecord(e1, st);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaGraphExecDestroy(ex), cudaGraphDestroy(gr);
    return 1000.0 * ms / n;
  }
};

}  // namespace lily::testcuda
