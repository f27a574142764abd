// The golden checkpoints under tests/data/golden (each a folder with model.safetensors), for tests that
// run a model on one: the first by name, "" when none is present (the test then skips and says so).
#pragma once
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

namespace lily {

inline std::string first_golden() {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(LILY_SOURCE_DIR) / "tests" / "data" / "golden";
  std::vector<std::string> v;
  std::error_code ec;
  if (fs::is_directory(root, ec))
    for (const auto& e : fs::directory_iterator(root, ec))
      if (fs::exists(e.path() / "model.safetensors")) v.push_back(e.path().string());
  std::sort(v.begin(), v.end());
  return v.empty() ? "" : v.front();
}

}  // namespace lily
