// Decode tokens drawn on the GPU (src/backend/cuda/sampling/draw.cu) against model/draw.cpp's host draw_row
// on the same logits: the id must be identical (the kernels compute the host's weights, sums and
// selections op for op), log-probabilities within 2e-6 and the alternatives' ids identical. Rows:
// the real vocabulary (248,320) and edge sizes, 1 to 64 rows a launch, random / flat / tied /
// near-tied / peaked logits, every option mix (greedy, plain draws at several temperatures,
// top-k, top-p, min-p, repetition / presence / frequency penalties, token masks, 0 / 5 / 20
// log-probabilities), u from 0 to 1 − 2^-53. Then the backend path: a tiny model's CUDA
// decode_draw (one row: the decode graph; several: the batched step) with the same option mixes
// equals the same step's logits (forward / forward_batch) + host draw_row, step for step, and the
// pipelined launch/collect with cuts. Skips loudly without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "../cuda_test_env.h"
#include "model/draw.h"
#include "model/synthetic_weights.h"

#ifdef LILY_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/sampling/draw.h"
#endif

namespace lily {
namespace {

#ifdef LILY_HAVE_CUDA
// One row's request options: temperature (0 = greedy), cuts, penalties (0 none, 1 repetition,
// 2 presence + frequency, 3 both), token mask (0 none, 1 sparse, 2 dense over half the words),
// log-probabilities.
struct DrawMix {
  float t;
  int top_k;
  float top_p, min_p;
  int pen, mask, lp;
};
constexpr DrawMix kMixes[] = {
    {0.0f, 0, 1.0f, 0.0f, 0, 0, -1},        // greedy
    {0.7f, 0, 1.0f, 0.0f, 0, 0, 5},         // plain draws
    {1.0f, 0, 1.0f, 0.0f, 0, 0, 20},
    {1.6f, 0, 1.0f, 0.0f, 0, 0, -1},
    {0.7f, 20, 0.8f, 0.0f, 0, 0, 5},        // Qwen's recommended cuts
    {1.0f, 40, 1.0f, 0.0f, 0, 0, -1},       // top-k
    {1.3f, 0, 0.9f, 0.0f, 0, 0, 0},         // top-p
    {0.6f, 0, 1.0f, 0.05f, 0, 0, 20},       // min-p
    {0.9f, 50, 0.95f, 0.02f, 3, 0, 2},      // every cut, every penalty
    {1.0f, 0, 1.0f, 0.0f, 1, 0, -1},        // plain, repetition
    {0.0f, 0, 1.0f, 0.0f, 2, 0, 3},         // greedy, presence + frequency
    {0.8f, 0, 1.0f, 0.0f, 0, 1, 3},         // sparse mask, plain
    {0.7f, 20, 0.9f, 0.05f, 3, 2, 5},       // dense mask, cuts, penalties
    {0.0f, 0, 1.0f, 0.0f, 3, 1, -1},        // sparse mask, greedy, penalties
    {1.0f, 3000, 0.999f, 0.0f, 0, 0, -1},   // a top-k past one gathered bucket, top-p near 1
    {2.0f, 0, 0.5f, 0.0f, 1, 2, 4},         // top-p under a short mask
    {0.05f, 5, 1.0f, 0.0f, 0, 0, -1},       // a low temperature: few candidates
    {1.0f, 0, 1e-6f, 0.0f, 0, 0, -1},       // top-p keeps only the best
};
constexpr int kNumMixes = int(sizeof(kMixes) / sizeof(kMixes[0]));

// Host specs (pointers into pens / masks) for B rows of logits l, row b taking mix (b + shift).
void make_specs(const std::vector<float>& l, int V, int B, int shift, std::mt19937& g, std::vector<DrawSpec>& spec,
                std::vector<std::vector<DrawPenalty>>& pens, std::vector<std::vector<uint64_t>>& masks) {
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  spec.assign(size_t(B), DrawSpec{});
  pens.assign(size_t(B), {});
  masks.assign(size_t(B), {});
  const size_t words = size_t((V + 63) / 64);
  for (int b = 0; b < B; ++b) {
    const DrawMix& m = kMixes[(b + shift) % kNumMixes];
    DrawSpec& s = spec[size_t(b)];
    s.inv_t = m.t > 0 ? 1.0f / m.t : 0.0f;
    s.u = b == 1 ? 0.0 : b == 2 ? 1.0 - 0x1.0p-53 : ud(g);
    s.top_logprobs = std::min(m.lp, V);
    s.cuts = DrawCuts{m.top_k, m.top_p, m.min_p};
    if (m.pen) {
      // The row's best ids (so the penalties change the draw), random ones, and two outside the row.
      const float* row = l.data() + size_t(b) * V;
      std::vector<int32_t> ids;
      for (int k = 0; k < 8 && k < V; ++k) ids.push_back(int32_t(std::max_element(row, row + V) - row + k) % V);
      for (int k = 0; k < 300; ++k) ids.push_back(int32_t(g() % uint32_t(V)));
      ids.push_back(-1), ids.push_back(V + 5);
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      s.repetition = m.pen & 1 ? 1.3f : 1.0f;
      for (int32_t id : ids) {
        DrawPenalty p{id, 0, 0.0f};
        if (m.pen & 1) p.flags |= kPenaltyRepeat;
        if ((m.pen & 2) && g() % 2) p.flags |= kPenaltySubtract, p.sub = 0.4f + 0.3f * float(1 + g() % 4);
        if (p.flags) pens[size_t(b)].push_back(p);
      }
      s.penalties = pens[size_t(b)].data(), s.n_penalties = int(pens[size_t(b)].size());
    }
    if (m.mask) {
      auto& mk = masks[size_t(b)];
      mk.assign(m.mask == 2 ? (words + 1) / 2 : words, 0);  // dense: the upper half disallowed (short mask)
      for (size_t i = 0; i < mk.size() * 64; ++i)
        if (m.mask == 1 ? g() % 100 == 0 : g() % 10 < 7) mk[i / 64] |= uint64_t(1) << (i % 64);
      mk[0] |= 1u;  // never empty
      s.allowed = mk.data(), s.n_allowed = int(mk.size());
    }
  }
}

// Logits of one kind: 0 random, 1 flat (every id a candidate, ties everywhere), 2 peaked with a
// tie at the top, 3 near-tied (quarter steps), 4 a few strong ids over a random tail.
void fill_logits(std::vector<float>& l, int V, int B, int kind, std::mt19937& g) {
  std::normal_distribution<float> nd(0.f, 3.f);
  std::uniform_int_distribution<int> q(-8, 8);
  l.resize(size_t(B) * V);
  for (auto& v : l) v = kind == 1 ? 0.25f : kind == 3 ? float(q(g)) * 0.25f : nd(g);
  for (int b = 0; b < B; ++b) {
    float* r = l.data() + size_t(b) * V;
    if (kind == 2) r[V / 3] = r[V / 2] = 60.f;
    if (kind == 4)
      for (int k = 0; k < 6; ++k) r[g() % uint32_t(V)] = 12.f + float(k);
  }
}

void draw_case(int V, int B, int kind, uint32_t seed, int* rows_checked) {
  std::mt19937 g(seed);
  std::vector<float> l;
  fill_logits(l, V, B, kind, g);
  std::vector<DrawSpec> spec;
  std::vector<std::vector<DrawPenalty>> pens;
  std::vector<std::vector<uint64_t>> masks;
  make_specs(l, V, B, int(seed), g, spec, pens, masks);
  float* dl = nullptr;
  Drawn* dout = nullptr;
  void* scratch = nullptr;
  ASSERT_EQ(cudaMalloc(&dl, l.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dout, size_t(B) * sizeof(Drawn)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&scratch, cuda::draw_scratch_bytes(B, V)), cudaSuccess);
  cudaMemcpy(dl, l.data(), l.size() * 4, cudaMemcpyHostToDevice);
  std::vector<unsigned char> image;
  Status st = cuda::pack_draw_specs(spec, V, scratch, image);
  ASSERT_TRUE(st.is_ok()) << st.message();
  ASSERT_LE(image.size(), cuda::draw_upload_bytes(B, V));
  cudaMemcpy(scratch, image.data(), image.size(), cudaMemcpyHostToDevice);
  st = cuda::draw_rows(dl, B, V, static_cast<const DrawSpec*>(scratch), dout, scratch, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.message();
  std::vector<Drawn> got(static_cast<size_t>(B));
  ASSERT_EQ(cudaMemcpy(got.data(), dout, size_t(B) * sizeof(Drawn), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dl), cudaFree(dout), cudaFree(scratch);
  DrawScratch hs;
  for (int b = 0; b < B; ++b) {
    Drawn want;
    const DrawSpec& s = spec[size_t(b)];
    draw_row(std::span<const float>(l.data() + size_t(b) * V, size_t(V)), s, want, hs);
    const Drawn& d = got[size_t(b)];
    const std::string what = "V " + std::to_string(V) + " B " + std::to_string(B) + " kind " + std::to_string(kind) +
                             " row " + std::to_string(b) + " mix " + std::to_string((b + int(seed)) % kNumMixes) +
                             " inv_t " + std::to_string(s.inv_t) + " u " + std::to_string(s.u);
    ASSERT_EQ(d.id, want.id) << what;
    if (s.top_logprobs >= 0) {
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
// The tiny synthetic model (seed 7) on the CUDA backend, with the weights its backend reads; m null (the
// failure recorded) when it cannot be made.
struct TinyCuda {
  std::unique_ptr<SyntheticWeights> sw;
  std::unique_ptr<Model> m;
};
TinyCuda tiny_cuda() {
  TinyCuda t;
  auto cfg = synthetic_config("tiny");
  EXPECT_TRUE(cfg.is_ok());
  if (!cfg.is_ok()) return t;
  t.sw = make_synthetic_weights(*cfg, 7);
  auto be = make_cuda_backend(t.sw->w, false);
  EXPECT_TRUE(be.is_ok()) << be.message();
  if (be.is_ok()) t.m = Model::over(t.sw->w.cfg, std::move(be).value());
  return t;
}
#endif

TEST(CudaDraw, DeviceDrawEqualsHostDrawRow) {
  // Every option mix (kMixes: greedy, plain, top-k, top-p, min-p, the penalties, token masks,
  // log-probabilities) on the real vocabulary and small ones, 1 to 64 rows a launch.
#ifndef LILY_HAVE_CUDA
  GTEST_SKIP() << "no CUDA device: lily was built without the CUDA backend (no nvcc)";
#else
  std::string why;
  if (!cuda_device_present(why)) GTEST_SKIP() << "no CUDA device: " << why;
  int rows = 0;
  for (int kind = 0; kind < 5; ++kind) {
    draw_case(248320, 1, kind, 1 + kind, &rows);
    draw_case(248320, kNumMixes, kind, 20 + kind, &rows);
    draw_case(1000, 24, kind, 7 + kind, &rows);
    draw_case(257, 12, kind, 9 + kind, &rows);
    draw_case(64, 12, kind, 3 + kind, &rows);
    draw_case(3, 12, kind, 11 + kind, &rows);
  }
  for (uint32_t s = 0; s < 6; ++s) draw_case(248320, 64, s % 5, 100 + s, &rows);  // many u on the real vocabulary
  std::printf("device draw == host draw_row: %d rows\n", rows);
#endif
}

TEST(CudaDraw, BackendDecodeDrawEqualsForwardPlusHostDraw) {
#ifndef LILY_HAVE_CUDA
  GTEST_SKIP() << "no CUDA device: lily was built without the CUDA backend (no nvcc)";
#else
  std::string why;
  if (!cuda_device_present(why)) GTEST_SKIP() << "no CUDA device: " << why;
  TinyCuda t = tiny_cuda();
  ASSERT_TRUE(t.m);
  Model* m = t.m.get();
  const int V = t.sw->w.cfg.vocab_size;
  for (int B : {1, 3, 17}) {
    std::vector<std::unique_ptr<SeqState>> a, r;
    std::vector<SeqState*> pa, pr;
    std::vector<int32_t> tok(static_cast<size_t>(B));
    std::vector<float> lg(static_cast<size_t>(V));
    for (int b = 0; b < B; ++b) {
      a.push_back(std::move(m->new_state(64).value()));
      r.push_back(std::move(m->new_state(64).value()));
      std::vector<int32_t> prompt = {int32_t(11 + b), 502, int32_t(1000 + 7 * b), 9, 77};
      ASSERT_TRUE(m->forward(*a.back(), prompt, {}).is_ok());
      ASSERT_TRUE(m->forward(*r.back(), prompt, {}).is_ok());
      pa.push_back(a.back().get()), pr.push_back(r.back().get());
      tok[size_t(b)] = int32_t(300 + b);
    }
    std::mt19937 g(5);
    std::vector<float> w;
    std::vector<double> sums;
    const std::vector<float> zeros(size_t(B) * size_t(V), 0.0f);  // penalised ids: 0..7 and random ones
    std::vector<std::vector<DrawPenalty>> pens;
    std::vector<std::vector<uint64_t>> masks;
    for (int step = 0; step < 8; ++step) {
      std::vector<DrawSpec> spec;  // every option mix over the rows and steps
      make_specs(zeros, V, B, step * 5, g, spec, pens, masks);
      std::vector<Drawn> got(static_cast<size_t>(B));
      Status st = m->decode_draw(pa, tok, spec, got);
      ASSERT_TRUE(st.is_ok()) << st.message();
      // The reference: the same step's logits to the host (forward for one row, forward_batch for
      // several: the same kernels as decode_draw's), then the host draw.
      std::vector<float> all(static_cast<size_t>(B) * size_t(V));
      if (B == 1) ASSERT_TRUE(m->forward(*pr[0], std::span<const int32_t>(tok.data(), 1), all).is_ok());
      else ASSERT_TRUE(m->forward_batch(pr, tok, all).is_ok());
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

// The server's single-stream decode (Model::launch / wait: step N+1 launched with step N's drawn id
// still on the device, kDrawnToken) draws exactly what the host draws from each step's logits fed
// step by step: same ids, logprobs within 2e-6, over 60 steps, greedy and seeded draws mixed, K/V
// growing from 16 positions on the way (graphs re-captured mid-pipeline).
TEST(CudaDraw, PipelinedLaunchCollectEqualsStepByStep) {
#ifndef LILY_HAVE_CUDA
  GTEST_SKIP() << "lily was built without the CUDA backend (no nvcc)";
#else
  std::string why;
  if (!cuda_device_present(why)) GTEST_SKIP() << "no CUDA device: " << why;
  TinyCuda t = tiny_cuda();
  ASSERT_TRUE(t.m);
  Model* m = t.m.get();
  ASSERT_TRUE(m->pipelines());
  const int V = t.sw->w.cfg.vocab_size;
  std::unique_ptr<SeqState> a, p;
  {
    ScopedEnv initial("LILY_CUDA_KV_INITIAL", "16");
    a = std::move(m->new_state(200).value());
    p = std::move(m->new_state(200).value());
  }
  const std::vector<int32_t> prompt = {17, 502, 1003, 9, 77, 4, 250};
  ASSERT_TRUE(m->forward(*a, prompt, {}).is_ok());
  ASSERT_TRUE(m->forward(*p, prompt, {}).is_ok());
  const int steps = 60;
  std::vector<DrawSpec> spec(steps);
  std::mt19937 g(9);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  for (int i = 0; i < steps; ++i) {
    spec[size_t(i)].inv_t = i % 4 == 0 ? 0.0f : 1.0f / 0.8f;
    spec[size_t(i)].u = ud(g);
    spec[size_t(i)].top_logprobs = i % 3 == 0 ? 5 : -1;
    if (i % 5 == 1) spec[size_t(i)].cuts = DrawCuts{20, 0.8f, 0.0f};
    if (i % 5 == 3) spec[size_t(i)].cuts = DrawCuts{0, 0.9f, 0.05f};
  }
  // Step by step: each step's logits to the host, drawn there, the id fed back.
  std::vector<Drawn> want(steps);
  std::vector<float> lg(static_cast<size_t>(V)), w;
  std::vector<double> sums;
  int32_t tok = 300;
  for (int i = 0; i < steps; ++i) {
    ASSERT_TRUE(m->forward(*a, std::span<const int32_t>(&tok, 1), lg).is_ok());
    draw_row(lg, spec[size_t(i)], want[size_t(i)], w, sums);
    tok = want[size_t(i)].id;
  }
  // Pipelined: two steps in flight, tokens fed on the device.
  std::vector<Drawn> got(steps);
  std::vector<StepTicket> ticket(steps);
  auto launch = [&](int i, int32_t token) {
    StepFeed f;
    f.state = p.get(), f.tokens = std::span<const int32_t>(&token, 1), f.draw = &spec[size_t(i)], f.drawn = &got[size_t(i)];
    auto t = m->launch(std::span<const StepFeed>(&f, 1));
    ASSERT_TRUE(t.is_ok()) << "step " << i << ": " << t.message();
    ticket[size_t(i)] = *t;
  };
  launch(0, 300);
  for (int i = 0; i < steps; ++i) {
    if (i + 1 < steps) launch(i + 1, kDrawnToken);
    ASSERT_TRUE(m->wait(ticket[size_t(i)]).is_ok()) << "step " << i;
  }
  EXPECT_FALSE(m->wait(ticket[steps - 1]).is_ok()) << "a step is waited for once";
  for (int i = 0; i < steps; ++i) {
    ASSERT_EQ(got[size_t(i)].id, want[size_t(i)].id) << "step " << i;
    if (spec[size_t(i)].top_logprobs >= 0) {
      EXPECT_NEAR(got[size_t(i)].logprob, want[size_t(i)].logprob, 2e-6) << "step " << i;
    }
    EXPECT_EQ(got[size_t(i)].n_top, want[size_t(i)].n_top) << "step " << i;
  }
  EXPECT_EQ(p->n_tokens(), a->n_tokens());
  // A penalised spec is not pipelined (its lists would have to outlive the launch): it runs at launch,
  // where the previous draw is not there to feed.
  const DrawPenalty pen{3, kPenaltySubtract, 1.0f};
  DrawSpec penalised = spec[0];
  penalised.penalties = &pen, penalised.n_penalties = 1;
  Drawn d;
  StepFeed f;
  const int32_t drawn_token = kDrawnToken;
  f.state = p.get(), f.tokens = std::span<const int32_t>(&drawn_token, 1), f.draw = &penalised, f.drawn = &d;
  auto h = m->launch(std::span<const StepFeed>(&f, 1));
  EXPECT_TRUE(!h.is_ok() || !m->wait(*h).is_ok()) << "kDrawnToken in a step that runs at launch";
  std::printf("pipelined launch/wait == step-by-step host draws over %d steps (K/V grown to %d tokens)\n", steps,
              p->n_tokens());
#endif
}

}  // namespace
}  // namespace lily
