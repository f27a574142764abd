// OpenAI's error object and the HTTP status that goes with it. Messages are for the client:
// they name the field at fault and never leak internals (engine failures say only
// "internal server error"; the details go to the log).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace lily {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" → null
  std::string code;   // "" → null

  nlohmann::json to_json() const {
    nlohmann::json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
    if (!param.empty()) e["param"] = param;
    if (!code.empty()) e["code"] = code;
    return {{"error", e}};
  }

  static ApiError bad_request(std::string msg, std::string param = "", std::string code = "") {
    return {400, std::move(msg), "invalid_request_error", std::move(param), std::move(code)};
  }
  static ApiError internal() { return {500, "internal server error", "server_error", "", ""}; }
  // The request's model state could not get its memory (the engine ends it; others go on): retryable.
  static ApiError out_of_memory() {
    return {503, "The server ran out of memory for this request; retry shortly", "server_error", "", "out_of_memory"};
  }
};

}  // namespace lily
