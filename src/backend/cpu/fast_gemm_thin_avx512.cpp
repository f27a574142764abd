// AVX-512 prefill GEMM for 4-bit weights and few tokens (the routed experts: ~8 tokens each at a
// 256-token prefill), k in lanes: 16 consecutive columns of a row are dequantized in registers
// (vpbroadcastq of two code words, vpsrlvd, then vpermps from the group's table scale·{0..15} + bias)
// and multiplied into 2 rows x T ≤ 12 tokens of accumulators; no gathers and no panel stores. The
// lane order this gives, lane l = column 8·(l&1) + (l>>1) of its 16, is applied to the packed
// activations instead. k runs in blocks of 512 so the packed tokens stay in L1, with the partial
// sums of the task's rows parked between blocks; each (row, token) sum is reduced once at the end.
#include "backend/cpu/fast_avx512.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "backend/cpu/fast_buf.h"
#include "backend/cpu/fast_gemm.h"
#include "core/bf16.h"

#define LILY_TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx2,bmi2")))

namespace lily::cpu::fast {
namespace {

#include "backend/cpu/fast_vec.inc"
#include "backend/cpu/fast_vec_avx512.inc"
using V = Avx512;

constexpr int kRows = 32;  // rows of a row group (the partial sums of a group are parked together)
constexpr int kKb = 512;   // k block

// Rows r, r+1 (R of them) over groups [g0, g1) for T tokens. codes: row r's words; sb, bb: row r's
// fp32 scales/biases (row stride G); xb: packed tokens [T][K]; part: R·T parked sums.
template <int R, int T>
LILY_TGT void thin_tile(const uint32_t* codes, int wpr, const float* sb, const float* bb, int G, int g0, int g1,
                        const float* xb, int K, float* part, bool first, bool last, float* const* yr) {
  const __m512i shifts = _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28);
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 acc[R][T];
#pragma GCC unroll 24
  for (int i = 0; i < R * T; ++i)
    acc[i / T][i % T] = first ? _mm512_setzero_ps() : _mm512_load_ps(part + size_t(i) * 16);
  for (int g = g0; g < g1; ++g) {
    // The group's 16 possible weights of each row, tab[q] = scale·q + bias: a vpermps of the codes
    // then dequantizes exactly as fma(scale, q, bias) would, without an FMA per 16 weights.
    __m512 tab[R];
#pragma GCC unroll 2
    for (int rr = 0; rr < R; ++rr)
      tab[rr] = _mm512_fmadd_ps(_mm512_set1_ps(sb[size_t(rr) * G + g]), iota, _mm512_set1_ps(bb[size_t(rr) * G + g]));
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      __m512 wv[R];
#pragma GCC unroll 2
      for (int rr = 0; rr < R; ++rr) {
        long long two;
        std::memcpy(&two, codes + size_t(rr) * wpr + size_t(g) * 8 + 2 * c, 8);
        const __m512i q = _mm512_srlv_epi32(_mm512_set1_epi64(two), shifts);
        wv[rr] = _mm512_permutexvar_ps(q, tab[rr]);
      }
      const float* xc = xb + size_t(g) * 64 + c * 16;
#pragma GCC unroll 12
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_load_ps(xc + size_t(t) * K);
#pragma GCC unroll 2
        for (int rr = 0; rr < R; ++rr) acc[rr][t] = _mm512_fmadd_ps(wv[rr], xv, acc[rr][t]);
      }
    }
  }
  if (last) {
#pragma GCC unroll 24
    for (int i = 0; i < R * T; ++i) yr[i % T][i / T] = _mm512_reduce_add_ps(acc[i / T][i % T]);
  } else {
#pragma GCC unroll 24
    for (int i = 0; i < R * T; ++i) _mm512_store_ps(part + size_t(i) * 16, acc[i / T][i % T]);
  }
}

using TileFn = void (*)(const uint32_t*, int, const float*, const float*, int, int, int, const float*, int, float*, bool,
                        bool, float* const*);

template <int R, int... Ts>
constexpr TileFn tile_for(int T, std::integer_sequence<int, Ts...>) {
  TileFn f = nullptr;
  ((T == Ts + 1 ? (f = thin_tile<R, Ts + 1>, 0) : 0), ...);
  return f;
}

}  // namespace

