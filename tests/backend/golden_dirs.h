// The golden checkpoints under tests/data/golden (each a folder with model.safetensors), for tests that
// run a model on them: all, sorted by name, or the first ("" when none is present (the test then skips and says so); the
// backends such a test runs, and a quiet load.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"

namespace lily {

inline std::vector<std::string> golden_dirs() {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(LILY_SOURCE_DIR) / "tests" / "data" / "golden";
  std::vector<std::string> v;
  std::error_code ec;
  if (fs::is_directory(root, ec))
    for (const auto& e : fs::directory_iterator(root, ec))
      if (fs::exists(e.path() / "model.safetensors")) v.push_back(e.path().string());
  std::sort(v.begin(), v.end());
  return v;
}
inline std::string first_golden() {
  const auto v = golden_dirs();
  return v.empty() ? "" : v.front();
}

// `base`, and LILY_BACKEND's backend when set and not among them (LILY_BACKEND=cuda: the suite on the GPU too).
inline std::vector<std::string> test_backends(std::vector<std::string> base = {"cpu"}) {
  if (const char* e = std::getenv("LILY_BACKEND"); e && *e && std::find(base.begin(), base.end(), e) == base.end())
    base.push_back(e);
  return base;
}

// The checkpoint at dir on `backend` ("" = the default), not verbose; null (and a failed expectation) when
// it does not load.
inline std::unique_ptr<Model> load_quiet(const std::string& dir, const std::string& backend = "") {
  ModelOptions o;
  if (!backend.empty()) o.backend = backend;
  o.verbose = false;
  auto m = Model::load(dir, o);
  EXPECT_TRUE(m.is_ok()) << backend << ": " << m.message();
  return m.is_ok() ? std::move(*m) : nullptr;
}

// body(model, backend) on the first golden checkpoint, once for each backend (a scoped trace names it).
template <class F> void each_backend(const std::vector<std::string>& backends, F&& body) {
  for (const std::string& backend : backends) {
    SCOPED_TRACE("backend " + backend);
    auto m = load_quiet(first_golden(), backend);
    ASSERT_TRUE(m);
    body(*m, backend);
  }
}

}  // namespace lily
