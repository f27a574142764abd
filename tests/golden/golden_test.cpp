// lily's Model against transformers' answers (tools/make_golden.py) for small random qwen3_5_moe
// checkpoints: tests/data/golden/* and, when present, ../shared/data/golden-small-seed7.
// Backend from env LILY_BACKEND (default cpu). Stated tolerances:
//   greedy ids  must equal transformers' wherever its top-1 minus top-2 logit margin > 0.02
//               (below that a bf16 engine may flip; the golden id is fed either way);
//   logprobs    log_softmax at transformers' top-8 ids within 0.03 (absolute);
//   forced      full-vocab logits of the last 8 teacher-forced positions (one prefill up to the first,
//               then decode) within 0.08 max absolute and 0.02 RMS.
// These suit an engine that keeps activations in fp32 (the CPU reference meets them at ~1e-4). With
// bf16 storage at every model-spec §1.5 point (LILY_CPU_STORAGE=bf16), errors on these random models
// reach 0.2-1.2 in logprob and picks flip at margins up to ~0.2 (MoE routing near-ties amplify rounding).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/model.h"

namespace lily {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kMarginThreshold = 0.02;
constexpr double kLogprobTol = 0.03;
constexpr double kForcedMaxTol = 0.08;
constexpr double kForcedRmsTol = 0.02;
constexpr int kMaxReported = 5;  // failure details printed per case and metric

std::vector<std::string> golden_dirs() {
  std::vector<std::string> dirs;
  const fs::path root = fs::path(LILY_SOURCE_DIR) / "tests" / "data" / "golden";
  std::error_code ec;
  if (fs::is_directory(root, ec))
    for (const auto& e : fs::directory_iterator(root, ec))
      if (fs::exists(e.path() / "expected.json")) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  const fs::path shared = fs::path(LILY_SHARED_DIR) / "data" / "golden-small-seed7";
  if (fs::exists(shared / "expected.json", ec)) dirs.push_back(shared.string());
  return dirs;
}

std::string backend_name() {
  const char* b = std::getenv("LILY_BACKEND");
  return (b && *b) ? b : "cpu";
}

std::vector<int32_t> ids_of(const json& a) {
  std::vector<int32_t> v;
  for (const auto& x : a) v.push_back(x.get<int32_t>());
  return v;
}

// Lowest index among the maxima (the engine's and transformers' tie rule).
int argmax(const std::vector<float>& x) {
  return int(std::max_element(x.begin(), x.end()) - x.begin());
}

double log_sum_exp(const std::vector<float>& x) {
  double m = *std::max_element(x.begin(), x.end()), s = 0;
  for (float v : x) s += std::exp(double(v) - m);
  return m + std::log(s);
}

struct Stats {
  int steps = 0, compared = 0, id_mismatch = 0, fragile_flips = 0, lp_viol = 0;
  double max_lp_err = 0, forced_max = 0, forced_sq = 0;
  size_t forced_n = 0;
  std::vector<std::string> notes;
  void note(int& counter, std::string s) {
    if (++counter <= kMaxReported) notes.push_back(std::move(s));
  }
};

// Greedy steps: forward the prompt, then feed the golden ids one at a time.
void check_steps(Model& model, const json& c, Stats& st) {
  const int V = model.config().vocab_size;
  const auto prompt = ids_of(c.at("prompt_ids"));
  const json& steps = c.at("steps");
  auto state = model.new_state(int(prompt.size() + steps.size()) + 1);
  ASSERT_TRUE(state.is_ok()) << state.message();
  std::vector<float> logits(static_cast<size_t>(V));
  Status s = model.forward(**state, prompt, logits);
  ASSERT_TRUE(s.is_ok()) << s.message();
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& g = steps[i];
    const int gid = g.at("id").get<int>();
    const double margin = g.at("margin").get<double>();
    const int ours = argmax(logits);
    ++st.steps;
    if (margin > kMarginThreshold) {
      ++st.compared;
      if (ours != gid)
        st.note(st.id_mismatch, fmt::format("step {}: ours {} golden {} (margin {:.4f})", i, ours, gid, margin));
    } else if (ours != gid) {
      ++st.fragile_flips;
    }
    const double lse = log_sum_exp(logits);
    for (const auto& pair : g.at("top8")) {
      const int id = pair[0].get<int>();
      const double err = std::abs(double(logits[size_t(id)]) - lse - pair[1].get<double>());
      st.max_lp_err = std::max(st.max_lp_err, err);
      if (err > kLogprobTol)
        st.note(st.lp_viol, fmt::format("step {} id {}: logprob err {:.4f}", i, id, err));
    }
    if (i + 1 < steps.size()) {
      const int32_t next = gid;
      s = model.forward(**state, std::span<const int32_t>(&next, 1), logits);
      ASSERT_TRUE(s.is_ok()) << s.message();
    }
  }
}

