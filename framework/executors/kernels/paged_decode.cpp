// Decode attention over paged KV, reading each row's blocks in place (CPU, AVX2; the cache in
// fp32 or bf16, the arithmetic in fp32).
//
// Why: the portable path (framework/paged_attention.py) first gathers every decode row's
// blocks into a padded contiguous copy, then runs SDPA on it; on CPU that copy plus SDPA's
// per-(row, head) overhead for one query cost 2.4-3.8x what these two loops do (measured on
// SmolLM2's shapes at 1 to 256 rows). Softmax stays in PyTorch between the two calls.
//
// Layout: k, v are one layer's cache, [slots, Hkv, D] with block b = slots b*bs .. b*bs+bs-1,
// so one block is bs * Hkv * D contiguous values. Query head h reads kv head h / (Hq / Hkv).
// A bf16 cache is widened to fp32 eight values at a time as it is read (a bf16 value is the
// top half of an fp32 one), so the queries, scores and probabilities stay fp32 and the cache is
// read at half the bytes; the caller casts the output back.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <limits>

namespace {

// Eight consecutive cache values as fp32.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  lo = _mm_add_ps(lo, _mm256_extractf128_ps(v, 1));
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}

// The first position a row's query sees: all of them, or the last `window` on a sliding layer.
inline int64_t first_seen(int64_t len, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, len - window) : 0;
}

void check(const torch::Tensor& q, const torch::Tensor& kv, const torch::Tensor& table,
           const torch::Tensor& lens) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat, "paged decode kernel: float32 queries only");
  TORCH_CHECK(kv.scalar_type() == torch::kFloat || kv.scalar_type() == torch::kBFloat16,
              "paged decode kernel: a float32 or bfloat16 cache only");
  TORCH_CHECK(q.is_contiguous() && kv.is_contiguous(), "paged decode kernel: contiguous only");
  TORCH_CHECK(kv.size(2) % 8 == 0, "paged decode kernel: head dim not a multiple of 8");
  TORCH_CHECK(q.size(1) % kv.size(1) == 0, "paged decode kernel: query heads / kv heads");
  TORCH_CHECK(table.scalar_type() == torch::kLong && lens.scalar_type() == torch::kLong,
              "paged decode kernel: int64 block tables and lengths");
  TORCH_CHECK(table.is_contiguous() && lens.is_contiguous() && table.size(0) == q.size(0) &&
                  lens.size(0) == q.size(0),
              "paged decode kernel: one block table and length per row");
}

}  // namespace

// q [B, Hq, D] -> scores [B, Hq, nb * bs], scaled; -inf where a row's query does not look.
// One task per (row, block): the block's keys are read once, contiguously, for every head.
// Four positions at a time, for each head four independent multiply-add chains (one chain
// per dot product left the core waiting on each add's latency) and one shared horizontal sum.
template <typename KV>
void scores_into(torch::Tensor& s, const torch::Tensor& q, const torch::Tensor& k,
                 const torch::Tensor& table, const torch::Tensor& lens, int64_t bs, double scale,
                 int64_t window) {
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k.size(1);
  const int64_t G = Hq / Hkv, nb = table.size(1), W = nb * bs, stride = Hkv * D;
  const float* Q = q.data_ptr<float>();
  const KV* K = k.data_ptr<KV>();
  const int64_t* T = table.data_ptr<int64_t>();
  const int64_t* L = lens.data_ptr<int64_t>();
  float* S = s.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const float off = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, B * nb, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / nb, j = t % nb, len = L[b], lo = first_seen(len, window);
      // The positions of this block the query sees: [i0, i1) of 0..bs-1 (maybe none).
      const int64_t i0 = std::clamp<int64_t>(lo - j * bs, 0, bs);
      const int64_t i1 = std::clamp<int64_t>(len - j * bs, 0, bs);
      const KV* block = K + T[b * nb + j] * bs * stride;
      if (i1 <= i0) {  // a padded block past the row's end, or before its window
        for (int64_t h = 0; h < Hq; ++h)
          std::fill(S + (b * Hq + h) * W + j * bs, S + (b * Hq + h) * W + (j + 1) * bs, off);
        continue;
      }
      for (int64_t h = 0; h < Hq; ++h) {
        float* out = S + (b * Hq + h) * W + j * bs;
        std::fill(out, out + i0, off);
        std::fill(out + i1, out + bs, off);
      }
      // Positions outer, heads inner: the block is read front to back, every kv head of a
      // position together.
      int64_t i = i0;
      for (; i + 4 <= i1; i += 4) {
        const KV* k0 = block + i * stride;
        for (int64_t h = 0; h < Hq; ++h) {
          const float* qh = Q + (b * Hq + h) * D;
          const KV* kh = k0 + (h / G) * D;
          __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
          for (int64_t d = 0; d < D; d += 8) {
            const __m256 qv = _mm256_loadu_ps(qh + d);
            a0 = _mm256_fmadd_ps(qv, load8(kh + d), a0);
            a1 = _mm256_fmadd_ps(qv, load8(kh + stride + d), a1);
            a2 = _mm256_fmadd_ps(qv, load8(kh + 2 * stride + d), a2);
            a3 = _mm256_fmadd_ps(qv, load8(kh + 3 * stride + d), a3);
          }
          // hadd twice leaves each chain's two 128-bit halves summed in lane order 0..3.
          const __m256 h4 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
          const __m128 sum =
              _mm_add_ps(_mm256_castps256_ps128(h4), _mm256_extractf128_ps(h4, 1));
          _mm_storeu_ps(S + (b * Hq + h) * W + j * bs + i, _mm_mul_ps(sum, _mm_set1_ps(sc)));
        }
      }
      for (; i < i1; ++i) {
        for (int64_t h = 0; h < Hq; ++h) {
          const float* qh = Q + (b * Hq + h) * D;
          const KV* kp = block + i * stride + (h / G) * D;
          __m256 acc = _mm256_setzero_ps();
          for (int64_t d = 0; d < D; d += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), load8(kp + d), acc);
          S[(b * Hq + h) * W + j * bs + i] = hsum(acc) * sc;
        }
      }
    }
  });
}

