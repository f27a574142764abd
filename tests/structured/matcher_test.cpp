// The grammar matcher against oracles written independently of it: integer and decimal bounds
// checked by enumeration and strtod, strings by a code-point count, object/array shapes by
// hand-written accept/reject lists, unsupported keywords by name, and the budget invariant (a
// position's min_finish is exactly the length of the shortest completion the matcher accepts,
// checked byte by byte).
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <set>

#include "structured/json_schema.h"
#include "structured/matcher.h"
#include "structured/output_grammar.h"

namespace lily::structured {
namespace {

using ojson = nlohmann::ordered_json;

std::shared_ptr<const Grammar> schema_grammar(const std::string& schema_text, std::string* err = nullptr) {
  const ojson schema = ojson::parse(schema_text);
  OutputSpec spec;
  spec.json = true;
  spec.schema = &schema;
  auto g = output_grammar(spec);
  if (err) *err = g ? "" : g.message();
  return g ? g.value() : nullptr;
}

// The text is a complete output: every byte accepted and the output may end there.
bool complete(const Grammar& g, const std::string& text) {
  Position p(g);
  return p.advance(g, text) && p.can_complete(g);
}
bool viable(const Grammar& g, const std::string& text) {
  Position p(g);
  return p.advance(g, text);
}

TEST(Matcher, IntegerBoundsMatchEnumeration) {
  auto g = schema_grammar(R"({"type":"integer","minimum":-15,"maximum":107})");
  ASSERT_TRUE(g);
  std::set<std::string> valid;  // the oracle: every JSON integer text in range
  for (int v = -15; v <= 107; ++v) valid.insert(std::to_string(v));
  valid.insert("-0");
  std::vector<std::string> probes = {"", "-", "00", "01", "-01", "1.0", "1e2", "+1", "108", "-16", "1000", "--1"};
  for (int v = -300; v <= 300; ++v) probes.push_back(std::to_string(v));
  for (const auto& s : probes) {
    EXPECT_EQ(complete(*g, s), valid.count(s) > 0) << s;
    bool prefix_of_valid = false;
    for (const auto& v : valid) prefix_of_valid = prefix_of_valid || v.rfind(s, 0) == 0;
    EXPECT_EQ(viable(*g, s), prefix_of_valid) << "prefix " << s;
  }
}

TEST(Matcher, DecimalBoundsMatchStrtod) {
  auto g = schema_grammar(R"({"type":"number","minimum":0.5,"exclusiveMaximum":2.25})");
  ASSERT_TRUE(g);
  std::mt19937 rng(7);
  for (int i = 0; i < 3000; ++i) {
    std::string s = (rng() % 4 == 0 ? "-" : "") + std::to_string(rng() % 4);
    if (rng() % 3) {
      s += ".";
      for (unsigned k = 0, n = 1 + rng() % 4; k < n; ++k) s += char('0' + rng() % 10);
    }
    const double v = std::strtod(s.c_str(), nullptr);
    EXPECT_EQ(complete(*g, s), v >= 0.5 && v < 2.25) << s;
  }
  EXPECT_TRUE(complete(*g, "0.5"));
  EXPECT_FALSE(complete(*g, "2.25"));
  EXPECT_TRUE(complete(*g, "2.249999"));
  EXPECT_FALSE(complete(*g, "2.2499999"));  // 7 decimals: beyond the grammar's 6
  EXPECT_FALSE(viable(*g, "3"));
  EXPECT_TRUE(viable(*g, "0."));
}

TEST(Matcher, StringLengthCountsCodePoints) {
  auto g = schema_grammar(R"({"type":"string","minLength":2,"maxLength":3})");
  ASSERT_TRUE(g);
  for (const char* ok : {R"("ab")", R"("abc")", R"("a\n")", "\"\xc3\xa9\xe2\x82\xac\"", "\"\xf0\x9f\x98\x80z\"",
                         R"("\u00e9\u20ac")", R"("\"\\")"})
    EXPECT_TRUE(complete(*g, ok)) << ok;
  for (const char* bad : {R"("a")", R"("abcd")", R"("\ud83d\ude00")", "\"a\xc0\xaf\"", "\"a\xed\xa0\x80\"",
                          "\"a\x01\"", R"("a\x")", "\"ab", "ab", "\"a\xff\""})
    EXPECT_FALSE(complete(*g, bad)) << bad;
}

TEST(Matcher, ObjectPropertiesInSchemaOrder) {
  auto g = schema_grammar(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"boolean"},
      "c":{"enum":["x","y z"]}},"required":["a","c"],"additionalProperties":false})");
  ASSERT_TRUE(g);
  for (const char* ok : {R"({"a":1,"c":"x"})", R"({"a":-2,"b":true,"c":"y z"})"}) EXPECT_TRUE(complete(*g, ok)) << ok;
  for (const char* bad : {R"({"c":"x","a":1})", R"({"a":1})", R"({"a":1,"c":"z"})", R"({ "a":1,"c":"x"})",
                          R"({"a":1,"c":"x","d":1})", R"({"a":1,"b":null,"c":"x"})", R"({"a":1,,"c":"x"})"})
    EXPECT_FALSE(complete(*g, bad)) << bad;
}

