// Bad checkpoints: each kind of damage to a synth tiny checkpoint gives one error naming the file,
// the tensor and the field — never a crash, never a silent load.
#include <gtest/gtest.h>

#include <filesystem>

#include "io/checkpoint.h"
#include "io_test_util.h"

namespace lily {
namespace {

using namespace lily::test;
using json = nlohmann::json;

// Removes the per-process temp directory after all tests.
class TempCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(temp_root(), ec);
  }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new TempCleanup);

const std::string kL0 = "language_model.model.layers.0.";
const std::string kL3 = "language_model.model.layers.3.";

// Opens `dir`, expects failure, returns the message.
std::string open_error(const std::string& dir) {
  auto r = Checkpoint::open(dir);
  EXPECT_FALSE(r.is_ok()) << "checkpoint " << dir << " unexpectedly passed";
  return r.is_ok() ? std::string() : r.message();
}

TEST(CheckpointBad, TinyIsGood) {
  ASSERT_FALSE(tiny_dir().empty());
  auto r = Checkpoint::open(tiny_dir());
  ASSERT_TRUE(r.is_ok()) << r.message();
}

TEST(CheckpointBad, TruncatedFile) {
  std::string d = fresh_dir("truncated");
  fs::copy_file(tiny_dir() + "/config.json", d + "/config.json");
  fs::copy_file(tiny_dir() + "/model.safetensors", d + "/model.safetensors");
  fs::resize_file(d + "/model.safetensors", fs::file_size(d + "/model.safetensors") - 100);
  std::string m = open_error(d);
  // The last tensor in the file (sorted by name) is norm.weight; its end is past the data.
  expect_contains(m, {d + "/model.safetensors", "tensor 'language_model.model.norm.weight'", "data_offsets", "truncated"});
}

TEST(CheckpointBad, TruncatedInsideHeader) {
  std::string d = fresh_dir("truncated-header");
  fs::copy_file(tiny_dir() + "/config.json", d + "/config.json");
  fs::copy_file(tiny_dir() + "/model.safetensors", d + "/model.safetensors");
  fs::resize_file(d + "/model.safetensors", 100);
  expect_contains(open_error(d), {d + "/model.safetensors", "header length", "past the end of the file"});
  fs::resize_file(d + "/model.safetensors", 5);
  expect_contains(open_error(d), {d + "/model.safetensors", "too short"});
}

TEST(CheckpointBad, HeaderLengthBeyondFile) {
  std::string d = fresh_dir("hlen");
  fs::copy_file(tiny_dir() + "/config.json", d + "/config.json");
  std::string bytes = read_all(tiny_dir() + "/model.safetensors");
  uint64_t big = uint64_t(bytes.size());  // header "as long as the file": runs past the end
  std::memcpy(bytes.data(), &big, 8);
  write_all_text(d + "/model.safetensors", bytes);
  expect_contains(open_error(d), {d + "/model.safetensors", "header length", "past the end"});
  big = ~uint64_t(0);
  std::memcpy(bytes.data(), &big, 8);
  write_all_text(d + "/model.safetensors", bytes);
  expect_contains(open_error(d), {d + "/model.safetensors", "header length", "not sane"});
}

TEST(CheckpointBad, HeaderNotJson) {
  std::string d = fresh_dir("hjson");
  fs::copy_file(tiny_dir() + "/config.json", d + "/config.json");
  std::string bytes = read_all(tiny_dir() + "/model.safetensors");
  bytes[8] = '[';
  bytes[9] = '{';
  write_all_text(d + "/model.safetensors", bytes);
  expect_contains(open_error(d), {d + "/model.safetensors", "header is not valid JSON"});
}

TEST(CheckpointBad, HeaderLiesAboutSize) {
  const std::string name = kL0 + "linear_attn.dt_bias";
  std::string d = tiny_with_header("lies", [&](json& h) { h[name]["shape"] = {8}; });  // 4 stored
  expect_contains(open_error(d), {d + "/model.safetensors", "tensor '" + name + "'", "data_offsets", "holds 8 bytes",
                                  "needs 16"});
}

TEST(CheckpointBad, HeaderShapeOverflow) {
  const std::string name = kL0 + "linear_attn.dt_bias";
  std::string d = tiny_with_header("overflow", [&](json& h) {
    h[name]["shape"] = {int64_t(1) << 40, int64_t(1) << 40};
  });
  expect_contains(open_error(d), {"tensor '" + name + "'", "shape", "overflows"});
}

