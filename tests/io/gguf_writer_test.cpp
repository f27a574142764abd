// The GGUF writer round-trips: a file with metadata of every value type (scalars and arrays) and
// F32/F16/Q4_0/Q4_1/Q8_0 tensors is parsed back by a small reader written here from the GGUF
// spec (not lily's code), and every field and every dequantized weight is checked against the
// source, within each format's rounding bound.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "io/gguf_quant.h"
#include "io/gguf_vocab.h"
#include "io/gguf_writer.h"
#include "io_test_util.h"

namespace lily {
namespace {

using namespace lily::gguf;

// ---- an independent reader, from the spec --------------------------------------------------
float half_to_float(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  if (exp == 31) v = mant ? NAN : INFINITY;
  return float(sign ? -v : v);
}

struct Parsed {  // one metadata value; arrays keep their element type and items
  uint32_t type = 0, elem = 0;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<Parsed> items;
};

struct ParsedTensor {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type = 0;
  uint64_t offset = 0;
};

struct Reader {
  std::string buf;
  size_t p = 0;
  template <typename T>
  T get() {
    T v{};
    EXPECT_LE(p + sizeof v, buf.size());
    if (p + sizeof v <= buf.size()) std::memcpy(&v, buf.data() + p, sizeof v);
    p += sizeof v;
    return v;
  }
  std::string str() {
    const uint64_t n = get<uint64_t>();
    std::string s = buf.substr(p, size_t(n));
    p += size_t(n);
    return s;
  }
  Parsed value(uint32_t type) {
    Parsed v;
    v.type = type;
    switch (type) {
      case 0: v.u = get<uint8_t>(); break;
      case 1: v.i = get<int8_t>(); break;
      case 2: v.u = get<uint16_t>(); break;
      case 3: v.i = get<int16_t>(); break;
      case 4: v.u = get<uint32_t>(); break;
      case 5: v.i = get<int32_t>(); break;
      case 6: v.f = get<float>(); break;
      case 7: v.u = get<uint8_t>(); break;
      case 8: v.s = str(); break;
      case 9: {
        v.elem = get<uint32_t>();
        const uint64_t n = get<uint64_t>();
        for (uint64_t k = 0; k < n; ++k) v.items.push_back(value(v.elem));
        break;
      }
      case 10: v.u = get<uint64_t>(); break;
      case 11: v.i = get<int64_t>(); break;
      case 12: v.f = get<double>(); break;
      default: ADD_FAILURE() << "unknown value type " << type;
    }
    return v;
  }
};

struct GgufFile {
  uint32_t version = 0;
  std::map<std::string, Parsed> kv;
  std::vector<std::string> key_order;
  std::vector<ParsedTensor> tensors;
  size_t data_start = 0;
  std::string bytes;
};

GgufFile parse(const std::string& path) {
  GgufFile g;
  Reader r{test::read_all(path)};
  EXPECT_EQ(r.buf.substr(0, 4), "GGUF");
  r.p = 4;
  g.version = r.get<uint32_t>();
  const uint64_t n_tensors = r.get<uint64_t>(), n_kv = r.get<uint64_t>();
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = r.str();
    g.key_order.push_back(key);
    g.kv[key] = r.value(r.get<uint32_t>());
  }
  for (uint64_t t = 0; t < n_tensors; ++t) {
    ParsedTensor ti;
    ti.name = r.str();
    const uint32_t n_dims = r.get<uint32_t>();
    for (uint32_t d = 0; d < n_dims; ++d) ti.ne.push_back(r.get<uint64_t>());
    ti.type = r.get<uint32_t>();
    ti.offset = r.get<uint64_t>();
    g.tensors.push_back(ti);
  }
  const uint64_t align = g.kv.count("general.alignment") ? g.kv["general.alignment"].u : 32;
  g.data_start = size_t((r.p + align - 1) / align * align);
  g.bytes = std::move(r.buf);
  return g;
}

// Dequantizes n weights of one of the spec's types starting at p.
std::vector<float> dequantize(uint32_t type, const uint8_t* p, uint64_t n) {
  std::vector<float> out;
  auto half = [](const uint8_t* q) { return half_to_float(uint16_t(q[0] | (q[1] << 8))); };
  for (uint64_t b = 0; b < (type <= 1 ? n : n / 32); ++b) {
    if (type == 0) {
      float f;
      std::memcpy(&f, p + 4 * b, 4);
      out.push_back(f);
    } else if (type == 1) {
      out.push_back(half(p + 2 * b));
    } else if (type == 2 || type == 3) {  // Q4_0: (q-8)·d; Q4_1: q·d + m
      const uint8_t* blk = p + b * (type == 2 ? 18 : 20);
      const float d = half(blk), m = type == 3 ? half(blk + 2) : 0.0f;
      const uint8_t* qs = blk + (type == 2 ? 2 : 4);
      std::vector<float> v(32);
      for (int j = 0; j < 16; ++j) {
        const int lo = qs[j] & 0xf, hi = qs[j] >> 4;
        v[j] = type == 2 ? float(lo - 8) * d : float(lo) * d + m;
        v[j + 16] = type == 2 ? float(hi - 8) * d : float(hi) * d + m;
      }
      out.insert(out.end(), v.begin(), v.end());
    } else if (type == 8) {  // Q8_0: q·d
      const uint8_t* blk = p + b * 34;
      for (int j = 0; j < 32; ++j) out.push_back(float(int8_t(blk[2 + j])) * half(blk));
    } else {
      ADD_FAILURE() << "type " << type;
    }
  }
  return out;
}

// Block scale d of Q4_0 / Q8_0 block b (for the rounding bound).
float block_d(uint32_t type, const uint8_t* p, uint64_t b) {
  const uint8_t* blk = p + b * (type == 2 ? 18 : 34);
  return std::fabs(half_to_float(uint16_t(blk[0] | (blk[1] << 8))));
}

// ---- the source data ------------------------------------------------------------------------
std::vector<float> random_weights(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = nd(rng) * (i / 32 % 3 == 0 ? 0.01f : 3.0f);  // blocks of mixed range
  for (size_t i = 64; i < 96 && i < n; ++i) x[i] = 0.0f;                                // an all-zero block
  if (n > 130) x[130] = -40.0f;                                                        // a negative extreme
  return x;
}

std::vector<uint8_t> packed(TensorType t, const std::vector<float>& x, int64_t row) {
  std::vector<uint8_t> out(row_bytes(t, int64_t(x.size())));
  for (size_t r = 0; r < x.size() / size_t(row); ++r)
    pack_row(t, x.data() + r * row, row, out.data() + r * row_bytes(t, row));
  return out;
}

TEST(GgufWriter, RoundTripsMetadataTensorsAndValues) {
  const std::string path = test::fresh_dir("gguf-roundtrip") + "/m.gguf";
  Writer w;
  w.add_string("general.architecture", "qwen35moe");
  w.add_u8("t.u8", 200);
  w.add_i8("t.i8", -100);
  w.add_u16("t.u16", 60000);
  w.add_i16("t.i16", -30000);
  w.add_u32("t.u32", 4000000000u);
  w.add_i32("t.i32", -2000000000);
  w.add_u64("t.u64", 18000000000000000000ull);
  w.add_i64("t.i64", -9000000000000000000ll);
  w.add_f32("t.f32", 1e-6f);
  w.add_f64("t.f64", 1e7);
  w.add_bool("t.bool", true);
  const std::vector<int32_t> ai{11, -11, 10, 0};
  const std::vector<uint32_t> au{1, 2, 4000000000u};
  const std::vector<float> af{0.5f, -2.25f};
  const std::vector<bool> ab{true, false, true};
  const std::vector<std::string> as{"Ġ", "", "a b", "<|im_end|>"};
  w.add_array_i32("t.ai32", ai);
  w.add_array_u32("t.au32", au);
  w.add_array_f32("t.af32", af);
  w.add_array_bool("t.abool", ab);
  w.add_array_string("t.astr", as);

  const auto x32 = random_weights(15, 1), x16 = random_weights(7, 2);
  const auto xq4 = random_weights(64 * 3 * 2, 3), xq8 = random_weights(32 * 5, 4);
  // Q4_1 from affine codes: scale and bias are bf16 values, so the blocks hold them exactly.
  std::mt19937 rng(5);
  std::vector<uint8_t> codes(128 * 2);
  for (auto& c : codes) c = uint8_t(rng() & 15);
  const std::vector<float> scale{0.015625f, -0.5f, 3.0f, 0.00732421875f}, bias{-0.125f, 4.0f, -24.0f, 0.0f};
  w.add_tensor({"a.f32", TensorType::F32, {5, 3}});
  w.add_tensor({"b.f16", TensorType::F16, {7}});
  w.add_tensor({"blk.0.q4_0", TensorType::Q4_0, {64, 3, 2}});
  w.add_tensor({"c.q8_0", TensorType::Q8_0, {32, 5}});
  w.add_tensor({"d.q4_1", TensorType::Q4_1, {128, 2}});
  ASSERT_TRUE(w.open(path).is_ok());
  std::vector<uint8_t> q41(row_bytes(TensorType::Q4_1, 256));
  for (int r = 0; r < 2; ++r)
    pack_q4_1(codes.data() + 128 * r, scale.data() + 2 * r, bias.data() + 2 * r, 128, 64,
              q41.data() + r * row_bytes(TensorType::Q4_1, 128));
  for (const auto& data : {packed(TensorType::F32, x32, 5), packed(TensorType::F16, x16, 7)}) {
    ASSERT_TRUE(w.write(data.data(), data.size()).is_ok());
  }
  const auto q4 = packed(TensorType::Q4_0, xq4, 64);
  ASSERT_TRUE(w.write(q4.data(), 18).is_ok());  // in two parts
  ASSERT_TRUE(w.write(q4.data() + 18, q4.size() - 18).is_ok());
  const auto q8 = packed(TensorType::Q8_0, xq8, 32);
  ASSERT_TRUE(w.write(q8.data(), q8.size()).is_ok());
  ASSERT_TRUE(w.write(q41.data(), q41.size()).is_ok());
  ASSERT_TRUE(w.finish().is_ok());

  GgufFile g = parse(path);
  EXPECT_EQ(g.version, 3u);
  ASSERT_EQ(g.key_order.size(), 17u);
  EXPECT_EQ(g.key_order.front(), "general.architecture");
  EXPECT_EQ(g.kv["general.architecture"].s, "qwen35moe");
  auto expect_int = [&](const std::string& key, uint32_t type, auto v) {
    EXPECT_EQ(g.kv[key].type, type) << key;
    if constexpr (std::is_signed_v<decltype(v)>) EXPECT_EQ(g.kv[key].i, int64_t(v)) << key;
    else EXPECT_EQ(g.kv[key].u, uint64_t(v)) << key;
  };
  expect_int("t.u8", 0, 200u);
  expect_int("t.i8", 1, -100);
  expect_int("t.u16", 2, 60000u);
  expect_int("t.i16", 3, -30000);
  expect_int("t.u32", 4, 4000000000u);
  expect_int("t.i32", 5, -2000000000);
  expect_int("t.u64", 10, 18000000000000000000ull);
  expect_int("t.i64", 11, -9000000000000000000ll);
  expect_int("t.bool", 7, 1u);
  EXPECT_EQ(g.kv["t.f32"].type, 6u);
  EXPECT_EQ(float(g.kv["t.f32"].f), 1e-6f);
  EXPECT_EQ(g.kv["t.f64"].type, 12u);
  EXPECT_EQ(g.kv["t.f64"].f, 1e7);
  auto expect_array = [&](const std::string& key, uint32_t elem, size_t n) {
    EXPECT_EQ(g.kv[key].type, 9u) << key;
    EXPECT_EQ(g.kv[key].elem, elem) << key;
    EXPECT_EQ(g.kv[key].items.size(), n) << key;
  };
  expect_array("t.ai32", 5, ai.size());
  expect_array("t.au32", 4, au.size());
  expect_array("t.af32", 6, af.size());
  expect_array("t.abool", 7, ab.size());
  expect_array("t.astr", 8, as.size());
  for (size_t k = 0; k < ai.size(); ++k) EXPECT_EQ(g.kv["t.ai32"].items[k].i, ai[k]);
  for (size_t k = 0; k < au.size(); ++k) EXPECT_EQ(g.kv["t.au32"].items[k].u, au[k]);
  for (size_t k = 0; k < af.size(); ++k) EXPECT_EQ(float(g.kv["t.af32"].items[k].f), af[k]);
  for (size_t k = 0; k < ab.size(); ++k) EXPECT_EQ(g.kv["t.abool"].items[k].u, ab[k] ? 1u : 0u);
  for (size_t k = 0; k < as.size(); ++k) EXPECT_EQ(g.kv["t.astr"].items[k].s, as[k]);

  // Tensor infos: names, dims, types, 32-aligned offsets one after another.
  const std::vector<std::string> names{"a.f32", "b.f16", "blk.0.q4_0", "c.q8_0", "d.q4_1"};
  const std::vector<std::vector<uint64_t>> dims{{5, 3}, {7}, {64, 3, 2}, {32, 5}, {128, 2}};
  const std::vector<uint32_t> types{0, 1, 2, 8, 3};
  const std::vector<uint64_t> sizes{60, 14, 6 * 2 * 18, 5 * 34, 8 * 20};
  ASSERT_EQ(g.tensors.size(), names.size());
  uint64_t off = 0;
  for (size_t t = 0; t < names.size(); ++t) {
    EXPECT_EQ(g.tensors[t].name, names[t]);
    EXPECT_EQ(g.tensors[t].ne, dims[t]);
    EXPECT_EQ(g.tensors[t].type, types[t]);
    EXPECT_EQ(g.tensors[t].offset, off) << names[t];
    off += (sizes[t] + 31) / 32 * 32;
  }
  EXPECT_EQ(g.data_start % 32, 0u);
  EXPECT_EQ(g.bytes.size(), g.data_start + off);

  auto data_of = [&](size_t t) { return reinterpret_cast<const uint8_t*>(g.bytes.data()) + g.data_start + g.tensors[t].offset; };
  const auto f32 = dequantize(0, data_of(0), 15);
  for (size_t i = 0; i < x32.size(); ++i) EXPECT_EQ(f32[i], x32[i]) << i;
  const auto f16 = dequantize(1, data_of(1), 7);
  for (size_t i = 0; i < x16.size(); ++i) EXPECT_NEAR(f16[i], x16[i], std::fabs(x16[i]) * 0x1p-11f) << i;
  // Q4_0: the block's largest-magnitude weight maps to q = 0 and is exact up to d's fp16
  // rounding; weights inside ±7.5·d round to the nearest step (error ≤ d/2); the opposite
  // extreme may clamp at q = 15 (error ≤ d).
  const auto q4v = dequantize(2, data_of(2), xq4.size());
  for (size_t i = 0; i < xq4.size(); ++i) {
    const float d = block_d(2, data_of(2), i / 32), err = std::fabs(q4v[i] - xq4[i]);
    const float bound = (std::fabs(xq4[i]) <= 7.5f * d ? 0.5f * d : d) * (1.0f + 0x1p-9f) + 1e-30f;
    EXPECT_LE(err, bound) << "q4_0 weight " << i << " x " << xq4[i] << " d " << d;
  }
  EXPECT_EQ(q4v[64], 0.0f);  // the all-zero block
  EXPECT_NEAR(q4v[130], -40.0f, 40.0f * 0x1p-10f);
  const auto q8v = dequantize(8, data_of(3), xq8.size());
  for (size_t i = 0; i < xq8.size(); ++i)
    EXPECT_LE(std::fabs(q8v[i] - xq8[i]), 0.5f * block_d(8, data_of(3), i / 32) * (1.0f + 0x1p-9f) + 1e-30f) << i;
  const auto q41v = dequantize(3, data_of(4), 256);
  for (size_t i = 0; i < 256; ++i) EXPECT_EQ(q41v[i], scale[i / 64] * float(codes[i]) + bias[i / 64]) << i;
}

TEST(GgufWriter, RejectsBadDeclarationsAndShortData) {
  const std::string dir = test::fresh_dir("gguf-bad");
  {
    Writer w;
    w.add_tensor({"x", TensorType::Q4_0, {48}});  // not a multiple of 32
    EXPECT_FALSE(w.open(dir + "/a.gguf").is_ok());
  }
  {
    Writer w;
    w.add_tensor({"x", TensorType::F32, {4}});
    w.add_tensor({"x", TensorType::F32, {4}});
    EXPECT_FALSE(w.open(dir + "/b.gguf").is_ok());
  }
  {
    Writer w;
    w.add_tensor({std::string(64, 'n'), TensorType::F32, {4}});
    EXPECT_FALSE(w.open(dir + "/c.gguf").is_ok());
  }
  {
    Writer w;
    w.add_u32("k", 1);
    w.add_u32("k", 2);
    EXPECT_FALSE(w.open(dir + "/d.gguf").is_ok());
  }
  {
    Writer w;
    w.add_tensor({"x", TensorType::F32, {4}});
    ASSERT_TRUE(w.open(dir + "/e.gguf").is_ok());
    const float v[5] = {};
    EXPECT_FALSE(w.write(v, 20).is_ok());  // more than declared
    EXPECT_TRUE(w.write(v, 8).is_ok());
    EXPECT_FALSE(w.finish().is_ok());      // 8 of 16 bytes
  }
  {
    Writer w;  // destroyed while open: the partial file is removed
    w.add_tensor({"x", TensorType::F32, {4}});
    ASSERT_TRUE(w.open(dir + "/f.gguf").is_ok());
  }
  EXPECT_FALSE(test::fs::exists(dir + "/f.gguf"));
}

TEST(GgufWriter, HalfRoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);           // tie, to even
  EXPECT_EQ(f32_to_f16(0x1.8p-24f), 0x0002);         // tie, to even
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);    // tie, to even
  EXPECT_EQ(f32_to_f16(1.0f + 0x3p-11f), 0x3c02);    // tie, to even
  EXPECT_EQ(f32_to_f16(1.0f + 0x1.8p-11f), 0x3c01);
  const uint16_t nan = f32_to_f16(NAN);
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x3ff, 0);
  for (uint32_t h = 0; h < 0x7c00; ++h) EXPECT_EQ(f32_to_f16(half_to_float(uint16_t(h))), h);  // every finite half
}