TEST(Matcher, ArraysAnyOfAndRecursiveRefs) {
  auto g = schema_grammar(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}},
      "anyOf":[{"$ref":"#/$defs/node"},{"type":"array","items":{"type":"string"},"minItems":1,"maxItems":2}]})");
  ASSERT_TRUE(g);
  for (const char* ok : {R"({"v":1})", R"({"v":1,"kids":[]})", R"({"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]})",
                         R"(["a"])", R"(["a","b"])"})
    EXPECT_TRUE(complete(*g, ok)) << ok;
  for (const char* bad : {R"({"v":1,"kids":[{"v":2},{"v":3},{"v":4}]})", R"([])", R"(["a","b","c"])", R"({"kids":[]})",
                          R"([1])"})
    EXPECT_FALSE(complete(*g, bad)) << bad;
}

TEST(Matcher, FreeObjectsAndNullable) {
  auto g = schema_grammar(R"({"type":"object","additionalProperties":{"type":"integer","nullable":true}})");
  ASSERT_TRUE(g);
  EXPECT_TRUE(complete(*g, R"({})"));
  EXPECT_TRUE(complete(*g, R"({"a":1,"b":null})"));
  EXPECT_FALSE(complete(*g, R"({"a":"x"})"));
  OutputSpec any;
  any.json = true;
  auto obj = output_grammar(any);  // response_format json_object
  ASSERT_TRUE(obj);
  EXPECT_TRUE(complete(*obj.value(), R"({"k":[1,{"x":null},"s",true,-0.5]})"));
  EXPECT_FALSE(complete(*obj.value(), R"([1])"));
  EXPECT_FALSE(complete(*obj.value(), R"({"k": 1})"));  // no free whitespace
}

TEST(Matcher, UnsupportedKeywordsAreNamedWithTheirPlace) {
  std::string err;
  EXPECT_FALSE(schema_grammar(R"({"type":"object","properties":{"a":{"type":"string","pattern":"^x"},
      "b":{"oneOf":[{"type":"string"}]}},"minProperties":1})", &err));
  EXPECT_NE(err.find("'pattern' at #/properties/a"), std::string::npos) << err;
  EXPECT_NE(err.find("'oneOf' at #/properties/b"), std::string::npos) << err;
  EXPECT_NE(err.find("'minProperties' at #"), std::string::npos) << err;
  EXPECT_FALSE(schema_grammar(R"({"type":"array","uniqueItems":true})", &err));
  EXPECT_NE(err.find("uniqueItems"), std::string::npos) << err;
  EXPECT_FALSE(schema_grammar(R"({"$ref":"http://example.com/s.json"})", &err));
  EXPECT_NE(err.find("only references into the same schema"), std::string::npos) << err;
  EXPECT_FALSE(schema_grammar(R"({"type":"string","minLength":5,"maxLength":2})", &err));
  EXPECT_FALSE(schema_grammar(R"({"type":"object","required":["a"],"additionalProperties":false})", &err));
  EXPECT_NE(err.find("required property 'a'"), std::string::npos) << err;
  // Without additionalProperties: false, a required name that is not listed may hold any value.
  auto open = schema_grammar(R"({"type":"object","required":["a"]})");
  ASSERT_TRUE(open);
  EXPECT_TRUE(complete(*open, R"({"a":[1,"x"]})"));
  EXPECT_FALSE(complete(*open, R"({})"));
  EXPECT_FALSE(schema_grammar(R"({"type":"integer","minimum":3,"maximum":2.5})", &err));
  // A required property that recurses forever has no finite value.
  EXPECT_FALSE(schema_grammar(R"({"$defs":{"n":{"type":"object","properties":{"n":{"$ref":"#/$defs/n"}},
      "required":["n"]}},"$ref":"#/$defs/n"})", &err));
  EXPECT_NE(err.find("no finite"), std::string::npos) << err;
  // Annotations and formats are fine.
  EXPECT_TRUE(schema_grammar(R"({"type":"string","format":"date-time","description":"d","title":"t","default":"x"})"));
}

