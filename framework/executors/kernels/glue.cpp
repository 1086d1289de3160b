// The decoder layer's elementwise glue as one operator each (CPU; fp32 or bf16): RMSNorm,
// rotary position embedding on the query and key together, and SiLU-and-multiply.
//
// Why: in eager PyTorch each of these is a chain of small operators (RMSNorm eight, rotary
// fourteen for q and k, SiLU-and-multiply two), and from Python every one of them costs its
// dispatch and a fresh tensor; over SmolLM2's 30 layers that was a tenth of a decode step.
//
// Rounding: each gives the same bits as Hugging Face's modules in both dtypes: every product
// and sum rounded where eager rounds it, in bf16 to bf16 (the build passes -ffp-contract=off so
// that no multiply and add become one rounding), and RMSNorm's mean of squares taken by
// ATen's own sum, whose summation order is eager's.
#include "glue_math.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>

namespace {

using nanoserve::round_as;
using nanoserve::store;
using nanoserve::widen;

// Rows of `n` values, each scaled by 1 / sqrt(its mean square + eps) and the weight.
template <typename T>
void rms_rows(const T* x, const float* var, const T* w, T* out, int64_t rows, int64_t n,
              float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * n;
      T* o = out + r * n;
      const float scale = 1.0f / std::sqrt(var[r] + eps);  // torch.rsqrt's own arithmetic
      for (int64_t k = 0; k < n; ++k) {
        // eager: (x * rsqrt(var + eps)).to(dtype), then weight * that, rounded to dtype
        const float y = round_as<T>(widen(xr[k]) * scale);
        o[k] = store<T, T>(widen(w[k]) * y);
      }
    }
  });
}

void check_dtype(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16,
              what, ": float32 or bfloat16 only");
}

// Each row's mean square, in fp32, with eager's bits: `x.to(float32).pow(2).mean(-1)` is, on
// the CPU, the squares (pow by 2 is x * x), ATen's sum over the last dim, then a division by
// the width. The squares and the division are ours; the sum is ATen's own, so that its order
// (which depends on the CPU's vector width) is eager's.
template <typename T>
at::Tensor mean_squares(const T* x, int64_t rows, int64_t n) {
  at::Tensor sq = at::empty({rows, n}, at::TensorOptions().dtype(at::kFloat));
  float* q = sq.data_ptr<float>();
  for (int64_t i = 0; i < rows * n; ++i) {
    const float v = widen(x[i]);
    q[i] = v * v;
  }
  at::Tensor var = at::sum(sq, -1);
  float* vp = var.data_ptr<float>();
  const float width = static_cast<float>(n);
  for (int64_t r = 0; r < rows; ++r) vp[r] = vp[r] / width;
  return var;
}

template <typename T>
void norm_rows(const T* x, const T* w, T* out, int64_t rows, int64_t n, float eps) {
  const at::Tensor var = mean_squares<T>(x, rows, n);
  rms_rows<T>(x, var.data_ptr<float>(), w, out, rows, n, eps);
}

void check_norm(const at::Tensor& x, const at::Tensor& weight, const char* what) {
  check_dtype(x, what);
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.dim() == 1 &&
                  weight.size(0) == x.size(-1),
              what, ": a weight of the input's dtype and last size");
}

}  // namespace

// RMSNorm over the last dim, as Llama's (weight * normed, the norm in fp32): x [..., n].
at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& weight, double eps) {
  check_norm(x_in, weight, "rms_norm kernel");
  const at::Tensor x = x_in.contiguous();
  const at::Tensor w = weight.contiguous();
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  at::Tensor out = at::empty_like(x);
  if (rows == 0) return out;
  if (x.scalar_type() == at::kFloat)
    norm_rows<float>(x.data_ptr<float>(), w.data_ptr<float>(), out.data_ptr<float>(), rows, n,
                     static_cast<float>(eps));
  else
    norm_rows<at::BFloat16>(x.data_ptr<at::BFloat16>(), w.data_ptr<at::BFloat16>(),
                            out.data_ptr<at::BFloat16>(), rows, n, static_cast<float>(eps));
  return out;
}

namespace {

template <typename T>
void add_rows(const T* x, const T* residual, T* sum, int64_t count) {
  for (int64_t i = 0; i < count; ++i) sum[i] = store<T, T>(widen(residual[i]) + widen(x[i]));
}

}  // namespace

