// The `lily` binary on checkpoints: `lily check` on a broken checkpoint exits non-zero with one
// error line naming the file and tensor; `lily synth` output passes `lily check`.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>

#include "io_test_util.h"

namespace lily {
namespace {

using namespace lily::test;

struct CliRun {
  int code = -1;
  std::string err;  // stderr
};

// Runs `$LILY_BIN args`, capturing stderr (stdout discarded).
CliRun run_lily(const std::string& args) {
  CliRun r;
  const char* bin = std::getenv("LILY_BIN");
  std::string cmd = std::string("'") + bin + "' " + args + " 2>&1 1>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.err.append(buf, n);
  int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

#define REQUIRE_LILY_BIN()                                                                       \
  if (!std::getenv("LILY_BIN") || !*std::getenv("LILY_BIN"))                                     \
  GTEST_SKIP() << "LILY_BIN is not set (ctest sets it to the lily binary); skipping the CLI test"

TEST(CliIo, CheckBrokenCheckpointFailsWithOneLine) {
  REQUIRE_LILY_BIN();
  std::string d = fresh_dir("cli-truncated");
  fs::copy_file(tiny_dir() + "/config.json", d + "/config.json");
  fs::copy_file(tiny_dir() + "/model.safetensors", d + "/model.safetensors");
  fs::resize_file(d + "/model.safetensors", fs::file_size(d + "/model.safetensors") - 100);
  CliRun r = run_lily("check --model '" + d + "'");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  expect_contains(r.err, {"lily check: ", d + "/model.safetensors", "tensor 'language_model.model.norm.weight'"});
}

TEST(CliIo, CheckMissingDirFailsWithOneLine) {
  REQUIRE_LILY_BIN();
  CliRun r = run_lily("check --model /nonexistent-lily-checkpoint");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  expect_contains(r.err, {"/nonexistent-lily-checkpoint/config.json"});
}

TEST(CliIo, SynthThenCheck) {
  REQUIRE_LILY_BIN();
  std::string d = fresh_dir("cli-synth");
  CliRun s = run_lily("synth --preset tiny --seed 4 --out '" + d + "/ck'");
  ASSERT_EQ(s.code, 0) << s.err;
  CliRun c = run_lily("check --model '" + d + "/ck'");
  EXPECT_EQ(c.code, 0) << c.err;
  CliRun bad = run_lily("synth --preset nope --out '" + d + "/x'");
  EXPECT_NE(bad.code, 0);
}

}  // namespace
}  // namespace lily