LILY_TGT void q4_gemm_thin_avx512(const QArgs& a) {
  const QWeight& w = *a.w;
  const int K = w.cols, G = w.groups_per_row(), wpr = w.words_per_row();
  thread_local AlignedBuf<float> xbuf, pbuf, sbuf;
  float* xb = xbuf.get(size_t(kThinMaxTokens) * K);
  float* part = pbuf.get(size_t(kRows) * kThinMaxTokens * 16);
  float* sb = sbuf.get(size_t(2) * kRows * G);
  float* bb = sb + size_t(kRows) * G;
  // Lane l of a packed 16-column chunk holds column 8·(l&1) + (l>>1) (the order of the dequant).
  const __m512i perm = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  for (int i0 = 0; i0 < a.n; i0 += kThinMaxTokens) {
    const int T = std::min(kThinMaxTokens, a.n - i0);
    for (int t = 0; t < T; ++t) {
      const float* x = a.xf + size_t(a.ids[i0 + t]) * a.ldxf;
      for (int k = 0; k < K; k += 16) _mm512_store_ps(xb + size_t(t) * K + k, _mm512_permutexvar_ps(perm, _mm512_loadu_ps(x + k)));
    }
    const TileFn f2 = tile_for<2>(T, std::make_integer_sequence<int, kThinMaxTokens>{});
    const TileFn f1 = tile_for<1>(T, std::make_integer_sequence<int, kThinMaxTokens>{});
    for (int rg = a.r0; rg < a.r1; rg += kRows) {
      const int nr = std::min(kRows, a.r1 - rg);
      // The group's scales and biases are contiguous ([rows][G] bf16): convert them 16 at a time.
      const size_t nsb = size_t(nr) * G, sb0 = size_t(rg) * G;
      for (size_t i = 0; i < nsb; i += 16) {
        const __mmask16 m = nsb - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (nsb - i)) - 1);
        _mm512_mask_storeu_ps(sb + i, m, V::load_bf16(m, w.scales + sb0 + i));
        _mm512_mask_storeu_ps(bb + i, m, V::load_bf16(m, w.biases + sb0 + i));
      }
      for (int k0 = 0; k0 < K; k0 += kKb) {
        const int g0 = k0 / 64, g1 = std::min(G, (k0 + kKb) / 64);
        const bool first = k0 == 0, last = k0 + kKb >= K;
        for (int l = 0; l < nr; l += 2) {
          const int R = std::min(2, nr - l);
          // Software prefetch 8 rows ahead in the traversal order (rows of this k block, then the
          // group's next k block, then the next group's first block: past the task, within the
          // weight), because each task's stream is too short for the hardware prefetchers.
          {
            int pr = rg + l + 8, pk = k0;
            if (l + 8 >= nr) pr -= nr, pk = last ? 0 : k0 + kKb, pr += last ? nr : 0;
            if (pr + 1 < w.rows) {
              for (int rr = 0; rr < 2; ++rr) {
                const uint32_t* p = w.codes + size_t(pr + rr) * wpr + pk / 8;
                for (int off = 0; off < std::min(kKb, K - pk) / 8; off += 16)
                  _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T0);
              }
              if (pk == 0 && (pr & 7) == 0) {  // the scales and biases of rows pr..pr+7
                _mm_prefetch(reinterpret_cast<const char*>(w.scales + size_t(pr) * G), _MM_HINT_T0);
                _mm_prefetch(reinterpret_cast<const char*>(w.biases + size_t(pr) * G), _MM_HINT_T0);
              }
            }
          }
          float* yr[kThinMaxTokens];
          for (int t = 0; t < T; ++t) yr[t] = a.y + size_t(i0 + t) * a.ldy + rg + l;
          (R == 2 ? f2 : f1)(w.codes + size_t(rg + l) * wpr, wpr, sb + size_t(l) * G, bb + size_t(l) * G, G, g0, g1, xb, K,
                             part + size_t(l) * kThinMaxTokens * 16, first, last, yr);
        }
      }
    }
  }
}

}  // namespace lily::cpu::fast
