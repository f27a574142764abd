// Fuzz target: request bodies of the Responses API and the Anthropic Messages API (and its
// count_tokens form). Either a 400 with a message naming the problem, or an accepted chat request
// with messages; never a crash. A response is stored first so previous_response_id can resolve.
#include "fuzz_util.h"
#include "server/messages_api.h"
#include "server/responses_api.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lily;
  std::string_view raw(reinterpret_cast<const char*>(data), size);
  nlohmann::ordered_json body;
  if (auto e = parse_request_body(raw, body)) return 0;
  static ResponseStore store;
  static const bool stored = [] {
    StoredResponse r;
    r.chain = "resp_a";
    r.conversation = nlohmann::ordered_json::parse(R"([{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}])");
    store.put("resp_a", r);
    return true;
  }();
  (void)stored;
  for (bool hooks : {false, true}) {
    ApiRequest req;
    ResponsesContext ctx;
    if (auto e = parse_responses_request(body, hooks, store, req, ctx)) {
      LILY_FUZZ_ASSERT(e->status >= 400 && e->status < 500 && !e->message.empty(), e->message);
      (void)e->to_json().dump();
    } else {
      LILY_FUZZ_ASSERT(req.chat && req.messages.is_array() && !req.messages.empty(), "accepted responses request");
    }
    for (bool count_only : {false, true}) {
      ApiRequest m;
      if (auto e = parse_messages_request(body, hooks, count_only, m)) {
        LILY_FUZZ_ASSERT(e->status == 400 && !e->message.empty(), e->message);
        (void)anthropic_error(*e).dump();
      } else {
        LILY_FUZZ_ASSERT(m.chat && m.messages.is_array() && !m.messages.empty(), "accepted messages request");
      }
    }
  }
  return 0;
}
