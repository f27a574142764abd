// The decode GEMV family (src/backend/cuda/gemm/gemv_q4.cu, gemv_tc.cu, batch_gemv.cu): CudaOps.* checks
// gemv() against the CPU reference (plain, add+RMSNorm and gated-norm prologues, the lm_head argmax
// epilogue; the CUDA-core kernels and, with GemvArgs::tc, the tensor-core ones; ops_util.h says how),
// CudaBatch.* the batched GEMV and its add+norm / router top-k kernels against the batch-1 (CUDA-core)
// ones, bit for bit (batch_util.h).
// The router's top-k epilogue is tested with the MoE (moe_test.cpp).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../cuda_test_env.h"

#ifdef LILY_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cpu/ref_ops.h"
#include "backend/cuda/common/ops.h"
#include "backend/cuda/step/batch_ops.h"
#include "core/bf16.h"
#include "model/logits.h"
#include "batch_util.h"
#include "ops_util.h"

// ---- CudaOps: gemv() against the CPU reference ------------------------------------------------------------
namespace lily::test_ops {
namespace {

// GemvArgs::tc of the cases below: unset, the CUDA-core kernels; the Tc tests set it (the decode step's
// calls: the tensor-core kernel where it applies).
bool g_tc = false;

// ---------------------------------------------------------------- GEMV (plain, 4/8 bit)
void gemv_plain_case(int rows, int cols, int bits) {
  HostQ W(rows, cols, bits);
  DevQ D({&W.w});
  auto x = rand_bf16(cols);
  std::vector<float> ref(rows);
  cpu::qmatmul(W.w, x.data(), 1, cols, ref.data(), rows, /*round=*/true);
  DBuf<float> dx(x), dy(rows);
  cuda::GemvArgs a{};
  a.w = D.q, a.in = dx.p, a.y = dy.p, a.tc = g_tc;
  ASSERT_TRUE(cuda::gemv(a, nullptr).is_ok());
  check(fmt::format("gemv q{} fp32", bits), dims({rows, cols}), dy.down(), ref, 1e-4f, 1e-3f);
}
TEST(CudaOps, GemvPlain) {
  LILY_OPS_REQUIRE_GPU();
  gemv_plain_case(12352, 2048, 4);  // [qkv|z|a|b]
  gemv_plain_case(2048, 4096, 4);   // out_proj / o_proj
  gemv_plain_case(9216, 2048, 4);   // [q|k|v]
  gemv_plain_case(1, 2048, 4);
  gemv_plain_case(3, 256, 4);
  gemv_plain_case(37, 512, 4);
  gemv_plain_case(17, 1024, 4);
  gemv_plain_case(257, 2048, 8);
  gemv_plain_case(5, 256, 8);
  gemv_plain_case(9, 1024, 8);
  gemv_plain_case(2048, 320, 4);  // wide golden: H = 320
  gemv_plain_case(17, 320, 8);
  gemv_plain_case(1700, 64, 4);   // K = one group
  gemv_plain_case(4096, 4096, 4);
}

// ---------------------------------------------------------------- GEMV with add+norm prologue
void gemv_addnorm_case(int rows, int cols, bool with_mix) {
  HostQ W(rows, cols, 4);
  DevQ D({&W.w});
  auto x = rand_bf16(cols, 3.f), mix = rand_bf16(cols), gain = rand_bf16(cols, 0.2f, 1.f);
  std::vector<float> r(cols), n(cols), ref(rows);
  for (int i = 0; i < cols; ++i) r[i] = with_mix ? x[i] + mix[i] : x[i];
  auto gb = as_bf16(gain);
  cpu::rmsnorm(r.data(), 1, cols, gb.data(), 1e-6f, n.data());
  cpu::qmatmul(W.w, n.data(), 1, cols, ref.data(), rows, true);
  DBuf<float> dx(x), dm(mix), dr(cols), dn(cols), dy(rows);
  DBuf<uint16_t> dg(to_bits(gain));
  cuda::GemvArgs a{};
  a.w = D.q, a.pro = cuda::Pro::kAddNorm, a.in = dx.p, a.mix = with_mix ? dm.p : nullptr, a.gain = dg.p;
  a.res_out = dr.p, a.n_out = dn.p, a.y = dy.p, a.tc = g_tc;
  ASSERT_TRUE(cuda::gemv(a, nullptr).is_ok());
  const std::string sh = dims({rows, cols}) + (with_mix ? " +mix" : "");
  check("add+rmsnorm→gemv: residual", sh, dr.down(), r, 0, 0);
  check("add+rmsnorm→gemv: normed", sh, dn.down(), n, 1e-5f, 1e-5f);
  check("add+rmsnorm→gemv: y", sh, dy.down(), ref, 1e-4f, 1e-3f);
}
TEST(CudaOps, GemvAddNorm) {
  LILY_OPS_REQUIRE_GPU();
  gemv_addnorm_case(12352, 2048, true);
  gemv_addnorm_case(9216, 2048, false);
  gemv_addnorm_case(7, 256, true);
  gemv_addnorm_case(2048, 2048, true);  // 2-warp blocks (fewer 16-row tiles than SMs)
  gemv_addnorm_case(100, 320, true);
}

// ---------------------------------------------------------------- tensor-core GEMV (gemv_tc.cu)
// x with a wide dynamic range (each element scaled by 2^u, u uniform in [-lo, hi]); zero = all zeros
// but element `spike` (or none when spike < 0).
void gemv_range_case(int rows, int cols, int lo, int hi, int spike = -2) {
  HostQ W(rows, cols, 4);
  DevQ D({&W.w});
  std::vector<float> x(cols, 0.f);
  if (spike == -2) {
    for (auto& v : x) v = round_bf16(randn() * std::ldexp(1.f, int(randu() * (lo + hi + 1)) - lo));
  } else if (spike >= 0) {
    x[size_t(spike)] = 3.5f;
  }
  std::vector<float> ref(rows);
  cpu::qmatmul(W.w, x.data(), 1, cols, ref.data(), rows, true);
  // Σ_j |s·q_j·x_j| + |b·x_j| per row: with x spanning 2^24 the large terms of a row can cancel to an output far
  // below them, and two fp32 sums in different orders (kernel, reference) then differ by their rounding, which
  // scales with this sum, not with |ref| (H100, 2026-12-06: 2.7e-4 at an output of −0.075 whose terms' magnitudes
  // sum to ~2e4, ~2^-26 of it); 2^-20 of the sum is allowed on top of the usual bound.
  std::vector<float> cond(rows);
  const int G = cols / 64;
  for (int r = 0; r < rows; ++r) {
    double t = 0;
    for (int j = 0; j < cols; ++j) {
      const float q = float((W.codes[(size_t(r) * cols + j) / 8] >> (4 * (j % 8))) & 15u);
      const float s = bf16_to_f32(W.sc[size_t(r) * G + j / 64]), b = bf16_to_f32(W.bi[size_t(r) * G + j / 64]);
      t += (std::fabs(s * q) + std::fabs(b)) * std::fabs(x[size_t(j)]);
    }
    cond[size_t(r)] = float(std::ldexp(t, -20));
  }
  DBuf<float> dx(x), dy(rows);
  cuda::GemvArgs a{};
  a.w = D.q, a.in = dx.p, a.y = dy.p, a.tc = g_tc;
  ASSERT_TRUE(cuda::gemv(a, nullptr).is_ok());
  const std::string what = spike == -2 ? fmt::format("x·2^[-{},{}]", lo, hi) : spike < 0 ? "x = 0" : "one nonzero x";
  check("gemv q4 " + what, dims({rows, cols}), dy.down(), ref, 1e-4f, 1e-3f, &cond);
}
void lm_head_case(int V, int H, bool tie);
// lm_head as the decode step runs it: add + RMSNorm prologue, argmax epilogue.
void lm_head_addnorm_case(int V, int H) {
  HostQ W(V, H, 4, 4.f);
  DevQ D({&W.w});
  auto x = rand_bf16(H, 3.f), mix = rand_bf16(H), gain = rand_bf16(H, 0.2f, 1.f);
  std::vector<float> r(H), n(H), ref(V);
  for (int i = 0; i < H; ++i) r[i] = x[i] + mix[i];
  auto gb = as_bf16(gain);
  cpu::rmsnorm(r.data(), 1, H, gb.data(), 1e-6f, n.data());
  cpu::qmatmul(W.w, n.data(), 1, H, ref.data(), V, false);
  const int want = argmax(ref);
  DBuf<float> dx(x), dm(mix), dr(H), dl(V), part(2 * size_t(cuda::gemv_argmax_max_blocks()));
  DBuf<uint16_t> dg(to_bits(gain));
  DBuf<cuda::StepCtl> ctl(1);
  cuda::StepCtl c0{};
  cudaMemcpy(ctl.p, &c0, sizeof(c0), cudaMemcpyHostToDevice);
  cuda::GemvArgs a{};
  a.w = D.q, a.pro = cuda::Pro::kAddNorm, a.in = dx.p, a.mix = dm.p, a.gain = dg.p, a.res_out = dr.p, a.y = dl.p;
  a.epi = cuda::Epi::kArgmax, a.ctl = ctl.p, a.partial = part.p, a.tc = g_tc;
  ASSERT_TRUE(cuda::gemv(a, nullptr).is_ok());
  cudaDeviceSynchronize();
  check("add+norm→lm_head logits", dims({V, H}), dl.down(), ref, 1e-3f, 1e-3f);
  check("add+norm→lm_head residual", dims({V, H}), dr.down(), r, 0, 0);
  auto c = ctl.down()[0];
  check("add+norm→lm_head argmax", dims({V, H}), {float(c.tok), float(c.pos)}, {float(want), 1.f}, 0, 0);
}
// The same op-table cases as the decode step calls gemv() (GemvArgs::tc: every 4-bit K 2048/4096 GEMV
// of the plain, add-norm and argmax kinds takes the tensor-core kernel; other K fall back).
TEST(CudaOps, GemvTc) {
  LILY_OPS_REQUIRE_GPU();
  g_tc = true;
  g_tag = " tc";
  gemv_plain_case(12352, 2048, 4);  // [qkv|z|a|b]
  gemv_plain_case(2048, 4096, 4);   // out_proj / o_proj
  gemv_plain_case(9216, 2048, 4);   // [q|k|v]
  gemv_plain_case(1, 2048, 4);
  gemv_plain_case(17, 4096, 4);
  gemv_plain_case(33, 2048, 4);     // a partial 16-row tile after a full one
  gemv_plain_case(4096, 4096, 4);
  gemv_plain_case(2048, 320, 4);    // K not 2048/4096: the old kernel
  gemv_range_case(2048, 4096, 12, 12);
  gemv_range_case(777, 2048, 20, 4);
  gemv_range_case(100, 2048, 0, 0, -1);
  gemv_range_case(100, 2048, 0, 0, 1999);
  gemv_addnorm_case(12352, 2048, true);
  gemv_addnorm_case(9216, 2048, false);
  gemv_addnorm_case(2048, 4096, true);
  gemv_addnorm_case(50, 2048, true);
  lm_head_case(248320, 2048, false);
  lm_head_case(248320, 2048, true);
  lm_head_case(4096, 4096, true);
  lm_head_case(3, 2048, false);
  lm_head_addnorm_case(248320, 2048);
  lm_head_addnorm_case(1000, 2048);
  g_tag.clear();
  g_tc = false;
}

// ---------------------------------------------------------------- GEMV with gated-norm prologue
void gated_case(int rows, int nv, int dv) {
  const int K = nv * dv;
  HostQ W(rows, K, 4);
  DevQ D({&W.w});
  auto o = rand_bf16(K, 0.5f), z = rand_bf16(K), gain = rand_bf16(dv, 0.2f, 1.f);
  std::vector<float> xin(K), ref(rows);
  for (int h = 0; h < nv; ++h) {
    float ss = 0;
    for (int d = 0; d < dv; ++d) ss += o[h * dv + d] * o[h * dv + d];
    const float inv = 1.0f / std::sqrt(ss / dv + 1e-6f);
    for (int d = 0; d < dv; ++d) {
      const float zz = z[h * dv + d];
      xin[h * dv + d] = gain[d] * o[h * dv + d] * inv * (zz / (1.0f + std::exp(-zz)));
    }
  }
  cpu::qmatmul(W.w, xin.data(), 1, K, ref.data(), rows, true);
  DBuf<float> dox(o), dz(z), dy(rows);
  DBuf<uint16_t> dg(to_bits(gain));
  cuda::GemvArgs a{};
  a.w = D.q, a.pro = cuda::Pro::kGatedNorm, a.in = dox.p, a.z = dz.p, a.gain = dg.p, a.gn_dv = dv, a.y = dy.p;
  ASSERT_TRUE(cuda::gemv(a, nullptr).is_ok());
  check("gated rmsnorm→out_proj", dims({rows, nv, dv}), dy.down(), ref, 1e-4f, 1e-3f);
}
TEST(CudaOps, GemvGatedNorm) {
  LILY_OPS_REQUIRE_GPU();
  gated_case(2048, 32, 128);
  gated_case(256, 4, 128);
  gated_case(64, 2, 128);
  gated_case(320, 4, 64);  // wide / seed7 goldens
}

// ---------------------------------------------------------------- lm_head + argmax epilogue
void lm_head_case(int V, int H, bool tie) {
  HostQ W(V, H, 4, 4.f);
  auto x = rand_bf16(H);
  std::vector<float> ref(V);
  cpu::qmatmul(W.w, x.data(), 1, H, ref.data(), V, false);
  int want = argmax(ref);
  if (tie) {  // duplicate the winner's row at a lower id: the lower id must win
    const int lo = want / 2;
    std::copy_n(W.codes.begin() + size_t(want) * W.w.words_per_row(), W.w.words_per_row(), W.codes.begin() + size_t(lo) * W.w.words_per_row());
    std::copy_n(W.sc.begin() + size_t(want) * W.w.groups_per_row(), W.w.groups_per_row(), W.sc.begin() + size_t(lo) * W.w.groups_per_row());
    std::copy_n(W.bi.begin() + size_t(want) * W.w.groups_per_row(), W.w.groups_per_row(), W.bi.begin() + size_t(lo) * W.w.groups_per_row());
    cpu::qmatmul(W.w, x.data(), 1, H, ref.data(), V, false);
    want = lo;
  }
  DevQ D({&W.w});
  DBuf<float> dx(x), dl(V), part(2 * size_t(cuda::gemv_argmax_max_blocks()));
  DBuf<cuda::StepCtl> ctl(1);
  cuda::StepCtl c0{};
  c0.pos = 5;
  cudaMemcpy(ctl.p, &c0, sizeof(c0), cudaMemcpyHostToDevice);
  cuda::GemvArgs a{};
  a.w = D.q, a.in = dx.p, a.y = dl.p, a.epi = cuda::Epi::kArgmax, a.ctl = ctl.p, a.partial = part.p;
  a.tc = g_tc;
  for (int rep = 0; rep < 2; ++rep) {
    ASSERT_TRUE(cuda::gemv(a, nullptr).is_ok());
    cudaDeviceSynchronize();
    const std::string sh = dims({V, H}) + (tie ? " tie" : "") + (rep ? " (replay)" : "");
    check("lm_head logits fp32", sh, dl.down(), ref, 1e-3f, 1e-3f);
    auto c = ctl.down()[0];
    check("argmax → ctl.tok, last_argmax, pos", sh, {float(c.tok), float(c.last_argmax), float(c.pos)},
          {float(want), float(want), float(6 + rep)}, 0, 0);
  }
}
TEST(CudaOps, LmHeadArgmax) {
  LILY_OPS_REQUIRE_GPU();
  lm_head_case(248320, 2048, false);
  lm_head_case(248320, 2048, true);
  lm_head_case(4096, 256, true);
  lm_head_case(3, 256, false);
}

}  // namespace
}  // namespace lily::test_ops

