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
#include "paged_decode.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

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

}  // namespace

void nanoserve::check_paged(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& table,
                            const at::Tensor& lens) {
  TORCH_CHECK(q.scalar_type() == at::kFloat, "paged decode kernel: float32 queries only");
  TORCH_CHECK(kv.scalar_type() == at::kFloat || kv.scalar_type() == at::kBFloat16,
              "paged decode kernel: a float32 or bfloat16 cache only");
  TORCH_CHECK(q.is_contiguous() && kv.is_contiguous(), "paged decode kernel: contiguous only");
  TORCH_CHECK(kv.size(2) % 8 == 0, "paged decode kernel: head dim not a multiple of 8");
  TORCH_CHECK(q.size(1) % kv.size(1) == 0, "paged decode kernel: query heads / kv heads");
  TORCH_CHECK(table.scalar_type() == at::kLong && lens.scalar_type() == at::kLong,
              "paged decode kernel: int64 block tables and lengths");
  TORCH_CHECK(table.is_contiguous() && lens.is_contiguous() && table.size(0) == q.size(0) &&
                  lens.size(0) == q.size(0),
              "paged decode kernel: one block table and length per row");
}

namespace {

// Ask for `bytes` from `p` in the cache ahead of use: each row's blocks lie at random places
// in the pool, so the hardware prefetcher, which follows a stream within a 4 KB page, cannot
// know the next block; without this every block (and every page of one) started with misses
// to memory, and the kernel read 5-8 GB/s where the machine streams 30+.
template <typename KV>
inline void prefetch(const KV* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  const int64_t bytes = n * static_cast<int64_t>(sizeof(KV));
  for (int64_t x = 0; x < bytes; x += 64) _mm_prefetch(c + x, _MM_HINT_T1);
}

// Four positions of one kv head against GT of its query heads: 4 * GT independent multiply-add
// chains (each key vector loaded once for all GT heads), then one shared horizontal sum per
// head. out points at the first head's score of position i; heads are W apart.
template <typename KV, int GT>
inline void dot4(const float* qg, const KV* k0, int64_t stride, int64_t D, float* out,
                 int64_t W, __m128 sc) {
  __m256 acc[GT][4];
  for (int g = 0; g < GT; ++g)
    for (int p = 0; p < 4; ++p) acc[g][p] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 8) {
    const __m256 k0v = load8(k0 + d), k1v = load8(k0 + stride + d);
    const __m256 k2v = load8(k0 + 2 * stride + d), k3v = load8(k0 + 3 * stride + d);
    for (int g = 0; g < GT; ++g) {
      const __m256 qv = _mm256_loadu_ps(qg + g * D + d);
      acc[g][0] = _mm256_fmadd_ps(qv, k0v, acc[g][0]);
      acc[g][1] = _mm256_fmadd_ps(qv, k1v, acc[g][1]);
      acc[g][2] = _mm256_fmadd_ps(qv, k2v, acc[g][2]);
      acc[g][3] = _mm256_fmadd_ps(qv, k3v, acc[g][3]);
    }
  }
  for (int g = 0; g < GT; ++g) {
    // hadd twice leaves each chain's two 128-bit halves summed in lane order 0..3.
    const __m256 h4 = _mm256_hadd_ps(_mm256_hadd_ps(acc[g][0], acc[g][1]),
                                     _mm256_hadd_ps(acc[g][2], acc[g][3]));
    const __m128 sum = _mm_add_ps(_mm256_castps256_ps128(h4), _mm256_extractf128_ps(h4, 1));
    _mm_storeu_ps(out + g * W, _mm_mul_ps(sum, sc));
  }
}

