// Model: checkpoint → weight views → backend. The forward pass itself lives in the backend
// (cpu: src/backend/cpu/cpu_backend.cpp, the reference; cuda: src/backend/cuda/).
#include "model/model.h"

#include <spdlog/spdlog.h>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "model/weights.h"

namespace lily {

struct Model::Impl {
  std::unique_ptr<Checkpoint> ckpt;
  ModelWeights weights;
  std::unique_ptr<Backend> backend;
};

Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::load(const std::string& dir, const ModelOptions& opts) {
  auto impl = std::make_unique<Impl>();
  LILY_ASSIGN_OR_RETURN(impl->ckpt, Checkpoint::open(dir));
  LILY_ASSIGN_OR_RETURN(impl->weights, ModelWeights::from_checkpoint(*impl->ckpt));
  if (opts.threads > 0) ThreadPool::set_global_threads(opts.threads);
  if (opts.backend == "cpu") {
    LILY_ASSIGN_OR_RETURN(impl->backend, make_cpu_backend(impl->weights));
  } else if (opts.backend == "cuda") {
    LILY_ASSIGN_OR_RETURN(impl->backend, make_cuda_backend(impl->weights, opts.verbose));
  } else {
    return errorf("unknown backend '{}' (expected cpu or cuda)", opts.backend);
  }
  std::unique_ptr<Model> m(new Model());
  m->impl_ = std::move(impl);
  return m;
}

const ModelConfig& Model::config() const { return impl_->weights.cfg; }
const std::string& Model::dir() const { return impl_->ckpt->dir(); }
const char* Model::backend_name() const { return impl_->backend->name(); }

Result<std::unique_ptr<SeqState>> Model::new_state(int max_seq) { return impl_->backend->new_state(max_seq); }

Status Model::forward(SeqState& state, std::span<const int32_t> tokens, std::span<float> logits) {
  return impl_->backend->forward(state, tokens, logits);
}

}  // namespace lily
