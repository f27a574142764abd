// Fuzz target: JSON Schema → grammar (structured outputs). Byte 0 picks the use (a response_format
// schema, with or without a think-block prefix, or a strict tool's parameters); the rest is the
// schema as JSON. A schema that compiles must give a grammar whose properties hold along a random
// byte walk: every position can still complete (min_finish finite, 0 exactly when complete), some
// byte shortens the completion by one and none by more, the shortest completion reached byte by
// byte parses as JSON (response_format); and the fast token mask equals the scalar reference over
// a small vocabulary at each position.
#include "fuzz_util.h"
#include "core/json_depth.h"
#include "structured/output_grammar.h"
#include "structured/token_mask.h"

namespace {

using namespace lily::structured;

const VocabIndex& small_vocab() {
  static const VocabIndex v = [] {
    std::vector<std::string> toks;
    for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, char(b)));
    for (const char* t : {"\"", "\":", "\",\"", "{\"", "\"}", "[", "],", "true", "false", "null", "-1", "0.", "12", "ab",
                          "\\n", "\\u00", "é", "\xe2\x82", "\xac\"", "<tool_call>", "\n<function=", ">\n", "<parameter=",
                          "\n</parameter>\n", "</function>\n</tool_call>", "\n\n", " ", "x\"}", "\"]}", "1,", "e5"})
      toks.push_back(t);
    return VocabIndex(toks);
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (lily::json_nesting_depth(text) > 64) return 0;
  const auto schema = nlohmann::ordered_json::parse(text, nullptr, false);
  if (schema.is_discarded()) return 0;
  OutputSpec spec;
  if (mode & 1) {
    spec.tools.push_back({"f", &schema, true});
  } else {
    spec.json = true;
    spec.schema = &schema;
    if (mode & 2) spec.prefix = "\n\n";
  }
  auto g = output_grammar(spec);
  if (!g) {
    LILY_FUZZ_ASSERT(!g.message().empty(), "an error without a message");
    return 0;
  }
  const Grammar& gr = *g.value();
  Position pos(gr);
  MaskComputer mc(small_vocab());
  uint32_t rng = 0x9e3779b9u ^ uint32_t(size);
  for (int step = 0; step < 24 && !pos.dead(); ++step) {
    const int64_t mf = pos.min_finish(gr);
    LILY_FUZZ_ASSERT(mf < kInf, "a position that cannot complete");
    LILY_FUZZ_ASSERT((mf == 0) == pos.can_complete(gr), "min_finish 0 iff complete");
    std::vector<int> ok;
    int shorter = -1;
    for (int b = 0; b < 256; ++b) {
      Position n = pos;
      if (!n.advance(gr, std::string(1, char(b)))) continue;
      const int64_t after = n.min_finish(gr);
      LILY_FUZZ_ASSERT(after >= mf - 1, "a byte shortened the completion by more than one");
      if (after == mf - 1 && shorter < 0) shorter = b;
      ok.push_back(b);
    }
    LILY_FUZZ_ASSERT(mf == 0 || shorter >= 0, "no byte shortens the completion");
    if (step % 6 == 0) {
      const VocabIndex& v = small_vocab();
      std::vector<uint64_t> fast(v.words()), ref(v.words());
      for (int64_t limit : {mf, mf + 3, int64_t(1) << 40}) {
        mc.compute(gr, pos, limit, v.plain(), fast);
        reference_mask(gr, pos, v, limit, v.plain(), ref);
        LILY_FUZZ_ASSERT(fast == ref, "fast mask differs from the reference");
      }
    }
    if (ok.empty()) break;
    rng = rng * 1103515245u + 12345u;
    LILY_FUZZ_ASSERT(pos.advance(gr, std::string(1, char(ok[(rng >> 8) % ok.size()]))), "advance");
  }
  // The shortest completion from where the walk stopped.
  std::string out;
  for (int guard = 0; guard < 4096 && !pos.dead() && pos.min_finish(gr) > 0; ++guard) {
    const int64_t mf = pos.min_finish(gr);
    bool moved = false;
    for (int b = 0; b < 256 && !moved; ++b) {
      Position n = pos;
      if (n.advance(gr, std::string(1, char(b))) && n.min_finish(gr) == mf - 1) {
        pos = n;
        moved = true;
      }
    }
    LILY_FUZZ_ASSERT(moved, "the shortest completion is not reachable");
  }
  LILY_FUZZ_ASSERT(pos.can_complete(gr), "completion did not complete");
  return 0;
}
