// A Linear layer on CPU, AVX2 + FMA: y = x W^T + b, with W in nn.Linear's own layout
// [out_features, in_features], float32 or bfloat16.
//
// Why, at a few rows (decode at batch 1 to 4): there a Linear is a matrix-vector product, bound
// by reading the weight once from memory (a decode step streams every layer's weights, far
// more than L3 holds). oneDNN's packed small-M path read SmolLM2's weights at a fraction of
// what a plain streaming read reaches on the project's EPYC VMs. Here each thread takes one
// contiguous run of output rows (one contiguous stretch of the weight), reads each weight row
// once for all the input rows, and asks for the weight a few rows ahead into L2 while it works.
//
// More rows (a prefill, a larger batch) are bound by the multiplies, not the read: there a tile
// of two weight rows by two input rows keeps eight FMA chains whose loads are shared, and the
// input goes in blocks small enough for L2, each block one pass over the weights. In bf16 on a
// CPU without bf16 instructions (AVX2 only) this was 3-4x PyTorch's bf16 Linear at every row
// count; where oneDNN is faster (fp32 above ~10 rows), `linear_choice` leaves it those counts.
//
// Numerics: each output is one fp32 sum, 16 lanes wide along in_features, the lanes added in a
// fixed order, then the tail, then the bias; the same order on either path and whatever the row
// count, so a row's result does not depend on the batch it is in. bf16 weights are widened to
// fp32 exactly (a shift left by 16); bf16 inputs too; the output is rounded once to the input's
// dtype.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace {

constexpr int64_t kAheadBytes = 2048;  // how far ahead of the loads the weight is asked for

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float widen(float v) { return v; }
inline float widen(c10::BFloat16 v) { return static_cast<float>(v); }

// Output row n of R input rows: out[r * ldo] = x[r] . w + bias.
template <int R, typename W, typename O>
inline void one_row(const W* w, const float* x, int64_t k_len, float bias, O* out, int64_t ldo) {
  __m256 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  const char* ahead = reinterpret_cast<const char*>(w) + kAheadBytes;
  int64_t k = 0;
  for (; k + 16 <= k_len; k += 16) {
    _mm_prefetch(ahead + k * sizeof(W), _MM_HINT_T1);
    const __m256 w0 = load8(w + k), w1 = load8(w + k + 8);
    for (int r = 0; r < R; ++r) {
      lo[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * k_len + k), lo[r]);
      hi[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * k_len + k + 8), hi[r]);
    }
  }
  if (k + 8 <= k_len) {
    const __m256 w0 = load8(w + k);
    for (int r = 0; r < R; ++r) lo[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * k_len + k), lo[r]);
    k += 8;
  }
  for (int r = 0; r < R; ++r) {
    float s = hsum(_mm256_add_ps(lo[r], hi[r]));
    for (int64_t j = k; j < k_len; ++j) s += x[r * k_len + j] * widen(w[j]);
    out[r * ldo] = static_cast<O>(s + bias);
  }
}

// The many-rows path's tile: NW weight rows (at `w + j * k_len`) by R input rows,
// out[r * ldo + j] = x[r] . w[j] + bias[j], each output summed as `one_row` sums it. It is
// not used at 1 to 4 rows: there the read bounds the time, and one weight row streamed at a
// time (`one_row`) was faster; tiles of two or four weight rows measured 1.05-1.5x slower at
// 1 to 3 rows on the Zen 3 VM.
template <int NW, int R, typename W, typename O>
inline void tile(const W* w, const float* x, int64_t k_len, const float* bias, O* out,
                 int64_t ldo) {
  __m256 lo[NW][R], hi[NW][R];
  for (int j = 0; j < NW; ++j) {
    for (int r = 0; r < R; ++r) lo[j][r] = hi[j][r] = _mm256_setzero_ps();
  }
  int64_t k = 0;
  for (; k + 16 <= k_len; k += 16) {
    for (int j = 0; j < NW; ++j) {
      const __m256 w0 = load8(w + j * k_len + k), w1 = load8(w + j * k_len + k + 8);
      for (int r = 0; r < R; ++r) {
        lo[j][r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * k_len + k), lo[j][r]);
        hi[j][r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * k_len + k + 8), hi[j][r]);
      }
    }
  }
  if (k + 8 <= k_len) {
    for (int j = 0; j < NW; ++j) {
      const __m256 w0 = load8(w + j * k_len + k);
      for (int r = 0; r < R; ++r) {
        lo[j][r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * k_len + k), lo[j][r]);
      }
    }
    k += 8;
  }
  for (int j = 0; j < NW; ++j) {
    for (int r = 0; r < R; ++r) {
      float s = hsum(_mm256_add_ps(lo[j][r], hi[j][r]));
      for (int64_t i = k; i < k_len; ++i) s += x[r * k_len + i] * widen(w[j * k_len + i]);
      out[r * ldo + j] = static_cast<O>(s + bias[j]);
    }
  }
}

// NW weight rows against every input row of a block, two at a time (the weight rows stay in
// L1 while the input passes).
template <int NW, typename W, typename O>
inline void against_block(const W* w, const float* x, int64_t rows, int64_t k_len,
                          const float* bias, O* out, int64_t ldo) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) tile<NW, 2>(w, x + r * k_len, k_len, bias, out + r * ldo, ldo);
  if (r < rows) tile<NW, 1>(w, x + r * k_len, k_len, bias, out + r * ldo, ldo);
}

