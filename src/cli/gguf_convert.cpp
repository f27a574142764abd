// MLX checkpoint -> llama.cpp qwen35moe GGUF (see gguf_convert.h). What llama.cpp expects, and
// so what this writes (model-spec §1.2 names on the left):
//   embed_tokens / lm_head / norm      -> token_embd, output, output_norm
//   input_layernorm, post_attention_layernorm -> blk.N.attn_norm, blk.N.post_attention_norm
//   self_attn.{q,k,v,o}_proj, q_norm, k_norm  -> blk.N.attn_{q,k,v,output}, attn_{q,k}_norm
//   linear_attn.in_proj_qkv, in_proj_z       -> blk.N.attn_qkv, blk.N.attn_gate
//   linear_attn.in_proj_b, in_proj_a         -> blk.N.ssm_beta, blk.N.ssm_alpha
//   linear_attn.conv1d [C,K,1]               -> blk.N.ssm_conv1d (ne {K, C}, F32)
//   linear_attn.A_log                        -> blk.N.ssm_a = −exp(A_log)
//   linear_attn.dt_bias, norm, out_proj      -> blk.N.ssm_dt.bias, ssm_norm, ssm_out
//   mlp.gate, shared_expert_gate             -> blk.N.ffn_gate_inp, ffn_gate_inp_shexp (1-D, F32)
//   mlp.switch_mlp.{gate,up,down}_proj       -> blk.N.ffn_{gate,up,down}_exps (ne {in, out, E})
//   mlp.shared_expert.{gate,up,down}_proj    -> blk.N.ffn_{gate,up,down}_shexp
// Norm gains are written as stored: MLX already holds 1 + w for the zero-centred norms, which
// is what llama.cpp multiplies by; the DeltaNet norm is plain in both. llama.cpp broadcasts the
// 2 value heads of a key head as tiles (v-head h uses k-head h mod n_k) where the checkpoint
// groups them (h uses h div 2), so every per-v-head row, column and value is reordered.
#include "cli/gguf_convert.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/gguf_vocab.h"
#include "io/gguf_writer.h"
#include "model/weights.h"

namespace lily::cli {
namespace {

using gguf::TensorInfo;
using gguf::TensorType;
constexpr const char* kArch = "qwen35moe";

// Writes a tensor's bytes into out (info.nbytes() of them).
using Fill = std::function<void(uint8_t* out)>;
struct Planned {
  TensorInfo info;
  Fill fill;
};

// fp32 weights of row r: scale·q + bias (codes low bits first within each u32 word).
void dequant_row(const QWeight& q, int r, float* out) {
  const uint32_t* words = q.codes + size_t(r) * q.words_per_row();
  const bf16* s = q.scales + size_t(r) * q.groups_per_row();
  const bf16* b = q.biases + size_t(r) * q.groups_per_row();
  const int per_word = 32 / q.bits, words_per_group = q.group_size / per_word;
  const uint32_t mask = (1u << q.bits) - 1;
  for (int g = 0; g < q.groups_per_row(); ++g) {
    const float sc = bf16_to_f32(s[g]), bi = bf16_to_f32(b[g]);
    for (int k = 0; k < words_per_group; ++k) {
      uint32_t word = *words++;
      for (int j = 0; j < per_word; ++j, word >>= q.bits) *out++ = sc * float(word & mask) + bi;
    }
  }
}

std::vector<float> to_f32(const bf16* p, int n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = bf16_to_f32(p[i]);
  return v;
}

// Position n of llama.cpp's tiled v-head order holds head tiled_src(n) of the grouped order.
int tiled_src(int n, int n_k, int per_k) { return (n % n_k) * per_k + n / n_k; }

// Index map over n_heads·head_dim entries (after `offset` unmoved ones) into tiled v-head order.
std::vector<int> v_head_order(int offset, int n_v, int n_k, int head_dim) {
  std::vector<int> src;
  for (int i = 0; i < offset; ++i) src.push_back(i);
  for (int n = 0; n < n_v; ++n)
    for (int e = 0; e < head_dim; ++e) src.push_back(offset + tiled_src(n, n_k, n_v / n_k) * head_dim + e);
  return src;
}

class Converter {
 public:
  Converter(const ModelWeights& w, TensorType wt) : w_(w), cfg_(w.cfg), wt_(wt) {}

