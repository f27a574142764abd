// Submitting a prepared request to the engine and answering it over HTTP, for every API: SSE
// frames while streaming (a comment every second while nothing happens, so a client that left is
// noticed even while queued), or one body at the end. A client that goes away cancels the request
// (and its other choices) before the engine's next step: a streaming one when a write fails, a
// non-streaming one when its socket reports the hang-up (client_watch.h).
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "server/completion_service.h"
#include "server/metrics.h"
#include "server/reply_writer.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lily {

// The requests being answered, so a shutdown can cancel them (weak: finished ones drop out).
class ActiveRequests {
 public:
  void add(const std::vector<std::shared_ptr<GenRequest>>& reqs);
  void cancel_all();

 private:
  std::mutex mu_;
  std::vector<std::weak_ptr<GenRequest>> reqs_;
};

struct GenerationHooks {
  Metrics* metrics = nullptr;
  std::function<void(httplib::Response&, const ApiError&)> send_error;  // this API's error shape
  std::function<void()> on_complete;      // after a complete reply (e.g. the Responses store); may be empty
  std::atomic<int>* in_flight = nullptr;  // counts this request while it is answered (drain waits on it)
  ActiveRequests* active = nullptr;       // registers it for cancellation at shutdown
};

void answer_generation(Engine& engine, const httplib::Request& req, httplib::Response& res, PreparedRequest prep,
                       std::shared_ptr<ReplyWriter> writer, bool stream, GenerationHooks hooks);

}  // namespace lily
