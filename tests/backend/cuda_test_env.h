// Shared by the CUDA tests: whether a CUDA device is usable (else the reason, for a loud skip),
// and an environment variable set for one scope (the CUDA backend reads its knobs at state creation).
#pragma once
#include <cstdlib>
#include <string>

#ifdef LILY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace lily {

inline bool cuda_device_present(std::string& why) {
#ifdef LILY_HAVE_CUDA
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    why = e != cudaSuccess ? cudaGetErrorString(e) : "0 devices";
    return false;
  }
  return true;
#else
  why = "lily was built without the CUDA backend (no nvcc)";
  return false;
#endif
}

// Sets `name` to `value` (nullptr: unsets it) until the end of the scope, then restores it.
struct ScopedEnv {
  std::string name, prev;
  bool had = false;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (const char* p = std::getenv(n)) prev = p, had = true;
    if (value) setenv(n, value, 1);
    else unsetenv(n);
  }
  ~ScopedEnv() {
    if (had) setenv(name.c_str(), prev.c_str(), 1);
    else unsetenv(name.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

}  // namespace lily
