// Greedy sampling's argmax over each row of fp32 logits (CPU, AVX2): the index of the first
// largest value, exactly as torch.argmax gives it (a NaN counts as the largest, and the first
// NaN wins; ties go to the lowest index, -0.0 equal to +0.0).
//
// Why: torch's CPU argmax over a [rows, vocab] tensor ran 13x slower than its amax over the
// same data (4.6 ms against 0.36 ms at 128 rows x 49,152 on a 2-core AMD EPYC, Zen 4): its
// reduction carries an index through every comparison. Here one vectorised pass finds the
// row's largest value (and whether it holds a NaN), and a second pass over the same row, now
// in L2, finds the first position equal to it, usually stopping part way.
#include <ATen/ATen.h>
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <limits>

namespace {

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

int64_t first_nan(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return i;
  }
  return -1;
}

int64_t row_argmax(const float* x, int64_t n) {
  int64_t i = 0;
  __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 unordered = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    vmax = _mm256_max_ps(vmax, v);
  }
  float m = hmax(vmax);
  bool nan = _mm256_movemask_ps(unordered) != 0;
  for (int64_t j = i; j < n; ++j) {
    nan = nan || std::isnan(x[j]);
    m = x[j] > m ? x[j] : m;
  }
  if (nan) return first_nan(x, n);
  const __m256 target = _mm256_set1_ps(m);
  for (i = 0; i + 8 <= n; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), target, _CMP_EQ_OQ));
    if (hit) return i + __builtin_ctz(static_cast<unsigned>(hit));
  }
  for (; i < n; ++i) {
    if (x[i] == m) return i;
  }
  return 0;  // unreachable: m is one of the row's values
}

}  // namespace

at::Tensor greedy_argmax(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous(),
              "greedy argmax kernel: contiguous [rows, vocab] float32 logits only");
  TORCH_CHECK(logits.size(1) > 0, "greedy argmax kernel: an empty vocabulary");
  const int64_t rows = logits.size(0), n = logits.size(1);
  auto out = at::empty({rows}, logits.options().dtype(at::kLong));
  const float* x = logits.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) o[r] = row_argmax(x + r * n, n);
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(nanoserve, m) {
  m.def("greedy_argmax(Tensor logits) -> Tensor");
  m.impl("greedy_argmax", c10::kCPU, &greedy_argmax);
}
