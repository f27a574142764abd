// Token masks: the fast path (trie walk, string tables) equals the scalar reference (every token fed
// alone through the matcher) at every position of random walks, with loose and tight budgets, on a
// vocabulary drawn from the real Qwen3 tokenizer (and on all of it at a few positions); replies
// generated under the constraint by a random "model" always end in complete output that parses,
// within the token budget.
#include <gtest/gtest.h>

#include <random>

#include "../text/tok_test_util.h"
#include "structured/constraint.h"
#include "server/tool_call_parser.h"
#include "structured/output_grammar.h"

namespace lily::structured {
namespace {

using ojson = nlohmann::ordered_json;

// Every 29th token of the Qwen3 vocabulary, and every token with JSON punctuation, digits,
// backslashes, newlines or bytes of a split UTF-8 character (the interesting ones), plus a stop id.
std::vector<std::string> sampled_vocab(const Tokenizer& tok) {
  std::vector<std::string> out(size_t(tok.vocab_size()) + 1);
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    const std::string* b = tok.token_bytes(id);
    if (!b || b->empty() || tok.is_added(id)) continue;
    bool keep = id % 29 == 0 || b->size() == 1;
    for (unsigned char c : *b) keep = keep || std::string_view("\"{}[]:,\\\n<>/-.0123456789").find(char(c)) != std::string_view::npos || c >= 0xF0;
    if (keep) out[size_t(id)] = *b;
  }
  return out;  // the last id stays empty: the stop token
}

const ojson kSchemas[] = {
    ojson::parse(R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":130},
        "tags":{"type":"array","items":{"type":"string","minLength":1,"maxLength":5},"maxItems":3},"ok":{"type":"boolean"}},
        "required":["name","age","tags"],"additionalProperties":false})"),
    ojson::parse(R"({"anyOf":[{"type":"object","properties":{"a":{"type":"number","minimum":-1,"maximum":1}},"required":["a"]},
        {"type":"object","properties":{"b":{"enum":["x\"y","z"]}},"required":["b"]},{"type":"null"}]})"),
    ojson::parse(R"({"type":"array","items":{"type":"array","items":{"type":"integer"},"maxItems":2},"minItems":1,"maxItems":3})"),
};

std::vector<std::shared_ptr<const Grammar>> test_grammars() {
  std::vector<std::shared_ptr<const Grammar>> out;
  for (const auto& s : kSchemas) {
    OutputSpec spec;
    spec.json = true;
    spec.schema = &s;
    spec.prefix = "\n\n";
    out.push_back(output_grammar(spec).value());
  }
  OutputSpec obj;  // json_object
  obj.json = true;
  out.push_back(output_grammar(obj).value());
  static const ojson params = ojson::parse(R"({"type":"object","properties":{"city":{"type":"string","minLength":2,"maxLength":30},
      "n":{"type":"integer"},"o":{"type":"object","properties":{"k":{"type":"string"}}}},"required":["city"]})");
  OutputSpec tools;
  tools.tools.push_back({"get_weather", &params, true});
  tools.tools.push_back({"free", nullptr, false});
  out.push_back(output_grammar(tools).value());
  return out;
}

std::vector<int32_t> ids_of(std::span<const uint64_t> bits) {
  std::vector<int32_t> out;
  for (size_t w = 0; w < bits.size(); ++w)
    for (uint64_t x = bits[w]; x; x &= x - 1) out.push_back(int32_t(w * 64 + size_t(__builtin_ctzll(x))));
  return out;
}

void expect_same(const Grammar& g, const Position& p, const VocabIndex& v, MaskComputer& mc, int64_t limit, const char* what) {
  std::vector<uint64_t> fast(v.words()), ref(v.words());
  mc.compute(g, p, limit, v.plain(), fast);
  reference_mask(g, p, v, limit, v.plain(), ref);
  if (fast == ref) return;
  const auto a = ids_of(fast), b = ids_of(ref);
  std::vector<int32_t> only_fast, only_ref;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(only_fast));
  std::set_difference(b.begin(), b.end(), a.begin(), a.end(), std::back_inserter(only_ref));
  ADD_FAILURE() << what << " limit " << limit << ": fast mask differs: " << only_fast.size() << " extra (first "
                << (only_fast.empty() ? "-" : ojson(std::string(v.bytes(only_fast[0]))).dump()) << "), " << only_ref.size()
                << " missing (first " << (only_ref.empty() ? "-" : ojson(std::string(v.bytes(only_ref[0]))).dump()) << ")";
}