// q [B, Hq, D] -> scores [B, Hq, nb * bs], scaled; -inf where a row's query does not look.
// One task per (row, block): the block's keys are read once, contiguously, for every head,
// while the next task's block is fetched. Four positions at a time; each key vector is loaded
// once for the (up to three) query heads that share its kv head, with one independent
// multiply-add chain per (head, position) so the core never waits on an add's latency.
template <typename KV>
void scores_into(at::Tensor& s, const at::Tensor& q, const at::Tensor& k,
                 const at::Tensor& table, const at::Tensor& lens, int64_t bs, double scale,
                 int64_t window) {
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k.size(1);
  const int64_t G = Hq / Hkv, nb = table.size(1), W = nb * bs, stride = Hkv * D;
  const float* Q = q.data_ptr<float>();
  const KV* K = k.data_ptr<KV>();
  const int64_t* T = table.data_ptr<int64_t>();
  const int64_t* L = lens.data_ptr<int64_t>();
  float* S = s.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const __m128 sc4 = _mm_set1_ps(sc);
  const float off = -std::numeric_limits<float>::infinity();
  // The block a task reads: nullptr for one it does not read (past the row's end).
  auto block_of = [&](int64_t t) -> const KV* {
    const int64_t b = t / nb, j = t % nb;
    return j * bs < L[b] ? K + T[b * nb + j] * bs * stride : nullptr;
  };
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
      // The next block this thread reads (the next tasks past a row's end read nothing).
      const KV* next = nullptr;
      for (int64_t u = t + 1; u < t1 && next == nullptr && u < t + nb + 1; ++u) next = block_of(u);
      int64_t i = i0;
      for (; i + 4 <= i1; i += 4) {
        const KV* k0 = block + i * stride;
        if (next != nullptr) prefetch(next + i * stride, 4 * stride);
        for (int64_t g = 0; g < Hkv; ++g) {
          int64_t h = g * G;
          const int64_t h_end = h + G;
          for (; h + 3 <= h_end; h += 3)
            dot4<KV, 3>(Q + (b * Hq + h) * D, k0 + g * D, stride, D,
                        S + (b * Hq + h) * W + j * bs + i, W, sc4);
          if (h_end - h == 2)
            dot4<KV, 2>(Q + (b * Hq + h) * D, k0 + g * D, stride, D,
                        S + (b * Hq + h) * W + j * bs + i, W, sc4);
          else if (h_end - h == 1)
            dot4<KV, 1>(Q + (b * Hq + h) * D, k0 + g * D, stride, D,
                        S + (b * Hq + h) * W + j * bs + i, W, sc4);
        }
      }
      if (next != nullptr && i < bs) prefetch(next + i * stride, (bs - i) * stride);
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

}  // namespace

void nanoserve::paged_scores_into(at::Tensor& s, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& table, const at::Tensor& lens, int64_t bs,
                                  double scale, int64_t window) {
  if (k.scalar_type() == at::kBFloat16)
    scores_into<at::BFloat16>(s, q, k, table, lens, bs, scale, window);
  else
    scores_into<float>(s, q, k, table, lens, bs, scale, window);
}

