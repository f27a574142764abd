// The attention family (src/backend/cuda/attention/): CudaOps.Attention checks the decode prep and
// split-K decode (attention.cu) against the CPU reference over fp32 caches (ops_util.h);
// CudaPrefill.Attn* the prefill flash attention (attn_prefill.cu, attn_wg.cu) at every tile edge,
// and times it with LILY_ATTN_BENCH=1 (prefill_util.h); CudaBatch.AttentionEqualsBatch1 the batched
// decode (batch_attn.cu) against attn_prep (cache write, q: bit for bit) + attn_decode (within 1e-5)
// (batch_util.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../cuda_test_env.h"

#ifdef LILY_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cpu/ref_ops.h"
#include "backend/cuda/common/ops.h"
#include "backend/cuda/step/batch_ops.h"
#include "backend/cuda/step/prefill_ops.h"
#include "core/bf16.h"
#include "core/thread_pool.h"
#include "batch_util.h"
#include "ops_util.h"
#include "prefill_util.h"

// ---- CudaOps: decode attention against the CPU reference --------------------------------------------------
namespace lily::test_ops {
namespace {

void attn_case(int nh, int nkv, int hd, int pos, int max_seq) {
  const int qw = 2 * hd, rot = hd / 4, G = nh / nkv;
  auto qkv = rand_bf16(size_t(nh) * qw + 2 * size_t(nkv) * hd, 2.f);
  auto qn = rand_bf16(hd, 0.2f, 1.f), kn = rand_bf16(hd, 0.2f, 1.f);
  auto qnb = as_bf16(qn), knb = as_bf16(kn);
  // cache rows before pos: random values
  std::vector<float> kc(size_t(nkv) * max_seq * hd, 0.f), vc(kc.size(), 0.f);
  for (int h = 0; h < nkv; ++h)
    for (int t = 0; t < pos; ++t)
      for (int d = 0; d < hd; ++d) {
        kc[(size_t(h) * max_seq + t) * hd + d] = round_bf16(randn() * 2.f);
        vc[(size_t(h) * max_seq + t) * hd + d] = round_bf16(randn());
      }
  // reference: q/k norm + rope, cache write, softmax attention, gate
  std::vector<float> q(size_t(nh) * hd), kk(size_t(nkv) * hd);
  for (int h = 0; h < nh; ++h) cpu::rmsnorm(&qkv[size_t(h) * qw], 1, hd, qnb.data(), 1e-6f, &q[size_t(h) * hd]);
  cpu::rmsnorm(&qkv[size_t(nh) * qw], nkv, hd, knb.data(), 1e-6f, kk.data());
  cpu::rope_neox(q.data(), nh, hd, rot, pos, 1e7);
  cpu::rope_neox(kk.data(), nkv, hd, rot, pos, 1e7);
  for (int h = 0; h < nkv; ++h)
    for (int d = 0; d < hd; ++d) {
      const float kv = kk[h * hd + d];
      kc[(size_t(h) * max_seq + pos) * hd + d] = kv;
      vc[(size_t(h) * max_seq + pos) * hd + d] = qkv[size_t(nh) * qw + size_t(nkv) * hd + h * hd + d];
    }
  std::vector<float> ref(size_t(nh) * hd);
  const float scale = 1.0f / std::sqrt(float(hd));
  for (int h = 0; h < nh; ++h) {
    const int kvh = h / G;
    std::vector<float> p(pos + 1);
    float mx = -INFINITY;
    for (int t = 0; t <= pos; ++t) {
      float s = 0;
      for (int d = 0; d < hd; ++d) s += q[h * hd + d] * kc[(size_t(kvh) * max_seq + t) * hd + d];
      mx = std::max(mx, p[t] = s * scale);
    }
    float sum = 0;
    for (int t = 0; t <= pos; ++t) sum += (p[t] = std::exp(p[t] - mx));
    for (int d = 0; d < hd; ++d) {
      float o = 0;
      for (int t = 0; t <= pos; ++t) o += p[t] / sum * vc[(size_t(kvh) * max_seq + t) * hd + d];
      const float gt = qkv[size_t(h) * qw + hd + d];
      ref[h * hd + d] = o * (1.0f / (1.0f + std::exp(-gt)));
    }
  }
  // device: cache rows < pos preloaded; rows ≥ pos poisoned
  std::vector<float> kc0 = kc, vc0 = vc;
  for (int h = 0; h < nkv; ++h)
    for (int d = 0; d < hd; ++d) kc0[(size_t(h) * max_seq + pos) * hd + d] = vc0[(size_t(h) * max_seq + pos) * hd + d] = NAN;
  DBuf<float> dk(kc0), dv(vc0);
  DBuf<float> dqkv(qkv), dq(size_t(nh) * hd), dout(size_t(nh) * hd);
  DBuf<uint16_t> dqn(to_bits(qn)), dkn(to_bits(kn));
  DBuf<float> part(size_t(nkv) * cuda::attn_max_splits() * G * (hd + 2));
  DBuf<cuda::StepCtl> ctl(1);
  cuda::StepCtl c0{};
  c0.pos = pos;
  cudaMemcpy(ctl.p, &c0, sizeof(c0), cudaMemcpyHostToDevice);
  ASSERT_TRUE(cuda::attn_init().is_ok());
  cuda::AttnArgs a{};
  a.qkv = dqkv.p, a.q_norm = dqn.p, a.k_norm = dkn.p, a.q = dq.p, a.kc = dk.p, a.vc = dv.p, a.out = dout.p;
  a.partial = part.p, a.ctl = ctl.p, a.nh = nh, a.nkv = nkv, a.hd = hd, a.qw = qw, a.rot = rot, a.max_seq = max_seq;
  a.n_split = cuda::attn_max_splits();
  ASSERT_TRUE(cuda::attn_prep(a, nullptr).is_ok());
  for (int rep = 0; rep < 2; ++rep) ASSERT_TRUE(cuda::attn_decode(a, nullptr).is_ok());
  const std::string sh = "h" + std::to_string(nh) + "/" + std::to_string(nkv) + " d" + std::to_string(hd) + " ctx " +
                         std::to_string(pos + 1);
  check("attn prep: q norm+rope", sh, dq.down(), q, 1e-5f, 1e-4f);
  std::vector<float> kpos, kref, vpos, vref;
  auto kd = dk.down(), vdv = dv.down();
  for (int h = 0; h < nkv; ++h)
    for (int d = 0; d < hd; ++d) {
      const size_t i = (size_t(h) * max_seq + pos) * hd + d;
      kpos.push_back(kd[i]), kref.push_back(kc[i]), vpos.push_back(vdv[i]), vref.push_back(vc[i]);
    }
  check("attn prep: k cache write", sh, kpos, kref, 1e-5f, 1e-4f);
  check("attn prep: v cache write", sh, vpos, vref, 0, 0);
  check("attn split-K decode + gate", sh, dout.down(), ref, 1e-4f, 1e-3f);
}
TEST(CudaOps, Attention) {
  LILY_OPS_REQUIRE_GPU();
  attn_case(16, 2, 256, 0, 8);
  attn_case(16, 2, 256, 63, 128);
  attn_case(16, 2, 256, 64, 128);
  attn_case(16, 2, 256, 4200, 4300);
  attn_case(16, 2, 256, 40000, 40001);
  attn_case(4, 2, 64, 5, 16);
  attn_case(8, 8, 128, 300, 512);
  attn_case(2, 1, 256, 20, 32);   // small-seed11 golden
  attn_case(6, 2, 64, 37, 64);    // wide-seed23 golden: GQA group 3
  attn_case(4, 2, 128, 50, 64);   // golden-small-seed7
  attn_case(16, 2, 256, 66, 128);          // chunk tails (67 positions)
  attn_case(16, 2, 256, 32766, 32768);     // the 32k bench context
  attn_case(12, 2, 128, 1001, 1024);       // GQA group 6 (24 scores per chunk)
  attn_case(2, 2, 64, 2, 8);               // group 1, 3 positions
}

}  // namespace
}  // namespace lily::test_ops

