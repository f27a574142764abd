// Decode tokens drawn on the GPU (src/backend/cuda/draw.cu) against model/draw.cpp's host draw_row
// on the same logits: the id must be identical (the kernel computes the host's weights and double
// sums op for op), log-probabilities within 2e-6 and the alternatives' ids identical. Rows: the real
// vocabulary (248,320) and edge sizes, random / flat / tied / peaked logits, greedy and three
// temperatures, u from 0 to 1 − 2^-53, 0 / 5 / 20 log-probabilities. Then the backend path: a tiny
// model's CUDA decode_draw (one row: the decode graph; three: the batched step) equals the same
// step's logits (forward / forward_batch) + host draw_row, step for step. Skips loudly
// without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cuda_test_env.h"
#include "model/draw.h"
#include "model/synthetic_weights.h"

#ifdef LILY_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/draw.h"
#endif

namespace lily {
namespace {

#ifdef LILY_HAVE_CUDA
void draw_case(int V, int B, int kind, uint32_t seed, int* rows_checked) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  std::vector<float> l(size_t(B) * V);
  for (auto& v : l) v = nd(g);
  if (kind == 1) std::fill(l.begin(), l.end(), 0.25f);  // flat: every id a candidate, ties everywhere
  if (kind == 2)                                         // peaked with a tie at the top
    for (int b = 0; b < B; ++b) l[size_t(b) * V + size_t(V / 3)] = l[size_t(b) * V + size_t(V / 2)] = 60.f;
  std::vector<DrawSpec> spec(static_cast<size_t>(B));
  const float temps[4] = {0.0f, 0.7f, 1.0f, 1.6f};
  const int tops[3] = {-1, 5, 20};
  for (int b = 0; b < B; ++b) {
    spec[size_t(b)].inv_t = temps[b % 4] > 0 ? 1.0f / temps[b % 4] : 0.0f;
    spec[size_t(b)].u = b == 1 ? 0.0 : b == 2 ? 1.0 - 0x1.0p-53 : ud(g);
    spec[size_t(b)].top_logprobs = std::min(tops[(b / 4) % 3], V);
  }
  float* dl = nullptr;
  DrawSpec* ds = nullptr;
  Drawn* dout = nullptr;
  void* scratch = nullptr;
  ASSERT_EQ(cudaMalloc(&dl, l.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ds, spec.size() * sizeof(DrawSpec)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dout, size_t(B) * sizeof(Drawn)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&scratch, cuda::draw_scratch_bytes(B, V)), cudaSuccess);
  cudaMemcpy(dl, l.data(), l.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(ds, spec.data(), spec.size() * sizeof(DrawSpec), cudaMemcpyHostToDevice);
  Status st = cuda::draw_rows(dl, B, V, ds, dout, scratch, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.message();
  std::vector<Drawn> got(static_cast<size_t>(B));
  ASSERT_EQ(cudaMemcpy(got.data(), dout, size_t(B) * sizeof(Drawn), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dl), cudaFree(ds), cudaFree(dout), cudaFree(scratch);
  std::vector<float> w;
  std::vector<double> sums;
  for (int b = 0; b < B; ++b) {
    Drawn want;
    draw_row(std::span<const float>(l.data() + size_t(b) * V, size_t(V)), spec[size_t(b)], want, w, sums);
    const Drawn& d = got[size_t(b)];
    const std::string what = "V " + std::to_string(V) + " kind " + std::to_string(kind) + " row " + std::to_string(b) +
                             " inv_t " + std::to_string(spec[size_t(b)].inv_t) + " u " + std::to_string(spec[size_t(b)].u);
    ASSERT_EQ(d.id, want.id) << what;
    if (spec[size_t(b)].top_logprobs >= 0) {
      EXPECT_NEAR(d.logprob, want.logprob, 2e-6) << what;
      ASSERT_EQ(d.n_top, want.n_top) << what;
      for (int i = 0; i < d.n_top; ++i) {
        EXPECT_EQ(d.top_id[i], want.top_id[i]) << what << " top " << i;
        EXPECT_NEAR(d.top_logprob[i], want.top_logprob[i], 2e-6) << what << " top " << i;
      }
    }
    ++*rows_checked;
  }
}
#endif

TEST(CudaDraw, DeviceDrawEqualsHostDrawRow) {
#ifndef LILY_HAVE_CUDA
  GTEST_SKIP() << "no CUDA device: lily was built without the CUDA backend (no nvcc)";
#else
  std::string why;
  if (!cuda_device_present(why)) GTEST_SKIP() << "no CUDA device: " << why;
  int rows = 0;
  for (int kind = 0; kind < 3; ++kind) {
    draw_case(248320, 24, kind, 1 + kind, &rows);
    draw_case(1000, 24, kind, 7 + kind, &rows);
    draw_case(257, 12, kind, 9 + kind, &rows);
    draw_case(3, 12, kind, 11 + kind, &rows);
  }
  for (uint32_t s = 0; s < 8; ++s) draw_case(248320, 64, 0, 100 + s, &rows);  // many u on the real vocabulary
  std::printf("device draw == host draw_row: %d rows\n", rows);
#endif
}

TEST(CudaDraw, BackendDecodeDrawEqualsForwardPlusHostDraw) {
#ifndef LILY_HAVE_CUDA
  GTEST_SKIP() << "no CUDA device: lily was built without the CUDA backend (no nvcc)";
#else
  std::string why;
  if (!cuda_device_present(why)) GTEST_SKIP() << "no CUDA device: " << why;
  auto cfg = synthetic_config("tiny");
  ASSERT_TRUE(cfg.is_ok());
  auto sw = make_synthetic_weights(*cfg, 7);
  auto be = make_cuda_backend(sw->w, false);
  ASSERT_TRUE(be.is_ok()) << be.message();
  const int V = cfg->vocab_size;
  for (int B : {1, 3, 17}) {
    std::vector<std::unique_ptr<SeqState>> a, r;
    std::vector<SeqState*> pa, pr;
    std::vector<int32_t> tok(static_cast<size_t>(B));
    std::vector<float> lg(static_cast<size_t>(V));
    for (int b = 0; b < B; ++b) {
      a.push_back(std::move((*be)->new_state(64).value()));
      r.push_back(std::move((*be)->new_state(64).value()));
      std::vector<int32_t> prompt = {int32_t(11 + b), 502, int32_t(1000 + 7 * b), 9, 77};
      ASSERT_TRUE((*be)->forward(*a.back(), prompt, {}).is_ok());
      ASSERT_TRUE((*be)->forward(*r.back(), prompt, {}).is_ok());
      pa.push_back(a.back().get()), pr.push_back(r.back().get());
      tok[size_t(b)] = int32_t(300 + b);
    }
    std::mt19937 g(5);
    std::uniform_real_distribution<double> ud(0.0, 1.0);
    std::vector<float> w;
    std::vector<double> sums;
    for (int step = 0; step < 8; ++step) {
      std::vector<DrawSpec> spec(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b) {
        spec[size_t(b)].inv_t = (step + b) % 3 == 0 ? 0.0f : 1.0f / (0.5f + 0.3f * float(b));
        spec[size_t(b)].u = ud(g);
        spec[size_t(b)].top_logprobs = (step + b) % 2 ? 4 : -1;
      }
      std::vector<Drawn> got(static_cast<size_t>(B));
      Status st = (*be)->decode_draw(pa, tok, spec, got);
      ASSERT_TRUE(st.is_ok()) << st.message();
      // The reference: the same step's logits to the host (forward for one row, forward_batch for
      // several: the same kernels as decode_draw's), then the host draw.
      std::vector<float> all(static_cast<size_t>(B) * size_t(V));
      if (B == 1) ASSERT_TRUE((*be)->forward(*pr[0], std::span<const int32_t>(tok.data(), 1), all).is_ok());
      else ASSERT_TRUE((*be)->forward_batch(pr, tok, all).is_ok());
      for (int b = 0; b < B; ++b) {
        std::copy(all.begin() + size_t(b) * size_t(V), all.begin() + size_t(b + 1) * size_t(V), lg.begin());
        Drawn want;
        draw_row(lg, spec[size_t(b)], want, w, sums);
        ASSERT_EQ(got[size_t(b)].id, want.id) << "B " << B << " step " << step << " row " << b;
        if (spec[size_t(b)].top_logprobs >= 0) {
          EXPECT_NEAR(got[size_t(b)].logprob, want.logprob, 2e-6);
        }
        tok[size_t(b)] = want.id;
      }
    }
  }
#endif
}

// The depth-2 pipeline (launch_draw / collect_draw: step N+1 launched with step N's drawn id
// still on the device) draws exactly what decode_draw draws step by step with host-fed tokens:
// same ids and logprobs over 60 steps, greedy and seeded draws mixed, K/V growing from 16
// positions on the way (graphs re-captured mid-pipeline).
TEST(CudaDraw, PipelinedLaunchCollectEqualsStepByStep) {
#ifndef LILY_HAVE_CUDA
  GTEST_SKIP() << "lily was built without the CUDA backend (no nvcc)";
#else
  std::string why;
  if (!cuda_device_present(why)) GTEST_SKIP() << "no CUDA device: " << why;
  auto cfg = synthetic_config("tiny");
  ASSERT_TRUE(cfg.is_ok());
  auto sw = make_synthetic_weights(*cfg, 7);
  auto be = make_cuda_backend(sw->w, false);
  ASSERT_TRUE(be.is_ok()) << be.message();
  ASSERT_TRUE((*be)->pipelined_draw());
  std::unique_ptr<SeqState> a, p;
  {
    ScopedEnv initial("LILY_CUDA_KV_INITIAL", "16");
    a = std::move((*be)->new_state(200).value());
    p = std::move((*be)->new_state(200).value());
  }
  const std::vector<int32_t> prompt = {17, 502, 1003, 9, 77, 4, 250};
  ASSERT_TRUE((*be)->forward(*a, prompt, {}).is_ok());
  ASSERT_TRUE((*be)->forward(*p, prompt, {}).is_ok());
  const int steps = 60;
  std::vector<DrawSpec> spec(steps);
  std::mt19937 g(9);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  for (int i = 0; i < steps; ++i) {
    spec[size_t(i)].inv_t = i % 4 == 0 ? 0.0f : 1.0f / 0.8f;
    spec[size_t(i)].u = ud(g);
    spec[size_t(i)].top_logprobs = i % 3 == 0 ? 5 : -1;
  }
  // Step by step: each drawn id goes back through the host.
  std::vector<Drawn> want(steps);
  int32_t tok = 300;
  for (int i = 0; i < steps; ++i) {
    SeqState* rows[1] = {a.get()};
    ASSERT_TRUE((*be)->decode_draw(rows, std::span<const int32_t>(&tok, 1), std::span<const DrawSpec>(&spec[size_t(i)], 1),
                                   std::span<Drawn>(&want[size_t(i)], 1)).is_ok());
    tok = want[size_t(i)].id;
  }
  // Pipelined: two steps in flight, tokens fed on the device.
  std::vector<Drawn> got(steps);
  ASSERT_TRUE((*be)->launch_draw(*p, 300, spec[0]).is_ok());
  for (int i = 0; i < steps; ++i) {
    if (i + 1 < steps) {
      ASSERT_TRUE((*be)->launch_draw(*p, -1, spec[size_t(i + 1)]).is_ok()) << "step " << i + 1;
    }
    ASSERT_TRUE((*be)->collect_draw(got[size_t(i)]).is_ok()) << "step " << i;
  }
  Drawn none;
  EXPECT_FALSE((*be)->collect_draw(none).is_ok()) << "nothing is in flight";
  for (int i = 0; i < steps; ++i) {
    ASSERT_EQ(got[size_t(i)].id, want[size_t(i)].id) << "step " << i;
    EXPECT_EQ(got[size_t(i)].logprob, want[size_t(i)].logprob) << "step " << i;
    EXPECT_EQ(got[size_t(i)].n_top, want[size_t(i)].n_top) << "step " << i;
  }
  EXPECT_EQ(p->n_tokens(), a->n_tokens());
  std::printf("pipelined launch/collect == step-by-step decode_draw over %d steps (K/V grown to %d tokens)\n", steps,
              p->n_tokens());
#endif
}

}  // namespace
}  // namespace lily