// Forced logits: a fresh state, one forward over forced_ids[0..p] for the first position p, then one
// token per following position.
void check_forced(Model& model, const json& c, Stats& st) {
  const int V = model.config().vocab_size;
  const auto forced = ids_of(c.at("forced_ids"));
  const json& positions = c.at("forced_last_positions");
  const json& rows = c.at("forced_last_logits");
  ASSERT_EQ(positions.size(), rows.size());
  auto state = model.new_state(int(forced.size()) + 1);
  ASSERT_TRUE(state.is_ok()) << state.message();
  std::vector<float> logits(static_cast<size_t>(V));
  int fed = 0;
  for (size_t k = 0; k < positions.size(); ++k) {
    const int p = positions[k].get<int>();
    ASSERT_GE(p, fed) << "forced positions must increase";
    ASSERT_LT(p, int(forced.size()));
    const json& row = rows[k];
    ASSERT_EQ(int(row.size()), V);
    Status s = model.forward(**state, std::span<const int32_t>(forced.data() + fed, size_t(p + 1 - fed)), logits);
    ASSERT_TRUE(s.is_ok()) << s.message();
    fed = p + 1;
    for (int v = 0; v < V; ++v) {
      const double e = std::abs(double(logits[size_t(v)]) - row[size_t(v)].get<double>());
      st.forced_max = std::max(st.forced_max, e);
      st.forced_sq += e * e;
      ++st.forced_n;
    }
  }
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesTransformers) {
  const std::string dir = GetParam();
  const std::string backend = backend_name();
#ifndef LILY_HAVE_CUDA
  if (backend == "cuda") GTEST_SKIP() << "LILY_BACKEND=cuda but this build has no CUDA backend";
#endif
  std::ifstream in(dir + "/expected.json");
  ASSERT_TRUE(in.good()) << "cannot read " << dir << "/expected.json";
  const json ex = json::parse(in);

  ModelOptions opts;
  opts.backend = backend;
  opts.verbose = false;
  auto model = Model::load(dir, opts);
  ASSERT_TRUE(model.is_ok()) << "Model::load(" << dir << ", backend " << backend << "): " << model.message();
  ASSERT_EQ((*model)->config().vocab_size, ex.at("config_summary").at("vocab_size").get<int>());

  for (const json& c : ex.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE(dir + " " + name);
    Stats st;
    check_steps(**model, c, st);
    if (HasFatalFailure()) return;
    check_forced(**model, c, st);
    if (HasFatalFailure()) return;
    const double rms = st.forced_n ? std::sqrt(st.forced_sq / double(st.forced_n)) : 0.0;
    fmt::print("[golden] {} {} ({}): ids compared {}/{} (margin > {}), mismatches {}, fragile flips {}; "
               "max |dlogprob| {:.2e}; forced logits max |d| {:.2e} rms {:.2e}\n",
               fs::path(dir).filename().string(), name, backend, st.compared, st.steps, kMarginThreshold,
               st.id_mismatch, st.fragile_flips, st.max_lp_err, st.forced_max, rms);
    std::string details;
    for (const auto& n : st.notes) details += "\n  " + n;
    EXPECT_EQ(st.id_mismatch, 0) << "greedy id differs where transformers' margin > " << kMarginThreshold << details;
    EXPECT_EQ(st.lp_viol, 0) << "logprob error above " << kLogprobTol << " (max " << st.max_lp_err << ")" << details;
    EXPECT_LE(st.forced_max, kForcedMaxTol) << "forced logits, max abs error";
    EXPECT_LE(rms, kForcedRmsTol) << "forced logits, RMS error";
  }
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = fs::path(info.param).filename().string();
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenTest, ::testing::ValuesIn(golden_dirs()), param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenTest);

}  // namespace
}  // namespace lily