namespace {

at::Tensor paged_scores(at::Tensor q, at::Tensor k, at::Tensor table,
                           at::Tensor lens, int64_t bs, double scale, int64_t window) {
  nanoserve::check_paged(q, k, table, lens);
  TORCH_CHECK(q.size(2) == k.size(2), "paged decode kernel: query and key head dims differ");
  auto s = at::empty({q.size(0), q.size(1), table.size(1) * bs}, q.options());
  nanoserve::paged_scores_into(s, q, k, table, lens, bs, scale, window);
  return s;
}

// GT heads' weighted sums of one kv head's values over positions [lo, hi), 8 * NV outputs
// each, added to `o` (or written, when `first`). The outputs stay in GT * NV registers across
// the positions, and each value vector is loaded once for the GT heads that share it.
// o: the first head's outputs (heads D apart); p: its probabilities (heads W apart);
// V + off: the kv head's first value of slot 0.
template <typename KV, int GT, int NV>
inline void mix_group(float* o, int64_t D, const float* p, int64_t W, const KV* V,
                      const int64_t* blocks, int64_t lo, int64_t hi, int64_t bs, int64_t stride,
                      int64_t off, bool first) {
  __m256 acc[GT][NV];
  for (int g = 0; g < GT; ++g)
    for (int v = 0; v < NV; ++v)
      acc[g][v] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(o + g * D + 8 * v);
  for (int64_t pos = lo; pos < hi;) {  // block by block: no division per position
    const int64_t jb = pos / bs, end = std::min(hi, (jb + 1) * bs);
    const KV* vb = V + blocks[jb] * bs * stride + off;
    for (int64_t i = pos - jb * bs; pos < end; ++pos, ++i) {
      const KV* vh = vb + i * stride;
      __m256 w[GT];
      for (int g = 0; g < GT; ++g) w[g] = _mm256_set1_ps(p[g * W + pos]);
      for (int v = 0; v < NV; ++v) {
        const __m256 x = load8(vh + 8 * v);
        for (int g = 0; g < GT; ++g) acc[g][v] = _mm256_fmadd_ps(w[g], x, acc[g][v]);
      }
    }
  }
  for (int g = 0; g < GT; ++g)
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(o + g * D + 8 * v, acc[g][v]);
}

// One kv head's query heads [h, h_end) over one chunk of NV * 8 outputs, three heads a pass.
template <typename KV, int NV>
inline void mix_heads(float* O, const float* P, int64_t h, int64_t h_end, int64_t D, int64_t W,
                      const KV* V, const int64_t* blocks, int64_t lo, int64_t hi, int64_t bs,
                      int64_t stride, int64_t off, bool first) {
  for (; h + 3 <= h_end; h += 3)
    mix_group<KV, 3, NV>(O + h * D, D, P + h * W, W, V, blocks, lo, hi, bs, stride, off, first);
  if (h_end - h == 2)
    mix_group<KV, 2, NV>(O + h * D, D, P + h * W, W, V, blocks, lo, hi, bs, stride, off, first);
  else if (h_end - h == 1)
    mix_group<KV, 1, NV>(O + h * D, D, P + h * W, W, V, blocks, lo, hi, bs, stride, off, first);
}

// probs [B, Hq, nb * bs] (softmax of the scores) -> out [B, Hq, D] = probs . values.
// One task per row; with fewer rows than threads, one per (row, kv head, chunk of outputs).
template <typename KV>
void mix_into(at::Tensor& out, const at::Tensor& probs, const at::Tensor& v,
              const at::Tensor& table, const at::Tensor& lens, int64_t bs,
              int64_t window) {
  const int64_t B = probs.size(0), Hq = probs.size(1), W = probs.size(2);
  const int64_t Hkv = v.size(1), D = v.size(2), G = Hq / Hkv, nb = table.size(1);
  const int64_t stride = Hkv * D;
  const float* P = probs.data_ptr<float>();
  const KV* V = v.data_ptr<KV>();
  const int64_t* T = table.data_ptr<int64_t>();
  const int64_t* L = lens.data_ptr<int64_t>();
  float* O = out.data_ptr<float>();
  // Outputs a pass: 32 (3 heads x 4 registers of outputs, 3 of weights, 1 of values: all 16
  // AVX2 registers), or what the head size allows.
  const int64_t chunk = D % 32 == 0 ? 32 : D % 16 == 0 ? 16 : 8;
  const int64_t per_head = D / chunk, parts = Hkv * per_head;  // chunks: a head's, all
  const int64_t split = B >= at::get_num_threads() ? 1 : parts;
  // Positions a tile: every head's pass over a tile finds its values still in L1 (32
  // positions x every kv head, 24 KB in fp32 at SmolLM2's shapes), while the next tile is
  // fetched into L2.
  constexpr int64_t tile = 32;
  at::parallel_for(0, B * split, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / split, len = L[b], lo = first_seen(len, window);
      const int64_t c0 = split == 1 ? 0 : t % split, c1 = split == 1 ? parts : c0 + 1;
      const int64_t* blocks = T + b * nb;
      // The values this task reads of a position: all, or its kv head's chunk.
      const int64_t seen = split == 1 ? 0 : (c0 / per_head) * D + (c0 % per_head) * chunk;
      const int64_t width = split == 1 ? stride : chunk;
      for (int64_t a = lo; a < len || a == lo; a += tile) {
        const int64_t z = std::min(len, a + tile);
        for (int64_t n = z; n < std::min(len, z + tile); ++n)
          prefetch(V + (blocks[n / bs] * bs + n % bs) * stride + seen, width);
        const bool first = a == lo;
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t g = c / per_head, d = (c % per_head) * chunk;
          float* o = O + b * Hq * D + d;
          const float* p = P + b * Hq * W;
          const int64_t off = g * D + d;
          if (chunk == 32)
            mix_heads<KV, 4>(o, p, g * G, g * G + G, D, W, V, blocks, a, z, bs, stride, off, first);
          else if (chunk == 16)
            mix_heads<KV, 2>(o, p, g * G, g * G + G, D, W, V, blocks, a, z, bs, stride, off, first);
          else
            mix_heads<KV, 1>(o, p, g * G, g * G + G, D, W, V, blocks, a, z, bs, stride, off, first);
        }
      }
    }
  });
}

}  // namespace

void nanoserve::paged_mix_into(at::Tensor& out, const at::Tensor& probs, const at::Tensor& v,
                               const at::Tensor& table, const at::Tensor& lens, int64_t bs,
                               int64_t window) {
  if (v.scalar_type() == at::kBFloat16)
    mix_into<at::BFloat16>(out, probs, v, table, lens, bs, window);
  else
    mix_into<float>(out, probs, v, table, lens, bs, window);
}

namespace {

at::Tensor paged_mix(at::Tensor probs, at::Tensor v, at::Tensor table,
                        at::Tensor lens, int64_t bs, int64_t window) {
  nanoserve::check_paged(probs, v, table, lens);
  // Every output is written (a row that sees no position gets zeros from its empty sum).
  auto out = at::empty({probs.size(0), probs.size(1), v.size(2)}, probs.options());
  nanoserve::paged_mix_into(out, probs, v, table, lens, bs, window);
  return out;
}

}  // namespace

TORCH_LIBRARY(nanoserve, m) {
  m.def("paged_scores(Tensor q, Tensor k, Tensor table, Tensor lens, int bs, float scale, "
        "int window) -> Tensor",
        paged_scores);
  m.def("paged_mix(Tensor probs, Tensor v, Tensor table, Tensor lens, int bs, int window) "
        "-> Tensor",
        paged_mix);
}
