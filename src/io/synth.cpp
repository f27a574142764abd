// `lily synth` weights: codes and group scales are drawn directly (no float weights, no
// quantization pass) so the 19 GB preset is generated faster than the disk writes it. Every
// 1 MiB chunk has its own PRNG stream seeded by (seed, tensor, chunk), so the bytes do not depend
// on the thread count; generation of the next 64 MiB overlaps the write of the previous one.
//
// Dequantized distribution: a code is floor((a+b)/2) of two uniform codes (a triangular,
// roughly gaussian shape, like min/max-quantized gaussian rows), scale = sigma/std(code) with a
// per-group jitter, bias = -scale*mean(code) + small offset, so each row has mean ~0 and std
// ~sigma. sigma = 1/sqrt(in) for input projections (unit-variance outputs) and 0.5/sqrt(in) for
// output projections, which keeps the residual stream bounded over 40 layers.
#include "io/synth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>

#include <spdlog/spdlog.h>

#include "core/bf16.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"

namespace lily {

namespace {

namespace fs = std::filesystem;

constexpr size_t kChunkBytes = size_t(1) << 20;   // one PRNG stream per chunk
constexpr size_t kBufferBytes = size_t(64) << 20;  // generated in parallel, then written

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t mix(uint64_t a, uint64_t b, uint64_t c = 0) {
  uint64_t x = a ^ (b * 0xd1342543de82ef95ull) ^ (c * 0x9e3779b97f4a7c15ull);
  splitmix64(x);
  return splitmix64(x);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// xoshiro256+: fast, good enough upper bits for codes and uniforms.
struct Rng {
  uint64_t s[4];
  explicit Rng(uint64_t seed) {
    for (auto& v : s) v = splitmix64(seed);
  }
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t next() {
    const uint64_t r = s[0] + s[3], t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
  }
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
};

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}
bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Target std of a quantized module's dequantized weights.
float weight_sigma(const std::string& module, int64_t n_in) {
  const float inv = 1.0f / std::sqrt(float(n_in));
  if (ends_with(module, "embed_tokens")) return 1.0f;
  if (ends_with(module, "lm_head")) return 2.5f * inv;       // logits std ~2.5
  if (ends_with(module, "mlp.gate")) return 2.0f * inv;      // router logits std ~2: spread-out routing
  if (contains(module, "down_proj") || contains(module, "out_proj") || contains(module, "o_proj")) return 0.5f * inv;
  return inv;
}

// Mean and std of floor((a+b)/2) for a, b uniform over 2^bits codes.
void code_moments(int bits, double& mean, double& sd) {
  const double n = double(1 << bits), var_u = (n * n - 1) / 12;
  mean = (n - 1) / 2 - 0.25;
  sd = std::sqrt(var_u / 2 + 1.0 / 16);
}

struct GroupParams {
  std::vector<bf16> scales, biases;  // [rows, n_groups]
};

GroupParams make_group_params(uint64_t mseed, int bits, float sigma, size_t rows, size_t n_groups) {
  GroupParams g;
  g.scales.resize(rows * n_groups);
  g.biases.resize(rows * n_groups);
  double cmean, csd;
  code_moments(bits, cmean, csd);
  const size_t kRowsPerBlock = 1024;
  const size_t n_blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  ThreadPool::global().parallel_for(n_blocks, 1, [&](size_t b0, size_t b1) {
    for (size_t b = b0; b < b1; ++b) {
      Rng rng(mix(mseed, 0x5ca1e5, b));
      const size_t r1 = std::min(rows, (b + 1) * kRowsPerBlock);
      for (size_t i = b * kRowsPerBlock * n_groups; i < r1 * n_groups; ++i) {
        float scale = round_bf16(float(sigma / csd) * (0.75f + 0.5f * rng.uniform()));
        float bias = float(-scale * cmean) + sigma * 0.2f * (rng.uniform() - 0.5f);
        g.scales[i] = f32_to_bf16(scale);
        g.biases[i] = f32_to_bf16(bias);
      }
    }
  });
  return g;
}

// Fills words [w0, w0+n) of a packed-code tensor; the chunk containing w0 starts at w0.
void fill_codes_chunk(uint32_t* out, size_t n_words, uint64_t chunk_seed, int bits) {
  const uint64_t mask = bits == 4 ? 0x7777777777777777ull : 0x7f7f7f7f7f7f7f7full;
  Rng rng(chunk_seed);
  size_t i = 0;
  for (; i + 2 <= n_words; i += 2) {
    const uint64_t a = rng.next(), b = rng.next();
    const uint64_t v = (a & b) + (((a ^ b) >> 1) & mask);  // per-lane floor((a+b)/2), no carries
    std::memcpy(out + i, &v, 8);
  }
  if (i < n_words) {
    const uint64_t a = rng.next(), b = rng.next();
    const uint64_t v = (a & b) + (((a ^ b) >> 1) & mask);
    out[i] = uint32_t(v);
  }
}

// Small non-quantized tensors (norms, conv, A_log, dt_bias).
std::vector<uint8_t> make_plain(const ExpectedTensor& e, uint64_t tseed) {
  Rng rng(tseed);
  int64_t n = 1;
  for (int64_t d : e.shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  const std::string& name = e.name;
  for (auto& x : v) {
    const float u = rng.uniform();
    if (ends_with(name, "A_log")) x = std::log(1.0f + 15.0f * u);          // A = exp(A_log) in [1, 16)
    else if (ends_with(name, "dt_bias")) x = 0.6f * (u - 0.5f);            // small
    else if (ends_with(name, "conv1d.weight")) x = 1.0f * (u - 0.5f);      // |w| < 0.5
    else x = 1.0f + 0.2f * (u - 0.5f);                                     // norm gains ~1 (1+w stored)
  }
  std::vector<uint8_t> out(size_t(n) * dtype_size(e.dtype));
  if (e.dtype == DType::F32) {
    std::memcpy(out.data(), v.data(), out.size());
  } else {
    for (size_t i = 0; i < v.size(); ++i) {
      bf16 b = f32_to_bf16(v[i]);
      std::memcpy(out.data() + 2 * i, &b.bits, 2);
    }
  }
  return out;
}

// Writes in order through one background writer thread while the caller generates the next
// buffer; at most one write is in flight.
class AsyncSink {
 public:
  explicit AsyncSink(SafeTensorsWriter& w) : w_(w) {
    for (auto& b : bufs_) b.resize(kBufferBytes);
  }
  ~AsyncSink() { (void)wait(); }
  uint8_t* buffer() { return bufs_[cur_].data(); }
  // Hands off buffer() with n bytes as the next part of the current tensor.
  Status submit(size_t n) {
    LILY_TRY(wait());
    const uint8_t* p = bufs_[cur_].data();
    pending_ = std::async(std::launch::async, [this, p, n] { return w_.write_part(p, n); });
    cur_ ^= 1;
    return Status::ok();
  }
  Status write_now(const void* p, size_t n) {
    LILY_TRY(wait());
    return w_.write_next(p, n);
  }
  Status wait() {
    if (!pending_.valid()) return Status::ok();
    return pending_.get();
  }

 private:
  SafeTensorsWriter& w_;
  std::vector<uint8_t> bufs_[2];
  int cur_ = 0;
  std::future<Status> pending_;
};

Status write_codes(AsyncSink& sink, const ExpectedTensor& e, uint64_t mseed) {
  size_t n_words = 1;
  for (int64_t d : e.shape) n_words *= size_t(d);
  const size_t total = n_words * 4, words_per_chunk = kChunkBytes / 4;
  for (size_t off = 0; off < total; off += kBufferBytes) {
    const size_t n = std::min(kBufferBytes, total - off);
    uint32_t* buf = reinterpret_cast<uint32_t*>(sink.buffer());
    const size_t first_chunk = off / kChunkBytes, n_chunks = (n + kChunkBytes - 1) / kChunkBytes;
    ThreadPool::global().parallel_for(n_chunks, 1, [&](size_t c0, size_t c1) {
      for (size_t c = c0; c < c1; ++c) {
        const size_t w0 = c * words_per_chunk, w1 = std::min(n / 4, w0 + words_per_chunk);
        fill_codes_chunk(buf + w0, w1 - w0, mix(mseed, 0xc0de, first_chunk + c), e.bits);
      }
    });
    LILY_TRY(sink.submit(n));
  }
  return Status::ok();
}

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return errorf("{}: write failed", path);
  return Status::ok();
}

Status copy_file(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec) return errorf("copying {} to {}: {}", from, to, ec.message());
  return Status::ok();
}

// tokenizer.json, tokenizer_config.json (Qwen3, from the npm test oracle) and the chat template.
Status write_tokenizer_files(const std::string& dir) {
  LILY_ASSIGN_OR_RETURN(std::string root, lily_repo_root());
  LILY_ASSIGN_OR_RETURN(std::string tok, qwen3_tokenizer_dir());
  tok += "/";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    struct stat sb {};
    if (::stat((tok + f).c_str(), &sb) != 0)
      return errorf("{}{}: missing; run scripts/setup.sh (it installs the Qwen3 tokenizer)", tok, f);
    LILY_TRY(copy_file(tok + f, dir + "/" + f));
  }
  return copy_file(root + "/assets/qwen3.6-chat_template.jinja", dir + "/chat_template.jinja");
}

