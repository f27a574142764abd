// CUDA prefill kernels (src/backend/cuda/prefill_ops.h) against the CPU reference (ref_ops and the
// reference forward), on seeded random inputs at prompt lengths that cross every tile (64) and
// chunk boundary, including prefill continuing from a non-empty state; then the whole model:
// CUDA prefill (+ decode) vs the CPU reference on the tiny synthetic model, chunked and in pieces.
// Each check prints one table row (op, shape, max |err|, tolerance). Skips loudly without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/ref_ops.h"
#include "core/bf16.h"
#include "model/logits.h"
#include "model/synthetic_weights.h"
#include "cuda_test_env.h"

#ifdef LILY_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/prefill_ops.h"

namespace lily {
namespace {

using cuda::QW;

#define REQUIRE_GPU()                                                \
  std::string why_;                                                  \
  if (!cuda_device_present(why_)) GTEST_SKIP() << "no CUDA device: " << why_;   \
  ASSERT_FALSE(cpu::bf16_storage()) << "reference must keep fp32 activations"

template <typename T> struct DBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DBuf(size_t n_) : n(n_) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
    cudaMemset(p, 0xFF, std::max<size_t>(n, 1) * sizeof(T));  // poison
  }
  DBuf(const std::vector<T>& v) : DBuf(v.size()) { up(v); }
  ~DBuf() { cudaFree(p); }
  void up(const std::vector<T>& v) { cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> down() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
};

std::mt19937_64& rng() {
  static std::mt19937_64 r(4321);
  return r;
}
float randn() { return std::normal_distribution<float>(0.f, 1.f)(rng()); }
float randu() { return std::uniform_real_distribution<float>(0.f, 1.f)(rng()); }
std::vector<float> randv(size_t n, float scale = 1.f, float mean = 0.f) {
  std::vector<float> v(n);
  for (auto& x : v) x = mean + scale * randn();
  return v;
}
std::vector<float> rand_bf16(size_t n, float scale = 1.f, float mean = 0.f) {
  auto v = randv(n, scale, mean);
  for (auto& x : v) x = round_bf16(x);
  return v;
}
std::vector<uint16_t> to_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]).bits;
  return b;
}
std::vector<float> from_bits(const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = bf16_to_f32(bf16{b[i]});
  return v;
}
std::vector<bf16> as_bf16(const std::vector<float>& v) {
  std::vector<bf16> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}

