// The CUDA state's K/V caches grow on demand (cuda_state.cu): a state that starts with 16
// positions and grows (copying what it holds, re-capturing the decode graphs) must give the
// logits of a state allocated at full size — max |Δ| ≤ 1e-6 (the same kernels; only the cache
// stride differs) — and the CPU reference's within the tiny-model tolerance of model_test.cpp
// (0.02). Clones (prefix-cache snapshots) hold only the positions in use and continue exactly
// like their source; forward_batch rows grow at different steps; reserve beyond max_seq fails
// and changes nothing; grown and cloned states give their memory back. A state's bytes() is what
// the engine's memory plan counts (state_memory, cuda_state_layout.h) and what the device gives
// (cudaMemGetInfo); growing with `upto` goes straight there; running out of device memory is an
// error that changes nothing, never a crash. Skips loudly without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/ref_ops.h"
#include "../cuda_test_env.h"
#include "model/logits.h"
#include "model/synthetic_weights.h"

#ifdef LILY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace lily {
namespace {

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

size_t device_free_bytes() {
  size_t f = 0;
#ifdef LILY_HAVE_CUDA
  size_t t = 0;
  cudaDeviceSynchronize();
  cudaMemGetInfo(&f, &t);
#endif
  return f;
}

int32_t tok_at(int i, int V) { return int32_t((uint64_t(i) * 2654435761ull % 4294967296ull) % uint64_t(V)); }

struct Rig {
  std::unique_ptr<SyntheticWeights> sw;
  std::unique_ptr<Model> cpu, gpu;  // over the CPU reference and the CUDA backend
  int V = 0;
};

void make_rig(Rig& r) {
  auto cfg = synthetic_config("tiny");
  ASSERT_TRUE(cfg.is_ok());
  r.sw = make_synthetic_weights(*cfg, 7);
  cpu::set_bf16_storage(false);
  auto c = make_cpu_backend(r.sw->w);
  auto g = make_cuda_backend(r.sw->w, false);
  ASSERT_TRUE(c.is_ok()) << c.message();
  ASSERT_TRUE(g.is_ok()) << g.message();
  r.cpu = Model::over(r.sw->w.cfg, std::move(c).value());
  r.gpu = Model::over(r.sw->w.cfg, std::move(g).value());
  r.V = r.sw->w.cfg.vocab_size;
}

std::unique_ptr<SeqState> state(Model& be, int max_seq, const char* initial) {
  ScopedEnv init("LILY_CUDA_KV_INITIAL", initial);
  auto s = be.new_state(max_seq);
  EXPECT_TRUE(s.is_ok()) << s.message();
  return s.is_ok() ? std::move(s).value() : nullptr;
}

TEST(CudaState, GrowingKvEqualsPreallocatedAndReference) {
  std::string why;
  if (!cuda_device_present(why)) GTEST_SKIP() << "no CUDA device: " << why;
  Rig r;
  make_rig(r);
  const int limit = 400, prompt = 37, steps = 170;  // growth 16 -> 48 -> 96 -> 192 -> 384 -> 400
  auto grow = state(*r.gpu, limit, "16");
  auto full = state(*r.gpu, limit, "4096");
  auto ref = r.cpu->new_state(limit);
  ASSERT_TRUE(grow && full && ref.is_ok());
  std::vector<int32_t> p(prompt);
  for (int i = 0; i < prompt; ++i) p[size_t(i)] = tok_at(i, r.V);
  std::vector<float> lg(size_t(r.V)), lf(size_t(r.V)), lc(size_t(r.V));
  ASSERT_TRUE(r.gpu->forward(*grow, p, lg).is_ok());
  ASSERT_TRUE(r.gpu->forward(*full, p, lf).is_ok());
  ASSERT_TRUE(r.cpu->forward(**ref, p, lc).is_ok());
  double worst_same = max_abs_diff(lg, lf), worst_ref = max_abs_diff(lg, lc);
  for (int i = 0; i < steps; ++i) {
    const int32_t t = argmax(lc);  // the reference's pick feeds all three
    ASSERT_TRUE(r.gpu->forward(*grow, std::span<const int32_t>(&t, 1), lg).is_ok()) << "step " << i;
    ASSERT_TRUE(r.gpu->forward(*full, std::span<const int32_t>(&t, 1), lf).is_ok());
    ASSERT_TRUE(r.cpu->forward(**ref, std::span<const int32_t>(&t, 1), lc).is_ok());
    worst_same = std::max(worst_same, max_abs_diff(lg, lf));
    worst_ref = std::max(worst_ref, max_abs_diff(lg, lc));
  }
  std::printf("grown (16 -> %d positions) vs preallocated: max |d| %.3g over %d tokens; vs CPU reference %.3g\n",
              grow->max_seq(), worst_same, prompt + steps, worst_ref);
  EXPECT_LE(worst_same, 1e-6);
  EXPECT_LE(worst_ref, 0.02);
  EXPECT_EQ(grow->n_tokens(), prompt + steps);
  // The limit: one more token than max_seq is refused and changes nothing.
  auto* g = grow.get();
  const int n0 = g->n_tokens();
  const size_t b0 = g->bytes();
  Status s = g->reserve(limit + 1);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("max_seq"), std::string::npos) << s.message();
  EXPECT_EQ(g->n_tokens(), n0);
  EXPECT_EQ(g->bytes(), b0);
}