  Status plan_all() {
    const ModelConfig& c = cfg_;
    LILY_TRY(matrix("token_embd.weight", w_.embed, wt_));
    for (int i = 0; i < c.num_hidden_layers; ++i) LILY_TRY(plan_layer(i));
    vec("output_norm.weight", to_f32(w_.final_norm, c.hidden_size));
    return matrix("output.weight", w_.lm_head, wt_);
  }
  const std::vector<Planned>& plan() const { return plan_; }

 private:
  // A quantized linear [rows, cols] as a tensor with ne {cols, ...}; row_src/col_src reorder
  // (output row r is source row row_src[r]; output column c is source column col_src[c]).
  Status matrix(const std::string& name, const QWeight& q, TensorType type, std::vector<uint64_t> ne = {},
                std::vector<int> row_src = {}, std::vector<int> col_src = {}) {
    if (ne.empty()) ne = {uint64_t(q.cols), uint64_t(q.rows)};
    uint64_t n = 1;
    for (uint64_t d : ne) n *= d;
    if (ne[0] != uint64_t(q.cols) || n != uint64_t(q.rows) * uint64_t(q.cols))
      return errorf("gguf: {}: shape does not match the [{}, {}] weight", name, q.rows, q.cols);
    if (type == TensorType::Q4_1) LILY_TRY(check_q4_1(name, q, col_src));
    const TensorInfo info{name, type, ne};
    const size_t rb = gguf::row_bytes(type, q.cols);
    plan_.push_back({info, [q, type, rb, row_src, col_src](uint8_t* out) {
                       ThreadPool::global().parallel_for(size_t(q.rows), 16, [&](size_t r0, size_t r1) {
                         Row row(q.cols);
                         for (size_t r = r0; r < r1; ++r)
                           row.emit(q, row_src.empty() ? int(r) : row_src[r], col_src, type, out + r * rb);
                       });
                     }});
    return Status::ok();
  }

  // Q4_1 keeps each source group's (scale, bias): a 4-bit weight whose column order keeps groups whole.
  static Status check_q4_1(const std::string& name, const QWeight& q, const std::vector<int>& col_src) {
    if (q.bits != 4) return errorf("gguf: {}: Q4_1 needs a 4-bit weight, this one has {} bits", name, q.bits);
    for (size_t c = 0; c < col_src.size(); ++c)
      if (col_src[c] % q.group_size != int(c % size_t(q.group_size)))
        return errorf("gguf: {}: the column order splits a group of {}", name, q.group_size);
    return Status::ok();
  }

  // One output row: dequantized and re-encoded (F32/F16/Q4_0/Q8_0), or codes copied (Q4_1).
  struct Row {
    explicit Row(int cols) : src(size_t(cols)), x(size_t(cols)), codes(size_t(cols)) {}
    std::vector<float> src, x, scale, bias;
    std::vector<uint8_t> codes;
    void emit(const QWeight& q, int r, const std::vector<int>& col_src, TensorType type, uint8_t* out) {
      const int cols = q.cols;
      if (type != TensorType::Q4_1) {
        dequant_row(q, r, src.data());
        for (int c = 0; c < cols; ++c) x[size_t(c)] = src[size_t(col_src.empty() ? c : col_src[size_t(c)])];
        gguf::pack_row(type, x.data(), cols, out);
        return;
      }
      scale.resize(size_t(q.groups_per_row()));
      bias.resize(scale.size());
      for (int c = 0; c < cols; ++c) {
        const int sc = col_src.empty() ? c : col_src[size_t(c)];
        codes[size_t(c)] = uint8_t(q.code(r, sc));
        if (c % q.group_size == 0) {
          scale[size_t(c / q.group_size)] = bf16_to_f32(q.scales[size_t(r) * q.groups_per_row() + sc / q.group_size]);
          bias[size_t(c / q.group_size)] = bf16_to_f32(q.biases[size_t(r) * q.groups_per_row() + sc / q.group_size]);
        }
      }
      gguf::pack_q4_1(codes.data(), scale.data(), bias.data(), cols, q.group_size, out);
    }
  };

