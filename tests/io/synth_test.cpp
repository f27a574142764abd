// `lily synth` checkpoints: they pass the checkpoint check, are byte-deterministic per seed, and
// their dequantized weights have the statistics a forward pass needs (finite, rows centred with
// the intended spread, norms near 1, routing that spreads tokens over the experts).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>

#include "core/bf16.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/synth.h"
#include "io_test_util.h"

namespace lily {
namespace {

using namespace lily::test;

// Dequantizes row `r` of a quantized module (MLX affine, model-spec §1.3): w = scale*q + bias.
std::vector<float> dequant_row(const Checkpoint& ck, const std::string& module, int bits, int64_t r, int64_t n_in) {
  const TensorView& w = ck.tensor(module + ".weight");
  const TensorView& s = ck.tensor(module + ".scales");
  const TensorView& b = ck.tensor(module + ".biases");
  const int64_t packed = w.shape.back(), n_groups = s.shape.back(), group = n_in / n_groups;
  const auto* words = reinterpret_cast<const uint32_t*>(w.data) + r * packed;
  const auto* sc = reinterpret_cast<const uint16_t*>(s.data) + r * n_groups;
  const auto* bi = reinterpret_cast<const uint16_t*>(b.data) + r * n_groups;
  const int per_word = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  std::vector<float> out(static_cast<size_t>(n_in));
  for (int64_t c = 0; c < n_in; ++c) {
    uint32_t q = (words[c / per_word] >> (bits * (c % per_word))) & mask;
    int64_t g = c / group;
    out[size_t(c)] = bf16_to_f32(bf16{sc[g]}) * float(q) + bf16_to_f32(bf16{bi[g]});
  }
  return out;
}

std::vector<float> plain_values(const TensorView& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype == DType::F32) {
      std::memcpy(&v[i], t.data + 4 * i, 4);
    } else {
      uint16_t u;
      std::memcpy(&u, t.data + 2 * i, 2);
      v[i] = bf16_to_f32(bf16{u});
    }
  }
  return v;
}

std::unique_ptr<Checkpoint> open_tiny() {
  auto r = Checkpoint::open(tiny_dir());
  EXPECT_TRUE(r.is_ok()) << r.message();
  return r.is_ok() ? std::move(r.value()) : nullptr;
}

TEST(Synth, TinyRoundTripsThroughCheckpointOpen) {
  auto ck = open_tiny();
  ASSERT_TRUE(ck);
  const ModelConfig& c = ck->config();
  // The preset, as the brief fixes it.
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.num_hidden_layers, 4);
  EXPECT_EQ(c.is_full_attention, (std::vector<bool>{false, false, false, true}));
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.linear_num_key_heads, 2);
  EXPECT_EQ(c.linear_num_value_heads, 4);
  EXPECT_EQ(c.linear_key_head_dim, 128);
  EXPECT_EQ(c.linear_value_head_dim, 128);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 64);
  EXPECT_EQ(c.shared_expert_intermediate_size, 64);
  // eos ids from the tokenizer: <|im_end|> 151645 and <|endoftext|> 151643 (Qwen3's ids).
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{151645, 151643}));
  EXPECT_EQ(c.quant_for("language_model.model.layers.2.mlp.gate").bits, 8);
  EXPECT_EQ(ck->files().tensors().size(), expected_tensors(c).size());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
    EXPECT_TRUE(fs::exists(tiny_dir() + "/" + f)) << f;
  auto cj = nlohmann::json::parse(read_all(tiny_dir() + "/config.json"));
  EXPECT_TRUE(is_synthetic_config(cj));
  EXPECT_EQ(cj["lily_synthetic"]["preset"], "tiny");
  EXPECT_EQ(cj["quantization"], cj["quantization_config"]);
  // The chat template is the repo's asset, byte for byte.
  auto root = lily_repo_root();
  ASSERT_TRUE(root.is_ok()) << root.message();
  EXPECT_EQ(read_all(tiny_dir() + "/chat_template.jinja"), read_all(*root + "/assets/qwen3.6-chat_template.jinja"));
}