// ---- CudaPrefill: prefill attention against the CPU reference ---------------------------------------------
namespace lily::test_prefill {
namespace {

// Against the plain fp32 reference over fp32 caches (softmax in double). terms 3: q/K/V/P split into bf16
// hi + lo (attn_wg.cu), errors ~1e-5, tolerance 3e-4 + 1e-3·|ref|. terms 1 (attn_wg16.cuh): q, K, V and P
// each rounded once to fp16, so from the arithmetic, per output element (softmax weights w_t, o = Σ w_t v_t):
// a score moves by at most scale·(2^-10 + hd·2^-24)·Σ_d |q_d k_td| =: E_t (two fp16 roundings, the fp32
// sum), which moves o by Σ_t w_t |v_t − o| E_t to first order; P and V add 2^-10 Σ_t w_t |v_t|, and fp16
// subnormals of small p at most 2^-25 Σ_t |v_t| / Σ_t p_t. Bound = 2·gate·(their sum) + 1e-6 (the factor 2
// for second-order terms). With random signs the errors sit well below it; a wrong key, tile or mask is
// off by ~|o|.
void attn_case(int nh, int nkv, int hd, int pos0, int M, int terms = 3) {
  const int qw = 2 * hd, rot = hd / 4, ldu = nh * qw + 2 * nkv * hd, max_seq = pos0 + M + 3;
  auto u = randv(size_t(M) * ldu);
  auto qn = rand_bf16(hd, 0.1f, 1.f), kn = rand_bf16(hd, 0.1f, 1.f);
  // Cache before: positions < pos0 random (as a previous prefill/decode left them).
  std::vector<float> kc(size_t(nkv) * max_seq * hd, 0.f), vc = kc;
  for (int h = 0; h < nkv; ++h)
    for (int t = 0; t < pos0; ++t)
      for (int d = 0; d < hd; ++d) {
        kc[(size_t(h) * max_seq + t) * hd + d] = randn();
        vc[(size_t(h) * max_seq + t) * hd + d] = randn();
      }
  DBuf<float> du(u), dout(size_t(M) * nh * hd), dkc(kc), dvc(vc);
  DBuf<uint16_t> dqn(to_bits(qn)), dkn(to_bits(kn)), dqb(size_t(2) * M * nh * hd);
  cuda::pf::AttnPrefillArgs a{};
  a.u = du.p, a.ldu = ldu, a.M = M, a.pos0 = pos0, a.q_norm = dqn.p, a.k_norm = dkn.p, a.kc = dkc.p, a.vc = dvc.p;
  a.qb = dqb.p, a.out = dout.p, a.nh = nh, a.nkv = nkv, a.hd = hd, a.qw = qw, a.rot = rot, a.max_seq = max_seq;
  a.terms = terms;
  ASSERT_TRUE(cuda::pf::attn_prefill(a, nullptr).is_ok());
  // Reference: fp32 norm + rope; softmax in double.
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
  std::vector<float> ref(size_t(M) * nh * hd);
  std::vector<double> bound(terms == 1 ? ref.size() : 0);
  const float scale = 1.f / std::sqrt(float(hd));
  const double c_s = scale * (std::ldexp(1.0, -10) + hd * std::ldexp(1.0, -24));
  // Each (query, head) on a pool thread (the long cases' references took most of the op tables' time on the
  // GPU machine's 16 cores); each writes its own rows of ref and bound.
  ThreadPool::global().parallel_for(size_t(M) * nh, 1, [&](size_t b, size_t e_end) {
    for (size_t mh = b; mh < e_end; ++mh) {
      const int m = int(mh / size_t(nh)), h = int(mh % size_t(nh));
      const int kvh = h / (nh / nkv), n = pos0 + m + 1;
      const float* qr = &q[(size_t(m) * nh + h) * hd];
      auto kr = [&](int t) { return &kc[(size_t(kvh) * max_seq + t) * hd]; };
      auto vr = [&](int t) { return &vc[(size_t(kvh) * max_seq + t) * hd]; };
      std::vector<double> p(n), e(n);  // e: the score's error bound E_t
      double mx = -1e30, sum = 0;
      for (int t = 0; t < n; ++t) {
        double s = 0, sa = 0;
        for (int d = 0; d < hd; ++d) s += double(qr[d]) * kr(t)[d], sa += std::fabs(double(qr[d]) * kr(t)[d]);
        p[t] = s * scale, mx = std::max(mx, p[t]), e[t] = c_s * sa;
      }
      for (auto& x : p) sum += (x = std::exp(x - mx));
      for (int d = 0; d < hd; ++d) {
        double o = 0;
        for (int t = 0; t < n; ++t) o += p[t] * vr(t)[d];
        o /= sum;
        const float gt = u[size_t(m) * ldu + h * qw + hd + d];
        const float gate = 1.f / (1.f + std::exp(-gt));
        const size_t i = (size_t(m) * nh + h) * hd + d;
        ref[i] = float(o) * gate;
        if (terms != 1) continue;
        double b_s = 0, b_pv = 0, b_sub = 0;
        for (int t = 0; t < n; ++t) {
          const double v = vr(t)[d], w = p[t] / sum;
          b_s += w * std::fabs(v - o) * e[t], b_pv += w * std::fabs(v), b_sub += std::fabs(v);
        }
        bound[i] = 2.0 * gate * (b_s + std::ldexp(b_pv, -10) + std::ldexp(b_sub, -25) / sum) + 1e-6;
      }
    }
  });
  const std::string shape = dims({nh, nkv, hd}) + " pos0=" + std::to_string(pos0) + " M=" + std::to_string(M);
  if (terms == 1) {
    const auto got = dout.down();
    double worst = 0, max_err = 0;  // worst = max |err| / bound
    size_t nbad = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double err = std::fabs(double(got[i]) - ref[i]);
      max_err = std::max(max_err, std::isnan(err) ? INFINITY : err);
      worst = std::max(worst, std::isnan(err) ? INFINITY : err / bound[i]);
      if (!(err <= bound[i])) ++nbad;
    }
    std::printf("| %-24s | %-34s | %10.3e | err/bound %.3f (bound: fp16 q, K, V, P; see attn_case) | %s |\n",
                "attn prefill single pass", shape.c_str(), max_err, worst, nbad ? "FAIL" : "ok");
    std::fflush(stdout);
    EXPECT_EQ(nbad, 0u) << "attn prefill single pass " << shape;
    // Again with the output as fp16 (AttnPrefillArgs::out16, the single-pass o_proj's input): the fp32 output
    // rounded to nearest, bit for bit (the K/V cache rewritten with the same values).
    testcuda::DBuf<uint16_t> d16(size_t(M) * nh * hd);
    a.out = nullptr, a.out16 = d16.p;
    ASSERT_TRUE(cuda::pf::attn_prefill(a, nullptr).is_ok());
    EXPECT_EQ(testcuda::count_not_half_of(d16.down(), got), 0u) << "attn prefill single pass, fp16 output " << shape;
  } else {
    // Split operands: ~16-bit products, errors ~1e-5 (tolerance 3e-4 + 1e-3·|ref|).
    check("attn prefill out", shape, dout.down(), ref, 3e-4f, 1e-3f);
  }
  // K: fp32 norm + RoPE vs the reference's (last-bit differences); V copied.
  check("attn prefill K cache", shape, dkc.down(), kc, 1e-5f, 1e-5f);
  check("attn prefill V cache", shape, dvc.down(), vc, 0.f, 0.f);
}
TEST(CudaPrefill, AttnPrefill) {
  LILY_PREFILL_REQUIRE_GPU();
  for (int M : {1, 2, 7, 8, 9, 63, 64, 65, 127, 128, 129}) attn_case(4, 2, 64, M % 3 == 0 ? 0 : 37, M);
  attn_case(16, 2, 256, 0, 129);
  attn_case(16, 2, 256, 100, 65);
  attn_case(4, 4, 128, 5, 200);
  attn_case(2, 1, 64, 0, 4097);
  attn_case(2, 1, 64, 4095, 2);
}
// The wgmma split kernel (attn_wg.cu): 128-query blocks of two 64-row warpgroups,
// 32-key tiles, the K/V split planes padded to 64 keys. The real shape (16 q / 2 kv heads, hd 256)
// at every query-tile and key-tile edge, with and without cached positions (pos0 0 / 37 / 100),
// chunks continuing far into the cache, one long row per head dim.
TEST(CudaPrefill, AttnPrefillWgmma) {
  LILY_PREFILL_REQUIRE_GPU();
  const int pos0s[3] = {0, 37, 100};
  int i = 0;
  for (int M : {1, 2, 7, 8, 9, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257})
    attn_case(16, 2, 256, pos0s[i++ % 3], M);
  attn_case(16, 2, 256, 4000, 129);  // continuing after 4000 cached positions
  attn_case(16, 2, 256, 4095, 2);
  attn_case(4, 1, 256, 4097, 64);
  for (int M : {4095, 4096, 4097}) attn_case(2, 1, 128, 0, M);
  attn_case(2, 1, 256, 0, 4097);
  attn_case(4, 2, 64, 1000, 300);
  attn_case(8, 8, 128, 63, 65);
}
// The single-pass kernel (attn_wg16.cuh): 128-query blocks, 64-key tiles double-buffered, the causal mask
// only on tiles crossing a warpgroup's diagonal. The real shape at every query-tile and key-tile edge with
// and without cached positions, chunks continuing far into the cache, the other head dims and GQA groups.
TEST(CudaPrefill, AttnPrefillSinglePass) {
  LILY_PREFILL_REQUIRE_GPU();
  const int pos0s[3] = {0, 37, 100};
  int i = 0;
  for (int M : {1, 2, 31, 32, 33, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257})
    attn_case(16, 2, 256, pos0s[i++ % 3], M, 1);
  attn_case(16, 2, 256, 4000, 129, 1);  // continuing after 4000 cached positions
  attn_case(16, 2, 256, 4095, 2, 1);
  attn_case(16, 2, 256, 1500, 130, 1);
  attn_case(4, 1, 256, 4097, 64, 1);
  attn_case(2, 1, 128, 0, 4097, 1);
  attn_case(2, 1, 256, 0, 4097, 1);
  attn_case(4, 2, 64, 1000, 300, 1);
  attn_case(8, 8, 128, 63, 65, 1);
  attn_case(6, 2, 64, 37, 64, 1);  // GQA group 3 (the wide golden's shape)
}
// Several sequences' segments in one launch (the mixed step's form, pf::attn_prefill_segments) against
// each segment run alone (attn_prefill, which attn_case checks against the CPU reference): outputs and
// caches equal bit for bit, so the segments neither share nor overrun each other's rows, caches or
// scratch. 19 segments: a launch takes 16, so the last 3 form a second group; lengths across the
// 128-query tiles, positions with and without a cached prefix, an empty segment among them.
void segments_case(int terms) {
  const int nh = 16, nkv = 2, hd = 256, qw = 2 * hd, rot = 64, ldu = nh * qw + 2 * nkv * hd;
  const int Ms[19] = {96, 1, 129, 7, 0, 64, 200, 33, 96, 5, 128, 2, 70, 96, 17, 300, 8, 65, 40};
  const int P0[19] = {0, 37, 0, 256, 0, 1000, 3, 0, 96, 64, 0, 511, 9, 0, 2, 130, 0, 77, 4000};
  struct Seq {
    DBuf<float> u, out, kc, vc;
    DBuf<uint16_t> qb;
    int M, pos0, max_seq;
    Seq(const std::vector<float>& u_, size_t out_n, const std::vector<float>& kc_, const std::vector<float>& vc_, size_t qb_n,
        int M_, int pos0_, int max_seq_)
        : u(u_), out(out_n), kc(kc_), vc(vc_), qb(qb_n), M(M_), pos0(pos0_), max_seq(max_seq_) {}
  };
  std::vector<std::unique_ptr<Seq>> a, b;  // the same inputs twice: a in one call, b one by one
  auto qn = rand_bf16(hd, 0.1f, 1.f), kn = rand_bf16(hd, 0.1f, 1.f);
  DBuf<uint16_t> dqn(to_bits(qn)), dkn(to_bits(kn));
  for (int i = 0; i < 19; ++i) {
    const int M = Ms[i], pos0 = P0[i], max_seq = pos0 + M + 5;
    auto u = randv(size_t(std::max(M, 1)) * ldu);
    std::vector<float> kc(size_t(nkv) * max_seq * hd, 0.f), vc = kc;
    for (size_t j = 0; j < kc.size(); ++j) kc[j] = round_bf16(randn()), vc[j] = round_bf16(randn());
    for (auto* side : {&a, &b}) {
      auto q = std::make_unique<Seq>(u, size_t(std::max(M, 1)) * nh * hd, kc, vc, size_t(2) * std::max(M, 1) * nh * hd, M,
                                     pos0, max_seq);
      cudaMemset(q->out.p, 0, q->out.n * sizeof(float));
      side->push_back(std::move(q));
    }
  }
  cuda::pf::AttnPrefillArgs base{};
  base.ldu = ldu, base.q_norm = dqn.p, base.k_norm = dkn.p, base.nh = nh;
  base.nkv = nkv, base.hd = hd, base.qw = qw, base.rot = rot, base.terms = terms;
  std::vector<cuda::pf::AttnSeg> segs;
  for (auto& q : a) {
    cuda::pf::AttnSeg g;
    g.u = q->u.p, g.out = q->out.p, g.kc = q->kc.p, g.vc = q->vc.p, g.qb = q->qb.p, g.M = q->M, g.pos0 = q->pos0;
    g.max_seq = q->max_seq;
    segs.push_back(g);
  }
  ASSERT_TRUE(cuda::pf::attn_prefill_segments(base, segs.data(), int(segs.size()), nullptr).is_ok());
  for (auto& q : b) {
    cuda::pf::AttnPrefillArgs one = base;
    one.u = q->u.p, one.out = q->out.p, one.kc = q->kc.p, one.vc = q->vc.p, one.qb = q->qb.p, one.M = q->M;
    one.pos0 = q->pos0, one.max_seq = q->max_seq;
    ASSERT_TRUE(cuda::pf::attn_prefill(one, nullptr).is_ok());
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int i = 0; i < 19; ++i) {
    const std::string shape = "terms " + std::to_string(terms) + ", segment " + std::to_string(i) + " of 19: pos0=" + std::to_string(P0[i]) + " M=" + std::to_string(Ms[i]);
    check("attn segments out = alone", shape, a[size_t(i)]->out.down(), b[size_t(i)]->out.down(), 0.f, 0.f);
    check("attn segments K = alone", shape, a[size_t(i)]->kc.down(), b[size_t(i)]->kc.down(), 0.f, 0.f);
    check("attn segments V = alone", shape, a[size_t(i)]->vc.down(), b[size_t(i)]->vc.down(), 0.f, 0.f);
  }
}
TEST(CudaPrefill, AttnPrefillSegmentsEqualAlone) {
  LILY_PREFILL_REQUIRE_GPU();
  segments_case(3);
  segments_case(1);
}
// Timing of the attention prefill (prep + K/V planes + flash), split and single pass, at the real shape
// (16 q / 2 kv heads, hd 256, gate): 4,096-token chunks after 0 and 4,096 cached positions, 2,048-token
// ones after 2,048 and 30,720 (the last chunk of a 32k prompt), fp32 caches. Runs only
// with LILY_ATTN_BENCH=1. TF/s counts 4·hd FLOP per (query, key ≤ query) pair and head (the
// products, not the three MMAs of a split one); the CPU rows above are the oracle.
TEST(CudaPrefill, AttnBench) {
  LILY_PREFILL_REQUIRE_GPU();
  const char* e = std::getenv("LILY_ATTN_BENCH");
  if (!e || std::string(e) != "1") GTEST_SKIP() << "set LILY_ATTN_BENCH=1 to time the attention kernels";
  const int nh = 16, nkv = 2, hd = 256, qw = 2 * hd, rot = 64, ldu = nh * qw + 2 * nkv * hd, max_seq = 32768, Mmax = 4096;
  DBuf<float> du(randv(size_t(Mmax) * ldu)), dout(size_t(Mmax) * nh * hd), dkc(size_t(nkv) * max_seq * hd), dvc(size_t(nkv) * max_seq * hd);
  cudaMemset(dkc.p, 0, dkc.n * 4), cudaMemset(dvc.p, 0, dvc.n * 4);
  DBuf<uint16_t> dqn(to_bits(rand_bf16(hd, 0.1f, 1.f))), dkn(to_bits(rand_bf16(hd, 0.1f, 1.f))), dqb(size_t(2) * Mmax * nh * hd);
  std::printf("| attn 16x2x256 (prep + K/V planes + flash) | split (terms 3) | single pass (terms 1) |\n");
  struct C { int M, pos0; };
  for (C c : {C{4096, 0}, C{4096, 4096}, C{2048, 2048}, C{2048, 30720}}) {
    std::printf("| M=%d pos0=%d |", c.M, c.pos0);
    for (int terms : {3, 1}) {
      cuda::pf::AttnPrefillArgs a{};
      a.u = du.p, a.ldu = ldu, a.M = c.M, a.pos0 = c.pos0, a.q_norm = dqn.p, a.k_norm = dkn.p, a.kc = dkc.p, a.vc = dvc.p;
      a.qb = dqb.p, a.out = dout.p, a.nh = nh, a.nkv = nkv, a.hd = hd, a.qw = qw, a.rot = rot;
      a.max_seq = max_seq, a.terms = terms;
      const float ms = mean_ms(5, [&] { return cuda::pf::attn_prefill(a, nullptr).is_ok(); });
      ASSERT_GE(ms, 0.f) << "pos0 " << c.pos0 << ": an attention call failed";
      const double pairs = double(c.M) * c.pos0 + double(c.M) * (c.M + 1) / 2;
      std::printf(" %7.3f ms %6.1f TF/s |", ms, 4.0 * hd * nh * pairs / (ms * 1e-3) / 1e12);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace lily::test_prefill

// ---- CudaBatch: the batched decode against attn_decode ----------------------------------------------------
namespace lily::test_batch {
namespace {

TEST(CudaBatch, AttentionEqualsBatch1) {
  LILY_REQUIRE_GPU();
  ASSERT_TRUE(cuda::attn_init().is_ok());
  // Real shape (16 heads, 2 kv heads, hd 256, gated, rotary 64) and an edge shape (group 2, hd 64).
  struct S { int nh, nkv, hd, rot; bool gate; };
  // battn runs attn_prep's, attn_decode's split and attn_merge's arithmetic (attn_common.cuh, attn_chunk.cuh):
  // exact wherever both cut a row's positions into the same splits, as here (positions up to 1,500: at most
  // 24 splits of 64, within attn_decode's one-wave cap of SMs × resident blocks / kv heads; H100 2026-12-06:
  // max |d| 0 at every B of both shapes).
  const float tol = 0.f;
  for (S s : {S{16, 2, 256, 64, true}, S{4, 2, 64, 64, false}}) {
    const int qw = (s.gate ? 2 : 1) * s.hd, ld = s.nh * qw + 2 * s.nkv * s.hd, nsplit = cuda::attn_max_splits();
    for (int B : kBs) {
      std::vector<int32_t> hp(static_cast<size_t>(B)), hcap(static_cast<size_t>(B));
      size_t tot = 0;
      std::vector<size_t> off(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b) {
        hp[size_t(b)] = b == 0 ? 0 : (b * 211 + 3) % 1500, hcap[size_t(b)] = hp[size_t(b)] + 1 + 16 * (b % 3);
        off[size_t(b)] = tot, tot += size_t(s.nkv) * hcap[size_t(b)] * s.hd;
      }
      std::vector<float> K0 = randv(tot), V0 = randv(tot);
      D<float> kb(K0), vb(V0), k1(K0), v1(V0), qkv(randv(size_t(B) * ld)), q(size_t(B) * s.nh * s.hd), out(size_t(B) * s.nh * s.hd);
      D<float> q1(size_t(B) * s.nh * s.hd), out1(size_t(B) * s.nh * s.hd);
      D<float> part(size_t(B) * cuda::battn_partial_floats(s.nh, s.nkv, s.hd, nsplit)), part1(cuda::battn_partial_floats(s.nh, s.nkv, s.hd, nsplit));
      D<uint16_t> qn(randbf(s.hd, 1.f, 0.2f)), kn(randbf(s.hd, 1.f, 0.2f));
      std::vector<void*> hk(static_cast<size_t>(B)), hv(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b) hk[size_t(b)] = kb.p + off[size_t(b)], hv[size_t(b)] = vb.p + off[size_t(b)];
      D<void*> tk(hk), tv(hv);
      D<int32_t> tp(hp), tcap(hcap);
      cuda::BAttnArgs a{};
      a.qkv = qkv.p, a.ldqkv = ld, a.q_norm = qn.p, a.k_norm = kn.p, a.q = q.p, a.kc = tk.p, a.vc = tv.p, a.cap = tcap.p;
      a.pos = tp.p, a.out = out.p, a.partial = part.p, a.nh = s.nh, a.nkv = s.nkv, a.hd = s.hd, a.qw = qw, a.rot = s.rot;
      a.n_split = nsplit, a.min_per_split = 64, a.B = B, a.theta = 1e7, a.eps = 1e-6f;
      ASSERT_TRUE(cuda::battn(a, nullptr).is_ok());
      D<cuda::StepCtl> ctl(1);
      for (int b = 0; b < B; ++b) {
        cuda::StepCtl c{};
        c.pos = hp[size_t(b)];
        cudaMemcpy(ctl.p, &c, sizeof c, cudaMemcpyHostToDevice);
        cuda::AttnArgs r{};
        r.qkv = qkv.p + size_t(b) * ld, r.q_norm = qn.p, r.k_norm = kn.p, r.q = q1.p + size_t(b) * s.nh * s.hd;
        r.kc = k1.p + off[size_t(b)], r.vc = v1.p + off[size_t(b)], r.out = out1.p + size_t(b) * s.nh * s.hd;
        r.partial = part1.p, r.ctl = ctl.p, r.nh = s.nh, r.nkv = s.nkv, r.hd = s.hd, r.qw = qw, r.rot = s.rot;
        r.max_seq = hcap[size_t(b)], r.n_split = nsplit, r.min_per_split = 64, r.theta = 1e7, r.eps = 1e-6f;
        ASSERT_TRUE(cuda::attn_prep(r, nullptr).is_ok());
        ASSERT_TRUE(cuda::attn_decode(r, nullptr).is_ok());
        cudaDeviceSynchronize();
      }
      const float e1 = max_diff(kb.get(), k1.get()) + max_diff(vb.get(), v1.get()), e2 = max_diff(q.get(), q1.get());
      size_t bad = size_t(-1);
      const float e3 = max_diff(out.get(), out1.get(), &bad, tol);
      const std::string shape = std::to_string(s.nh) + "/" + std::to_string(s.nkv) + " heads hd " + std::to_string(s.hd);
      row("attn cache write", shape, B, e1);
      row("attn q (norm+rope)", shape, B, e2);
      row("attn decode+merge+gate", shape, B, e3);
      EXPECT_EQ(e1, 0.f);
      EXPECT_EQ(e2, 0.f);
      EXPECT_LE(e3, tol) << "first bad index " << bad;
    }
  }
}

}  // namespace
}  // namespace lily::test_batch
#endif  // LILY_HAVE_CUDA
