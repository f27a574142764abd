// What the commands that load the model straight, without the engine (`lily bench`, `bench-batch`,
// `generate`), share: the --model, --backend and --threads options and the load. One function an
// option, so that each command keeps them where its --help has always listed them.
#pragma once
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "model/model.h"

namespace lily::cli {

struct ModelArgs {
  std::string dir;              // --model, required
  std::string backend = "cpu";  // --backend
  int threads = 0;              // --threads (0: all cores)
};

void add_model_option(CLI::App& app, ModelArgs& m);
// `help` names the backends, in the order this command puts them.
void add_backend_option(CLI::App& app, ModelArgs& m, const std::string& help);
void add_threads_option(CLI::App& app, ModelArgs& m);

// Prints the reason of a failure on stderr; nullptr on failure. `verbose`: load progress on stderr.
std::unique_ptr<Model> load_model(const ModelArgs& m, bool verbose);

}  // namespace lily::cli
