// What `lily serve` and `lily chat` share: load a checkpoint (or make the demo one), its
// tokenizer and chat template, and start the engine and the completion service over them.
#pragma once
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "engine/engine.h"
#include "model/model.h"
#include "server/completion_service.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace lily::cli {

struct RuntimeArgs {
  std::string model_dir;     // "" = the demo checkpoint
  std::string backend = "cpu";
  int max_seq = 0;           // 0 = min(8192, max_position_embeddings)
  int threads = 0;
  int max_queue = 64;
  int parallel = 0;          // requests decoded together (0: the backend's default, lowered to what fits)
  int state_mb = 0;          // memory for sequence states, MiB (0: what is free after weights and scratch, less headroom)
  int step_tokens = 512;     // prompt tokens per step beside the decode rows (the first segment always runs)
  int long_step_tokens = -1; // prompt tokens of a step of long segments (EngineOptions::long_step_tokens; -1: the backend's default)
  int prefill_chunk = 0;     // prompt segment length (tokens): fixed cut points, one forward each (0: the backend's default)
  int spec_draft = 0;        // speculative decoding: prompt-lookup drafts per step (EngineOptions::spec_draft; 0: off)
  int spec_ngram = 3;        // the longest n-gram it looks up (down to 2)
  int max_cached = 8;
  int cache_mb = 8192;
  int cache_shared_min = 256;
  int max_tokens_default = 4096;  // completion tokens when a request gives no max_tokens (0: up to the context)
  bool test_hooks = false;
};

struct Runtime {
  std::string dir;
  bool synthetic = false;  // random weights
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<ChatTemplate> tmpl;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<CompletionService> service;
};

// Prints progress and the reason of a failure on stderr; nullptr on failure.
std::unique_ptr<Runtime> load_runtime(const RuntimeArgs& a);

// Adds the shared options to a subcommand.
void add_runtime_options(CLI::App& app, RuntimeArgs& a);

}  // namespace lily::cli