TEST(CudaState, CloneHoldsUsedPositionsAndContinuesLikeSource) {
  std::string why;
  if (!cuda_device_present(why)) GTEST_SKIP() << "no CUDA device: " << why;
  Rig r;
  make_rig(r);
  const int limit = 300;
  std::vector<int32_t> p(60);
  for (int i = 0; i < 60; ++i) p[size_t(i)] = tok_at(i + 5, r.V);
  {  // warm-up: the backend's own lazily sized scratch (prefill, graphs) is allocated here, not below
    auto w = state(*r.gpu, limit, "16");
    ASSERT_TRUE(w);
    std::vector<int32_t> out;
    ASSERT_TRUE(r.gpu->forward(*w, p, {}).is_ok());
    ASSERT_TRUE(r.gpu->decode_greedy(*w, 1, 4, out).is_ok());
  }
  const size_t free0 = device_free_bytes();
  {
    auto src = state(*r.gpu, limit, "16");
    ASSERT_TRUE(src);
    std::vector<float> la(size_t(r.V));
    ASSERT_TRUE(r.gpu->forward(*src, p, la).is_ok());
    ASSERT_TRUE(src->reserve(200).is_ok());  // capacity well beyond what is used
    auto snap = src->clone();
    ASSERT_TRUE(snap);
    EXPECT_EQ(snap->n_tokens(), 60);
    EXPECT_EQ(snap->max_seq(), limit);
    EXPECT_LT(snap->bytes(), src->bytes()) << "a snapshot should hold the positions in use, not the capacity";
    // Continue both with the same tokens: forward on the source, the graph pipeline on the clone.
    std::vector<int32_t> seq;
    int32_t t = argmax(la);
    const int32_t first = t;
    for (int i = 0; i < 120; ++i) {
      ASSERT_TRUE(r.gpu->forward(*src, std::span<const int32_t>(&t, 1), la).is_ok());
      t = argmax(la);
      seq.push_back(t);
    }
    std::vector<int32_t> pipe;
    ASSERT_TRUE(r.gpu->decode_greedy(*snap, first, 120, pipe).is_ok());
    EXPECT_EQ(pipe, seq) << "clone + decode_greedy (growing 64 -> 192) differs from the source";
    std::printf("clone: %zu bytes vs source %zu; 120 greedy steps equal: %s\n", snap->bytes(), src->bytes(),
                pipe == seq ? "yes" : "NO");
  }
  const size_t free1 = device_free_bytes();
  std::printf("device free memory before %.1f MB, after the states are gone %.1f MB\n", free0 / 1e6, free1 / 1e6);
  EXPECT_GE(double(free1) + 4e6, double(free0)) << "grown or cloned K/V caches were not freed";
}

TEST(CudaState, BatchRowsGrowAtDifferentSteps) {
  std::string why;
  if (!cuda_device_present(why)) GTEST_SKIP() << "no CUDA device: " << why;
  Rig r;
  make_rig(r);
  const int B = 3, steps = 70;
  const int lens[B] = {5, 30, 47};  // row 2 crosses 48 at once, row 1 at step 18, row 0 at step 43
  std::vector<std::unique_ptr<SeqState>> grow, alone;
  std::vector<std::vector<float>> la(B, std::vector<float>(size_t(r.V)));
  std::vector<int32_t> tok(B);
  for (int b = 0; b < B; ++b) {
    grow.push_back(state(*r.gpu, 256, "16"));
    alone.push_back(state(*r.gpu, 256, "4096"));
    ASSERT_TRUE(grow.back() && alone.back());
    std::vector<int32_t> p(static_cast<size_t>(lens[b]));
    for (int i = 0; i < lens[b]; ++i) p[size_t(i)] = tok_at(i + 100 * b, r.V);
    ASSERT_TRUE(r.gpu->forward(*grow[size_t(b)], p, {}).is_ok());
    ASSERT_TRUE(r.gpu->forward(*alone[size_t(b)], p, la[size_t(b)]).is_ok());
    tok[size_t(b)] = argmax(la[size_t(b)]);
  }
  std::vector<float> lb(size_t(B) * r.V);
  double worst = 0;
  int flips = 0;
  for (int s = 0; s < steps; ++s) {
    std::vector<SeqState*> rows;
    for (auto& g : grow) {
      ASSERT_TRUE(g->reserve(g->n_tokens() + 1).is_ok());  // what Model::forward_batch does
      rows.push_back(g.get());
    }
    ASSERT_TRUE(r.gpu->forward_batch(rows, tok, lb).is_ok()) << "step " << s;
    for (int b = 0; b < B; ++b) {
      ASSERT_TRUE(r.gpu->forward(*alone[size_t(b)], std::span<const int32_t>(&tok[size_t(b)], 1), la[size_t(b)]).is_ok());
      std::vector<float> row(lb.begin() + ptrdiff_t(b) * r.V, lb.begin() + ptrdiff_t(b + 1) * r.V);
      worst = std::max(worst, max_abs_diff(row, la[size_t(b)]));
      if (argmax(row) != argmax(la[size_t(b)])) ++flips;
      tok[size_t(b)] = argmax(la[size_t(b)]);
    }
  }
  std::printf("forward_batch rows growing at different steps vs preallocated rows alone: max |d| %.3g, argmax flips %d\n",
              worst, flips);
  EXPECT_LE(worst, 1e-3);
  EXPECT_EQ(flips, 0);
}