// The tokenizer metadata: Qwen3's pre-tokenizer regex is llama.cpp's "qwen2"; ids the tokenizer
// lacks are "[PAD<id>]" (Unused); special added tokens are Control, others UserDefined.
TEST(GgufVocab, FromTokenizerJson) {
  const std::string dir = test::fresh_dir("gguf-vocab");
  const char* qwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  nlohmann::json split = {{"type", "Split"}, {"pattern", {{"Regex", qwen2}}}, {"behavior", "Isolated"}};
  nlohmann::json tok = {
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"\u0120", 3}}}, {"merges", nlohmann::json::array({nlohmann::json::array({"a", "b"})})}}},
      {"added_tokens", {{{"id", 5}, {"content", "<|im_end|>"}, {"special", true}},
                        {{"id", 6}, {"content", "<think>"}, {"special", false}}}},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, {{"type", "ByteLevel"}}}}}}};
  std::ofstream(dir + "/tokenizer.json") << tok.dump();
  std::ofstream(dir + "/tokenizer_config.json") << R"({"eos_token": "<|im_end|>", "pad_token": "b", "add_bos_token": false})";
  auto v = gguf::read_vocab(dir, 8, {});
  ASSERT_TRUE(v.is_ok()) << v.message();
  EXPECT_EQ(v->pre, "qwen2");
  EXPECT_EQ(v->tokens, (std::vector<std::string>{"a", "b", "ab", "\u0120", "[PAD4]", "<|im_end|>", "<think>", "[PAD7]"}));
  EXPECT_EQ(v->types, (std::vector<int32_t>{1, 1, 1, 1, 5, 3, 4, 5}));
  EXPECT_EQ(v->merges, (std::vector<std::string>{"a b"}));
  EXPECT_EQ(v->eos_id, 5);
  EXPECT_EQ(v->pad_id, 1);
  EXPECT_FALSE(v->add_bos);
  EXPECT_FALSE(gguf::read_vocab(dir, 6, {}).is_ok());  // id 6 outside a vocab of 6

  split["pattern"]["Regex"] = "\\s+";
  tok["pre_tokenizer"]["pretokenizers"][0] = split;
  std::ofstream(dir + "/tokenizer.json") << tok.dump();
  EXPECT_FALSE(gguf::read_vocab(dir, 8, {}).is_ok());  // a pre-tokenizer llama.cpp would not match
}

}  // namespace
}  // namespace lily
