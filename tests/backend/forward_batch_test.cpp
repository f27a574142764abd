// Model::forward_batch (one decode token for each of B sequences, weights read once per step)
// against forward() on each sequence alone, on the golden checkpoints: sequences at different
// lengths (so attention rows read caches of different sizes and DeltaNet rows different states),
// B = 1, 3, 7 and 17, several steps, rows leaving the batch between steps. Backends: cpu (the batched
// fast path), cpu-ref (the default per-row loop), and LILY_BACKEND's if set (cuda on the GPU
// machine). Stated tolerance: every logit within 1e-5 + 1e-6·|alone| of the alone run (the fast
// path computes each row as it does alone, so the measured difference is 0), except the CUDA
// batched step (qgemm), which rounds differently from the batch-1 GEMVs: 2e-3 + 2e-3·|alone| there,
// and the argmax must agree. Batch
// invariance: the first step's rows 0..2 (the same sequences in the same states) are identical at
// B = 3, 7 and 17 (|Δ| = 0) on every backend. The steps are prepared up front (Model::prepare,
// as `lily serve` does). Bad arguments are refused by name.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "model/model.h"
#include "golden_dirs.h"

namespace lily {
namespace {

std::vector<std::string> backends() { return test_backends({"cpu", "cpu-ref"}); }

std::vector<int32_t> prompt_of(int seq, int len, int V) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(int32_t((uint64_t(i + 31 * seq) * 2654435761u) % uint32_t(V)));
  return p;
}

TEST(ForwardBatch, EqualsForwardAlone) {
  const std::string dir = first_golden();
  if (dir.empty()) GTEST_SKIP() << "no checkpoints under tests/data/golden";
  each_backend(backends(), [&](Model& model, const std::string& backend) {
    // Every batch size's step readied up front, as `lily serve` does (CUDA: scratch and graphs of
    // 2..17 rows captured before any row exists); the engine tests run without it (captured lazily).
    ASSERT_TRUE(model.prepare(17).is_ok());
    const int V = model.config().vocab_size;
    const bool loose = backend == "cuda";
    const double atol = loose ? 2e-3 : 1e-5, rtol = loose ? 2e-3 : 1e-6;
    std::vector<float> first3;  // step 0 logits of rows 0..2 at B = 3
    double inv_err = 0;
    for (int B : {1, 3, 7, 17}) {
      SCOPED_TRACE(fmt::format("B = {}", B));
      // Two copies of every sequence: one decoded alone, one in the batch.
      std::vector<std::unique_ptr<SeqState>> alone, batched;
      std::vector<int32_t> next(static_cast<size_t>(B), 0);
      std::vector<float> logits(static_cast<size_t>(V));
      for (int s = 0; s < B; ++s) {
        const auto p = prompt_of(s, 1 + 13 * s, V);  // lengths 1, 14, 27, …
        for (auto* set : {&alone, &batched}) {
          auto st = model.new_state(256);
          ASSERT_TRUE(st.is_ok()) << st.message();
          ASSERT_TRUE(model.forward(**st, p, logits).is_ok());
          set->push_back(std::move(*st));
        }
        next[size_t(s)] = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      }
      double max_err = 0;
      std::vector<int> rows(static_cast<size_t>(B));
      for (int s = 0; s < B; ++s) rows[size_t(s)] = s;
      for (int step = 0; step < 4 && !rows.empty(); ++step) {
        std::vector<SeqState*> states;
        std::vector<int32_t> toks;
        for (int s : rows) states.push_back(batched[size_t(s)].get()), toks.push_back(next[size_t(s)]);
        std::vector<float> lb(rows.size() * size_t(V));
        ASSERT_TRUE(model.forward_batch(states, toks, lb).is_ok());
        if (step == 0 && B >= 3) {  // batch invariance: rows 0..2 hold the same states at every B ≥ 3
          if (first3.empty()) first3.assign(lb.begin(), lb.begin() + 3 * V);
          for (size_t i = 0; i < 3 * size_t(V); ++i) inv_err = std::max(inv_err, double(std::fabs(lb[i] - first3[i])));
        }
        for (size_t r = 0; r < rows.size(); ++r) {
          const int s = rows[r];
          ASSERT_TRUE(model.forward(*alone[size_t(s)], {&next[size_t(s)], 1}, logits).is_ok());
          for (int v = 0; v < V; ++v) {
            const float a = logits[size_t(v)], b = lb[r * size_t(V) + size_t(v)];
            max_err = std::max(max_err, double(std::fabs(a - b)));
            ASSERT_NEAR(b, a, atol + rtol * std::fabs(a)) << "step " << step << " row " << r << " id " << v;
          }
          const auto am = std::max_element(logits.begin(), logits.end()) - logits.begin();
          const auto bm = std::max_element(lb.begin() + long(r) * V, lb.begin() + long(r + 1) * V) - (lb.begin() + long(r) * V);
          EXPECT_EQ(am, bm) << "argmax, step " << step << " row " << r;
          next[size_t(s)] = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        }
        if (rows.size() > 1) rows.erase(rows.begin() + int(step % rows.size()));  // a row leaves
      }
      fmt::print("[forward-batch] {} B={}: max |batched - alone| logit {:.2e}\n", backend, B, max_err);
    }
    fmt::print("[forward-batch] {}: rows 0..2 at B = 3 / 7 / 17, max |delta| {:.2e} (batch invariance)\n", backend, inv_err);
    EXPECT_EQ(inv_err, 0.0) << "a row's logits depend on the batch";
  });
}

TEST(ForwardBatch, RefusesBadArguments) {
  const std::string dir = first_golden();
  if (dir.empty()) GTEST_SKIP() << "no checkpoints under tests/data/golden";
  each_backend(backends(), [&](Model& model, const std::string& backend) {
    const int V = model.config().vocab_size;
    auto a = model.new_state(8), b = model.new_state(8);
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    std::vector<float> lg(2 * size_t(V));
    const int32_t toks[2] = {1, 2};
    SeqState* same[2] = {a->get(), a->get()};
    auto st = model.forward_batch(same, toks, lg);
    EXPECT_FALSE(st.is_ok());
    SeqState* two[2] = {a->get(), b->get()};
    st = model.forward_batch(two, std::span<const int32_t>(toks, 1), lg);
    EXPECT_FALSE(st.is_ok());
    st = model.forward_batch(two, toks, std::span<float>(lg.data(), size_t(V)));
    EXPECT_FALSE(st.is_ok());
    const int32_t bad[2] = {1, V};
    st = model.forward_batch(two, bad, lg);
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("token"), std::string::npos) << st.message();
    st = model.prepare(0);
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("prepare"), std::string::npos) << st.message();
  });
}

}  // namespace
}  // namespace lily
