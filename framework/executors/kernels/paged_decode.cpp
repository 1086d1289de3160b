// Decode attention over paged KV, reading each row's blocks in place (CPU, fp32, AVX2).
//
// Why: the portable path (framework/paged_attention.py) first gathers every decode row's
// blocks into a padded contiguous copy, then runs SDPA on it; on CPU that copy plus SDPA's
// per-(row, head) overhead for one query cost 2.4-3.8x what these two loops do (measured on
// SmolLM2's shapes at 1 to 256 rows). Softmax stays in PyTorch between the two calls.
//
// Layout: k, v are one layer's cache, [slots, Hkv, D] with block b = slots b*bs .. b*bs+bs-1,
// so one block is bs * Hkv * D contiguous floats. Query head h reads kv head h / (Hq / Hkv).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <limits>

namespace {

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
  TORCH_CHECK(q.scalar_type() == torch::kFloat && kv.scalar_type() == torch::kFloat,
              "paged decode kernel: float32 only");
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
torch::Tensor paged_scores(torch::Tensor q, torch::Tensor k, torch::Tensor table,
                           torch::Tensor lens, int64_t bs, double scale, int64_t window) {
  check(q, k, table, lens);
  TORCH_CHECK(q.size(2) == k.size(2), "paged decode kernel: query and key head dims differ");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k.size(1);
  const int64_t G = Hq / Hkv, nb = table.size(1), W = nb * bs;
  auto s = torch::empty({B, Hq, W}, q.options());
  const float* Q = q.data_ptr<float>();
  const float* K = k.data_ptr<float>();
  const int64_t* T = table.data_ptr<int64_t>();
  const int64_t* L = lens.data_ptr<int64_t>();
  float* S = s.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const float off = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, B * nb, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / nb, j = t % nb, len = L[b], lo = first_seen(len, window);
      const float* block = K + T[b * nb + j] * bs * Hkv * D;
      for (int64_t i = 0; i < bs; ++i) {
        const int64_t p = j * bs + i;
        const bool seen = p >= lo && p < len;
        for (int64_t h = 0; h < Hq; ++h) {
          float* out = S + (b * Hq + h) * W + p;
          if (!seen) {
            *out = off;
            continue;
          }
          const float* qh = Q + (b * Hq + h) * D;
          const float* kp = block + (i * Hkv + h / G) * D;
          __m256 acc = _mm256_setzero_ps();
          for (int64_t d = 0; d < D; d += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), _mm256_loadu_ps(kp + d), acc);
          *out = hsum(acc) * sc;
        }
      }
    }
  });
  return s;
}

// probs [B, Hq, nb * bs] (softmax of the scores) -> out [B, Hq, D] = probs . values.
// One task per row (each position's values read once for every head); with fewer rows than
// threads, one per (row, head).
torch::Tensor paged_mix(torch::Tensor probs, torch::Tensor v, torch::Tensor table,
                        torch::Tensor lens, int64_t bs, int64_t window) {
  check(probs, v, table, lens);
  const int64_t B = probs.size(0), Hq = probs.size(1), W = probs.size(2);
  const int64_t Hkv = v.size(1), D = v.size(2), G = Hq / Hkv, nb = table.size(1);
  auto out = torch::zeros({B, Hq, D}, probs.options());
  const float* P = probs.data_ptr<float>();
  const float* V = v.data_ptr<float>();
  const int64_t* T = table.data_ptr<int64_t>();
  const int64_t* L = lens.data_ptr<int64_t>();
  float* O = out.data_ptr<float>();
  const int64_t split = B >= at::get_num_threads() ? 1 : Hq;
  at::parallel_for(0, B * split, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / split, len = L[b];
      const int64_t h0 = split == 1 ? 0 : t % split, h1 = split == 1 ? Hq : h0 + 1;
      for (int64_t p = first_seen(len, window); p < len; ++p) {
        const float* vp = V + (T[b * nb + p / bs] * bs + p % bs) * Hkv * D;
        for (int64_t h = h0; h < h1; ++h) {
          const __m256 w = _mm256_set1_ps(P[(b * Hq + h) * W + p]);
          const float* vh = vp + (h / G) * D;
          float* o = O + (b * Hq + h) * D;
          for (int64_t d = 0; d < D; d += 8)
            _mm256_storeu_ps(o + d, _mm256_fmadd_ps(w, _mm256_loadu_ps(vh + d),
                                                    _mm256_loadu_ps(o + d)));
        }
      }
    }
  });
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