TEST(Synth, SameSeedSameBytesDifferentSeedDifferentBytes) {
  std::string a = fresh_dir("det-a"), b = fresh_dir("det-b"), c = fresh_dir("det-c");
  ASSERT_TRUE(write_synthetic_checkpoint({"tiny", 7, a}).is_ok());
  ASSERT_TRUE(write_synthetic_checkpoint({"tiny", 7, b}).is_ok());
  ASSERT_TRUE(write_synthetic_checkpoint({"tiny", 8, c}).is_ok());
  const std::string fa = read_all(a + "/model.safetensors"), fb = read_all(b + "/model.safetensors"),
                    fc = read_all(c + "/model.safetensors");
  ASSERT_GT(fa.size(), 1000000u);
  EXPECT_TRUE(fa == fb) << "same seed must give the same bytes";
  ASSERT_EQ(fa.size(), fc.size());
  // Different seeds differ throughout, not only in a corner: compare every tensor.
  auto sa = SafeTensors::open_file(a + "/model.safetensors");
  auto sc = SafeTensors::open_file(c + "/model.safetensors");
  ASSERT_TRUE(sa.is_ok() && sc.is_ok());
  for (const auto& [name, t] : (*sa)->tensors()) {
    const TensorView* u = (*sc)->find(name);
    ASSERT_TRUE(u);
    EXPECT_NE(std::memcmp(t.data, u->data, t.nbytes), 0) << name << " is identical across seeds";
  }
}

TEST(Synth, BytesDoNotDependOnThreadCount) {
  std::string a = fresh_dir("thr-a"), b = fresh_dir("thr-b");
  ThreadPool::set_global_threads(1);
  ASSERT_TRUE(write_synthetic_checkpoint({"tiny", 11, a}).is_ok());
  ThreadPool::set_global_threads(3);
  ASSERT_TRUE(write_synthetic_checkpoint({"tiny", 11, b}).is_ok());
  ThreadPool::set_global_threads(0);  // back to the default
  EXPECT_TRUE(read_all(a + "/model.safetensors") == read_all(b + "/model.safetensors"));
}

TEST(Synth, UnknownPresetIsAnError) {
  auto r = write_synthetic_checkpoint({"huge", 0, fresh_dir("nopreset")});
  ASSERT_FALSE(r.is_ok());
  expect_contains(r.message(), {"unknown preset \"huge\"", "tiny", "small", "qwen3.6-35b-a3b"});
}

TEST(Synth, FullPresetConfigIsTheExactShape) {
  auto cj = synth_config_json("qwen3.6-35b-a3b", 3);
  ASSERT_TRUE(cj.is_ok()) << cj.message();
  auto c = parse_config_json(cj->dump(), "config.json");
  ASSERT_TRUE(c.is_ok()) << c.message();
  EXPECT_TRUE(c->is_exact_qwen36_35b_a3b());
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{248046, 248044}));
  // Size of the weights per model-spec: about 19.4-19.5 GB.
  size_t bytes = 0;
  for (const auto& e : expected_tensors(*c)) {
    size_t n = dtype_size(e.dtype);
    for (int64_t d : e.shape) n *= size_t(d);
    bytes += n;
  }
  EXPECT_GT(bytes, size_t(19.2e9));
  EXPECT_LT(bytes, size_t(19.7e9));
}