torch::Tensor paged_scores(torch::Tensor q, torch::Tensor k, torch::Tensor table,
                           torch::Tensor lens, int64_t bs, double scale, int64_t window) {
  check(q, k, table, lens);
  TORCH_CHECK(q.size(2) == k.size(2), "paged decode kernel: query and key head dims differ");
  auto s = torch::empty({q.size(0), q.size(1), table.size(1) * bs}, q.options());
  if (k.scalar_type() == torch::kBFloat16)
    scores_into<at::BFloat16>(s, q, k, table, lens, bs, scale, window);
  else
    scores_into<float>(s, q, k, table, lens, bs, scale, window);
  return s;
}

// One (row, head)'s weighted sum of values over positions [lo, hi), added to `o` (or
// written, when `first`), 8 * NV of its outputs held in NV registers across the positions
// rather than loaded and stored at each one.
template <typename KV, int NV>
inline void mix_head(float* o, const float* p, const KV* V, const int64_t* blocks,
                     int64_t lo, int64_t hi, int64_t bs, int64_t stride, int64_t off,
                     bool first) {
  __m256 acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(o + 8 * v);
  for (int64_t pos = lo; pos < hi; ++pos) {
    const __m256 w = _mm256_set1_ps(p[pos]);
    const KV* vh = V + (blocks[pos / bs] * bs + pos % bs) * stride + off;
    for (int v = 0; v < NV; ++v) acc[v] = _mm256_fmadd_ps(w, load8(vh + 8 * v), acc[v]);
  }
  for (int v = 0; v < NV; ++v) _mm256_storeu_ps(o + 8 * v, acc[v]);
}

// probs [B, Hq, nb * bs] (softmax of the scores) -> out [B, Hq, D] = probs . values.
// One task per row; with fewer rows than threads, one per (row, head).
template <typename KV>
void mix_into(torch::Tensor& out, const torch::Tensor& probs, const torch::Tensor& v,
              const torch::Tensor& table, const torch::Tensor& lens, int64_t bs,
              int64_t window) {
  const int64_t B = probs.size(0), Hq = probs.size(1), W = probs.size(2);
  const int64_t Hkv = v.size(1), D = v.size(2), G = Hq / Hkv, nb = table.size(1);
  const int64_t stride = Hkv * D;
  const float* P = probs.data_ptr<float>();
  const KV* V = v.data_ptr<KV>();
  const int64_t* T = table.data_ptr<int64_t>();
  const int64_t* L = lens.data_ptr<int64_t>();
  float* O = out.data_ptr<float>();
  const int64_t split = B >= at::get_num_threads() ? 1 : Hq;
  // Positions a tile: every head's pass over a tile finds its values still in L1 (32
  // positions x every kv head, 24 KB in fp32 at SmolLM2's shapes), where one pass per head
  // over a whole long context read them from L2 or memory once per head.
  constexpr int64_t tile = 32;
  at::parallel_for(0, B * split, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / split, len = L[b], lo = first_seen(len, window);
      const int64_t h0 = split == 1 ? 0 : t % split, h1 = split == 1 ? Hq : h0 + 1;
      const int64_t* blocks = T + b * nb;
      for (int64_t a = lo; a < len || a == lo; a += tile) {
        const int64_t z = std::min(len, a + tile);
        const bool first = a == lo;
        for (int64_t h = h0; h < h1; ++h) {
          float* o = O + (b * Hq + h) * D;
          const float* p = P + (b * Hq + h) * W;
          const int64_t off = (h / G) * D;
          if (D % 64 == 0) {  // 64 outputs a pass: 8 accumulators, registers to spare
            for (int64_t d = 0; d < D; d += 64)
              mix_head<KV, 8>(o + d, p, V, blocks, a, z, bs, stride, off + d, first);
          } else if (D == 32) {
            mix_head<KV, 4>(o, p, V, blocks, a, z, bs, stride, off, first);
          } else if (D == 16) {
            mix_head<KV, 2>(o, p, V, blocks, a, z, bs, stride, off, first);
          } else {  // any other multiple of 8: eight outputs a pass
            for (int64_t d = 0; d < D; d += 8)
              mix_head<KV, 1>(o + d, p, V, blocks, a, z, bs, stride, off + d, first);
          }
        }
      }
    }
  });
}

torch::Tensor paged_mix(torch::Tensor probs, torch::Tensor v, torch::Tensor table,
                        torch::Tensor lens, int64_t bs, int64_t window) {
  check(probs, v, table, lens);
  // Every output is written (a row that sees no position gets zeros from its empty sum).
  auto out = torch::empty({probs.size(0), probs.size(1), v.size(2)}, probs.options());
  if (v.scalar_type() == torch::kBFloat16)
    mix_into<at::BFloat16>(out, probs, v, table, lens, bs, window);
  else
    mix_into<float>(out, probs, v, table, lens, bs, window);
  return out;
}

TORCH_LIBRARY(nanoserve, m) {
  m.def("paged_scores(Tensor q, Tensor k, Tensor table, Tensor lens, int bs, float scale, "
        "int window) -> Tensor",
        paged_scores);
  m.def("paged_mix(Tensor probs, Tensor v, Tensor table, Tensor lens, int bs, int window) "
        "-> Tensor",
        paged_mix);
}
