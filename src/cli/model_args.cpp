// The model commands' options and load: see model_args.h.
#include "cli/model_args.h"

#include <fmt/format.h>

namespace lily::cli {

void add_model_option(CLI::App& app, ModelArgs& m) {
  app.add_option("--model", m.dir, "Checkpoint directory")->required();
}

void add_backend_option(CLI::App& app, ModelArgs& m, const std::string& help) { app.add_option("--backend", m.backend, help); }

void add_threads_option(CLI::App& app, ModelArgs& m) { app.add_option("--threads", m.threads, "CPU threads (0: all cores)"); }

std::unique_ptr<Model> load_model(const ModelArgs& m, bool verbose) {
  ModelOptions mo;
  mo.backend = m.backend;
  mo.threads = m.threads;
  mo.verbose = verbose;
  auto model = Model::load(m.dir, mo);
  if (!model) {
    fmt::print(stderr, "error: {}\n", model.message());
    return nullptr;
  }
  return std::move(model).value();
}

}  // namespace lily::cli