TEST(Matcher, ToolCallsInQwenFormat) {
  const ojson params = ojson::parse(R"({"type":"object","properties":{"city":{"type":"string","maxLength":8},
      "days":{"type":"integer","minimum":1,"maximum":14},"opts":{"type":"object","properties":{"u":{"enum":["c","f"]}}}},
      "required":["city"]})");
  OutputSpec spec;
  spec.tools.push_back({"get_weather", &params, true});
  spec.tools.push_back({"free", nullptr, false});
  auto g = output_grammar(spec);
  ASSERT_TRUE(g) << g.message();
  const std::string head = "<tool_call>\n<function=get_weather>\n";
  const std::string tail = "</function>\n</tool_call>";
  EXPECT_TRUE(complete(*g.value(), head + "<parameter=city>\nParis\n</parameter>\n" + tail));
  EXPECT_TRUE(complete(*g.value(), head + "<parameter=city>\nSan\nJose\n</parameter>\n<parameter=days>\n3\n</parameter>\n" +
                                       "<parameter=opts>\n{\"u\":\"c\"}\n</parameter>\n" + tail));
  EXPECT_FALSE(complete(*g.value(), head + "<parameter=city>\nTimbuktu!\n</parameter>\n" + tail));  // 9 > maxLength
  EXPECT_FALSE(complete(*g.value(), head + "<parameter=days>\n3\n</parameter>\n" + tail));           // city required
  EXPECT_FALSE(complete(*g.value(), head + "<parameter=city>\na</parameter>b\n</parameter>\n" + tail));
  EXPECT_FALSE(complete(*g.value(), head + "<parameter=city>\nP\n</parameter>\n<parameter=days>\n15\n</parameter>\n" + tail));
  EXPECT_TRUE(complete(*g.value(), "<tool_call>\n<function=free>\n<parameter=x>\nanything\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_TRUE(complete(*g.value(), head + "<parameter=city>\nA\n</parameter>\n" + tail + "\n<tool_call>\n<function=free>\n</function>\n</tool_call>"));
  spec.after_trigger = true;  // tool_choice auto: from just after the <tool_call> token
  auto t = output_grammar(spec);
  ASSERT_TRUE(t);
  EXPECT_TRUE(complete(*t.value(), "\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n" + tail));
}

TEST(Matcher, MinFinishIsTheShortestCompletion) {
  const char* schemas[] = {
      R"({"type":"object","properties":{"name":{"type":"string","minLength":2},"n":{"type":"integer","minimum":100,"maximum":250},
          "tags":{"type":"array","items":{"enum":["a","bb"]},"minItems":2}},"required":["name","n","tags"]})",
      R"({"type":"number","minimum":-3.25,"maximum":-1.5})",
      R"({"anyOf":[{"type":"string","minLength":4},{"type":"array","items":{"type":"boolean"},"minItems":1}]})",
  };
  // Raw tool-call strings whose length bounds are closer than the terminator is long.
  const ojson params = ojson::parse(R"({"type":"object","properties":{"s":{"type":"string","minLength":3,"maxLength":5},
      "t":{"type":"string","maxLength":2}},"required":["s","t"]})");
  OutputSpec tools;
  tools.tools.push_back({"f", &params, true});
  std::vector<std::shared_ptr<const Grammar>> grammars;
  for (const char* s : schemas) grammars.push_back(schema_grammar(s));
  grammars.push_back(output_grammar(tools).value());
  std::mt19937 rng(11);
  for (const auto& g : grammars) {
    const char* s = "(grammar)";
    ASSERT_TRUE(g);
    for (int walk = 0; walk < 6; ++walk) {
      Position p(*g);
      for (int step = 0; step < 80 && !p.dead(); ++step) {
        // By induction over m = min_finish: m == 0 exactly when the output may end; some byte
        // leads to m - 1 (a completion of m bytes exists); no byte leads below m - 1 (none shorter).
        const int64_t mf = p.min_finish(*g);
        ASSERT_LT(mf, kInf);
        EXPECT_EQ(mf == 0, p.can_complete(*g)) << s << " at step " << step;
        bool descends = mf == 0;
        std::vector<int> ok;
        for (int b = 0; b < 256; ++b) {
          Position n = p;
          if (!n.advance(*g, std::string(1, char(b)))) continue;
          const int64_t after = n.min_finish(*g);
          EXPECT_GE(after, mf - 1) << s << " byte " << b;
          descends = descends || after == mf - 1;
          if ((b >= 32 && b < 127) || b == 10) ok.push_back(b);
        }
        EXPECT_TRUE(descends) << s << " at step " << step << ": no byte shortens the completion";
        if (ok.empty()) break;
        p.advance(*g, std::string(1, char(ok[rng() % ok.size()])));
      }
    }
  }
}

}  // namespace
}  // namespace lily::structured