  void vec(const std::string& name, std::vector<float> v, std::vector<uint64_t> ne = {}) {
    if (ne.empty()) ne = {uint64_t(v.size())};
    plan_.push_back({{name, TensorType::F32, ne}, [v](uint8_t* out) { std::memcpy(out, v.data(), v.size() * 4); }});
  }

  Status plan_layer(int i) {
    const LayerWeights& L = w_.layers[size_t(i)];
    const ModelConfig& c = cfg_;
    const std::string p = fmt::format("blk.{}.", i);
    vec(p + "attn_norm.weight", to_f32(L.input_norm, c.hidden_size));
    if (L.full_attention) {
      const AttnWeights& a = L.attn;
      LILY_TRY(matrix(p + "attn_q.weight", a.q_proj, wt_));  // per head [q | gate], as llama.cpp views it
      LILY_TRY(matrix(p + "attn_k.weight", a.k_proj, wt_));
      LILY_TRY(matrix(p + "attn_v.weight", a.v_proj, wt_));
      LILY_TRY(matrix(p + "attn_output.weight", a.o_proj, wt_));
      vec(p + "attn_q_norm.weight", to_f32(a.q_norm, c.head_dim));
      vec(p + "attn_k_norm.weight", to_f32(a.k_norm, c.head_dim));
    } else {
      LILY_TRY(plan_gdn(p, L.gdn));
    }
    vec(p + "post_attention_norm.weight", to_f32(L.post_norm, c.hidden_size));
    return plan_moe(p, L.moe);
  }

  Status plan_gdn(const std::string& p, const GdnWeights& g) {
    const ModelConfig& c = cfg_;
    const int nk = c.linear_num_key_heads, nv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
    const int K = c.linear_conv_kernel_dim, C = c.gdn_conv_dim(), key2 = 2 * c.gdn_key_dim();
    const std::vector<int> qkv_rows = v_head_order(key2, nv, nk, dv), v_rows = v_head_order(0, nv, nk, dv);
    const std::vector<int> heads = v_head_order(0, nv, nk, 1);
    LILY_TRY(matrix(p + "attn_qkv.weight", g.in_proj_qkv, wt_, {}, qkv_rows));
    LILY_TRY(matrix(p + "attn_gate.weight", g.in_proj_z, wt_, {}, v_rows));
    std::vector<float> conv(static_cast<size_t>(C) * K), a(static_cast<size_t>(nv)), dt(static_cast<size_t>(nv));
    for (int ch = 0; ch < C; ++ch)
      for (int k = 0; k < K; ++k) conv[size_t(ch) * K + k] = bf16_to_f32(g.conv1d[size_t(qkv_rows[size_t(ch)]) * K + k]);
    for (int n = 0; n < nv; ++n) {
      a[size_t(n)] = -std::exp(g.A_log[size_t(heads[size_t(n)])]);
      dt[size_t(n)] = bf16_to_f32(g.dt_bias[heads[size_t(n)]]);
    }
    vec(p + "ssm_conv1d.weight", std::move(conv), {uint64_t(K), uint64_t(C)});
    vec(p + "ssm_dt.bias", std::move(dt));
    vec(p + "ssm_a", std::move(a));
    LILY_TRY(matrix(p + "ssm_beta.weight", g.in_proj_b, wt_, {}, heads));
    LILY_TRY(matrix(p + "ssm_alpha.weight", g.in_proj_a, wt_, {}, heads));
    vec(p + "ssm_norm.weight", to_f32(g.norm, dv));
    return matrix(p + "ssm_out.weight", g.out_proj, wt_, {}, {}, v_rows);
  }