template <typename W, typename O>
void many_rows(const W* w, const float* x, int64_t rows, const W* bias, O* out, int64_t n_out,
               int64_t k_len) {
  std::vector<float> b(n_out, 0.0f);  // the bias in fp32 (zeros without one): tiles read it
  if (bias) {
    for (int64_t n = 0; n < n_out; ++n) b[n] = widen(bias[n]);
  }
  // Input blocks of 128 KB (a quarter to half of L2 on the EPYC VMs), so the block stays in L2
  // while every weight pair passes it; at least 64 KB of weight (and 8 pairs) a thread's chunk.
  const int64_t block = std::max<int64_t>(2, (int64_t{1} << 17) / (k_len * int64_t{sizeof(float)}));
  const int64_t pairs = (n_out + 1) / 2;
  const int64_t grain = std::max<int64_t>(8, (int64_t{1} << 15) / (k_len * sizeof(W)));
  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    const int64_t here = std::min(block, rows - r0);
    const float* xb = x + r0 * k_len;
    O* ob = out + r0 * n_out;
    at::parallel_for(0, pairs, grain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t n = 2 * t;
        if (n + 2 <= n_out) {
          against_block<2>(w + n * k_len, xb, here, k_len, b.data() + n, ob + n, n_out);
        } else {
          against_block<1>(w + n * k_len, xb, here, k_len, b.data() + n, ob + n, n_out);
        }
      }
    });
  }
}

template <int R, typename W, typename O>
void rows_of(const W* w, const float* x, const W* bias, O* out, int64_t n_out, int64_t k_len) {
  // A grain of 16 rows: a small layer runs on one thread rather than paying a fork for little.
  const int64_t grain = std::max<int64_t>(16, (int64_t{1} << 16) / (k_len * sizeof(W)));
  at::parallel_for(0, n_out, grain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float b = bias ? widen(bias[n]) : 0.0f;
      one_row<R, W, O>(w + n * k_len, x, k_len, b, out + n, n_out);
    }
  });
}

template <typename W, typename O>
void dispatch(int64_t rows, const W* w, const float* x, const W* bias, O* out, int64_t n_out,
              int64_t k_len) {
  switch (rows) {
    case 1: return rows_of<1>(w, x, bias, out, n_out, k_len);
    case 2: return rows_of<2>(w, x, bias, out, n_out, k_len);
    case 3: return rows_of<3>(w, x, bias, out, n_out, k_len);
    case 4: return rows_of<4>(w, x, bias, out, n_out, k_len);
    default: return many_rows(w, x, rows, bias, out, n_out, k_len);
  }
}

template <typename W>
void run(const float* x, int64_t rows, const at::Tensor& weight,
         const std::optional<at::Tensor>& bias, at::Tensor& out) {
  const int64_t k_len = weight.size(1), n_out = weight.size(0);
  const W* w = weight.data_ptr<W>();
  const W* b = bias.has_value() ? bias->data_ptr<W>() : nullptr;
  if (out.scalar_type() == at::kFloat) {
    dispatch<W, float>(rows, w, x, b, out.data_ptr<float>(), n_out, k_len);
  } else {
    dispatch<W, c10::BFloat16>(rows, w, x, b, out.data_ptr<c10::BFloat16>(), n_out, k_len);
  }
}

}  // namespace

at::Tensor small_linear(const at::Tensor& input, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias) {
  const auto dtype = weight.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "small_linear kernel: float32 or bfloat16 weights only");
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.device().is_cpu(),
              "small_linear kernel: a contiguous [out, in] CPU weight");
  const auto in_dtype = input.scalar_type();
  TORCH_CHECK(in_dtype == at::kFloat || in_dtype == at::kBFloat16,
              "small_linear kernel: float32 or bfloat16 input only");
  const int64_t k_len = weight.size(1), n_out = weight.size(0);
  TORCH_CHECK(input.dim() >= 1 && input.size(-1) == k_len, "small_linear kernel: input width ",
              input.size(-1), " is not the weight's in_features ", k_len);
  const int64_t rows = k_len ? input.numel() / k_len : 0;
  TORCH_CHECK(rows >= 1, "small_linear kernel: at least 1 row, got ", rows);
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == dtype && bias->is_contiguous() && bias->numel() == n_out,
                "small_linear kernel: a contiguous bias of out_features in the weight's dtype");
  }
  // The input as fp32 rows: in place where it is already, else widened here (a few KB at
  // decode sizes, where an ATen conversion would cost more than a small layer's product).
  const at::Tensor x = input.is_contiguous() ? input : input.contiguous();
  const float* xf = nullptr;
  std::vector<float> widened;
  if (in_dtype == at::kFloat) {
    xf = x.data_ptr<float>();
  } else {
    const c10::BFloat16* xb = x.data_ptr<c10::BFloat16>();
    widened.resize(rows * k_len);
    for (int64_t i = 0; i < rows * k_len; ++i) widened[i] = static_cast<float>(xb[i]);
    xf = widened.data();
  }
  auto sizes = input.sizes().vec();
  sizes.back() = n_out;
  at::Tensor out = at::empty(sizes, input.options());
  if (dtype == at::kFloat) {
    run<float>(xf, rows, weight, bias, out);
  } else {
    run<c10::BFloat16>(xf, rows, weight, bias, out);
  }
  return out;
}

TORCH_LIBRARY_FRAGMENT(nanoserve, m) {
  m.def("small_linear(Tensor input, Tensor weight, Tensor? bias) -> Tensor");
  m.impl("small_linear", c10::kCPU, &small_linear);
}