TEST(CheckpointBad, HeaderEntryMissingField) {
  const std::string name = kL0 + "linear_attn.dt_bias";
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    std::string d = tiny_with_header(std::string("nofield-") + field, [&](json& h) { h[name].erase(field); });
    expect_contains(open_error(d), {d + "/model.safetensors", "tensor '" + name + "'", std::string(field) + ": missing"});
  }
  std::string d = tiny_with_header("baddtype", [&](json& h) { h[name]["dtype"] = "Q4_K"; });
  expect_contains(open_error(d), {"tensor '" + name + "'", "dtype", "unknown dtype \"Q4_K\""});
  d = tiny_with_header("badoffsets", [&](json& h) { h[name]["data_offsets"] = {10}; });
  expect_contains(open_error(d), {"tensor '" + name + "'", "data_offsets", "expected [begin, end]"});
  d = tiny_with_header("reversed", [&](json& h) {
    auto o = h[name]["data_offsets"];
    h[name]["data_offsets"] = {o[1], o[0]};
  });
  expect_contains(open_error(d), {"tensor '" + name + "'", "data_offsets", "is after end"});
}

TEST(CheckpointBad, DuplicateNameInHeader) {
  std::string d = fresh_dir("dup");
  fs::copy_file(tiny_dir() + "/config.json", d + "/config.json");
  std::string bytes = read_all(tiny_dir() + "/model.safetensors");
  uint64_t hlen = 0;
  std::memcpy(&hlen, bytes.data(), 8);
  std::string hs = bytes.substr(8, hlen);
  // Repeat the first entry (same name, same offsets) right after the opening brace.
  const std::string name = kL0 + "linear_attn.dt_bias";
  json h = json::parse(hs);
  std::string entry = "\"" + name + "\":" + h[name].dump() + ",";
  hs.insert(1, entry);
  while (hs.size() % 8) hs.push_back(' ');
  uint64_t nl = hs.size();
  std::string out(reinterpret_cast<const char*>(&nl), 8);
  out += hs + bytes.substr(8 + hlen);
  write_all_text(d + "/model.safetensors", out);
  expect_contains(open_error(d), {d + "/model.safetensors", "tensor '" + name + "'", "listed twice"});
}

TEST(CheckpointBad, OverlappingOffsets) {
  const std::string a = kL0 + "linear_attn.dt_bias", b = kL0 + "linear_attn.A_log";
  std::string d = tiny_with_header("overlap", [&](json& h) {
    // dt_bias (4 x BF16 = 8 bytes) now points into A_log's bytes.
    uint64_t begin = h[b]["data_offsets"][0].get<uint64_t>();
    h[a]["data_offsets"] = {begin, begin + 8};
  });
  expect_contains(open_error(d), {d + "/model.safetensors", "data_offsets", "overlaps", a, b});
}

TEST(CheckpointBad, WrongDtype) {
  const std::string name = kL0 + "linear_attn.dt_bias";
  std::string d = tiny_with_tensors("dtype", [&](auto& ts) { find_tensor(ts, name)->entry.dtype = DType::F16; });
  expect_contains(open_error(d), {d + "/model.safetensors", "tensor '" + name + "'", "dtype: F16, expected BF16"});
  const std::string codes = kL0 + "mlp.switch_mlp.up_proj.weight";
  d = tiny_with_tensors("dtype2", [&](auto& ts) { find_tensor(ts, codes)->entry.dtype = DType::I32; });
  expect_contains(open_error(d), {"tensor '" + codes + "'", "dtype: I32, expected U32"});
}

TEST(CheckpointBad, ALogMayBeBf16) {
  const std::string name = kL0 + "linear_attn.A_log";
  std::string d = tiny_with_tensors("alog-bf16", [&](auto& ts) {
    OwnedTensor* t = find_tensor(ts, name);
    t->entry.dtype = DType::BF16;
    t->bytes.resize(t->bytes.size() / 2);
  });
  auto r = Checkpoint::open(d);
  EXPECT_TRUE(r.is_ok()) << r.message();
}

TEST(CheckpointBad, MissingTensor) {
  const std::string name = kL3 + "self_attn.k_norm.weight";
  std::string d = tiny_with_tensors("missing", [&](auto& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [&](const auto& t) { return t.entry.name == name; }), ts.end());
  });
  expect_contains(open_error(d), {d + "/model.safetensors", "tensor '" + name + "' is missing", "BF16 [64]"});
}

TEST(CheckpointBad, ExtraTensor) {
  const std::string name = kL0 + "linear_attn.conv1d.bias";
  std::string d = tiny_with_tensors("extra", [&](auto& ts) {
    ts.push_back({{name, DType::BF16, {4}}, std::vector<uint8_t>(8, 0)});
  });
  expect_contains(open_error(d), {d + "/model.safetensors", "tensor '" + name + "'", "unknown tensor"});
}

