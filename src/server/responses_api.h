// OpenAI's Responses API (POST /v1/responses) on top of the chat service. A request's input
// items (messages, function calls and their outputs, reasoning) become chat messages for the
// template; previous_response_id prepends the stored conversation (whose state the prefix cache
// usually still holds: the prompt extends the earlier one). The writer emits the typed SSE events
// (response.created, response.output_item.added, response.reasoning_text.delta,
// response.output_text.delta, response.function_call_arguments.delta, ..., response.completed)
// and the response object; completed responses are kept (store, default true) for retrieval and
// continuation, least recently used first out.
#pragma once
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/openai_request.h"
#include "server/reply_writer.h"

namespace lily {

struct StoredResponse {
  nlohmann::json response;               // the response object (GET /v1/responses/{id})
  nlohmann::ordered_json conversation;   // chat messages: the input (without instructions) and the output
  std::string chain;                     // id of the first response of the conversation (cache key)
};

class ResponseStore {
 public:
  explicit ResponseStore(size_t capacity = 1000) : capacity_(capacity) {}
  void put(const std::string& id, StoredResponse r);
  std::optional<StoredResponse> get(const std::string& id);
  bool erase(const std::string& id);

 private:
  std::mutex mu_;
  size_t capacity_;
  std::list<std::string> order_;  // most recent first
  std::map<std::string, std::pair<StoredResponse, std::list<std::string>::iterator>> items_;
};

// What the response object echoes and the store needs, beside the ApiRequest.
struct ResponsesContext {
  nlohmann::ordered_json body;           // the request (echoed fields)
  nlohmann::ordered_json conversation;   // chat messages without the instructions
  std::string previous_id, chain;
  bool store = true;
};

// The request body → ApiRequest (chat) and context; previous responses come from `store`.
std::optional<ApiError> parse_responses_request(const nlohmann::ordered_json& body, bool test_hooks, ResponseStore& store,
                                                ApiRequest& out, ResponsesContext& ctx);

class ResponsesWriter : public ReplyWriter {
 public:
  ResponsesWriter(const ApiRequest& req, const ReplyParserOptions& parser, std::string model, ResponsesContext ctx);
  std::vector<std::string> begin() override;
  std::vector<std::string> on_event(int choice, const GenEvent& ev) override;
  std::vector<std::string> end() override;
  nlohmann::json whole() override;
  std::string error_frame(const ApiError& e) const override;
  const std::string& id() const override { return id_; }
  // The stored form of the finished response.
  StoredResponse stored();
  const ResponsesContext& context() const { return ctx_; }

 private:
  nlohmann::json response(const std::string& status) const;
  nlohmann::json frame(const std::string& type, nlohmann::json fields);  // numbered event
  void close_open(std::vector<std::string>& out);  // ends the open reasoning or message item
  int add_item(nlohmann::json item, std::vector<std::string>& out);

  std::string id_, model_;
  int64_t created_;
  ResponsesContext ctx_;
  ChoiceParse parse_;
  nlohmann::json output_ = nlohmann::json::array();
  int seq_ = 0;
  int open_ = -1;                  // output index of the open reasoning/message item
  std::map<int, int> call_item_;   // call index -> output index
  std::vector<std::string> final_; // response.completed / incomplete, sent by end()
};

}  // namespace lily
