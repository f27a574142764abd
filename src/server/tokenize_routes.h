// POST /tokenize and /detokenize as llama.cpp's server offers them ({"content": text,
// "with_pieces": bool} → {"tokens": [...]}; {"tokens": [...]} → {"content": text}), also taking
// vLLM's forms ({"prompt": text} or {"messages": [...]} rendered by the chat template; the answer
// adds "count" and "max_model_len", and /detokenize's "prompt").
#pragma once

namespace httplib {
class Server;
}

namespace lily {

class CompletionService;
void add_tokenize_routes(httplib::Server& h, CompletionService& svc);

}  // namespace lily