TEST(TokenMask, FastEqualsReferenceAlongRandomWalks) {
  LILY_NEED_QWEN_TOKENIZER(tok);
  const VocabIndex v(sampled_vocab(*tok));
  MaskComputer mc(v);
  std::mt19937 rng(5);
  int positions = 0;
  for (const auto& g : test_grammars()) {
    for (int walk = 0; walk < 2; ++walk) {
      Position p(*g);
      for (int step = 0; step < 30; ++step) {
        const int64_t mf = p.min_finish(*g);
        for (int64_t limit : {int64_t(1) << 40, mf + 2, mf})
          expect_same(*g, p, v, mc, limit, "walk");
        ++positions;
        std::vector<uint64_t> bits(v.words());
        mc.compute(*g, p, mf + 30, v.plain(), bits);
        const auto ids = ids_of(bits);
        if (ids.empty()) break;
        ASSERT_TRUE(p.advance(*g, v.bytes(ids[rng() % ids.size()])));
      }
    }
  }
  EXPECT_GT(positions, 150);
  EXPECT_GT(mc.stats().table_fast, 0u);  // both paths were exercised
  EXPECT_GT(mc.stats().table_scans, 0u);
  EXPECT_GT(mc.stats().walks, 0u);
}

TEST(TokenMask, FastEqualsReferenceOnTheWholeVocabulary) {
  LILY_NEED_QWEN_TOKENIZER(tok);
  const VocabIndex v(*tok, tok->vocab_size());
  MaskComputer mc(v);
  auto grammars = test_grammars();
  const Grammar& g = *grammars[0];
  for (const char* prefix : {"\n\n", "\n\n{\"name\":\"ab", "\n\n{\"name\":\"abcdefghijk", "\n\n{\"name\":\"a\",\"age\":1",
                             "\n\n{\"name\":\"a\",\"age\":12,\"tags\":[\"x\""}) {
    Position p(g);
    ASSERT_TRUE(p.advance(g, prefix)) << prefix;
    expect_same(g, p, v, mc, int64_t(1) << 40, prefix);
  }
  const Grammar& tools = *grammars.back();
  Position p(tools);
  ASSERT_TRUE(p.advance(tools, "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan"));
  expect_same(tools, p, v, mc, int64_t(1) << 40, "raw text");
}

// A random "model": any allowed token, uniformly; the reply must end complete within max_tokens.
TEST(TokenMask, RandomRepliesAlwaysEndInCompleteOutput) {
  LILY_NEED_QWEN_TOKENIZER(tok);
  auto vocab = std::make_shared<VocabIndex>(sampled_vocab(*tok));
  const int32_t stop = vocab->n_vocab() - 1;
  std::mt19937 rng(9);
  int replies = 0;
  for (const auto& g : test_grammars()) {
    auto spec = std::make_shared<ConstraintSpec>();
    spec->grammar = g;
    spec->vocab = vocab;
    spec->allowed = vocab->plain();
    spec->stop_ids = {stop};
    GrammarConstraint proto(spec);
    for (int max_tokens : {int(proto.reserve()), int(proto.reserve()) + 7, 60}) {
      for (int rep = 0; rep < 4; ++rep) {
        auto c = proto.fresh();
        std::string out;
        bool stopped = false;
        std::vector<uint64_t> bits(vocab->words());
        for (int left = max_tokens; left > 0 && !stopped; --left) {
          ASSERT_TRUE(c->constrains(left));
          c->mask(left, bits);
          const auto ids = ids_of(bits);
          ASSERT_FALSE(ids.empty());
          const int32_t id = ids[rng() % ids.size()];
          ASSERT_TRUE(c->accept(id));
          if (id == stop) stopped = true;
          else out += vocab->bytes(id);
        }
        Position p(*g);
        ASSERT_TRUE(p.advance(*g, out) && p.can_complete(*g)) << "max_tokens " << max_tokens << ": " << ojson(out).dump();
        const size_t start = out.find_first_not_of('\n');
        if (out.find("<tool_call>") == std::string::npos) {
          EXPECT_FALSE(ojson::parse(out.substr(start), nullptr, false).is_discarded()) << out;
        }
        ++replies;
      }
    }
  }
  EXPECT_EQ(replies, 5 * 3 * 4);
}