// The decoder layer's residual add and the next RMSNorm in one call: (norm(residual + x),
// residual + x), the sum rounded to the dtype as eager's add rounds it.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x_in,
                                                const at::Tensor& residual_in,
                                                const at::Tensor& weight, double eps) {
  check_norm(x_in, weight, "add_rms_norm kernel");
  TORCH_CHECK(residual_in.scalar_type() == x_in.scalar_type() &&
                  residual_in.sizes() == x_in.sizes(),
              "add_rms_norm kernel: x and the residual of one dtype and shape");
  const at::Tensor x = x_in.contiguous(), residual = residual_in.contiguous();
  const at::Tensor w = weight.contiguous();
  const int64_t n = x.size(-1), rows = n ? x.numel() / n : 0;
  at::Tensor sum = at::empty_like(x), out = at::empty_like(x);
  if (rows == 0) return {out, sum};
  const float e = static_cast<float>(eps);
  if (x.scalar_type() == at::kFloat) {
    add_rows<float>(x.data_ptr<float>(), residual.data_ptr<float>(), sum.data_ptr<float>(),
                    rows * n);
    norm_rows<float>(sum.data_ptr<float>(), w.data_ptr<float>(), out.data_ptr<float>(), rows, n,
                     e);
  } else {
    using B = at::BFloat16;
    add_rows<B>(x.data_ptr<B>(), residual.data_ptr<B>(), sum.data_ptr<B>(), rows * n);
    norm_rows<B>(sum.data_ptr<B>(), w.data_ptr<B>(), out.data_ptr<B>(), rows, n, e);
  }
  return {out, sum};
}

namespace {

using nanoserve::rotate;

// x [1, H, T, D] with strides (any, sH, sT, 1); cos, sin [1, T, D] contiguous. out: the same
// shape laid out as [T, H, D] (what the paged attention reads token by token).
template <typename T>
at::Tensor rotary_one(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t heads = x.size(1), tokens = x.size(2), d = x.size(3);
  const int64_t sh = x.stride(1), st = x.stride(2);
  at::Tensor out = at::empty({1, tokens, heads, d}, x.options());
  const T* xp = x.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, tokens * heads, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / heads, hd = i % heads;
      rotate<T, T>(xp + t * st + hd * sh, cp + t * d, sp + t * d, op + i * d, d);
    }
  });
  return out.transpose(1, 2);
}

at::Tensor rotary_dispatch(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4 && x.size(0) == 1 && x.stride(3) == 1 && x.size(3) % 2 == 0,
              "rotary kernel: [1, heads, tokens, even head dim], the last dim contiguous");
  if (x.scalar_type() == at::kFloat) return rotary_one<float>(x, cos, sin);
  return rotary_one<at::BFloat16>(x, cos, sin);
}

}  // namespace

// Rotary position embedding on q and k ([1, H, T, D] each) with cos, sin [1, T, D].
std::tuple<at::Tensor, at::Tensor> rotary(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& cos_in, const at::Tensor& sin_in) {
  check_dtype(q, "rotary kernel");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && cos_in.scalar_type() == q.scalar_type() &&
                  sin_in.scalar_type() == q.scalar_type(),
              "rotary kernel: q, k, cos and sin of one dtype");
  const at::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
  TORCH_CHECK(cos.dim() == 3 && cos.size(0) == 1 && cos.size(1) == q.size(2) &&
                  cos.size(2) == q.size(3) && sin.sizes() == cos.sizes() &&
                  k.size(2) == q.size(2) && k.size(3) == q.size(3),
              "rotary kernel: cos and sin [1, tokens, head dim] for q and k's tokens");
  return {rotary_dispatch(q, cos, sin), rotary_dispatch(k, cos, sin)};
}

// SiLU(gate) * up, as eager computes it: SiLU rounded to the dtype, then the product. ATen's
// own vectorised SiLU, with the multiply in place: one call from Python instead of two.
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  check_dtype(gate, "silu_mul kernel");
  TORCH_CHECK(up.scalar_type() == gate.scalar_type() && up.sizes() == gate.sizes(),
              "silu_mul kernel: gate and up of one dtype and shape");
  at::Tensor out = at::silu(gate);
  out.mul_(up);
  return out;
}

TORCH_LIBRARY_FRAGMENT(nanoserve, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.impl("rms_norm", c10::kCPU, &rms_norm);
  m.def("rotary(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
  m.impl("rotary", c10::kCPU, &rotary);
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.impl("add_rms_norm", c10::kCPU, &add_rms_norm);
  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");
  m.impl("silu_mul", c10::kCPU, &silu_mul);
}