TEST(CheckpointBad, VisionAndMtpIgnored) {
  std::string d = tiny_with_tensors("vision", [&](auto& ts) {
    ts.push_back({{"vision_tower.blocks.0.attn.qkv.weight", DType::BF16, {2, 2}}, std::vector<uint8_t>(8, 0)});
    ts.push_back({{"mtp.fc.weight", DType::BF16, {2}}, std::vector<uint8_t>(4, 0)});
    ts.push_back({{"language_model.mtp.norm.weight", DType::BF16, {2}}, std::vector<uint8_t>(4, 0)});
  });
  auto r = Checkpoint::open(d);
  EXPECT_TRUE(r.is_ok()) << r.message();
}

TEST(CheckpointBad, WrongShape) {
  // conv1d in the HF layout [C, 1, K] instead of MLX's [C, K, 1].
  const std::string name = kL0 + "linear_attn.conv1d.weight";
  std::string d = tiny_with_tensors("shape", [&](auto& ts) { find_tensor(ts, name)->entry.shape = {1024, 1, 4}; });
  expect_contains(open_error(d), {d + "/model.safetensors", "tensor '" + name + "'", "shape: [1024, 1, 4], expected [1024, 4, 1]"});
  const std::string sc = kL3 + "self_attn.q_proj.scales";  // q_proj without the output gate
  d = tiny_with_tensors("shape2", [&](auto& ts) {
    OwnedTensor* t = find_tensor(ts, sc);
    t->entry.shape = {256, 2};
    t->bytes.resize(256 * 2 * 2);
  });
  expect_contains(open_error(d), {"tensor '" + sc + "'", "shape: [256, 2], expected [512, 2]"});
}

TEST(CheckpointBad, RouterStoredAs4Bit) {
  // mlp.gate must be 8-bit: 128 inputs -> 32 words per row; a 4-bit router has 16.
  const std::string m = kL0 + "mlp.gate";
  std::string d = tiny_with_tensors("bits", [&](auto& ts) {
    OwnedTensor* t = find_tensor(ts, m + ".weight");
    t->entry.shape = {8, 16};
    t->bytes.resize(8 * 16 * 4);
  });
  expect_contains(open_error(d), {d + "/model.safetensors", "tensor '" + m + ".weight'", "bits: 4-bit, expected 8-bit"});
}

TEST(CheckpointBad, ExpertsStoredAs8Bit) {
  const std::string m = kL0 + "mlp.switch_mlp.up_proj";
  std::string d = tiny_with_tensors("bits8", [&](auto& ts) {
    OwnedTensor* t = find_tensor(ts, m + ".weight");
    t->entry.shape = {8, 64, 32};
    t->bytes.resize(size_t(8) * 64 * 32 * 4);
  });
  expect_contains(open_error(d), {"tensor '" + m + ".weight'", "bits: 8-bit, expected 4-bit"});
}

TEST(CheckpointBad, OddBitWidth) {
  const std::string m = kL0 + "mlp.switch_mlp.up_proj";
  std::string d = tiny_with_tensors("bits3", [&](auto& ts) {
    OwnedTensor* t = find_tensor(ts, m + ".weight");
    t->entry.shape = {8, 64, 12};  // 12*32/128 = 3 bits
    t->bytes.resize(size_t(8) * 64 * 12 * 4);
  });
  expect_contains(open_error(d), {"tensor '" + m + ".weight'", "bits", "3 bits", "only 4 and 8"});
}

TEST(CheckpointBad, ConfigOverrideDisagrees) {
  std::string d = fresh_dir("override");
  fs::copy_file(tiny_dir() + "/model.safetensors", d + "/model.safetensors");
  json c = json::parse(read_all(tiny_dir() + "/config.json"));
  c["quantization"][kL0 + "mlp.gate"]["bits"] = 4;
  write_all_text(d + "/config.json", c.dump());
  expect_contains(open_error(d), {"tensor '" + kL0 + "mlp.gate.weight'", "bits", "config.json quantization." + kL0 + "mlp.gate says 4-bit"});
}

TEST(CheckpointBad, ConfigDisagreesWithTensors) {
  std::string d = fresh_dir("cfgdim");
  fs::copy_file(tiny_dir() + "/model.safetensors", d + "/model.safetensors");
  json c = json::parse(read_all(tiny_dir() + "/config.json"));
  c["text_config"]["num_experts"] = 16;
  write_all_text(d + "/config.json", c.dump());
  expect_contains(open_error(d), {d + "/model.safetensors", "tensor '", "shape", "expected [16"});
}

