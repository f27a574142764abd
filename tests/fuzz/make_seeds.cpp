// Writes the seed inputs that lily's own writers produce, for the committed corpus:
// small safetensors files (SafeTensorsWriter), config.json files (synth presets and a micro
// config) and whole micro checkpoints (config + safetensors [+ index]) for checkpoint_fuzz.
// Usage: fuzz_make_seeds <corpus dir>   (tests/fuzz/corpus; run by hand, output committed)
#include <filesystem>
#include <fstream>

#include "fuzz_util.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/synth.h"

namespace fs = std::filesystem;
using namespace lily;
using ojson = nlohmann::ordered_json;

namespace {

constexpr std::string_view kPartSep = "\n#--lily-fuzz-part--#\n";  // as in checkpoint_fuzz.cpp

void check(const Status& s) {
  if (!s.is_ok()) fuzz::die(s.message());
}

void write(const fs::path& p, std::string_view bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

// Writes entries (with bytes i*7+k for determinism) to path and returns the file's bytes.
std::string write_safetensors(const std::string& path, const std::vector<SafeTensorsWriter::Entry>& entries,
                              const std::map<std::string, std::string>& meta = {}) {
  auto w = SafeTensorsWriter::create(path, entries, meta);
  check(w.status());
  for (size_t i = 0; i < entries.size(); ++i) {
    size_t n = dtype_size(entries[i].dtype);
    for (int64_t d : entries[i].shape) n *= size_t(d);
    if (n == 0) continue;  // the writer counts empty tensors as written
    std::string bytes(n, '\0');
    for (size_t k = 0; k < n; ++k) bytes[k] = char(i * 7 + k);
    check(w.value()->write_next(bytes.data(), bytes.size()));
  }
  check(w.value()->finish());
  return fuzz::read_text(path);
}

// A config of the qwen3_5_moe family small enough that a whole checkpoint is ~20 KB.
ojson micro_config() {
  auto r = synth_config_json("tiny", 1);
  check(r.status());
  ojson c = r.value();
  ojson& t = c["text_config"];
  t["hidden_size"] = 32;
  t["num_hidden_layers"] = 2;
  t["vocab_size"] = 16;
  t["num_experts"] = 2;
  t["num_experts_per_tok"] = 1;
  t["moe_intermediate_size"] = 32;
  t["shared_expert_intermediate_size"] = 32;
  t["num_attention_heads"] = 2;
  t["num_key_value_heads"] = 1;
  t["head_dim"] = 16;
  t["linear_num_key_heads"] = 1;
  t["linear_num_value_heads"] = 2;
  t["linear_key_head_dim"] = 16;
  t["linear_value_head_dim"] = 16;
  t["linear_conv_kernel_dim"] = 4;
  t["layer_types"] = {"linear_attention", "full_attention"};
  t["full_attention_interval"] = 2;
  t["rope_parameters"]["mrope_section"] = {1, 1, 0};
  t["eos_token_id"] = 2;
  c["eos_token_id"] = {1, 2};
  ojson q = {{"group_size", 32}, {"bits", 4}, {"mode", "affine"}};
  for (int i = 0; i < 2; ++i) {
    const std::string m = "language_model.model.layers." + std::to_string(i) + ".mlp.";
    q[m + "gate"] = {{"group_size", 32}, {"bits", 8}};
    q[m + "shared_expert_gate"] = {{"group_size", 32}, {"bits", 8}};
  }
  c["quantization"] = q;
  c["quantization_config"] = q;
  c.erase("lily_synthetic");
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) fuzz::die("usage: fuzz_make_seeds <corpus dir>");
  const fs::path corpus = argv[1];
  const fs::path tmp = fs::temp_directory_path() / ("lily-fuzz-seeds-" + std::to_string(::getpid()));
  fs::create_directories(tmp);

  // safetensors: a few dtypes and shapes, metadata, empty and scalar tensors.
  using E = SafeTensorsWriter::Entry;
  write(corpus / "safetensors" / "two_tensors.safetensors",
        write_safetensors((tmp / "a").string(), {E{"w", DType::F32, {2, 3}}, E{"b", DType::BF16, {4}}}));
  write(corpus / "safetensors" / "metadata.safetensors",
        write_safetensors((tmp / "b").string(), {E{"x.weight", DType::U32, {1, 2}}}, {{"format", "mlx"}}));
  write(corpus / "safetensors" / "empty_and_scalar.safetensors",
        write_safetensors((tmp / "c").string(),
                          {E{"empty", DType::I64, {0, 5}}, E{"scalar", DType::U8, {}}, E{"h", DType::F16, {3}}}));
  write(corpus / "safetensors" / "no_tensors.safetensors", write_safetensors((tmp / "d").string(), {}));

  // config.json: the synth presets and the micro config.
  for (const char* preset : {"tiny", "small", "qwen3.6-35b-a3b"}) {
    auto c = synth_config_json(preset, 0);
    check(c.status());
    write(corpus / "config" / (std::string(preset) + ".json"), c.value().dump(1));
  }
  ojson micro = micro_config();
  write(corpus / "config" / "micro.json", micro.dump(1));
  auto parsed = parse_config_json(micro.dump(), "micro");
  check(parsed.status());

  // checkpoint: every tensor of the micro config's inventory, single file and with an index.
  std::vector<E> entries;
  ojson weight_map = ojson::object();
  for (const auto& e : expected_tensors(parsed.value())) {
    entries.push_back(E{e.name, e.dtype, e.shape});
    weight_map[e.name] = "model.safetensors";
  }
  std::string st = write_safetensors((tmp / "model.safetensors").string(), entries);
  std::string cfg = micro.dump();
  write(corpus / "checkpoint" / "micro_single", cfg + std::string(kPartSep) + st);
  ojson index = {{"metadata", {{"total_size", st.size()}}}, {"weight_map", weight_map}};
  write(corpus / "checkpoint" / "micro_indexed", cfg + std::string(kPartSep) + st + std::string(kPartSep) + index.dump());
  // And check that it really opens (the seed must be valid).
  const fs::path ck = tmp / "ck";
  fs::create_directories(ck);
  write(ck / "config.json", cfg);
  write(ck / "model.safetensors", st);
  auto opened = Checkpoint::open(ck.string());
  check(opened.status());

  fs::remove_all(tmp);
  std::printf("seeds written under %s (checkpoint %zu bytes)\n", corpus.c_str(), cfg.size() + st.size());
  return 0;
}
