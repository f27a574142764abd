// The engine hooks of issue 22 on a tiny synthetic checkpoint: a constrained request's reply is
// complete JSON of its schema even at the smallest token budget (random weights, sampled); n > 1
// choices share one prefill and each gives exactly what a request with its seed gives alone; the
// stop string that ended a reply is reported.
#include <gtest/gtest.h>

#include <filesystem>
#include <future>

#include <unistd.h>

#include "engine/engine.h"
#include "tiny_checkpoint.h"
#include "model/model.h"
#include "reply_watch.h"
#include "structured/constraint.h"
#include "structured/output_grammar.h"
#include "text/tokenizer.h"

namespace lily {
namespace {

class ChoicesTest : public TinySuite<ChoicesTest, 4, false> {
 protected:
  static std::shared_ptr<GenRequest> request(uint64_t seed, int max_tokens) {
    auto r = std::make_shared<GenRequest>();
    r->prompt = tok_->encode("<|im_start|>user\nGive me JSON.<|im_end|>\n<|im_start|>assistant\n");
    r->max_tokens = max_tokens;
    r->sampling.temperature = 1.0f;
    r->sampling.seed = seed;
    return r;
  }
};

TEST_F(ChoicesTest, ConstrainedReplyIsCompleteJsonAtTheSmallestBudget) {
  const auto schema = nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"id":{"type":"integer","minimum":1,"maximum":99},"name":{"type":"string","maxLength":6},
          "tags":{"type":"array","items":{"enum":["a","b"]},"minItems":1,"maxItems":2}},"required":["id","name","tags"]})");
  structured::OutputSpec os;
  os.json = true;
  os.schema = &schema;
  auto spec = std::make_shared<structured::ConstraintSpec>();
  spec->grammar = structured::output_grammar(os).value();
  spec->vocab = std::make_shared<structured::VocabIndex>(*tok_, model_->config().vocab_size);
  spec->allowed = spec->vocab->plain();
  Engine e(*model_, *tok_, EngineOptions{});
  spec->stop_ids = e.stop_ids();
  const int reserve = int(structured::GrammarConstraint(spec).reserve());
  for (int extra : {0, 3, 40}) {
    for (uint64_t seed : {1u, 2u, 3u}) {
      auto r = request(seed, reserve - 1 + extra);  // no think block: the JSON and a stop token
      r->constraint = std::make_unique<structured::GrammarConstraint>(spec);
      auto out = watch(*r);
      ASSERT_TRUE(e.submit(r));
      out->done.wait();
      const auto j = nlohmann::json::parse(out->text, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << "budget +" << extra << " seed " << seed << ": " << out->text;
      EXPECT_TRUE(j["id"].is_number_integer() && j["id"] >= 1 && j["id"] <= 99) << out->text;
      EXPECT_TRUE(j["tags"].is_array() && !j["tags"].empty()) << out->text;
      EXPECT_EQ(out->last.finish, FinishReason::kStop) << out->text;
    }
  }
}

TEST_F(ChoicesTest, ForksShareThePrefillAndMatchSingleRequests) {
  EngineOptions eo;
  eo.max_batch = 4;
  std::vector<std::shared_ptr<Reply>> alone;
  {
    Engine e(*model_, *tok_, eo);
    for (uint64_t seed : {11u, 12u, 13u}) {
      auto r = request(seed, 12);
      alone.push_back(watch(*r));
      ASSERT_TRUE(e.submit(r));
      alone.back()->done.wait();
    }
  }
  Engine e(*model_, *tok_, eo);
  auto parent = request(11, 12);
  std::vector<std::shared_ptr<Reply>> got{watch(*parent)};
  for (uint64_t seed : {12u, 13u}) {
    auto f = request(seed, 12);
    got.push_back(watch(*f));
    parent->forks.push_back(f);
  }
  const uint64_t prompt_before = e.stats().prompt_tokens;
  ASSERT_TRUE(e.submit(parent));
  for (auto& g : got) g->done.wait();
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i]->ids(), alone[i]->ids()) << "choice " << i;
    EXPECT_EQ(got[i]->text, alone[i]->text) << "choice " << i;
  }
  EXPECT_EQ(e.stats().prompt_tokens - prompt_before, parent->prompt.size());  // one prefill
  EXPECT_NE(got[0]->ids(), got[1]->ids());  // different seeds, different replies
}

TEST_F(ChoicesTest, TheStopStringThatEndedTheReplyIsReported) {
  Engine e(*model_, *tok_, EngineOptions{});
  auto r = request(1, 20);
  r->forced_output = tok_->encode("alpha beta gamma delta");
  r->stop = {"zeta", "gam"};
  auto out = watch(*r);
  ASSERT_TRUE(e.submit(r));
  out->done.wait();
  EXPECT_EQ(out->text, "alpha beta ");
  EXPECT_EQ(out->last.stop_string, "gam");
}

}  // namespace
}  // namespace lily