Result<SynthStats> write_weights(const ModelConfig& cfg, uint64_t seed, const std::string& path) {
  std::vector<ExpectedTensor> exp = expected_tensors(cfg);
  std::sort(exp.begin(), exp.end(), [](const auto& a, const auto& b) { return a.name < b.name; });  // as MLX writes
  std::vector<SafeTensorsWriter::Entry> entries;
  for (const auto& e : exp) entries.push_back({e.name, e.dtype, e.shape});
  const auto t0 = std::chrono::steady_clock::now();
  LILY_ASSIGN_OR_RETURN(auto writer, SafeTensorsWriter::create(path, entries, {{"format", "mlx"}}));
  SynthStats stats;
  {
    AsyncSink sink(*writer);
    std::map<std::string, GroupParams> groups;  // module -> scales/biases, until its weight is written
    for (const auto& e : exp) {
      size_t nbytes = dtype_size(e.dtype);
      for (int64_t d : e.shape) nbytes *= size_t(d);
      stats.bytes += nbytes;
      if (e.bits == 0) {
        std::vector<uint8_t> v = make_plain(e, mix(seed, fnv1a(e.name)));
        LILY_TRY(sink.write_now(v.data(), v.size()));
        continue;
      }
      const std::string module = e.name.substr(0, e.name.rfind('.'));
      const uint64_t mseed = mix(seed, fnv1a(module));
      if (ends_with(e.name, ".weight")) {
        LILY_TRY(write_codes(sink, e, mseed));
        groups.erase(module);
        continue;
      }
      auto it = groups.find(module);
      if (it == groups.end()) {
        const size_t n_groups = size_t(e.shape.back());
        const size_t rows = nbytes / 2 / n_groups;
        const int64_t n_in = int64_t(n_groups) * cfg.quant_for(module).group_size;
        it = groups.emplace(module, make_group_params(mseed, e.bits, weight_sigma(module, n_in), rows, n_groups)).first;
      }
      const auto& v = ends_with(e.name, ".scales") ? it->second.scales : it->second.biases;
      LILY_TRY(sink.write_now(v.data(), v.size() * 2));
    }
    LILY_TRY(sink.wait());
  }
  LILY_TRY(writer->finish());
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace

Result<SynthStats> write_synthetic_checkpoint(const SynthOptions& opts) {
  LILY_ASSIGN_OR_RETURN(nlohmann::ordered_json cj, synth_config_json(opts.preset, opts.seed));
  const std::string text = cj.dump(2) + "\n";
  // The config goes through the same parser as a real checkpoint's.
  LILY_ASSIGN_OR_RETURN(ModelConfig cfg, parse_config_json(text, opts.out_dir + "/config.json"));
  std::error_code ec;
  fs::create_directories(opts.out_dir, ec);
  if (ec) return errorf("{}: cannot create directory: {}", opts.out_dir, ec.message());
  if (opts.preset != "qwen3.6-35b-a3b") LILY_TRY(write_tokenizer_files(opts.out_dir));
  LILY_TRY(write_file(opts.out_dir + "/config.json", text));
  LILY_ASSIGN_OR_RETURN(SynthStats stats, write_weights(cfg, opts.seed, opts.out_dir + "/model.safetensors"));
  spdlog::info("synth {} seed {}: wrote {:.2f} GB of weights to {} in {:.1f} s ({:.2f} GB/s)", opts.preset, opts.seed,
               stats.bytes / 1e9, opts.out_dir, stats.seconds, stats.gb_per_s());
  return stats;
}

Result<std::string> ensure_demo_checkpoint() {
  std::string dir;
  if (const char* e = std::getenv("LILY_DEMO_DIR"); e && *e) {
    dir = e;
  } else {
    LILY_ASSIGN_OR_RETURN(std::string root, lily_repo_root());
    dir = root + "/demo/small-seed0";
  }
  auto complete = [](const std::string& d) {
    struct stat sb {};
    return ::stat((d + "/config.json").c_str(), &sb) == 0 && ::stat((d + "/model.safetensors").c_str(), &sb) == 0;
  };
  if (complete(dir)) return dir;
  std::error_code ec;
  if (fs::exists(dir, ec)) return errorf("{}: exists but is not a complete checkpoint; remove it to recreate the demo", dir);
  fs::create_directories(fs::path(dir).parent_path(), ec);
  const std::string tmp = dir + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  spdlog::info("creating the demo checkpoint (random weights, small preset, seed 0) in {}", dir);
  auto r = write_synthetic_checkpoint({"small", 0, tmp});
  if (!r.is_ok()) {
    fs::remove_all(tmp, ec);
    return r.status();
  }
  fs::rename(tmp, dir, ec);
  if (ec) {
    fs::remove_all(tmp, ec);
    if (complete(dir)) return dir;  // another process got there first
    return errorf("{}: cannot move the demo checkpoint into place", dir);
  }
  return dir;
}

}  // namespace lily