// The tokenizer a checkpoint is served and benchmarked with: its own; for a synthetic checkpoint
// without one (the full-size preset's config, written alone here), the bundled Qwen3 tokenizer; for
// any other checkpoint without one, an error naming the folder.
TEST(Synth, CheckpointTokenizerDir) {
  auto own = checkpoint_tokenizer_dir(tiny_dir());
  ASSERT_TRUE(own.is_ok()) << own.message();
  EXPECT_EQ(*own, tiny_dir());

  const std::string full = fresh_dir("full-config-only");
  auto cj = synth_config_json("qwen3.6-35b-a3b", 3);
  ASSERT_TRUE(cj.is_ok()) << cj.message();
  std::ofstream(full + "/config.json") << cj->dump();
  auto qwen = checkpoint_tokenizer_dir(full);
  ASSERT_TRUE(qwen.is_ok()) << qwen.message();
  auto want = qwen3_tokenizer_dir();
  ASSERT_TRUE(want.is_ok()) << want.message();
  EXPECT_EQ(*qwen, *want);
  EXPECT_TRUE(std::ifstream(*qwen + "/tokenizer.json").good());

  const std::string real = fresh_dir("real-config-only");
  auto plain = *cj;
  plain.erase("lily_synthetic");
  std::ofstream(real + "/config.json") << plain.dump();
  auto none = checkpoint_tokenizer_dir(real);
  ASSERT_FALSE(none.is_ok());
  expect_contains(none.message(), {real, "no tokenizer.json"});
}

TEST(Synth, SmallPresetConfig) {
  auto cj = synth_config_json("small", 0);
  ASSERT_TRUE(cj.is_ok()) << cj.message();
  auto c = parse_config_json(cj->dump(), "config.json");
  ASSERT_TRUE(c.is_ok()) << c.message();
  EXPECT_EQ(c->hidden_size, 512);
  EXPECT_EQ(c->num_hidden_layers, 8);
  EXPECT_EQ(c->n_full_attention(), 2);
  EXPECT_TRUE(c->is_full_attention[3] && c->is_full_attention[7]);
  EXPECT_EQ(c->num_attention_heads, 8);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->linear_num_key_heads, 4);
  EXPECT_EQ(c->linear_num_value_heads, 8);
  EXPECT_EQ(c->linear_key_head_dim, 64);
  EXPECT_EQ(c->num_experts, 32);
  EXPECT_EQ(c->num_experts_per_tok, 4);
  EXPECT_EQ(c->moe_intermediate_size, 256);
  EXPECT_EQ(c->shared_expert_intermediate_size, 256);
}

// Every quantized weight: finite, each row centred, spread ~ k/sqrt(in) with k in a sane band.
TEST(Synth, QuantizedWeightStatistics) {
  auto ck = open_tiny();
  ASSERT_TRUE(ck);
  std::mt19937 rng(1);
  for (const auto& e : expected_tensors(ck->config())) {
    if (e.bits == 0 || e.name.size() < 7 || e.name.compare(e.name.size() - 7, 7, ".weight") != 0) continue;
    const std::string module = e.name.substr(0, e.name.size() - 7);
    const int64_t n_in = e.shape.back() * 32 / e.bits;
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < e.shape.size(); ++i) rows *= e.shape[i];
    double sum = 0, sum2 = 0;
    int64_t n = 0;
    const int64_t n_rows = std::min<int64_t>(rows, 64);
    for (int64_t k = 0; k < n_rows; ++k) {
      const int64_t r = rows <= 64 ? k : int64_t(rng() % uint64_t(rows));
      for (float v : dequant_row(*ck, module, e.bits, r, n_in)) {
        ASSERT_TRUE(std::isfinite(v)) << module;
        sum += v;
        sum2 += double(v) * v;
        ++n;
      }
    }
    const double mean = sum / n, sd = std::sqrt(sum2 / n - mean * mean);
    const bool is_embed = module.find("embed_tokens") != std::string::npos;
    const double k = is_embed ? sd : sd * std::sqrt(double(n_in));  // spread relative to 1/sqrt(in)
    EXPECT_LT(std::abs(mean), 0.05 * sd + 4 * sd / std::sqrt(double(n))) << module << " is not centred";
    EXPECT_GT(k, 0.2) << module << " sd " << sd;
    EXPECT_LT(k, 4.0) << module << " sd " << sd;
  }
}

