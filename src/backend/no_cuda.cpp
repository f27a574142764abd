// Stand-in for make_cuda_backend when lily is built without the CUDA backend.
#include "backend/backend.h"

#ifndef LILY_HAVE_CUDA
namespace lily {
Result<std::unique_ptr<Backend>> make_cuda_backend(const ModelWeights&, bool) {
  return errorf("this lily was built without the CUDA backend (no nvcc at build time); use --backend cpu");
}
}  // namespace lily
#endif