// ---- CudaBatch: the batched GEMV against gemv() -----------------------------------------------------------
namespace lily::test_batch {
namespace {

// bgemv_grouped at its default shapes, every row against gemv() alone: 4- and 8-bit, K 320..4096, partial
// weight tiles.
TEST(CudaBatch, GemvRowsEqualBatch1) {
  LILY_REQUIRE_GPU();
  struct S { int bits, K, rows; };
  for (S s : {S{4, 2048, 12352}, S{4, 4096, 2048}, S{8, 2048, 257}, S{4, 2048, 2000}, S{4, 320, 96}}) {
    Q w(s.rows, s.K, s.bits);
    for (int B : kBs) {
      if (s.rows > 10000 && B > 17) continue;  // time: the big matrix at up to 17 rows
      D<float> x(randv(size_t(B) * s.K)), y1(size_t(B) * s.rows);
      for (int b = 0; b < B; ++b) {
        cuda::GemvArgs a{};
        a.w = w.q, a.pro = cuda::Pro::kPlain, a.in = x.p + size_t(b) * s.K, a.y = y1.p + size_t(b) * s.rows;
        ASSERT_TRUE(cuda::gemv(a, nullptr).is_ok());
      }
      const std::string sh = std::to_string(s.bits) + "-bit " + std::to_string(s.rows) + "x" + std::to_string(s.K);
      D<float> yg(size_t(B) * s.rows);
      ASSERT_TRUE(cuda::bgemv_grouped(w.q, x.p, s.K, yg.p, s.rows, B, nullptr).is_ok());
      const float eg = max_diff(yg.get(), y1.get());
      row("bgemv_grouped", sh, B, eg);
      EXPECT_EQ(eg, 0.f) << "grouped: bits " << s.bits << " K " << s.K << " B " << B;
    }
  }
}

// The router's shape at the batched step's row counts, in every launch shape (staged rows a block, weight
// rows a warp, rows a step of the sums, tiles a block): partial groups, blocks walking several tiles.
TEST(CudaBatch, GroupedRouterEqualsBatch1) {
  LILY_REQUIRE_GPU();
  Q w(257, 2048, 8);
  const cuda::GroupedShape shapes[] = {{}, {8, 2, 8, 0}, {4, 1, 4, 1}, {8, 1, 8, 3}, {16, 2, 4, 2}, {8, 2, 4, 17}, {4, 1, 4, 33}};
  for (int B : {1, 5, 16, 64, 197, 256}) {
    D<float> x(randv(size_t(B) * 2048)), y(size_t(B) * 257), y1(size_t(B) * 257);
    for (int b = 0; b < B; ++b) {
      cuda::GemvArgs a{};
      a.w = w.q, a.pro = cuda::Pro::kPlain, a.in = x.p + size_t(b) * 2048, a.y = y1.p + size_t(b) * 257;
      ASSERT_TRUE(cuda::gemv(a, nullptr).is_ok());
    }
    const auto ref = y1.get();
    for (const cuda::GroupedShape& g : shapes) {
      ASSERT_TRUE(cuda::bgemv_grouped(w.q, x.p, 2048, y.p, 257, B, nullptr, g).is_ok());
      const float e = max_diff(y.get(), ref);
      const std::string sh = "8-bit 257x2048, shape " + std::to_string(g.group) + "/" + std::to_string(g.r) + "/" +
                             std::to_string(g.nb) + "/" + std::to_string(g.tiles);
      row("bgemv_grouped", sh, B, e);
      EXPECT_EQ(e, 0.f) << sh << " B " << B;
    }
  }
}

// The step's small kernels by launch shape (LILY_SMALL_OPS_BENCH=1; run.sh's OPS_BENCH): the router GEMV
// (bgemv_grouped) and the add+norm+pack with the MoE combine (bnorm_pack), µs a call at the step's row counts.
TEST(CudaBatch, SmallOpsBench) {
  LILY_REQUIRE_GPU();
  if (!std::getenv("LILY_SMALL_OPS_BENCH")) GTEST_SKIP() << "set LILY_SMALL_OPS_BENCH=1 to time the router GEMV and add+norm+pack";
  GraphTimer t;
  const int H = 2048, E = 256, k = 8;
  Q w(E + 1, H, 8);
  const cuda::GroupedShape shapes[] = {{}, {4, 1, 4, 0}, {8, 1, 4, 0}, {8, 1, 8, 0}, {8, 2, 4, 0}, {8, 2, 8, 0}, {16, 1, 4, 0}, {8, 1, 4, 33}, {8, 2, 8, 17}};
  std::printf("[small-ops-bench] | op | shape | rows | us |\n");
  for (int B : {4, 16, 64, 256, 736}) {
    D<float> x(randv(size_t(B) * H)), y(size_t(B) * (E + 1));
    for (const cuda::GroupedShape& g : shapes) {
      const cuda::GroupedShape d = g.group ? g : cuda::bgemv_grouped_shape(w.q, B);
      const double us = t.us([&](cudaStream_t s) { (void)cuda::bgemv_grouped(w.q, x.p, H, y.p, E + 1, B, s, g); });
      std::printf("[small-ops-bench] | router bgemv_grouped | %s%d/%d/%d/%d | %d | %.1f |\n", g.group ? "" : "default ", d.group,
                  d.r, d.nb, d.tiles, B, us);
    }
    D<float> in(randv(size_t(B) * H)), yd(randv(size_t(B) * (k + 1) * H)), tw(randv(size_t(B) * (k + 1)));
    D<float> res(size_t(B) * H), n(size_t(B) * H);
    D<uint16_t> gain(randbf(H, 1.f, 0.2f)), X(size_t(B) * H), Xlo(size_t(B) * H);
    D<float> XS(size_t(B) * H / 32);
    for (int cs : {0, 1, 2, 4, 8}) {
      cuda::BNormArgs a{};
      a.in = in.p, a.yd = yd.p, a.tw = tw.p, a.top_k = k, a.gain = gain.p, a.H = H, a.B = B, a.res_out = res.p, a.n_out = n.p;
      a.X16 = X.p, a.X16lo = Xlo.p, a.XS = XS.p, a.blocks = cs;
      const double us = t.us([&](cudaStream_t s) { (void)cuda::bnorm_pack(a, s); });
      std::printf("[small-ops-bench] | add+norm+pack (MoE combine, two-pass) | %s blocks a row | %d | %.1f |\n",
                  cs ? std::to_string(cs).c_str() : "default", B, us);
    }
  }
}

// The step's router on rows normed as the batch-1 step norms them: logits (bgemv_grouped) and the top-k
// epilogue (brouter_topk) equal to the batch-1 GEMV with its add+norm prologue and top-k epilogue.
TEST(CudaBatch, RouterTopkEqualsBatch1) {
  LILY_REQUIRE_GPU();
  const int H = 2048, E = 256, k = 8;
  Q w(E + 1, H, 8);
  D<uint16_t> gain(randbf(H, 1.f, 0.2f));
  for (int B : {1, 3, 17}) {
    D<float> in(randv(size_t(B) * H)), mix(randv(size_t(B) * H, 0.5f)), y(size_t(B) * (E + 1));
    D<int32_t> ids(size_t(B) * k);
    D<float> tw(size_t(B) * (k + 1));
    D<float> res1(size_t(B) * H), xn1(size_t(B) * H), y1(size_t(B) * (E + 1));
    D<int32_t> ids1(size_t(B) * k);
    D<float> tw1(size_t(B) * (k + 1));
    D<cuda::StepCtl> ctl{static_cast<size_t>(B)};
    for (int b = 0; b < B; ++b) {
      cuda::GemvArgs a{};
      a.w = w.q, a.pro = cuda::Pro::kAddNorm, a.in = in.p + size_t(b) * H, a.mix = mix.p + size_t(b) * H, a.gain = gain.p;
      a.res_out = res1.p + size_t(b) * H, a.n_out = xn1.p + size_t(b) * H, a.eps = 1e-6f, a.y = y1.p + size_t(b) * (E + 1);
      a.epi = cuda::Epi::kTopK, a.ctl = ctl.p + b, a.n_experts = E, a.top_k = k, a.topk_ids = ids1.p + size_t(b) * k;
      a.topk_w = tw1.p + size_t(b) * (k + 1), a.norm_topk = true;
      ASSERT_TRUE(cuda::gemv(a, nullptr).is_ok());
    }
    ASSERT_TRUE(cuda::bgemv_grouped(w.q, xn1.p, H, y.p, E + 1, B, nullptr).is_ok());
    ASSERT_TRUE(cuda::brouter_topk(y.p, E + 1, E, k, true, true, ids.p, tw.p, B, nullptr).is_ok());
    const float e3 = max_diff(y.get(), y1.get()), e4 = max_diff(tw.get(), tw1.get());
    const bool ids_eq = ids.get() == ids1.get();
    row("router q8 logits", "257x2048", B, e3);
    row("router top-k weights", "E 256 k 8", B, e4);
    EXPECT_EQ(e3, 0.f);
    EXPECT_EQ(e4, 0.f);
    EXPECT_TRUE(ids_eq);
  }
}

}  // namespace
}  // namespace lily::test_batch

#else
TEST(CudaOps, Skipped) { GTEST_SKIP() << "no CUDA device: lily was built without the CUDA backend (no nvcc)"; }
TEST(CudaBatch, Skipped) { GTEST_SKIP() << "built without CUDA (LILY_HAVE_CUDA unset)"; }
#endif
