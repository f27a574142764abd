// The first include of every AVX-512 file of the fast kernels: <immintrin.h> with the warnings that
// GCC 12's avx512 headers trip on their own _mm512_undefined_* helpers silenced. The pragmas stay in
// force for the rest of the including file, which is what lets them reach the inlined intrinsics.
#pragma once
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // GCC only (clang has no such group)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
