// The engine and service tests' shared model: a tiny synthetic checkpoint (io/synth.h, preset "tiny")
// written to a temporary folder, loaded once per test suite with its tokenizer. With backend_env,
// LILY_BACKEND picks the backend (LILY_BACKEND=cuda runs the suite on the GPU).
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "io/synth.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace lily {

// Call from SetUpTestSuite: writes the checkpoint of `seed` to a folder named after `name` and the
// process, and loads it into model and tok (owned by the caller until unload_tiny).
inline void load_tiny(const char* name, uint64_t seed, bool backend_env, std::string& dir, Model*& model, Tokenizer*& tok) {
  dir = (std::filesystem::temp_directory_path() / ("lily-" + std::string(name) + "-" + std::to_string(::getpid()))).string();
  SynthOptions so;
  so.preset = "tiny";
  so.seed = seed;
  so.out_dir = dir;
  auto st = write_synthetic_checkpoint(so);
  ASSERT_TRUE(st) << st.message();
  ModelOptions mo;
  mo.verbose = false;
  if (const char* b = std::getenv("LILY_BACKEND"); backend_env && b && *b) mo.backend = b;
  auto m = Model::load(dir, mo);
  ASSERT_TRUE(m) << m.message();
  model = std::move(m).value().release();
  auto t = Tokenizer::load_dir(dir);
  ASSERT_TRUE(t) << t.message();
  tok = std::move(t).value().release();
}

// Call from TearDownTestSuite.
inline void unload_tiny(std::string& dir, Model*& model, Tokenizer*& tok) {
  delete model;
  delete tok;
  model = nullptr, tok = nullptr;
  std::filesystem::remove_all(dir);
}

// A fixture whose suite shares one tiny checkpoint of `Seed` (its folder named after the suite), loaded on the
// backend LILY_BACKEND picks when BackendEnv: class FooTest : public TinySuite<FooTest, 3, true> {...}.
template <class Derived, uint64_t Seed, bool BackendEnv> class TinySuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_suite()->name();  // "Engine/BatchSizes"
    for (char& c : name)
      if (c == '/') c = '-';
    load_tiny(name.c_str(), Seed, BackendEnv, dir_, model_, tok_);
  }
  static void TearDownTestSuite() { unload_tiny(dir_, model_, tok_); }
  static inline std::string dir_;
  static inline Model* model_ = nullptr;
  static inline Tokenizer* tok_ = nullptr;
};

}  // namespace lily
