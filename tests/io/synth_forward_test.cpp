// A synth tiny checkpoint through the real forward pass (CPU backend): logits are finite and
// form a non-degenerate distribution, and different prompts lead to different predictions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "io_test_util.h"
#include "model/model.h"

namespace lily {
namespace {

using namespace lily::test;

TEST(SynthForward, TinyLogitsAreSane) {
  ModelOptions opts;
  opts.verbose = false;
  auto m = Model::load(tiny_dir(), opts);
  ASSERT_TRUE(m.is_ok()) << m.message();
  const int V = (*m)->config().vocab_size;
  std::set<int> argmaxes;
  for (int p = 0; p < 4; ++p) {
    auto st = (*m)->new_state(64);
    ASSERT_TRUE(st.is_ok()) << st.message();
    std::vector<int32_t> toks;
    for (int i = 0; i < 24; ++i) toks.push_back(int32_t((p * 7919 + i * 104729) % 151643));
    std::vector<float> logits(static_cast<size_t>(V));
    ASSERT_TRUE((*m)->forward(**st, toks, logits).is_ok());
    double s = 0, s2 = 0, mx = -1e30;
    for (float v : logits) {
      ASSERT_TRUE(std::isfinite(v));
      s += v;
      s2 += double(v) * v;
      mx = std::max(mx, double(v));
    }
    const double mean = s / V, sd = std::sqrt(s2 / V - mean * mean);
    EXPECT_GT(sd, 0.3) << "logits nearly flat";
    EXPECT_LT(sd, 30.0) << "logits blow up";
    double z = 0;
    for (float v : logits) z += std::exp(double(v) - mx);
    EXPECT_LT(1.0 / z, 0.99) << "distribution collapsed on one token";
    argmaxes.insert(int(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }
  EXPECT_GE(argmaxes.size(), 2u) << "every prompt predicts the same token";
}

TEST(SynthDemo, EnsureDemoCheckpointIsIdempotent) {
  const std::string d = temp_root() + "/demo-ck";
  ::setenv("LILY_DEMO_DIR", d.c_str(), 1);
  auto a = ensure_demo_checkpoint();
  ASSERT_TRUE(a.is_ok()) << a.message();
  EXPECT_EQ(*a, d);
  const auto t1 = fs::last_write_time(d + "/model.safetensors");
  auto b = ensure_demo_checkpoint();
  ASSERT_TRUE(b.is_ok()) << b.message();
  EXPECT_EQ(fs::last_write_time(d + "/model.safetensors"), t1) << "second call must not rewrite";
  auto cj = nlohmann::json::parse(read_all(d + "/config.json"));
  EXPECT_EQ(cj["lily_synthetic"]["preset"], "small");
  EXPECT_EQ(cj["lily_synthetic"]["seed"], 0);
  // No temporary directory left behind.
  for (const auto& e : fs::directory_iterator(temp_root()))
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  ::unsetenv("LILY_DEMO_DIR");
}

}  // namespace
}  // namespace lily
