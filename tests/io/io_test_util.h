// Helpers for the io tests: a synth tiny checkpoint made once per test binary, and copies of it
// with one thing broken (bad-input fixtures are made at test time, never committed).
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "io/synth.h"

namespace lily::test {

namespace fs = std::filesystem;

inline std::string temp_root() {
  static const std::string root = [] {
    std::string r = (fs::temp_directory_path() / ("lily-io-test-" + std::to_string(::getpid()))).string();
    fs::create_directories(r);
    return r;
  }();
  return root;
}

// A fresh empty directory under the test's temp root.
inline std::string fresh_dir(const std::string& name) {
  std::string d = temp_root() + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// synth --preset tiny --seed 1, written once.
inline const std::string& tiny_dir() {
  static const std::string dir = [] {
    std::string d = temp_root() + "/tiny-seed1";
    auto r = write_synthetic_checkpoint({"tiny", 1, d});
    if (!r.is_ok()) {
      ADD_FAILURE() << "synth tiny failed: " << r.message();
      return std::string();
    }
    return d;
  }();
  return dir;
}

inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_all_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

struct OwnedTensor {
  SafeTensorsWriter::Entry entry;
  std::vector<uint8_t> bytes;
};

// The tensors of a safetensors file, copied out.
inline std::vector<OwnedTensor> load_tensors(const std::string& file) {
  auto st = SafeTensors::open_file(file);
  EXPECT_TRUE(st.is_ok()) << st.message();
  std::vector<OwnedTensor> out;
  if (!st.is_ok()) return out;
  for (const auto& [name, t] : (*st)->tensors())
    out.push_back({{name, t.dtype, t.shape}, std::vector<uint8_t>(t.data, t.data + t.nbytes)});
  return out;
}

inline void write_tensors(const std::string& file, const std::vector<OwnedTensor>& ts) {
  std::vector<SafeTensorsWriter::Entry> entries;
  for (const auto& t : ts) entries.push_back(t.entry);
  auto w = SafeTensorsWriter::create(file, entries, {{"format", "mlx"}});
  ASSERT_TRUE(w.is_ok()) << w.message();
  for (const auto& t : ts) ASSERT_TRUE((*w)->write_next(t.bytes.data(), t.bytes.size()).is_ok());
  ASSERT_TRUE((*w)->finish().is_ok());
}

// A copy of the tiny checkpoint whose tensor list went through `mutate` (written with the
// SafeTensorsWriter, so the file itself is well-formed).
inline std::string tiny_with_tensors(const std::string& name, const std::function<void(std::vector<OwnedTensor>&)>& mutate) {
  std::string d = fresh_dir(name);
  fs::copy_file(tiny_dir() + "/config.json", d + "/config.json");
  auto ts = load_tensors(tiny_dir() + "/model.safetensors");
  mutate(ts);
  write_tensors(d + "/model.safetensors", ts);
  return d;
}

// A copy of the tiny checkpoint whose raw safetensors header JSON went through `mutate`; the
// data section is kept byte for byte (so the header may now lie).
inline std::string tiny_with_header(const std::string& name, const std::function<void(nlohmann::json&)>& mutate) {
  std::string d = fresh_dir(name);
  fs::copy_file(tiny_dir() + "/config.json", d + "/config.json");
  std::string bytes = read_all(tiny_dir() + "/model.safetensors");
  uint64_t hlen = 0;
  std::memcpy(&hlen, bytes.data(), 8);
  nlohmann::json h = nlohmann::json::parse(bytes.substr(8, hlen));
  mutate(h);
  std::string hs = h.dump();
  while (hs.size() % 8) hs.push_back(' ');
  uint64_t nl = hs.size();
  std::string out(reinterpret_cast<const char*>(&nl), 8);
  out += hs;
  out += bytes.substr(8 + hlen);
  write_all_text(d + "/model.safetensors", out);
  return d;
}

inline OwnedTensor* find_tensor(std::vector<OwnedTensor>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.entry.name == name) return &t;
  ADD_FAILURE() << "no tensor " << name;
  return nullptr;
}

// Expects `msg` to contain every one of `parts`.
inline void expect_contains(const std::string& msg, std::initializer_list<std::string> parts) {
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
}

}  // namespace lily::test