struct HostQ {
  std::vector<uint32_t> codes;
  std::vector<bf16> sc, bi;
  QWeight w;
  HostQ(int rows, int cols, int bits, float gain = 1.f) {
    codes.resize(size_t(rows) * cols * bits / 32);
    for (auto& c : codes) c = uint32_t(rng()());
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
struct DevQ {
  DBuf<uint32_t> codes;
  DBuf<uint16_t> sb;
  QW q;
  explicit DevQ(const QWeight& w) : codes(size_t(w.rows) * w.words_per_row()), sb(size_t(w.rows) * w.groups_per_row() * 2) {
    codes.up(std::vector<uint32_t>(w.codes, w.codes + codes.n));
    std::vector<uint16_t> s;
    for (size_t i = 0; i < size_t(w.rows) * w.groups_per_row(); ++i) s.push_back(w.scales[i].bits), s.push_back(w.biases[i].bits);
    sb.up(s);
    q.codes = codes.p, q.sb = sb.p, q.rows = w.rows, q.cols = w.cols, q.bits = w.bits;
  }
};

bool check(const std::string& op, const std::string& shape, const std::vector<float>& got, const std::vector<float>& ref,
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
std::string dims(std::initializer_list<long> d) {
  std::string s;
  for (long v : d) s += (s.empty() ? "" : "x") + std::to_string(v);
  return s;
}

// ------------------------------------------------------------------------------- GEMM
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

// pipe: A pre-split, the pipelined kernel (gemm_q4_pipe.cu); else the register-prefetch kernel.
// wg (2 or 4, implies pipe): the Hopper wgmma kernel (gemm_wg.cu) with that many warpgroups.
void gemm_case(int M, int N, int K, int bits, int terms, bool pipe = false, int wg = 0) {
  if (wg) pipe = true;
  HostQ W(N, K, bits);
  DevQ D(W.w);
  auto x = randv(size_t(M) * K);
  std::vector<float> ref(size_t(M) * N);
  cpu::qmatmul(W.w, x.data(), M, K, ref.data(), N, false);
  DBuf<float> dx(x), dy(size_t(M) * N);
  cuda::pf::GemmArgs a{};
  a.w = D.q, a.n_out = N, a.a = dx.p, a.lda = K, a.M = M, a.y = dy.p, a.ldy = N, a.terms = terms;
  std::unique_ptr<DevSplit> sp;
  if (pipe) sp = std::make_unique<DevSplit>(dx.p, K, M, K), sp->use(a);
  a.wg = wg;
  ASSERT_TRUE(cuda::pf::gemm(a, nullptr).is_ok());
  const float tol = terms == 0 ? 1e-4f : terms == 2 ? 2e-4f : 4e-3f;
  check(fmt::format("gemm q{} x{}{}", bits, terms == 0 ? "f32 ref" : terms == 2 ? "f16 hi+lo" : "f16",
                    wg ? fmt::format(" wgmma{}", wg) : pipe ? " pipe" : ""),
        dims({M, N, K}), dy.down(), ref, tol, tol);
}
TEST(CudaPrefill, Gemm) {
  REQUIRE_GPU();
  for (int M : {1, 2, 7, 8, 9, 63, 64, 65, 127, 128, 129}) gemm_case(M, 200, 512, 4, 2);
  for (int terms : {1, 2}) {
    gemm_case(257, 12352, 2048, 4, terms);  // [qkv|z|a|b]
    gemm_case(130, 2048, 4096, 4, terms);   // out_proj / o_proj
    gemm_case(130, 2048, 512, 4, terms);    // down
    gemm_case(65, 257, 2048, 8, terms);     // router + shared gate (8-bit)
  }
  gemm_case(4097, 256, 256, 4, 2);
  // Pipelined kernel (pre-split A): tile edges in M and N, K one and many tiles, real shapes.
  for (int M : {1, 2, 7, 63, 64, 65, 129}) gemm_case(M, 200, 512, 4, 2, true);
  gemm_case(257, 12352, 2048, 4, 2, true);  // [qkv|z|a|b]
  gemm_case(130, 2048, 4096, 4, 2, true);   // out_proj / o_proj
  gemm_case(130, 2048, 512, 4, 2, true);    // down
  gemm_case(65, 257, 2048, 8, 2, true);     // router + shared gate (8-bit)
  gemm_case(9, 136, 64, 8, 2, true);        // one k tile, 8-bit
  gemm_case(4097, 256, 256, 4, 2, true);
  gemm_case(65, 257, 2048, 8, 0);  // fp32 reference path (A/B knob LILY_PREFILL_TERMS=0)
  gemm_case(130, 2048, 512, 4, 0);
}
// The Hopper wgmma kernel (gemm_wg.cu): every 64-token tile edge, weight-row block edges (N = 300
// crosses 128 and 256), K one to many tiles, the real shapes.
TEST(CudaPrefill, GemmWgmma) {
  REQUIRE_GPU();
  for (int wg : {4, 2}) {
    for (int M : {1, 2, 7, 8, 9, 63, 64, 65, 127, 128, 129, 4095, 4096, 4097}) gemm_case(M, 300, 256, 4, 2, true, wg);
    gemm_case(33, 64, 64, 4, 2, true, wg);  // one k tile, one partial block
    gemm_case(257, 12352, 2048, 4, 2, true, wg);  // [qkv|z|a|b]
    gemm_case(130, 2048, 4096, 4, 2, true, wg);   // out_proj / o_proj
    gemm_case(130, 9216, 2048, 4, 2, true, wg);   // attention [q|gate|k|v]
    gemm_case(130, 2048, 512, 4, 2, true, wg);    // down
  }
  gemm_case(4097, 3000, 2048, 4, 2, true, 4);   // a whole prefill chunk (+1) at the real K
  gemm_case(65, 257, 2048, 8, 2, true, 4);      // 8-bit weights fall back to the pipe kernel
  // Single-pass fp16 x (terms 1, x_hi only; the LILY_PREFILL_TERMS=1 A/B), at the one-term tolerance.
  for (int M : {1, 9, 64, 65, 129, 4097}) gemm_case(M, 300, 256, 4, 1, true, 2);
  gemm_case(257, 12352, 2048, 4, 1, true, 2);
  gemm_case(130, 2048, 4096, 4, 1, true, 4);
}

// Timing of the quantized GEMM kernels at the real shapes for a 4,096-token chunk (M = 4096;
// grouped: 4096 tokens × top-8 over 256 experts, uniform random routing). Runs only with
// LILY_GEMM_BENCH=1. Per shape: ms per call and model TFLOP/s (2·M·N·K) of the mma.sync pipe
// kernel and the wgmma kernel with 2 and 4 warpgroups, and the wgmma outputs' max |Δ| against the
// pipe kernel's relative to max |y| (same inputs; a cross-check at full size).
struct BenchW {
  DBuf<uint32_t> codes;
  DBuf<uint16_t> sb;
  QW q;
  BenchW(int rows, int cols) : codes(size_t(rows) * cols / 8), sb(size_t(rows) * cols / 64 * 2) {
    std::vector<uint32_t> c(codes.n);
    uint64_t st = 0x9E3779B97F4A7C15ull ^ (uint64_t(rows) * 31 + uint64_t(cols));
    for (auto& v : c) st ^= st << 13, st ^= st >> 7, st ^= st << 17, v = uint32_t(st);
    codes.up(c);
    std::vector<uint16_t> b(sb.n);
    const float s0 = 1.f / (15.f / std::sqrt(12.f) * std::sqrt(float(cols)));
    for (size_t i = 0; i < b.size(); i += 2) {
      const float sc = s0 * (0.5f + randu());
      b[i] = f32_to_bf16(sc).bits, b[i + 1] = f32_to_bf16(-sc * (7.5f + randu() - 0.5f)).bits;
    }
    sb.up(b);
    q.codes = codes.p, q.sb = sb.p, q.rows = rows, q.cols = cols, q.bits = 4;
  }
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
std::pair<double, double> max_diff(const std::vector<float>& y, const std::vector<float>& base) {
  double md = 0, my = 0;
  for (size_t i = 0; i < y.size(); ++i) md = std::max(md, double(std::fabs(y[i] - base[i]))), my = std::max(my, double(std::fabs(base[i])));
  return {md, my};
}

void bench_row(const char* name, cuda::pf::GemmArgs a, double flop) {
  std::vector<float> base;
  std::printf("| %-26s |", name);
  for (int v : {0, 2, 4, -2, -4}) {  // pipe, wgmma 2/4 warpgroups, the same with look-ahead
    const int wg = std::abs(v);
    a.wg = wg;
    setenv("LILY_WG_LA", v < 0 ? "1" : "0", 1);
    const float ms = mean_ms(10, [&] { return cuda::pf::gemm(a, nullptr).is_ok(); });
    ASSERT_GE(ms, 0.f) << name << " variant " << v << ": a GEMM call failed";
    std::vector<float> y(size_t(a.M) * a.ldy);  // grouped: a.M = slots
    ASSERT_EQ(cudaMemcpy(y.data(), a.y, y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    std::printf(" %8.3f ms %6.1f TF/s", ms, flop / (ms * 1e-3) / 1e12);
    if (wg == 0) base = y;
    else {
      const auto [md, my] = max_diff(y, base);
      std::printf(" (rel %.1e)", md / std::max(my, 1e-30));
      EXPECT_LT(md, 1e-3 * my) << name << " variant " << v;
    }
    std::printf(" |");
  }
  std::printf("\n");
  std::fflush(stdout);
}
TEST(CudaPrefill, GemmBench) {
  REQUIRE_GPU();
  const char* e = std::getenv("LILY_GEMM_BENCH");
  if (!e || std::string(e) != "1") GTEST_SKIP() << "set LILY_GEMM_BENCH=1 to time the GEMM kernels";
  const int M = 4096, H = 2048, E = 256, k = 8, I = 512;
  std::printf("| GEMM (M=4096) | pipe (mma.sync) | wgmma 2 WG | wgmma 4 WG | 2 WG look-ahead | 4 WG look-ahead |\n");
  auto dense = [&](const char* name, int N, int K, bool swiglu) {
    BenchW w(swiglu ? 2 * N : N, K);
    auto x = randv(size_t(M) * K);
    DBuf<float> dx(x), dy(size_t(M) * N);
    DevSplit sp(dx.p, K, M, K);
    cuda::pf::GemmArgs a{};
    a.w = w.q, a.w2 = w.q, a.row0_2 = N, a.n_out = N, a.a = dx.p, a.lda = K, a.M = M, a.y = dy.p, a.ldy = N, a.swiglu = swiglu;
    sp.use(a);
    bench_row(name, a, 2.0 * M * N * K * (swiglu ? 2 : 1));
  };
  dense("gdn in_proj 12352x2048", 12352, 2048, false);
  dense("out_proj/o_proj 2048x4096", 2048, 4096, false);
  dense("attn qkv 9216x2048", 9216, 2048, false);
  dense("shared gate+up 2x512x2048", 512, 2048, true);
  dense("shared down 2048x512", 2048, 512, false);
  // Grouped: random top-8 of 256 per token, expert-major slots, 64-row tiles.
  const int S = M * k, T = cuda::pf::moe_max_tiles(M, E, k);
  std::vector<std::vector<int>> by_e(E);
  for (int m = 0; m < M; ++m) {
    std::vector<int> ids;
    while (int(ids.size()) < k) {
      const int id = int(rng()() % E);
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
    for (int id : ids) by_e[id].push_back(m);
  }
  std::vector<int32_t> slot_tok, tiles;
  for (int ex = 0; ex < E; ++ex) {
    const int o = int(slot_tok.size()), c = int(by_e[ex].size());
    for (int i = 0; i < c; i += 64) tiles.insert(tiles.end(), {ex, o + i, o + std::min(i + 64, c), 0});
    slot_tok.insert(slot_tok.end(), by_e[ex].begin(), by_e[ex].end());
  }
  tiles.resize(size_t(T) * 4, 0);
  DBuf<int32_t> dslot(slot_tok), dtiles(tiles);
  {
    BenchW gate(E * I, H), up(E * I, H);
    auto x = randv(size_t(M) * H);
    DBuf<float> dx(x), dact(size_t(S) * I);
    DevSplit sp(dx.p, H, M, H);
    cuda::pf::GemmArgs gu{};
    gu.w = gate.q, gu.w2 = up.q, gu.n_out = I, gu.a = dx.p, gu.lda = H, gu.a_rows = dslot.p, gu.M = S, gu.y = dact.p, gu.ldy = I;
    gu.swiglu = true, gu.tiles = dtiles.p, gu.max_tiles = T;
    sp.use(gu);
    bench_row("moe gate+up 8x2x512x2048", gu, 2.0 * S * 2 * I * H);
  }
  {
    BenchW down(E * H, I);
    auto act = randv(size_t(S) * I);
    DBuf<float> dact(act), dyd(size_t(S) * H);
    DevSplit sp(dact.p, I, S, I);
    cuda::pf::GemmArgs dn{};
    dn.w = down.q, dn.n_out = H, dn.a = dact.p, dn.lda = I, dn.M = S, dn.y = dyd.p, dn.ldy = H, dn.tiles = dtiles.p, dn.max_tiles = T;
    sp.use(dn);
    bench_row("moe down 8x2048x512", dn, 2.0 * S * H * I);
  }
  unsetenv("LILY_WG_LA");
}

// ------------------------------------------------------------------------------- MoE layer
void moe_case(int M, int H, int E, int k, int I, int terms = 2, bool pipe = false, int wg = 0) {
  if (wg) pipe = true;
  HostQ gate(E * I, H, 4), up(E * I, H, 4), down(E * H, I, 4), shgu(2 * I, H, 4), shd(H, I, 4), router(E + 1, H, 8, 3.f);
  DevQ dg(gate.w), du(up.w), dd(down.w), dsgu(shgu.w), dsd(shd.w), dr(router.w);
  auto x = randv(size_t(M) * H);
  // CPU reference (as the reference forward's moe()).
  std::vector<float> rl(size_t(M) * (E + 1));
  cpu::qmatmul(router.w, x.data(), M, H, rl.data(), E + 1, false);
  std::vector<std::vector<int>> ids(M);
  std::vector<std::vector<float>> wts(M);
  std::vector<float> gap(M);
  for (int m = 0; m < M; ++m) {
    const float* l = &rl[size_t(m) * (E + 1)];
    const float mx = *std::max_element(l, l + E);
    std::vector<float> p(E);
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - mx));
    for (auto& v : p) v /= sum;
    std::vector<int> idx(E);
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float ts = 0;
    for (int j = 0; j < k; ++j) ts += p[idx[j]];
    for (int j = 0; j < k; ++j) ids[m].push_back(idx[j]), wts[m].push_back(p[idx[j]] / ts);
    gap[m] = std::fabs(p[idx[k - 1]] - p[idx[k]]);
  }
  std::vector<float> ref(size_t(M) * H, 0.f);
  for (int m = 0; m < M; ++m) {
    const float* xm = &x[size_t(m) * H];
    std::vector<float> g(I), u(I), y(H), acc(H, 0.f);
    for (int j = 0; j < k; ++j) {
      const int e = ids[m][j];
      cpu::qmatmul(gate.w.rows_slice(e * I, I), xm, 1, H, g.data(), I, false);
      cpu::qmatmul(up.w.rows_slice(e * I, I), xm, 1, H, u.data(), I, false);
      for (int i = 0; i < I; ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
      cpu::qmatmul(down.w.rows_slice(e * H, H), g.data(), 1, I, y.data(), H, false);
      for (int c = 0; c < H; ++c) acc[c] += wts[m][j] * y[c];
    }
    cpu::qmatmul(shgu.w.rows_slice(0, I), xm, 1, H, g.data(), I, false);
    cpu::qmatmul(shgu.w.rows_slice(I, I), xm, 1, H, u.data(), I, false);
    for (int i = 0; i < I; ++i) g[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    cpu::qmatmul(shd.w, g.data(), 1, I, y.data(), H, false);
    const float sig = 1.f / (1.f + std::exp(-rl[size_t(m) * (E + 1) + E]));
    for (int c = 0; c < H; ++c) ref[size_t(m) * H + c] = acc[c] + sig * y[c];
  }
  // GPU, as CudaBackend::pf_chunk runs it.
  const int S = M * k, T = cuda::pf::moe_max_tiles(M, E, k);
  DBuf<float> dx(x), drl(size_t(M) * (E + 1)), dtw(size_t(M) * (k + 1)), dact(size_t(S) * I), dyd(size_t(S) * H);
  DBuf<float> dsact(size_t(M) * I), dsy(size_t(M) * H), dout(size_t(M) * H);
  DBuf<int32_t> dids(static_cast<size_t>(S)), dslot_tok(S), dslot_of(S), dtiles(size_t(T) * 4), dscr(cuda::pf::moe_route_scratch_ints(E));
  cuda::pf::GemmArgs ra{};
  ra.w = dr.q, ra.n_out = E + 1, ra.a = dx.p, ra.lda = H, ra.M = M, ra.y = drl.p, ra.ldy = E + 1, ra.terms = terms;
  std::unique_ptr<DevSplit> sx;
  if (pipe) sx = std::make_unique<DevSplit>(dx.p, H, M, H), sx->use(ra);
  ra.wg = wg;  // 8-bit: stays on the pipe kernel
  ASSERT_TRUE(cuda::pf::gemm(ra, nullptr).is_ok());
  cuda::pf::RouteArgs r{};
  r.logits = drl.p, r.M = M, r.E = E, r.top_k = k, r.topk_ids = dids.p, r.topk_w = dtw.p, r.slot_tok = dslot_tok.p;
  r.slot_of = dslot_of.p, r.tiles = dtiles.p, r.max_tiles = T, r.scratch = dscr.p;
  ASSERT_TRUE(cuda::pf::moe_route(r, nullptr).is_ok());
  cuda::pf::GemmArgs gu{};
  gu.w = dg.q, gu.w2 = du.q, gu.n_out = I, gu.a = dx.p, gu.lda = H, gu.a_rows = dslot_tok.p, gu.y = dact.p, gu.ldy = I;
  gu.swiglu = true, gu.tiles = dtiles.p, gu.max_tiles = T, gu.terms = terms;
  if (pipe) sx->use(gu);
  gu.wg = wg;
  ASSERT_TRUE(cuda::pf::gemm(gu, nullptr).is_ok());
  cuda::pf::GemmArgs dn{};
  dn.w = dd.q, dn.n_out = H, dn.a = dact.p, dn.lda = I, dn.y = dyd.p, dn.ldy = H, dn.tiles = dtiles.p, dn.max_tiles = T, dn.terms = terms;
  std::unique_ptr<DevSplit> sa;
  if (pipe) sa = std::make_unique<DevSplit>(dact.p, I, S, I), sa->use(dn);
  dn.wg = wg;
  ASSERT_TRUE(cuda::pf::gemm(dn, nullptr).is_ok());
  cuda::pf::GemmArgs sg{};
  sg.w = dsgu.q, sg.w2 = dsgu.q, sg.row0_2 = I, sg.n_out = I, sg.a = dx.p, sg.lda = H, sg.M = M, sg.y = dsact.p, sg.ldy = I;
  sg.swiglu = true, sg.terms = terms;
  if (pipe) sx->use(sg);
  sg.wg = wg;
  ASSERT_TRUE(cuda::pf::gemm(sg, nullptr).is_ok());
  cuda::pf::GemmArgs sd{};
  sd.w = dsd.q, sd.n_out = H, sd.a = dsact.p, sd.lda = I, sd.M = M, sd.y = dsy.p, sd.ldy = H, sd.terms = terms;
  std::unique_ptr<DevSplit> ss;
  if (pipe) ss = std::make_unique<DevSplit>(dsact.p, I, M, I), ss->use(sd);
  sd.wg = wg;
  ASSERT_TRUE(cuda::pf::gemm(sd, nullptr).is_ok());
  ASSERT_TRUE(cuda::pf::moe_combine(dyd.p, dsy.p, dslot_of.p, dtw.p, M, H, k, dout.p, nullptr).is_ok());
  // Routing: ids must match except at near-ties of the reference (those tokens are skipped).
  auto gid = dids.down();
  std::vector<char> skip(M, 0);
  int flips = 0;
  for (int m = 0; m < M; ++m) {
    std::vector<int> a(gid.begin() + size_t(m) * k, gid.begin() + size_t(m + 1) * k), b = ids[m];
    std::sort(a.begin(), a.end()), std::sort(b.begin(), b.end());
    if (a != b) {
      skip[m] = 1, ++flips;
      EXPECT_LT(gap[m], 1e-5f) << "token " << m << " routed differently without a near-tie";
    }
  }
  std::printf("| moe routing              | %-34s | %d of %d tokens differ (all near-ties) |\n", dims({M, E, k}).c_str(), flips, M);
  check(wg ? fmt::format("moe (router..comb.) wg{}", wg) : pipe ? "moe (router..comb.) pipe" : "moe (router..combine)", dims({M, H, E, k, I}), dout.down(), ref, 5e-4f, 1e-3f, &skip, H);
}
TEST(CudaPrefill, Moe) {
  REQUIRE_GPU();
  for (int M : {1, 2, 9, 65, 129}) moe_case(M, 256, 16, 4, 256);
  moe_case(300, 2048, 256, 8, 512);  // real shapes
  moe_case(4097, 256, 64, 8, 128);   // many tiles, skewed counts
  moe_case(129, 256, 16, 4, 256, /*terms=*/0);  // fp32 reference GEMM (A/B path), grouped + SwiGLU
  // Pipelined GEMMs (pre-split A), as the prefill runs them by default.
  for (int M : {1, 9, 129}) moe_case(M, 256, 16, 4, 256, 2, /*pipe=*/true);
  moe_case(300, 2048, 256, 8, 512, 2, true);
  moe_case(4097, 256, 64, 8, 128, 2, true);
  // Hopper wgmma GEMMs (gemm_wg.cu) for gate/up+SwiGLU, down, shared expert.
  for (int wg : {4, 2}) {
    for (int M : {1, 9, 129}) moe_case(M, 256, 16, 4, 256, 2, true, wg);
    moe_case(300, 2048, 256, 8, 512, 2, true, wg);
    moe_case(4097, 256, 64, 8, 128, 2, true, wg);
  }
}

// ------------------------------------------------------------------------------- DeltaNet
struct GdnCase {
  int nk, nv, K = 4;
  std::vector<float> conv_w, A_log, dt_bias, gnorm;
  GdnCase(int nk_, int nv_) : nk(nk_), nv(nv_) {
    const int C = 2 * nk * 128 + nv * 128;
    conv_w = rand_bf16(size_t(C) * K, 0.5f);
    A_log = randv(nv, 0.5f);
    dt_bias = rand_bf16(nv, 0.5f);
    gnorm = rand_bf16(128, 0.2f, 1.f);
  }
  // CPU: u [M, ldu] → out [M, vd] (gated-norm applied); window [C, K-1] fp32 and S advance.
  void cpu(const std::vector<float>& u, int M, int ldu, std::vector<float>& win, std::vector<float>& S, std::vector<float>& out) {
    const int C = 2 * nk * 128 + nv * 128, vd = nv * 128, kd = nk * 128;
    std::vector<float> c(size_t(M) * C), q(size_t(M) * kd), k(size_t(M) * kd), v(size_t(M) * vd), a(size_t(M) * nv), b(size_t(M) * nv);
    auto wb = as_bf16(conv_w), db = as_bf16(dt_bias);
    cpu::conv_silu(u.data(), M, ldu, C, K, wb.data(), win.data(), c.data());
    const cpu::GdnDims d{nk, nv, 128, 128};
    cpu::gdn_split_qkv(d, M, c.data(), q.data(), k.data(), v.data());
    for (int m = 0; m < M; ++m)
      for (int h = 0; h < nv; ++h) a[size_t(m) * nv + h] = u[size_t(m) * ldu + C + vd + h], b[size_t(m) * nv + h] = u[size_t(m) * ldu + C + vd + nv + h];
    std::vector<float> g(size_t(M) * nv), beta(size_t(M) * nv), o(size_t(M) * vd);
    cpu::gdn_gates(M, nv, a.data(), b.data(), A_log.data(), db.data(), g.data(), beta.data());
    cpu::gdn_recurrent(d, M, q.data(), k.data(), v.data(), g.data(), beta.data(), S.data(), o.data());
    out.resize(size_t(M) * vd);
    for (int m = 0; m < M; ++m)
      for (int h = 0; h < nv; ++h) {
        float ss = 0;
        for (int i = 0; i < 128; ++i) ss += o[(size_t(m) * nv + h) * 128 + i] * o[(size_t(m) * nv + h) * 128 + i];
        const float inv = 1.f / std::sqrt(ss / 128 + 1e-6f);
        for (int i = 0; i < 128; ++i) {
          const float z = u[size_t(m) * ldu + C + h * 128 + i];
          out[(size_t(m) * nv + h) * 128 + i] = gnorm[i] * o[(size_t(m) * nv + h) * 128 + i] * inv * (z / (1.f + std::exp(-z)));
        }
      }
  }
};

// chunk: the chunked WY recurrence (gdn_chunk.cu, the prefill default); else the token-by-token scan.
void gdn_case(GdnCase& G, std::vector<int> pieces, bool nonzero_state, bool win_f32 = true, bool chunk = true) {
  const int nk = G.nk, nv = G.nv, C = 2 * nk * 128 + nv * 128, vd = nv * 128, kd = nk * 128, W = G.K - 1;
  const int ldu = C + vd + 2 * nv;
  int Mt = 0;
  for (int p : pieces) Mt += p;
  auto u = randv(size_t(Mt) * ldu, 0.5f);
  std::vector<float> win = nonzero_state ? rand_bf16(size_t(C) * W) : std::vector<float>(size_t(C) * W, 0.f);
  // Window buffers: fp32 (decode default) or bf16, each [C, K-1], alternated by parity.
  const size_t wbytes = size_t(C) * W * (win_f32 ? 4 : 2);
  DBuf<uint8_t> wb0(wbytes), wb1(wbytes);
  if (win_f32) cudaMemcpy(wb0.p, win.data(), wbytes, cudaMemcpyHostToDevice);
  else { auto b = to_bits(win); cudaMemcpy(wb0.p, b.data(), wbytes, cudaMemcpyHostToDevice); }
  std::vector<float> S = nonzero_state ? randv(size_t(nv) * 128 * 128, 0.05f) : std::vector<float>(size_t(nv) * 128 * 128, 0.f);
  DBuf<uint16_t> dcw(to_bits(G.conv_w)), ddt(to_bits(G.dt_bias)), dgn(to_bits(G.gnorm));
  DBuf<float> dS(S), dA(G.A_log), du(u);
  const int Mmax = *std::max_element(pieces.begin(), pieces.end());
  DBuf<float> qn(size_t(Mmax) * kd), kn(size_t(Mmax) * kd), v(size_t(Mmax) * vd), g(size_t(Mmax) * nv), be(size_t(Mmax) * nv);
  DBuf<float> oraw(size_t(Mmax) * vd), o(size_t(Mt) * vd);
  DBuf<float> wy(chunk ? cuda::pf::gdn_wy_floats(Mmax, nv) : 0);
  int t0 = 0, par = 0;
  for (int M : pieces) {
    cuda::pf::GdnPrefillArgs a{};
    a.u = du.p + size_t(t0) * ldu, a.ldu = ldu, a.M = M;
    // Alternate the window buffers as the decode layout does (same buffer when M is even).
    uint8_t* bufs[2] = {wb0.p, wb1.p};
    a.win_in = bufs[par], a.win_out = bufs[par ^ (M & 1)], a.win_f32 = win_f32;
    a.conv_w = dcw.p, a.A_log = dA.p, a.dt_bias = ddt.p, a.gnorm = dgn.p, a.S = dS.p, a.nk = nk, a.nv = nv, a.K = G.K;
    a.qn = qn.p, a.kn = kn.p, a.v = v.p, a.g = g.p, a.beta = be.p, a.o_raw = oraw.p, a.o = o.p + size_t(t0) * vd;
    if (chunk) a.wy = wy.p;
    ASSERT_TRUE(cuda::pf::gdn_prefill(a, nullptr).is_ok());
    par ^= (M & 1);
    t0 += M;
  }
  // CPU piece by piece (as the GPU ran), the window rounded to bf16 between pieces when stored so.
  std::vector<float> ref, Sref = S, wref = win;
  t0 = 0;
  for (int M : pieces) {
    std::vector<float> up(u.begin() + size_t(t0) * ldu, u.begin() + size_t(t0 + M) * ldu), o1;
    G.cpu(up, M, ldu, wref, Sref, o1);
    if (!win_f32)
      for (auto& x : wref) x = round_bf16(x);
    ref.insert(ref.end(), o1.begin(), o1.end());
    t0 += M;
  }
  std::string shape = dims({nk, nv}) + " M=";
  for (size_t i = 0; i < pieces.size(); ++i) shape += (i ? "+" : "") + std::to_string(pieces[i]);
  if (nonzero_state) shape += " S0≠0";
  if (!win_f32) shape += " bf16 win";
  // The chunked form (3xTF32 products, ~fp32) is held to a tighter bound than the scan's.
  const float to = chunk ? 5e-4f : 2e-3f, ts = chunk ? 2e-4f : 1e-3f;
  check(chunk ? "gdn chunk out" : "gdn scan out", shape, o.down(), ref, to, to);
  check(chunk ? "gdn chunk state" : "gdn scan state", shape, dS.down(), Sref, ts, ts);
  const DBuf<uint8_t>& wl = par ? wb1 : wb0;
  std::vector<float> wgot(size_t(C) * W);
  auto raw = wl.down();
  if (win_f32) std::memcpy(wgot.data(), raw.data(), raw.size());
  else {
    std::vector<uint16_t> b(wgot.size());
    std::memcpy(b.data(), raw.data(), raw.size());
    wgot = from_bits(b);
  }
  check("gdn prefill window", shape, wgot, wref, 0.f, 0.f);
}
TEST(CudaPrefill, GdnPrefill) {
  REQUIRE_GPU();
  GdnCase small(2, 4), real(16, 32);
  for (int M : {1, 2, 7, 8, 9, 63, 64, 65, 127, 128, 129, 4095, 4096, 4097}) gdn_case(small, {M}, M % 2 == 1);
  gdn_case(small, {3, 64, 1, 130}, true);
  gdn_case(small, {3, 64, 1, 130}, true, /*win_f32=*/false);
  gdn_case(real, {129}, false);
  gdn_case(real, {65, 2, 200}, true);
  gdn_case(real, {4097}, true);
  gdn_case(small, {64, 63, 1, 129, 4096, 5}, true);  // pieces on and off chunk boundaries
  // The token-by-token scan (LILY_GDN_CHUNK=0, or no scratch) stays tested.
  for (int M : {1, 65, 4097}) gdn_case(small, {M}, true, true, /*chunk=*/false);
  gdn_case(real, {65, 2, 200}, true, true, false);
}

// Several independent sequences in one launch per kernel (pf::gdn_prefill_segments: the mixed serving
// step's segments), each with its own state, window, rows of u and scratch: bit-identical to
// gdn_prefill on each alone, and within the chunked form's tolerance of the CPU reference.
void gdn_segments_case(GdnCase& G, const std::vector<int>& lens, bool win_f32) {
  const int nk = G.nk, nv = G.nv, C = 2 * nk * 128 + nv * 128, vd = nv * 128, kd = nk * 128, W = G.K - 1;
  const int ldu = C + vd + 2 * nv, n = int(lens.size());
  int Mt = 0, Mmax = 0;
  size_t wyt = 0;
  for (int L : lens) Mt += L, Mmax = std::max(Mmax, L), wyt += cuda::pf::gdn_wy_floats(L, nv);
  auto u = randv(size_t(Mt) * ldu, 0.5f);
  DBuf<uint16_t> dcw(to_bits(G.conv_w)), ddt(to_bits(G.dt_bias)), dgn(to_bits(G.gnorm));
  DBuf<float> dA(G.A_log), du(u);
  const size_t wbytes = size_t(C) * W * (win_f32 ? 4 : 2);
  std::vector<std::vector<float>> win(n), S(n);
  // Two copies of every sequence's state: [0] for the segments launch, [1] for one launch each.
  std::vector<std::unique_ptr<DBuf<uint8_t>>> wb[2][2];
  std::vector<std::unique_ptr<DBuf<float>>> dS[2];
  for (int j = 0; j < n; ++j) {
    win[j] = rand_bf16(size_t(C) * W);
    S[j] = randv(size_t(nv) * 128 * 128, 0.05f);
    for (int c = 0; c < 2; ++c) {
      for (int b = 0; b < 2; ++b) wb[c][b].push_back(std::make_unique<DBuf<uint8_t>>(wbytes));
      if (win_f32) cudaMemcpy(wb[c][0][j]->p, win[j].data(), wbytes, cudaMemcpyHostToDevice);
      else { auto bits = to_bits(win[j]); cudaMemcpy(wb[c][0][j]->p, bits.data(), wbytes, cudaMemcpyHostToDevice); }
      dS[c].push_back(std::make_unique<DBuf<float>>(S[j]));
    }
  }
  DBuf<float> qn(size_t(Mt) * kd), kn(size_t(Mt) * kd), v(size_t(Mt) * vd), g(size_t(Mt) * nv), be(size_t(Mt) * nv);
  DBuf<float> oraw(size_t(Mt) * vd), o(size_t(Mt) * vd), o1(size_t(Mt) * vd), wy(wyt);
  std::vector<cuda::pf::GdnPrefillArgs> args(n);
  int t0 = 0, longest = 0;
  size_t wo = 0;
  for (int j = 0; j < n; ++j) {
    cuda::pf::GdnPrefillArgs& a = args[j];
    const int M = lens[j];
    a.u = du.p + size_t(t0) * ldu, a.ldu = ldu, a.M = M;
    a.win_in = wb[0][0][j]->p, a.win_out = wb[0][M & 1][j]->p, a.win_f32 = win_f32;
    a.conv_w = dcw.p, a.A_log = dA.p, a.dt_bias = ddt.p, a.gnorm = dgn.p, a.S = dS[0][j]->p, a.nk = nk, a.nv = nv, a.K = G.K;
    a.qn = qn.p + size_t(t0) * kd, a.kn = kn.p + size_t(t0) * kd, a.v = v.p + size_t(t0) * vd, a.g = g.p + size_t(t0) * nv;
    a.beta = be.p + size_t(t0) * nv, a.o_raw = oraw.p + size_t(t0) * vd, a.o = o.p + size_t(t0) * vd, a.wy = wy.p + wo;
    if (M > lens[longest]) longest = j;
    t0 += M, wo += cuda::pf::gdn_wy_floats(M, nv);
  }
  DBuf<uint8_t> dargs(args.size() * sizeof(cuda::pf::GdnPrefillArgs));
  cudaMemcpy(dargs.p, args.data(), args.size() * sizeof(cuda::pf::GdnPrefillArgs), cudaMemcpyHostToDevice);
  ASSERT_TRUE(cuda::pf::gdn_prefill_segments(args[longest], reinterpret_cast<const cuda::pf::GdnPrefillArgs*>(dargs.p), n, nullptr).is_ok());
  // One launch each, on the second copies of the states, same scratch rows.
  t0 = 0;
  for (int j = 0; j < n; ++j) {
    cuda::pf::GdnPrefillArgs a = args[j];
    a.win_in = wb[1][0][j]->p, a.win_out = wb[1][lens[j] & 1][j]->p, a.S = dS[1][j]->p, a.o = o1.p + size_t(t0) * vd;
    ASSERT_TRUE(cuda::pf::gdn_prefill(a, nullptr).is_ok());
    t0 += lens[j];
  }
  std::string shape = dims({nk, nv}) + " segments ";
  for (int j = 0; j < n; ++j) shape += (j ? "+" : "") + std::to_string(lens[j]);
  if (!win_f32) shape += " bf16 win";
  check("gdn segments out == alone", shape, o.down(), o1.down(), 0.f, 0.f);
  std::vector<float> ref, got_S, ref_S, alone_S;
  t0 = 0;
  for (int j = 0; j < n; ++j) {
    std::vector<float> up(u.begin() + size_t(t0) * ldu, u.begin() + size_t(t0 + lens[j]) * ldu), out1, w = win[j], s = S[j];
    G.cpu(up, lens[j], ldu, w, s, out1);
    ref.insert(ref.end(), out1.begin(), out1.end());
    auto a = dS[0][j]->down(), b = dS[1][j]->down();
    got_S.insert(got_S.end(), a.begin(), a.end()), alone_S.insert(alone_S.end(), b.begin(), b.end());
    ref_S.insert(ref_S.end(), s.begin(), s.end());
    t0 += lens[j];
  }
  check("gdn segments state == alone", shape, got_S, alone_S, 0.f, 0.f);
  check("gdn segments out", shape, o.down(), ref, 5e-4f, 5e-4f);
  check("gdn segments state", shape, got_S, ref_S, 2e-4f, 2e-4f);
}
TEST(CudaPrefill, GdnPrefillSegments) {
  REQUIRE_GPU();
  GdnCase small(2, 4), real(16, 32);
  gdn_segments_case(small, {5, 64, 65, 2, 130}, true);
  gdn_segments_case(small, {96, 7}, false);
  gdn_segments_case(real, {96, 96, 33, 129, 2}, true);
}

// ------------------------------------------------------------------------------- attention
// terms 3 (fp32 caches): q/K/V/P split into bf16 hi + lo, checked against the plain fp32
// reference; terms 1: bf16 operands, checked against a reference that rounds q/K/V to bf16.
// wg: the split-operand kernel (1 wgmma, attn_wg.cu; 0 mma.sync; -1 the default).
void attn_case(int nh, int nkv, int hd, int pos0, int M, bool kv_f32 = true, int terms = 3, int wg = -1) {
  if (!kv_f32) terms = 1;
  const int qw = 2 * hd, rot = hd / 4, ldu = nh * qw + 2 * nkv * hd, max_seq = pos0 + M + 3;
  auto u = randv(size_t(M) * ldu);
  auto qn = rand_bf16(hd, 0.1f, 1.f), kn = rand_bf16(hd, 0.1f, 1.f);
  // Cache before: positions < pos0 random bf16 (as a previous prefill/decode left them).
  std::vector<float> kc(size_t(nkv) * max_seq * hd, 0.f), vc = kc;
  for (int h = 0; h < nkv; ++h)
    for (int t = 0; t < pos0; ++t)
      for (int d = 0; d < hd; ++d) {
        kc[(size_t(h) * max_seq + t) * hd + d] = round_bf16(randn());
        vc[(size_t(h) * max_seq + t) * hd + d] = round_bf16(randn());
      }
  DBuf<float> du(u), dout(size_t(M) * nh * hd);
  // Cache on the device: fp32 (decode default) or bf16.
  const size_t esz = kv_f32 ? 4 : 2, cbytes = kc.size() * esz;
  DBuf<uint8_t> dkc(cbytes), dvc(cbytes);
  auto upc = [&](DBuf<uint8_t>& d, const std::vector<float>& v) {
    if (kv_f32) cudaMemcpy(d.p, v.data(), cbytes, cudaMemcpyHostToDevice);
    else { auto b = to_bits(v); cudaMemcpy(d.p, b.data(), cbytes, cudaMemcpyHostToDevice); }
  };
  auto downc = [&](DBuf<uint8_t>& d) {
    auto raw = d.down();
    std::vector<float> v(kc.size());
    if (kv_f32) std::memcpy(v.data(), raw.data(), cbytes);
    else {
      std::vector<uint16_t> b(v.size());
      std::memcpy(b.data(), raw.data(), cbytes);
      v = from_bits(b);
    }
    return v;
  };
  upc(dkc, kc), upc(dvc, vc);
  DBuf<uint16_t> dqn(to_bits(qn)), dkn(to_bits(kn)), dqb(size_t(terms == 3 ? 2 : 1) * M * nh * hd);
  cuda::pf::AttnPrefillArgs a{};
  a.u = du.p, a.ldu = ldu, a.M = M, a.pos0 = pos0, a.q_norm = dqn.p, a.k_norm = dkn.p, a.kc = dkc.p, a.vc = dvc.p;
  a.kv_f32 = kv_f32, a.terms = terms, a.qb = dqb.p, a.out = dout.p, a.nh = nh, a.nkv = nkv, a.hd = hd, a.qw = qw, a.rot = rot, a.max_seq = max_seq;
  a.wg = wg;
  ASSERT_TRUE(cuda::pf::attn_prefill(a, nullptr).is_ok());
  // Reference: fp32 norm + rope; q, K, V rounded to bf16 when the kernel's MMAs take them so
  // (terms 1); softmax in double.
  auto qnb = as_bf16(qn), knb = as_bf16(kn);
  std::vector<float> q(size_t(M) * nh * hd);
  for (int m = 0; m < M; ++m) {
    for (int h = 0; h < nh; ++h) cpu::rmsnorm(&u[size_t(m) * ldu + h * qw], 1, hd, qnb.data(), 1e-6f, &q[(size_t(m) * nh + h) * hd]);
    std::vector<float> k(size_t(nkv) * hd);
    for (int h = 0; h < nkv; ++h) cpu::rmsnorm(&u[size_t(m) * ldu + nh * qw + h * hd], 1, hd, knb.data(), 1e-6f, &k[size_t(h) * hd]);
    cpu::rope_neox(&q[size_t(m) * nh * hd], nh, hd, rot, pos0 + m, 1e7);
    cpu::rope_neox(k.data(), nkv, hd, rot, pos0 + m, 1e7);
    for (int h = 0; h < nkv; ++h)
      for (int d = 0; d < hd; ++d) {
        kc[(size_t(h) * max_seq + pos0 + m) * hd + d] = k[size_t(h) * hd + d];
        vc[(size_t(h) * max_seq + pos0 + m) * hd + d] = u[size_t(m) * ldu + nh * qw + nkv * hd + h * hd + d];
      }
  }
  std::vector<float> kcr = kc, vcr = vc;
  if (terms == 1) {
    for (auto& x : q) x = round_bf16(x);
    for (auto& x : kcr) x = round_bf16(x);
    for (auto& x : vcr) x = round_bf16(x);
  }
  std::vector<float> ref(size_t(M) * nh * hd);
  const float scale = 1.f / std::sqrt(float(hd));
  for (int m = 0; m < M; ++m)
    for (int h = 0; h < nh; ++h) {
      const int kvh = h / (nh / nkv), n = pos0 + m + 1;
      std::vector<double> p(n);
      double mx = -1e30, sum = 0;
      for (int t = 0; t < n; ++t) {
        double s = 0;
        for (int d = 0; d < hd; ++d) s += double(q[(size_t(m) * nh + h) * hd + d]) * kcr[(size_t(kvh) * max_seq + t) * hd + d];
        p[t] = s * scale, mx = std::max(mx, p[t]);
      }
      for (auto& x : p) sum += (x = std::exp(x - mx));
      for (int d = 0; d < hd; ++d) {
        double o = 0;
        for (int t = 0; t < n; ++t) o += p[t] * vcr[(size_t(kvh) * max_seq + t) * hd + d];
        const float gt = u[size_t(m) * ldu + h * qw + hd + d];
        ref[(size_t(m) * nh + h) * hd + d] = float(o / sum) / (1.f + std::exp(-gt));
      }
    }
  const std::string shape = dims({nh, nkv, hd}) + " pos0=" + std::to_string(pos0) + " M=" + std::to_string(M) +
                            (kv_f32 ? " f32 kv" : " bf16 kv") + (terms == 3 ? " split" : " bf16 ops") +
                            (terms == 3 ? (wg == 0 ? " mma.sync" : " wgmma") : "");
  // Split operands: ~16-bit products, errors ~1e-5 (tolerance 3e-4 + 1e-3·|ref|); bf16: ~3e-3.
  if (terms == 3) check("attn prefill out", shape, dout.down(), ref, 3e-4f, 1e-3f);
  else check("attn prefill out", shape, dout.down(), ref, 1.5e-2f, 2e-2f);
  // K: fp32 norm + RoPE vs the reference's (last-bit differences; one bf16 ulp when stored bf16).
  std::vector<float> kcb = kc;
  for (auto& x : kcb) x = round_bf16(x);
  check("attn prefill K cache", shape, downc(dkc), kv_f32 ? kc : kcb, kv_f32 ? 1e-5f : 1e-2f, kv_f32 ? 1e-5f : 8e-3f);
  std::vector<float> vcb = vc;
  for (auto& x : vcb) x = round_bf16(x);
  check("attn prefill V cache", shape, downc(dvc), kv_f32 ? vc : vcb, 0.f, 0.f);
}
TEST(CudaPrefill, AttnPrefill) {
  REQUIRE_GPU();
  for (int M : {1, 2, 7, 8, 9, 63, 64, 65, 127, 128, 129}) attn_case(4, 2, 64, M % 3 == 0 ? 0 : 37, M);
  attn_case(16, 2, 256, 0, 129);
  attn_case(16, 2, 256, 100, 65);
  attn_case(4, 4, 128, 5, 200);
  attn_case(2, 1, 64, 0, 4097);
  attn_case(2, 1, 64, 4095, 2);
  attn_case(16, 2, 256, 100, 65, /*kv_f32=*/true, /*terms=*/1);
  attn_case(2, 1, 64, 0, 4097, /*kv_f32=*/true, /*terms=*/1);
  attn_case(16, 2, 256, 100, 65, /*kv_f32=*/false);
  attn_case(4, 2, 64, 37, 129, /*kv_f32=*/false);
  // The mma.sync split kernel (LILY_PREFILL_ATTN_WG=0) stays covered.
  attn_case(16, 2, 256, 100, 65, true, 3, /*wg=*/0);
  attn_case(4, 2, 64, 37, 129, true, 3, /*wg=*/0);
  attn_case(2, 1, 64, 0, 4097, true, 3, /*wg=*/0);
}
// The wgmma split kernel (attn_wg.cu, the default): 128-query blocks of two 64-row warpgroups,
// 32-key tiles, the K/V split planes padded to 64 keys. The real shape (16 q / 2 kv heads, hd 256)
// at every query-tile and key-tile edge, with and without cached positions (pos0 0 / 37 / 100),
// chunks continuing far into the cache, one long row per head dim.
TEST(CudaPrefill, AttnPrefillWgmma) {
  REQUIRE_GPU();
  const int pos0s[3] = {0, 37, 100};
  int i = 0;
  for (int M : {1, 2, 7, 8, 9, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257})
    attn_case(16, 2, 256, pos0s[i++ % 3], M, true, 3, 1);
  attn_case(16, 2, 256, 4000, 129, true, 3, 1);  // continuing after 4000 cached positions
  attn_case(16, 2, 256, 4095, 2, true, 3, 1);
  attn_case(4, 1, 256, 4097, 64, true, 3, 1);
  for (int M : {4095, 4096, 4097}) attn_case(2, 1, 128, 0, M, true, 3, 1);
  attn_case(2, 1, 256, 0, 4097, true, 3, 1);
  attn_case(4, 2, 64, 1000, 300, true, 3, 1);
  attn_case(8, 8, 128, 63, 65, true, 3, 1);
}
// Experimental wgmma variants (LILY_PREFILL_ATTN_WG=2: stacked [Kh; Kl] tile; =3: three S
// accumulators), not the default: the same edges on fewer rows. Only with LILY_ATTN_VARIANTS=1
// (scripts/device/attn_ab.sh), so an unproven variant does not fail the default op table.
TEST(CudaPrefill, AttnPrefillWgmmaVariants) {
  REQUIRE_GPU();
  const char* e = std::getenv("LILY_ATTN_VARIANTS");
  if (!e || std::string(e) != "1") GTEST_SKIP() << "set LILY_ATTN_VARIANTS=1 to check the experimental attention variants";
  for (int v : {2, 3}) {
    const int pos0s[3] = {0, 37, 100};
    int i = 0;
    for (int M : {1, 9, 32, 33, 64, 129, 257}) attn_case(16, 2, 256, pos0s[i++ % 3], M, true, 3, v);
    attn_case(16, 2, 256, 4000, 129, true, 3, v);
    attn_case(2, 1, 128, 0, 4097, true, 3, v);
    attn_case(4, 2, 64, 1000, 300, true, 3, v);
  }
}
// Timing of the attention prefill (prep + K/V split + flash) at the real shape (16 q / 2 kv heads,
// hd 256, gate) for a 4,096-token chunk with 0 and 4,096 cached positions, per kernel variant
// (0 mma.sync, 1 wgmma default, 2 and 3 experimental). Runs only with LILY_ATTN_BENCH=1. TF/s
// counts 4·hd FLOP per (query, key ≤ query) pair and head. "rel": max |Δ| against variant 0's
// output relative to max |out| (a cross-check; the CPU rows above are the oracle).
TEST(CudaPrefill, AttnBench) {
  REQUIRE_GPU();
  const char* e = std::getenv("LILY_ATTN_BENCH");
  if (!e || std::string(e) != "1") GTEST_SKIP() << "set LILY_ATTN_BENCH=1 to time the attention kernels";
  const int nh = 16, nkv = 2, hd = 256, qw = 2 * hd, rot = 64, ldu = nh * qw + 2 * nkv * hd, M = 4096, max_seq = 8192;
  DBuf<float> du(randv(size_t(M) * ldu)), dout(size_t(M) * nh * hd), dkc(size_t(nkv) * max_seq * hd), dvc(size_t(nkv) * max_seq * hd);
  cudaMemset(dkc.p, 0, dkc.n * 4), cudaMemset(dvc.p, 0, dvc.n * 4);
  DBuf<uint16_t> dqn(to_bits(rand_bf16(hd, 0.1f, 1.f))), dkn(to_bits(rand_bf16(hd, 0.1f, 1.f))), dqb(size_t(2) * M * nh * hd);
  for (int pos0 : {0, 4096}) {
    std::vector<float> base;
    std::printf("| attn 16x2x256 M=%d pos0=%d |", M, pos0);
    for (int v : {0, 1, 2, 3}) {
      cuda::pf::AttnPrefillArgs a{};
      a.u = du.p, a.ldu = ldu, a.M = M, a.pos0 = pos0, a.q_norm = dqn.p, a.k_norm = dkn.p, a.kc = dkc.p, a.vc = dvc.p;
      a.kv_f32 = true, a.terms = 3, a.qb = dqb.p, a.out = dout.p, a.nh = nh, a.nkv = nkv, a.hd = hd, a.qw = qw, a.rot = rot;
      a.max_seq = max_seq, a.wg = v;
      const float ms = mean_ms(5, [&] { return cuda::pf::attn_prefill(a, nullptr).is_ok(); });
      ASSERT_GE(ms, 0.f) << "variant " << v << " pos0 " << pos0 << ": an attention call failed";
      const double pairs = double(M) * pos0 + double(M) * (M + 1) / 2;
      std::printf(" v%d %7.3f ms %6.1f TF/s", v, ms, 4.0 * hd * nh * pairs / (ms * 1e-3) / 1e12);
      auto y = dout.down();
      if (v == 0) base = y;
      else {
        const auto [md, my] = max_diff(y, base);
        std::printf(" (rel %.1e)", md / std::max(my, 1e-30));
      }
      std::printf(" |");
    }
    std::printf("\n");
    std::fflush(stdout);
  }
}

// ------------------------------------------------------------------------------- whole model

void model_case(const ModelWeights& w, std::vector<int> pieces, int steps, const char* chunk) {
  ScopedEnv eg("LILY_PREFILL_CHUNK", chunk);
  ScopedEnv em("LILY_PREFILL_MIN", "2");  // the prefill kernels from 2 tokens up (the default hands M < 8 to the decode graph)
  auto cpu_be = make_cpu_backend(w);
  auto gpu_be = make_cuda_backend(w, false);
  ASSERT_TRUE(cpu_be.is_ok() && gpu_be.is_ok()) << gpu_be.message();
  auto cpu_m = Model::over(w.cfg, std::move(cpu_be).value()), gpu_m = Model::over(w.cfg, std::move(gpu_be).value());
  int Mt = 0;
  for (int p : pieces) Mt += p;
  const int V = w.cfg.vocab_size, cap = Mt + steps + 4;
  auto cs = cpu_m->new_state(cap);
  auto gs = gpu_m->new_state(cap);
  ASSERT_TRUE(cs.is_ok() && gs.is_ok());
  std::vector<int32_t> prompt(Mt);
  for (int i = 0; i < Mt; ++i) prompt[i] = int32_t((uint64_t(i) * 2654435761ull % 4294967296ull) % uint64_t(V));
  std::vector<float> lc(V), lg(V);
  int t0 = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    std::span<const int32_t> sp(prompt.data() + t0, pieces[i]);
    const bool last = i + 1 == pieces.size();
    ASSERT_TRUE(cpu_m->forward(**cs, sp, last ? std::span<float>(lc) : std::span<float>()).is_ok());
    ASSERT_TRUE(gpu_m->forward(**gs, sp, last ? std::span<float>(lg) : std::span<float>()).is_ok());
    t0 += pieces[i];
  }
  std::string shape = "M=";
  for (size_t i = 0; i < pieces.size(); ++i) shape += (i ? "+" : "") + std::to_string(pieces[i]);
  shape += std::string(" chunk ") + chunk;
  // Tolerance: activations fp32, GEMM x as fp16 hi+lo (~22 bits), attention operands bf16 hi+lo
  // (~16 bits); random models amplify rounding (helpers-common, numerics finding).
  check("model prefill logits", shape, lg, lc, 5e-3f, 0.f);
  {
    std::vector<float> c = lc;
    std::partial_sort(c.begin(), c.begin() + 2, c.end(), std::greater<float>());
    if (c[0] - c[1] > 0.1f) {
      EXPECT_EQ(argmax(lc), argmax(lg)) << shape;
    }
  }
  // Decode continues from the prefilled state (the decode graph, fp32 activations and K/V).
  for (int s = 0; s < steps; ++s) {
    const int32_t ic = argmax(lc);
    ASSERT_TRUE(cpu_m->forward(**cs, std::span<const int32_t>(&ic, 1), lc).is_ok());
    ASSERT_TRUE(gpu_m->forward(**gs, std::span<const int32_t>(&ic, 1), lg).is_ok());
  }
  if (steps > 0) check("model decode after prefill", shape + " +" + std::to_string(steps) + " steps", lg, lc, 5e-3f, 0.f);
}
TEST(CudaPrefill, TinyModel) {
  REQUIRE_GPU();
  auto cfg = synthetic_config("tiny");
  ASSERT_TRUE(cfg.is_ok());
  auto sw = make_synthetic_weights(*cfg, 7);
  for (int M : {2, 7, 63, 64, 65, 129}) model_case(sw->w, {M}, 0, "4096");
  model_case(sw->w, {300}, 4, "64");
  model_case(sw->w, {5, 70, 1, 130}, 4, "64");
  model_case(sw->w, {4097}, 2, "4096");
}

}  // namespace
}  // namespace lily
#endif  // LILY_HAVE_CUDA