TEST(Synth, PlainTensorsInRange) {
  auto ck = open_tiny();
  ASSERT_TRUE(ck);
  for (const auto& e : expected_tensors(ck->config())) {
    if (e.bits != 0) continue;
    std::vector<float> v = plain_values(ck->tensor(e.name));
    float lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
    const std::string& n = e.name;
    if (n.find("A_log") != std::string::npos) {
      EXPECT_GE(lo, 0.0f) << n;  // A = exp(A_log) in [1, 16]
      EXPECT_LE(hi, std::log(16.0f)) << n;
    } else if (n.find("dt_bias") != std::string::npos || n.find("conv1d") != std::string::npos) {
      EXPECT_LT(std::max(-lo, hi), 1.0f) << n;
      EXPECT_GT(hi - lo, 0.05f) << n << " is degenerate";
    } else {  // norm gains (stored 1+w) and the GDN norm weight
      EXPECT_GT(lo, 0.8f) << n;
      EXPECT_LT(hi, 1.2f) << n;
    }
  }
}

// Tokens embedded, RMS-normalised and routed by layer 0's router: different tokens pick
// different experts, and every expert gets some tokens.
TEST(Synth, RoutingIsSpreadOut) {
  auto ck = open_tiny();
  ASSERT_TRUE(ck);
  const ModelConfig& c = ck->config();
  const std::string emb = "language_model.model.embed_tokens", router = "language_model.model.layers.0.mlp.gate";
  std::vector<std::vector<float>> w(size_t(c.num_experts));
  for (int e = 0; e < c.num_experts; ++e) w[size_t(e)] = dequant_row(*ck, router, 8, e, c.hidden_size);
  std::mt19937 rng(5);
  std::vector<int> top1_count(size_t(c.num_experts)), topk_count(size_t(c.num_experts));
  double logit_sd_sum = 0;
  const int n_tok = 400;
  for (int t = 0; t < n_tok; ++t) {
    std::vector<float> x = dequant_row(*ck, emb, 4, int64_t(rng() % 151643u), c.hidden_size);
    double ms = 0;
    for (float v : x) ms += double(v) * v;
    const float inv = float(1.0 / std::sqrt(ms / x.size() + 1e-6));
    std::vector<std::pair<float, int>> logits;
    double s = 0, s2 = 0;
    for (int e = 0; e < c.num_experts; ++e) {
      double acc = 0;
      for (size_t i = 0; i < x.size(); ++i) acc += double(w[size_t(e)][i]) * x[i] * inv;
      logits.push_back({float(acc), e});
      s += acc;
      s2 += acc * acc;
    }
    logit_sd_sum += std::sqrt(s2 / c.num_experts - (s / c.num_experts) * (s / c.num_experts));
    std::sort(logits.begin(), logits.end(), [](auto a, auto b) { return a.first > b.first; });
    top1_count[size_t(logits[0].second)]++;
    for (int k = 0; k < c.num_experts_per_tok; ++k) topk_count[size_t(logits[size_t(k)].second)]++;
  }
  const double mean_sd = logit_sd_sum / n_tok;
  EXPECT_GT(mean_sd, 0.5) << "router logits too flat";
  EXPECT_LT(mean_sd, 10.0) << "router logits too peaked";
  for (int e = 0; e < c.num_experts; ++e) {
    EXPECT_GT(topk_count[size_t(e)], 0) << "expert " << e << " never chosen";
    EXPECT_LT(top1_count[size_t(e)], n_tok / 2) << "expert " << e << " takes most tokens";
  }
}