  Status plan_moe(const std::string& p, const MoeWeights& m) {
    const ModelConfig& c = cfg_;
    const uint64_t H = uint64_t(c.hidden_size), I = uint64_t(c.moe_intermediate_size), E = uint64_t(c.num_experts);
    // The 8-bit router: Q8_0 (8.5 bits) beside Q4_0 weights; exact F32 beside Q4_1.
    const TensorType router = wt_ == TensorType::Q4_1 ? TensorType::F32 : TensorType::Q8_0;
    LILY_TRY(matrix(p + "ffn_gate_inp.weight", m.router, router));
    LILY_TRY(matrix(p + "ffn_gate_exps.weight", m.experts_gate, wt_, {H, I, E}));
    LILY_TRY(matrix(p + "ffn_up_exps.weight", m.experts_up, wt_, {H, I, E}));
    LILY_TRY(matrix(p + "ffn_down_exps.weight", m.experts_down, wt_, {I, H, E}));
    std::vector<float> shexp_gate(static_cast<size_t>(H));
    dequant_row(m.shared_expert_gate, 0, shexp_gate.data());
    vec(p + "ffn_gate_inp_shexp.weight", std::move(shexp_gate));
    LILY_TRY(matrix(p + "ffn_gate_shexp.weight", m.shared_gate, wt_));
    LILY_TRY(matrix(p + "ffn_up_shexp.weight", m.shared_up, wt_));
    return matrix(p + "ffn_down_shexp.weight", m.shared_down, wt_);
  }

  const ModelWeights& w_;
  const ModelConfig& cfg_;
  TensorType wt_;
  std::vector<Planned> plan_;
};

// text_config.rope_parameters.mrope_section (or rope_scaling's), padded to 4; Qwen3.5's
// [11, 11, 10] when absent, as llama.cpp's converter does.
std::vector<int32_t> mrope_sections(const std::string& model_dir) {
  std::ifstream f(std::filesystem::path(model_dir) / "config.json");
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  std::vector<int32_t> s{11, 11, 10};
  if (!j.is_discarded() && j.contains("text_config") && j["text_config"].is_object())
    for (const char* key : {"rope_parameters", "rope_scaling"}) {
      const auto& tc = j["text_config"];
      if (tc.contains(key) && tc[key].is_object() && tc[key].contains("mrope_section") && tc[key]["mrope_section"].is_array()) {
        s.clear();
        for (const auto& v : tc[key]["mrope_section"])
          if (v.is_number_integer()) s.push_back(v.get<int32_t>());
        break;
      }
    }
  s.resize(4, 0);
  return s;
}

Status check_supported(const ModelConfig& c) {
  if (c.linear_key_head_dim != c.linear_value_head_dim)
    return errorf("gguf: llama.cpp's qwen35moe has one DeltaNet head size (ssm.state_size); key {} != value {}",
                  c.linear_key_head_dim, c.linear_value_head_dim);
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
    return errorf("gguf: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
                  c.linear_num_value_heads, c.linear_num_key_heads);
  if (!c.norm_topk_prob) return Status::error("gguf: llama.cpp's qwen35moe always renormalizes the top-k (norm_topk_prob)");
  if (!c.attn_output_gate) return Status::error("gguf: llama.cpp's qwen35moe needs the gated q_proj (attn_output_gate)");
  return Status::ok();
}

void add_model_metadata(gguf::Writer& w, const ModelConfig& c, const GgufConvertOptions& o) {
  const std::string a = kArch;
  w.add_string("general.architecture", a);
  w.add_string("general.name", "lily gguf of " + std::filesystem::path(o.model_dir).filename().string());
  w.add_u32("general.file_type", o.weight_type == TensorType::Q4_1 ? 3u : 2u);  // llama_ftype MOSTLY_Q4_1 / Q4_0
  w.add_u32("general.quantization_version", 2);
  const std::pair<const char*, int> counts[] = {
      {"block_count", c.num_hidden_layers},
      {"context_length", c.max_position_embeddings},
      {"embedding_length", c.hidden_size},
      {"attention.head_count", c.num_attention_heads},
      {"attention.head_count_kv", c.num_key_value_heads},
      {"attention.key_length", c.head_dim},
      {"attention.value_length", c.head_dim},
      {"rope.dimension_count", c.rotary_dim()},
      {"expert_count", c.num_experts},
      {"expert_used_count", c.num_experts_per_tok},
      {"expert_feed_forward_length", c.moe_intermediate_size},
      {"expert_shared_feed_forward_length", c.shared_expert_intermediate_size},
      {"ssm.conv_kernel", c.linear_conv_kernel_dim},
      {"ssm.state_size", c.linear_key_head_dim},       // the DeltaNet head size
      {"ssm.group_count", c.linear_num_key_heads},
      {"ssm.time_step_rank", c.linear_num_value_heads},
      {"ssm.inner_size", c.gdn_value_dim()},
  };
  for (const auto& [key, v] : counts) w.add_u32(a + "." + key, uint32_t(v));
  w.add_f32(a + ".attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  w.add_f32(a + ".rope.freq_base", float(c.rope_theta));
  w.add_array_i32(a + ".rope.dimension_sections", mrope_sections(o.model_dir));
  std::vector<bool> recurrent;
  for (bool full : c.is_full_attention) recurrent.push_back(!full);
  w.add_array_bool(a + ".attention.recurrent_layers", recurrent);
}

}  // namespace

Status convert_to_gguf(const GgufConvertOptions& o) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto secs = [&] { return std::chrono::duration<double>(clock::now() - t0).count(); };
  LILY_ASSIGN_OR_RETURN(auto ck, Checkpoint::open(o.model_dir));
  LILY_ASSIGN_OR_RETURN(ModelWeights mw, ModelWeights::from_checkpoint(*ck));
  const ModelConfig& c = mw.cfg;
  LILY_TRY(check_supported(c));
  auto vocab = gguf::read_vocab(o.tokenizer_dir, c.vocab_size, c.eos_token_ids);
  if (!vocab.is_ok()) return errorf("gguf: tokenizer in {}: {}", o.tokenizer_dir, vocab.message());