TEST(TokenMask, ThinkingThenForcedCloseThenGrammar) {
  LILY_NEED_QWEN_TOKENIZER(tok);
  auto vocab = std::make_shared<VocabIndex>(sampled_vocab(*tok));
  auto spec = std::make_shared<ConstraintSpec>();
  spec->grammar = test_grammars()[0];
  spec->vocab = vocab;
  spec->allowed = vocab->plain();
  spec->stop_ids = {vocab->n_vocab() - 1};
  spec->in_think = true;
  spec->think_close = 5;  // any id outside the grammar's bytes will do for the test
  GrammarConstraint c(spec);
  const int reserve = int(c.reserve());
  EXPECT_FALSE(c.constrains(reserve + 1));  // thinking freely
  ASSERT_TRUE(c.accept(100));
  ASSERT_TRUE(c.constrains(reserve));       // only what the JSON needs is left: </think> now
  std::vector<uint64_t> bits(vocab->words());
  c.mask(reserve, bits);
  EXPECT_EQ(ids_of(bits), std::vector<int32_t>{5});
  ASSERT_TRUE(c.accept(5));
  EXPECT_TRUE(c.constrains(reserve - 1));
  spec->think_budget = 2;  // a thinking budget forces </think> after two thinking tokens
  GrammarConstraint b(spec);
  ASSERT_TRUE(b.accept(100));
  EXPECT_FALSE(b.constrains(1000));
  ASSERT_TRUE(b.accept(101));
  EXPECT_TRUE(b.constrains(1000));
}

// tool_choice auto: free text until the trigger token, then one call that follows the schema,
// then free again (a second call is constrained too).
TEST(TokenMask, TriggeredCallsFollowTheSchema) {
  LILY_NEED_QWEN_TOKENIZER(tok);
  auto vocab = std::make_shared<VocabIndex>(sampled_vocab(*tok));
  int32_t trigger = -1;  // any id outside the trie stands for the <tool_call> token
  for (int32_t id = 1; id < vocab->n_vocab() - 1 && trigger < 0; ++id)
    if (!vocab->in_trie(id)) trigger = id;
  const ojson tools = ojson::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string","maxLength":10},"n":{"type":"integer","minimum":1,"maximum":3}},"required":["city","n"]}}}])");
  OutputSpec os;
  os.tools.push_back({"get_weather", &tools[0]["function"]["parameters"], true});
  os.after_trigger = true;
  auto spec = std::make_shared<ConstraintSpec>();
  spec->grammar = output_grammar(os).value();
  spec->vocab = vocab;
  spec->allowed = vocab->plain();
  spec->stop_ids = {vocab->n_vocab() - 1};
  spec->trigger = trigger;
  GrammarConstraint c(spec);
  std::mt19937 rng(3);
  std::vector<uint64_t> bits(vocab->words());
  std::string reply;
  for (int call = 0; call < 2; ++call) {
    for (int i = 0; i < 5; ++i) {  // free text: not constrained
      ASSERT_FALSE(c.constrains(1000));
      ASSERT_TRUE(c.accept(int32_t('a' + i)));
      reply += vocab->bytes(int32_t('a' + i));
    }
    ASSERT_TRUE(c.accept(trigger));
    reply += "<tool_call>";
    int steps = 0;
    while (c.constrains(1000)) {
      ASSERT_LT(++steps, 400);
      c.mask(1000, bits);
      const auto ids = ids_of(bits);
      ASSERT_FALSE(ids.empty());
      const int32_t id = ids[rng() % ids.size()];
      ASSERT_TRUE(c.accept(id));
      reply += vocab->bytes(id);
    }
    ASSERT_TRUE(reply.ends_with("</function>\n</tool_call>")) << reply;
  }
  ToolCallParser p(tools, true, 1);
  ReplyDelta d;
  p.push(reply, d);
  p.flush(d);
  const auto calls = d.calls();
  ASSERT_EQ(calls.size(), 2u) << reply;
  for (const auto& call : calls) {
    const auto args = nlohmann::json::parse(call.arguments);
    ASSERT_TRUE(args["city"].is_string()) << call.arguments;
    EXPECT_LE(args["city"].get<std::string>().size(), 40u);
    ASSERT_TRUE(args["n"].is_number_integer()) << call.arguments;
    EXPECT_TRUE(args["n"] >= 1 && args["n"] <= 3) << call.arguments;
  }
}

}  // namespace
}  // namespace lily::structured