// One MoE block of layer 0 computed from the dequantized weights (model-spec §1.4.3): routed
// experts (softmax, top-k, renormalised) plus the sigmoid-gated shared expert. Its output must be
// a modest fraction of the residual it is added to: if every block (attention/DeltaNet and MoE,
// 2 per layer) adds an independent ~r·|x|, 80 blocks grow the residual by sqrt(1 + 80 r²), which
// stays under ~4x for r < 0.45.
TEST(Synth, MoeBlockKeepsResidualBounded) {
  auto ck = open_tiny();
  ASSERT_TRUE(ck);
  const ModelConfig& c = ck->config();
  const int H = c.hidden_size, I = c.moe_intermediate_size, S = c.shared_expert_intermediate_size, E = c.num_experts;
  const std::string L = "language_model.model.layers.0.mlp.";
  auto matvec = [&](const std::string& module, int bits, int64_t row0, int n_out, int n_in, const std::vector<float>& x) {
    std::vector<float> y(static_cast<size_t>(n_out));
    for (int o = 0; o < n_out; ++o) {
      std::vector<float> w = dequant_row(*ck, module, bits, row0 + o, n_in);
      double acc = 0;
      for (int i = 0; i < n_in; ++i) acc += double(w[size_t(i)]) * x[size_t(i)];
      y[size_t(o)] = float(acc);
    }
    return y;
  };
  auto silu = [](float v) { return v / (1.0f + std::exp(-v)); };
  auto rms = [](const std::vector<float>& v) {
    double s = 0;
    for (float a : v) s += double(a) * a;
    return std::sqrt(s / v.size());
  };
  std::vector<float> gain = plain_values(ck->tensor("language_model.model.layers.0.post_attention_layernorm.weight"));
  std::mt19937 rng(9);
  double ratio_sum = 0;
  const int n_tok = 12;
  for (int t = 0; t < n_tok; ++t) {
    std::vector<float> x = dequant_row(*ck, "language_model.model.embed_tokens", 4, int64_t(rng() % 151643u), H);
    const double inv = 1.0 / std::sqrt(rms(x) * rms(x) + 1e-6);
    std::vector<float> h(static_cast<size_t>(H));
    for (int i = 0; i < H; ++i) h[size_t(i)] = float(x[size_t(i)] * inv * gain[size_t(i)]);
    std::vector<float> logits = matvec(L + "gate", 8, 0, E, H, h);
    std::vector<int> order(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) order[size_t(e)] = e;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
    double z = 0;
    for (int k = 0; k < c.num_experts_per_tok; ++k) z += std::exp(double(logits[size_t(order[size_t(k)])] - logits[size_t(order[0])]));
    std::vector<float> out(static_cast<size_t>(H), 0.0f);
    for (int k = 0; k < c.num_experts_per_tok; ++k) {
      const int e = order[size_t(k)];
      const double p = std::exp(double(logits[size_t(e)] - logits[size_t(order[0])])) / z;
      std::vector<float> g = matvec(L + "switch_mlp.gate_proj", 4, int64_t(e) * I, I, H, h);
      std::vector<float> u = matvec(L + "switch_mlp.up_proj", 4, int64_t(e) * I, I, H, h);
      for (int i = 0; i < I; ++i) g[size_t(i)] = silu(g[size_t(i)]) * u[size_t(i)];
      std::vector<float> d = matvec(L + "switch_mlp.down_proj", 4, int64_t(e) * H, H, I, g);
      for (int i = 0; i < H; ++i) out[size_t(i)] += float(p * d[size_t(i)]);
    }
    std::vector<float> g = matvec(L + "shared_expert.gate_proj", 4, 0, S, H, h);
    std::vector<float> u = matvec(L + "shared_expert.up_proj", 4, 0, S, H, h);
    for (int i = 0; i < S; ++i) g[size_t(i)] = silu(g[size_t(i)]) * u[size_t(i)];
    std::vector<float> d = matvec(L + "shared_expert.down_proj", 4, 0, H, S, g);
    const float gate = 1.0f / (1.0f + std::exp(-matvec(L + "shared_expert_gate", 8, 0, 1, H, h)[0]));
    for (int i = 0; i < H; ++i) out[size_t(i)] += gate * d[size_t(i)];
    for (float v : out) ASSERT_TRUE(std::isfinite(v));
    ratio_sum += rms(out) / rms(x);
  }
  const double r = ratio_sum / n_tok;
  std::printf("MoE block: rms(out)/rms(residual) = %.3f\n", r);
  EXPECT_GT(r, 0.05) << "MoE block contributes almost nothing";
  EXPECT_LT(r, 0.45) << "MoE block output too large relative to the residual";
}

}  // namespace
}  // namespace lily
