// Fuzz target: config.json validation. Any bytes either fail with a message naming the file or
// give a config whose derived dimensions are usable: the tensor inventory can be built and every
// quantized linear's input splits into whole groups.
#include "fuzz_util.h"
#include "io/checkpoint.h"
#include "io/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lily;
  std::string text(reinterpret_cast<const char*>(data), size);
  auto r = parse_config_json(text, "config.json");
  if (!r.is_ok()) {
    LILY_FUZZ_ASSERT(r.message().rfind("config.json: ", 0) == 0, r.message());
    return 0;
  }
  const ModelConfig& c = r.value();
  LILY_FUZZ_ASSERT(int(c.is_full_attention.size()) == c.num_hidden_layers, "layer_types");
  LILY_FUZZ_ASSERT(!c.eos_token_ids.empty(), "eos");
  (void)c.is_exact_qwen36_35b_a3b();
  (void)c.n_full_attention();
  LILY_FUZZ_ASSERT(c.rotary_dim() > 0 || c.partial_rotary_factor == 0.25f, "rotary_dim");
  LILY_FUZZ_ASSERT(c.gdn_conv_dim() > 0, "gdn_conv_dim");
  for (const auto& e : expected_tensors(c)) {
    for (int64_t d : e.shape) LILY_FUZZ_ASSERT(d > 0, e.name + " has a dimension <= 0: " + shape_str(e.shape));
  }
  return 0;
}
