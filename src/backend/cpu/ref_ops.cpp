// Plain CPU reference ops. Parallel over output rows / heads with the global thread pool;
// every inner loop is the scalar textbook form.
#include "backend/cpu/ref_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "core/thread_pool.h"

namespace lily::cpu {

static bool& bf16_storage_flag() {
  static bool flag = [] {
    const char* e = std::getenv("LILY_CPU_STORAGE");
    return e && std::string(e) == "bf16";
  }();
  return flag;
}
void set_bf16_storage(bool on) { bf16_storage_flag() = on; }
bool bf16_storage() { return bf16_storage_flag(); }

void qmatmul(const QWeight& w, const float* x, int M, int ldx, float* y, int ldy, bool round) {
  const int gs = w.group_size, G = w.groups_per_row(), K = w.cols;
  std::vector<float> xsum(size_t(M) * G);  // Σx per token and group
  for (int m = 0; m < M; ++m)
    for (int g = 0; g < G; ++g) {
      float s = 0;
      for (int c = 0; c < gs; ++c) s += x[size_t(m) * ldx + g * gs + c];
      xsum[size_t(m) * G + g] = s;
    }
  const int per_word = 32 / w.bits;
  const uint32_t mask = (1u << w.bits) - 1;
  ThreadPool::global().parallel_for(w.rows, 8, [&](size_t r0, size_t r1) {
    std::vector<float> q(K);
    for (size_t r = r0; r < r1; ++r) {
      const uint32_t* words = w.codes + r * w.words_per_row();
      for (int c = 0; c < K; ++c) q[c] = float((words[c / per_word] >> ((c % per_word) * w.bits)) & mask);
      const bf16* sc = w.scales + r * G;
      const bf16* bi = w.biases + r * G;
      for (int m = 0; m < M; ++m) {
        const float* xm = x + size_t(m) * ldx;
        float acc = 0;
        for (int g = 0; g < G; ++g) {
          float d = 0;
          for (int c = g * gs; c < (g + 1) * gs; ++c) d += q[c] * xm[c];
          acc += bf16_to_f32(sc[g]) * d + bf16_to_f32(bi[g]) * xsum[size_t(m) * G + g];
        }
        y[size_t(m) * ldy + r] = round ? store(acc) : acc;
      }
    }
  });
}

void embed_rows(const QWeight& e, std::span<const int32_t> ids, float* out) {
  for (size_t i = 0; i < ids.size(); ++i) {
    int r = ids[i];
    for (int c = 0; c < e.cols; ++c) {
      int g = c / e.group_size;
      float s = bf16_to_f32(e.scales[size_t(r) * e.groups_per_row() + g]);
      float b = bf16_to_f32(e.biases[size_t(r) * e.groups_per_row() + g]);
      out[i * e.cols + c] = store(s * float(e.code(r, c)) + b);
    }
  }
}

void rmsnorm(const float* x, int M, int n, const bf16* gain, float eps, float* out) {
  for (int m = 0; m < M; ++m) {
    const float* xm = x + size_t(m) * n;
    float ss = 0;
    for (int i = 0; i < n; ++i) ss += xm[i] * xm[i];
    float inv = 1.0f / std::sqrt(ss / n + eps);
    for (int i = 0; i < n; ++i) out[size_t(m) * n + i] = store(xm[i] * inv * bf16_to_f32(gain[i]));
  }
}

static float silu(float v) { return v / (1.0f + std::exp(-v)); }

void conv_silu(const float* u, int M, int ldu, int C, int K, const bf16* w, float* window, float* out) {
  const int W = K - 1;
  ThreadPool::global().parallel_for(C, 256, [&](size_t c0, size_t c1) {
    std::vector<float> hist(W + M);
    for (size_t ch = c0; ch < c1; ++ch) {
      for (int t = 0; t < W; ++t) hist[t] = window[ch * W + t];
      for (int m = 0; m < M; ++m) hist[W + m] = u[size_t(m) * ldu + ch];
      for (int m = 0; m < M; ++m) {
        float acc = 0;
        for (int t = 0; t < K; ++t) acc += bf16_to_f32(w[ch * K + t]) * hist[m + t];
        out[size_t(m) * C + ch] = store(silu(acc));
      }
      for (int t = 0; t < W; ++t) window[ch * W + t] = hist[M + t];
    }
  });
}

void gdn_split_qkv(const GdnDims& d, int M, const float* c, float* q, float* k, float* v) {
  const int kd = d.n_k_heads * d.dk, vd = d.n_v_heads * d.dv, C = 2 * kd + vd, dk = d.dk;
  const float qscale = 1.0f / std::sqrt(float(dk));
  for (int m = 0; m < M; ++m) {
    const float* cm = c + size_t(m) * C;
    for (int hh = 0; hh < d.n_k_heads; ++hh) {
      float sq = 0, sk = 0;
      for (int i = 0; i < dk; ++i) {
        sq += cm[hh * dk + i] * cm[hh * dk + i];
        sk += cm[kd + hh * dk + i] * cm[kd + hh * dk + i];
      }
      const float iq = 1.0f / std::sqrt(sq + 1e-6f), ik = 1.0f / std::sqrt(sk + 1e-6f);
      for (int i = 0; i < dk; ++i) {
        q[size_t(m) * kd + hh * dk + i] = cm[hh * dk + i] * iq * qscale;
        k[size_t(m) * kd + hh * dk + i] = cm[kd + hh * dk + i] * ik;
      }
    }
    std::copy(cm + 2 * kd, cm + C, v + size_t(m) * vd);
  }
}

void gdn_gates(int M, int n_v_heads, const float* a, const float* b, const float* A_log, const bf16* dt_bias,
               float* g, float* beta) {
  for (int m = 0; m < M; ++m)
    for (int hh = 0; hh < n_v_heads; ++hh) {
      const size_t j = size_t(m) * n_v_heads + hh;
      beta[j] = 1.0f / (1.0f + std::exp(-b[j]));
      const float x = a[j] + bf16_to_f32(dt_bias[hh]);
      const float softplus = x > 20.0f ? x : std::log1p(std::exp(x));
      g[j] = -std::exp(A_log[hh]) * softplus;
    }
}

void gdn_recurrent(const GdnDims& d, int M, const float* q, const float* k, const float* v, const float* g,
                   const float* beta, float* S, float* out) {
  const int ratio = d.n_v_heads / d.n_k_heads;
  ThreadPool::global().parallel_for(d.n_v_heads, 1, [&](size_t h0, size_t h1) {
    std::vector<float> r(d.dv);
    for (size_t h = h0; h < h1; ++h) {
      float* Sh = S + h * d.dk * d.dv;  // [dk, dv]
      const int kh = int(h) / ratio;
      for (int t = 0; t < M; ++t) {
        const float* qt = q + (size_t(t) * d.n_k_heads + kh) * d.dk;
        const float* kt = k + (size_t(t) * d.n_k_heads + kh) * d.dk;
        const float* vt = v + (size_t(t) * d.n_v_heads + h) * d.dv;
        const float alpha = std::exp(g[t * d.n_v_heads + h]);
        const float b = beta[t * d.n_v_heads + h];
        for (int i = 0; i < d.dk * d.dv; ++i) Sh[i] *= alpha;
        for (int j = 0; j < d.dv; ++j) {
          float acc = 0;
          for (int i = 0; i < d.dk; ++i) acc += Sh[i * d.dv + j] * kt[i];
          r[j] = b * (vt[j] - acc);  // δ
        }
        for (int i = 0; i < d.dk; ++i)
          for (int j = 0; j < d.dv; ++j) Sh[i * d.dv + j] += kt[i] * r[j];
        float* ot = out + (size_t(t) * d.n_v_heads + h) * d.dv;
        for (int j = 0; j < d.dv; ++j) {
          float acc = 0;
          for (int i = 0; i < d.dk; ++i) acc += Sh[i * d.dv + j] * qt[i];
          ot[j] = acc;
        }
      }
    }
  });
}

void gdn_chunked(const GdnDims& d, int M, int chunk, const float* q, const float* k, const float* v,
                 const float* g, const float* beta, float* S, float* out) {
  const int ratio = d.n_v_heads / d.n_k_heads;
  const int dk = d.dk, dv = d.dv;
  ThreadPool::global().parallel_for(d.n_v_heads, 1, [&](size_t h0, size_t h1) {
    std::vector<float> gam(chunk), L(size_t(chunk) * chunk), U(size_t(chunk) * dv), W(size_t(chunk) * dk);
    std::vector<float> S_new(size_t(dk) * dv);
    for (size_t h = h0; h < h1; ++h) {
      float* Sh = S + h * dk * dv;
      const int kh = int(h) / ratio;
      auto K_ = [&](int t) { return k + (size_t(t) * d.n_k_heads + kh) * dk; };
      auto Q_ = [&](int t) { return q + (size_t(t) * d.n_k_heads + kh) * dk; };
      auto V_ = [&](int t) { return v + (size_t(t) * d.n_v_heads + h) * dv; };
      for (int t0 = 0; t0 < M; t0 += chunk) {
        const int n = std::min(chunk, M - t0);
        float acc_g = 0;
        for (int i = 0; i < n; ++i) gam[i] = (acc_g += g[(t0 + i) * d.n_v_heads + h]);
        auto bet = [&](int i) { return beta[(t0 + i) * d.n_v_heads + h]; };
        // L = strict_lower(diag(β)·(K Kᵀ) ⊙ Γ), Γ_ij = exp(γ_i − γ_j)
        for (int i = 0; i < n; ++i)
          for (int j = 0; j < i; ++j) {
            float dot = 0;
            for (int c = 0; c < dk; ++c) dot += K_(t0 + i)[c] * K_(t0 + j)[c];
            L[i * chunk + j] = bet(i) * dot * std::exp(gam[i] - gam[j]);
          }
        // (I + L) U = diag(β) V ; (I + L) W = diag(β e^γ) K   (forward substitution)
        for (int i = 0; i < n; ++i) {
          for (int c = 0; c < dv; ++c) {
            float x = bet(i) * V_(t0 + i)[c];
            for (int j = 0; j < i; ++j) x -= L[i * chunk + j] * U[j * dv + c];
            U[i * dv + c] = x;
          }
          for (int c = 0; c < dk; ++c) {
            float x = bet(i) * std::exp(gam[i]) * K_(t0 + i)[c];
            for (int j = 0; j < i; ++j) x -= L[i * chunk + j] * W[j * dk + c];
            W[i * dk + c] = x;
          }
        }
        // U' = U − W S₀
        for (int i = 0; i < n; ++i)
          for (int c = 0; c < dv; ++c) {
            float x = 0;
            for (int r = 0; r < dk; ++r) x += W[i * dk + r] * Sh[r * dv + c];
            U[i * dv + c] -= x;
          }
        // O = diag(e^γ) Q S₀ + ((Q Kᵀ) ⊙ Γ) U'   (Γ includes the diagonal)
        for (int i = 0; i < n; ++i) {
          float* o = out + (size_t(t0 + i) * d.n_v_heads + h) * dv;
          const float eg = std::exp(gam[i]);
          for (int c = 0; c < dv; ++c) {
            float x = 0;
            for (int r = 0; r < dk; ++r) x += Q_(t0 + i)[r] * Sh[r * dv + c];
            o[c] = eg * x;
          }
          for (int j = 0; j <= i; ++j) {
            float dot = 0;
            for (int r = 0; r < dk; ++r) dot += Q_(t0 + i)[r] * K_(t0 + j)[r];
            const float a = dot * std::exp(gam[i] - gam[j]);
            for (int c = 0; c < dv; ++c) o[c] += a * U[j * dv + c];
          }
        }
        // S₁ = e^{γ_n} S₀ + (diag(e^{γ_n − γ}) K)ᵀ U'
        const float gn = gam[n - 1];
        for (int r = 0; r < dk; ++r)
          for (int c = 0; c < dv; ++c) S_new[r * dv + c] = std::exp(gn) * Sh[r * dv + c];
        for (int j = 0; j < n; ++j) {
          const float e = std::exp(gn - gam[j]);
          for (int r = 0; r < dk; ++r) {
            const float kr = e * K_(t0 + j)[r];
            for (int c = 0; c < dv; ++c) S_new[r * dv + c] += kr * U[j * dv + c];
          }
        }
        std::copy(S_new.begin(), S_new.end(), Sh);
      }
    }
  });
}

void rope_neox(float* x, int n_heads, int hd, int rot, int pos, double theta) {
  const int half = rot / 2;
  for (int j = 0; j < half; ++j) {
    // As HF computes it: inv_freq in fp32 from base ** (2j/rot), angle = fp32(pos) · inv_freq.
    const float inv_freq = 1.0f / std::pow(float(theta), float(2 * j) / float(rot));
    const float ang = float(pos) * inv_freq;
    const float cs = std::cos(ang), sn = std::sin(ang);
    for (int h = 0; h < n_heads; ++h) {
      float* xh = x + size_t(h) * hd;
      const float a = xh[j], b = xh[j + half];
      xh[j] = a * cs - b * sn;
      xh[j + half] = b * cs + a * sn;
    }
  }
}

void route_topk(const float* l, int E, int top_k, bool norm, int* ids, float* w) {
  const float mx = *std::max_element(l, l + E);
  std::vector<float> p(E);
  std::vector<int> idx(E);
  float sum = 0;
  for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - mx));
  for (int e = 0; e < E; ++e) p[e] /= sum;
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + top_k, idx.end(), [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  float tsum = 0;
  for (int j = 0; j < top_k; ++j) tsum += p[idx[j]];
  for (int j = 0; j < top_k; ++j) ids[j] = idx[j], w[j] = norm ? p[idx[j]] / tsum : p[idx[j]];
}

}  // namespace lily::cpu
