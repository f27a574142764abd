// lily's Model against transformers' answers (tools/make_golden.py) for small random qwen3_5_moe
// checkpoints: tests/data/golden/* and, when present, ../shared/data/golden-small-seed7.
// Backend from env LILY_BACKEND (default cpu). Every step is teacher-forced with the golden ids.
// The precision budget (../shared/docs/precision.md): over all cases of a golden, lily must agree with
// transformers' fp32 at least as well as transformers' own fp16 run does, as recorded in the golden's
// envelope.json (`make_golden.py --envelope DIR`, run where torch has a GPU):
//   top-1 agreement on steps whose golden margin >= the envelope's margin threshold: no lower;
//   delta = |logprob - golden logprob| at the golden id: max and median no higher;
//   forced full-vocab logits of the last 8 teacher-forced positions: max and RMS error no higher.
// A golden without envelope.json is held to the fixed tolerances below (and the test says so).
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

// Fixed tolerances for a golden without envelope.json (an fp32 engine meets them at ~1e-4).
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
  std::vector<double> deltas;  // |logprob - golden logprob| at the golden id, per step
  size_t forced_n = 0;
  std::vector<std::string> notes;
  void note(int& counter, std::string s) {
    if (++counter <= kMaxReported) notes.push_back(std::move(s));
  }
};

// Greedy steps: forward the prompt, then feed the golden ids one at a time.
void check_steps(Model& model, const json& c, double margin_threshold, Stats& st) {
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
    if (margin >= margin_threshold) {
      ++st.compared;
      if (ours != gid)
        st.note(st.id_mismatch, fmt::format("step {}: ours {} golden {} (margin {:.4f})", i, ours, gid, margin));
    } else if (ours != gid) {
      ++st.fragile_flips;
    }
    const double lse = log_sum_exp(logits);
    st.deltas.push_back(std::abs(double(logits[size_t(gid)]) - lse - g.at("logprob").get<double>()));
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

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

TEST_P(GoldenTest, MatchesTransformers) {
  const std::string dir = GetParam();
  const std::string backend = backend_name();
#ifndef LILY_HAVE_CUDA
  if (backend == "cuda") GTEST_SKIP() << "LILY_BACKEND=cuda but this build has no CUDA backend";
#endif
  std::ifstream in(dir + "/expected.json");
  ASSERT_TRUE(in.good()) << "cannot read " << dir << "/expected.json";
  const json ex = json::parse(in);
  // transformers' own fp16 run on these cases (the budget), if recorded.
  json fp16;
  double margin_threshold = kMarginThreshold;
  if (std::ifstream env_in(dir + "/envelope.json"); env_in.good()) {
    const json env = json::parse(env_in);
    ASSERT_EQ(env.at("golden_sha256"), ex.at("checkpoint").at("sha256").at("model.safetensors"))
        << dir << "/envelope.json was measured on another checkpoint";
    fp16 = env.at("runs").at("fp16");
    margin_threshold = env.at("margin_threshold").get<double>();
  } else {
    fmt::print("[golden] {}: no envelope.json, using the fixed tolerances\n", dir);
  }

  ModelOptions opts;
  opts.backend = backend;
  opts.verbose = false;
  auto model = Model::load(dir, opts);
  ASSERT_TRUE(model.is_ok()) << "Model::load(" << dir << ", backend " << backend << "): " << model.message();
  ASSERT_EQ((*model)->config().vocab_size, ex.at("config_summary").at("vocab_size").get<int>());

  Stats all;  // every case of the golden
  for (const json& c : ex.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE(dir + " " + name);
    Stats st;
    check_steps(**model, c, margin_threshold, st);
    if (HasFatalFailure()) return;
    check_forced(**model, c, st);
    if (HasFatalFailure()) return;
    const double rms = st.forced_n ? std::sqrt(st.forced_sq / double(st.forced_n)) : 0.0;
    fmt::print("[golden] {} {} ({}): top-1 {}/{} agree (margin >= {}), fragile flips {}; max |dlogprob| top-8 "
               "{:.2e}, at the golden id {:.2e}; forced logits max |d| {:.2e} rms {:.2e}\n",
               fs::path(dir).filename().string(), name, backend, st.compared - st.id_mismatch, st.compared,
               margin_threshold, st.fragile_flips, st.max_lp_err, *std::max_element(st.deltas.begin(), st.deltas.end()),
               st.forced_max, rms);
    all.steps += st.steps, all.compared += st.compared, all.id_mismatch += st.id_mismatch;
    all.lp_viol += st.lp_viol, all.max_lp_err = std::max(all.max_lp_err, st.max_lp_err);
    all.forced_max = std::max(all.forced_max, st.forced_max), all.forced_sq += st.forced_sq, all.forced_n += st.forced_n;
    all.deltas.insert(all.deltas.end(), st.deltas.begin(), st.deltas.end());
    for (auto& n : st.notes) all.notes.push_back(name + ": " + n);
  }
  const double rms = all.forced_n ? std::sqrt(all.forced_sq / double(all.forced_n)) : 0.0;
  const double max_d = all.deltas.empty() ? 0 : *std::max_element(all.deltas.begin(), all.deltas.end());
  const double med_d = median(all.deltas);
  const int agree = all.compared - all.id_mismatch;
  std::string details;
  for (const auto& n : all.notes) details += "\n  " + n;
  fmt::print("[golden] {} ({}), all cases: top-1 {}/{}, delta max {:.3e} median {:.3e}, forced max {:.3e} rms {:.3e}",
             fs::path(dir).filename().string(), backend, agree, all.compared, max_d, med_d, all.forced_max, rms);
  if (fp16.is_null()) {
    fmt::print("\n");
    EXPECT_EQ(all.id_mismatch, 0) << "greedy id differs where transformers' margin >= " << margin_threshold << details;
    EXPECT_EQ(all.lp_viol, 0) << "logprob error above " << kLogprobTol << " (max " << all.max_lp_err << ")" << details;
    EXPECT_LE(all.forced_max, kForcedMaxTol) << "forced logits, max abs error";
    EXPECT_LE(rms, kForcedRmsTol) << "forced logits, RMS error";
    return;
  }
  fmt::print("; transformers fp16: top-1 {}/{}, delta max {:.3e} median {:.3e}, forced max {:.3e} rms {:.3e}\n",
             fp16.at("top1_agree").get<int>(), fp16.at("top1_compared").get<int>(), fp16.at("max_delta").get<double>(),
             fp16.at("median_delta").get<double>(), fp16.at("forced_max").get<double>(), fp16.at("forced_rms").get<double>());
  ASSERT_EQ(all.compared, fp16.at("top1_compared").get<int>()) << "the envelope counted other steps";
  EXPECT_GE(agree, fp16.at("top1_agree").get<int>()) << "top-1 agreement below transformers' fp16" << details;
  EXPECT_LE(max_d, fp16.at("max_delta").get<double>()) << "max delta above transformers' fp16";
  EXPECT_LE(med_d, fp16.at("median_delta").get<double>()) << "median delta above transformers' fp16";
  EXPECT_LE(all.forced_max, fp16.at("forced_max").get<double>()) << "forced logits max error above transformers' fp16";
  EXPECT_LE(rms, fp16.at("forced_rms").get<double>()) << "forced logits RMS error above transformers' fp16";
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