TEST(CheckpointBad, MalformedConfigJson) {
  std::string d = fresh_dir("badcfg");
  fs::copy_file(tiny_dir() + "/model.safetensors", d + "/model.safetensors");
  write_all_text(d + "/config.json", "{\"model_type\": \"qwen3_5_moe\", ");
  expect_contains(open_error(d), {d + "/config.json", "not valid JSON"});
  json c = json::parse(read_all(tiny_dir() + "/config.json"));
  c["text_config"]["hidden_size"] = "abc";
  write_all_text(d + "/config.json", c.dump());
  expect_contains(open_error(d), {d + "/config.json: text_config.hidden_size: expected a positive integer, got \"abc\""});
}

TEST(CheckpointBad, NoSafetensors) {
  std::string d = fresh_dir("nost");
  fs::copy_file(tiny_dir() + "/config.json", d + "/config.json");
  expect_contains(open_error(d), {d, "neither model.safetensors nor model.safetensors.index.json"});
}

// Splits the tiny checkpoint into two shards with an index.
std::string sharded(const std::string& name, const std::function<void(json&)>& mutate_index) {
  std::string d = fresh_dir(name);
  fs::copy_file(tiny_dir() + "/config.json", d + "/config.json");
  auto ts = load_tensors(tiny_dir() + "/model.safetensors");
  std::vector<OwnedTensor> a(ts.begin(), ts.begin() + ts.size() / 2), b(ts.begin() + ts.size() / 2, ts.end());
  write_tensors(d + "/model-00001-of-00002.safetensors", a);
  write_tensors(d + "/model-00002-of-00002.safetensors", b);
  json idx = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  for (const auto& t : a) idx["weight_map"][t.entry.name] = "model-00001-of-00002.safetensors";
  for (const auto& t : b) idx["weight_map"][t.entry.name] = "model-00002-of-00002.safetensors";
  mutate_index(idx);
  write_all_text(d + "/model.safetensors.index.json", idx.dump());
  return d;
}

TEST(CheckpointBad, ShardedGoodAndBad) {
  std::string d = sharded("shards", [](json&) {});
  auto r = Checkpoint::open(d);
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_EQ((*r)->files().tensors().size(), expected_tensors((*r)->config()).size());

  const std::string name = "language_model.lm_head.weight";  // in shard 1
  d = sharded("shards-wrong", [&](json& idx) { idx["weight_map"][name] = "model-00002-of-00002.safetensors"; });
  expect_contains(open_error(d), {"model.safetensors.index.json", "tensor '" + name + "'"});
  d = sharded("shards-escape", [&](json& idx) { idx["weight_map"][name] = "../x.safetensors"; });
  expect_contains(open_error(d), {"model.safetensors.index.json", name, "not a plain file name"});
  d = sharded("shards-unlisted", [&](json& idx) { idx["weight_map"].erase(name); });
  expect_contains(open_error(d), {"tensor '" + name + "' is not listed"});
}

TEST(SafeTensorsWriter, RejectsWrongSizesAndRemovesPartialFile) {
  std::string d = fresh_dir("writer");
  const std::string f = d + "/x.safetensors";
  {
    auto w = SafeTensorsWriter::create(f, {{"a", DType::F32, {2}}, {"b", DType::BF16, {3}}});
    ASSERT_TRUE(w.is_ok()) << w.message();
    float a[2] = {1, 2};
    EXPECT_FALSE((*w)->write_next(a, 4).is_ok());  // declared 8 bytes
    EXPECT_TRUE((*w)->write_next(a, 8).is_ok());
    Status s = (*w)->finish();
    EXPECT_FALSE(s.is_ok());
    expect_contains(s.message(), {"'b'"});
  }
  EXPECT_FALSE(fs::exists(f)) << "an unfinished writer must not leave a file";
  {
    auto w = SafeTensorsWriter::create(f, {{"a", DType::F32, {2}}, {"z", DType::U8, {0}}, {"b", DType::BF16, {3}}});
    ASSERT_TRUE(w.is_ok());
    uint8_t buf[8] = {};
    ASSERT_TRUE((*w)->write_next(buf, 8).is_ok());
    ASSERT_TRUE((*w)->write_part(buf, 2).is_ok());  // b in two parts
    ASSERT_TRUE((*w)->write_part(buf, 4).is_ok());
    ASSERT_TRUE((*w)->finish().is_ok());
  }
  auto st = SafeTensors::open_file(f);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ((*st)->tensors().size(), 3u);
  EXPECT_EQ((*st)->find("b")->nbytes, 6u);
  EXPECT_EQ((*st)->find("z")->nbytes, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*st)->find("a")->data) % 8, 0u);  // header padded to 8
}

}  // namespace
}  // namespace lily