  gguf::Writer w;
  add_model_metadata(w, c, o);
  gguf::add_vocab(w, *vocab);
  Converter conv(mw, o.weight_type);
  LILY_TRY(conv.plan_all());
  uint64_t total = 0;
  for (const auto& t : conv.plan()) {
    w.add_tensor(t.info);
    total += t.info.nbytes();
  }
  const std::string tmp = o.out_path + ".partial";
  LILY_TRY(w.open(tmp));
  fmt::print(stderr, "gguf: {} tensors, {:.2f} GB of tensor data, {} weights, {} threads -> {}\n", conv.plan().size(),
             total / 1e9, gguf::tensor_type_name(o.weight_type), ThreadPool::global().size(), o.out_path);
  // Fill one buffer while the other is written.
  std::vector<uint8_t> bufs[2];
  std::future<Status> writing;
  uint64_t done = 0;
  int last_pct = -1;
  for (size_t i = 0; i < conv.plan().size(); ++i) {
    const Planned& t = conv.plan()[i];
    std::vector<uint8_t>& buf = bufs[i % 2];
    buf.resize(t.info.nbytes());
    t.fill(buf.data());
    if (writing.valid()) LILY_TRY(writing.get());
    writing = std::async(std::launch::async, [&w, &buf] { return w.write(buf.data(), buf.size()); });
    done += buf.size();
    const int pct = int(100 * done / std::max<uint64_t>(total, 1));
    if (pct / 10 != last_pct / 10) fmt::print(stderr, "gguf: {:3d}% ({:.0f} s)\n", pct, secs());
    last_pct = pct;
  }
  if (writing.valid()) LILY_TRY(writing.get());
  LILY_TRY(w.finish());
  std::error_code ec;
  std::filesystem::rename(tmp, o.out_path, ec);
  if (ec) return errorf("gguf: renaming {} to {}: {}", tmp, o.out_path, ec.message());
  fmt::print(stderr, "gguf: wrote {} in {:.1f} s\n", o.out_path, secs());
  return Status::ok();
}

}  // namespace lily::cli