// The memory plan's arithmetic against the device: 8 states whose K/V arenas are over 2 MiB (4,096
// positions of the tiny config: 4,194,816 B, 3 pages) take, by cudaMemGetInfo, what their bytes()
// say: never more than a page beyond (the plan must not under-count), at most a page per state less
// (the plan should not waste much). Then a growth straight to `upto` holds bytes_for(upto).
TEST(CudaState, BytesAreWhatTheDeviceGives) {
  std::string why;
  if (!cuda_device_present(why)) GTEST_SKIP() << "no CUDA device: " << why;
  Rig r;
  make_rig(r);
  const int limit = 8192;
  StateMemory m;
  {
    ScopedEnv init("LILY_CUDA_KV_INITIAL", "4096");
    m = r.gpu->state_memory(limit);
  }
  { auto warm = state(*r.gpu, limit, "4096"); }  // the driver's first pages for small allocations
  const size_t free0 = device_free_bytes();
  std::vector<std::unique_ptr<SeqState>> sts;
  size_t sum = 0;
  for (int i = 0; i < 8; ++i) {
    sts.push_back(state(*r.gpu, limit, "4096"));
    ASSERT_TRUE(sts.back());
    EXPECT_EQ(sts.back()->bytes(), m.bytes_for(0, limit));
    sum += sts.back()->bytes();
  }
  const double used = double(free0) - double(device_free_bytes()), page = 2.0 * 1048576;
  std::printf("8 states: bytes() %.2f MiB each, the device gave %.2f MiB each\n", double(sum) / 8 / 1048576,
              used / 8 / 1048576);
  EXPECT_LE(used, double(sum) + page) << "the plan under-counts a state's device memory";
  EXPECT_GE(used + 8 * page + page, double(sum)) << "the plan over-counts a state's device memory by more than a page";
  ASSERT_TRUE(sts[0]->reserve(4097, 6000).is_ok());
  EXPECT_EQ(sts[0]->bytes(), m.bytes_for(6000, limit));
  ASSERT_TRUE(sts[0]->reserve(6000, 7000).is_ok());  // within: nothing changes
  EXPECT_EQ(sts[0]->bytes(), m.bytes_for(6000, limit));
}

// Device memory runs out: states whose K/V grow by 1 GiB each (2^20 positions of the tiny config)
// until a growth fails. The failure is an error naming device memory; the state that could not
// grow is unchanged and still decodes; everything comes back when the states are freed.
TEST(CudaState, RunningOutOfDeviceMemoryIsAnError) {
  std::string why;
  if (!cuda_device_present(why)) GTEST_SKIP() << "no CUDA device: " << why;
  Rig r;
  make_rig(r);
  const int limit = 1 << 20;
  std::vector<int32_t> p(8);
  for (int i = 0; i < 8; ++i) p[size_t(i)] = tok_at(i, r.V);
  std::vector<float> logits(size_t(r.V));
  {  // the backend's prefill scratch is allocated once, by the first forward: before the baseline
    auto warm = state(*r.gpu, limit, "16");
    ASSERT_TRUE(warm && r.gpu->forward(*warm, p, logits).is_ok());
  }
  const size_t free0 = device_free_bytes();
  std::vector<std::unique_ptr<SeqState>> sts;
  Status failed = Status::ok();
  for (int i = 0; i < 1000 && failed.is_ok(); ++i) {
    sts.push_back(state(*r.gpu, limit, "16"));
    ASSERT_TRUE(sts.back());
    failed = sts.back()->reserve(17, limit);
  }
  ASSERT_FALSE(failed.is_ok()) << "1000 GiB of K/V fitted?";
  std::printf("%zu states of 1 GiB before the device ran out: %s\n", sts.size() - 1, failed.message().c_str());
  EXPECT_NE(failed.message().find("out of device memory"), std::string::npos) << failed.message();
  SeqState& last = *sts.back();
  EXPECT_EQ(last.bytes(), r.gpu->state_memory(limit).bytes_at(16)) << "a failed growth changes nothing";
  sts.front().reset();  // room again for the small state to decode
  EXPECT_TRUE(r.gpu->forward(last, p, logits).is_ok());
  sts.clear();
  EXPECT_GE(double(device_free_bytes()) + 64e6, double(free0)) << "device memory did not come back";
}

}  // namespace
}  // namespace lily
