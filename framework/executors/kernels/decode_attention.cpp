// A decode step's attention for one layer in one call (CPU; fp32 or bf16): the rotary
// embedding of this step's queries and keys, the keys and values written into their cache
// slots, and attention over each row's blocks (the paged decode kernel's two passes, with
// ATen's softmax between them), out in the model's dtype.
//
// Why: between the q/k/v projections and the o projection a decode step otherwise runs a
// dozen operators a layer from Python (views, rotary, two index copies, the query's widening,
// scores, softmax, values, the narrowing, reshapes), each costing its dispatch and a fresh
// tensor; at batch 1 that was as much time as the arithmetic.
//
// Bits: the same as those operators give in turn: the rotary rounds as Hugging Face's
// (glue_math.h), a bf16 query is rounded to bf16 and then widened, as `.float()` of the rotary
// output is, and the scores, softmax and weighted sum are the same code and ATen calls.
#include "glue_math.h"
#include "paged_decode.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

namespace {

// Rotary on the queries (into fp32 [T, Hq, D]) and keys (into the key cache at each token's
// slot), and the values copied into theirs. q, k, v: [T, H * D] rows, the last dim contiguous.
template <typename T>
void rotate_and_store(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& cos, const at::Tensor& sin, at::Tensor& qf,
                      at::Tensor& k_cache, at::Tensor& v_cache, const int64_t* slots,
                      int64_t tokens, int64_t hq, int64_t hkv, int64_t d) {
  const T* Q = q.data_ptr<T>();
  const T* K = k.data_ptr<T>();
  const T* V = v.data_ptr<T>();
  const T* C = cos.data_ptr<T>();
  const T* S = sin.data_ptr<T>();
  float* QF = qf.data_ptr<float>();
  T* KC = k_cache.data_ptr<T>();
  T* VC = v_cache.data_ptr<T>();
  const int64_t sq = q.stride(0), sk = k.stride(0), sv = v.stride(0), row = hkv * d;
  const int64_t heads = hq + hkv;
  at::parallel_for(0, tokens * heads, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = i / heads, h = i % heads;
      const T* c = C + t * d;
      const T* s = S + t * d;
      if (h < hq) {
        nanoserve::rotate<T, float>(Q + t * sq + h * d, c, s, QF + (t * hq + h) * d, d);
      } else {
        const int64_t g = h - hq;
        nanoserve::rotate<T, T>(K + t * sk + g * d, c, s, KC + slots[t] * row + g * d, d);
        std::memcpy(VC + slots[t] * row + g * d, V + t * sv + g * d, d * sizeof(T));
      }
    }
  });
}

at::Tensor as_rows(const at::Tensor& x, int64_t tokens) {
  at::Tensor r = x.reshape({tokens, x.size(-1)});
  TORCH_CHECK(r.stride(1) == 1,
              "decode_attention kernel: projections with the last dim contiguous");
  return r;
}

}  // namespace

// q [.., T, Hq * D], k and v [.., T, Hkv * D] (this step's projections, one decode row a token);
// cos, sin [1, T, D]; k_cache, v_cache [slots, Hkv, D]; slots [T]; table [T, nb]; lens [T]
// (any shape of T values). Returns the attention output shaped as q, in q's dtype.
at::Tensor decode_attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                            const at::Tensor& cos_in, const at::Tensor& sin_in,
                            at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& slots_in,
                            const at::Tensor& table, const at::Tensor& lens_in, int64_t bs,
                            double scale, int64_t window) {
  const auto dtype = q_in.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "decode_attention kernel: float32 or bfloat16 only");
  const at::Tensor* operands[] = {&k_in, &v_in, &cos_in, &sin_in, &k_cache, &v_cache};
  for (const at::Tensor* t : operands)
    TORCH_CHECK(t->scalar_type() == dtype, "decode_attention kernel: every operand in q's dtype");
  TORCH_CHECK(k_cache.dim() == 3 && k_cache.is_contiguous() && v_cache.sizes() == k_cache.sizes() &&
                  v_cache.is_contiguous(),
              "decode_attention kernel: contiguous [slots, kv heads, head dim] caches");
  const int64_t hkv = k_cache.size(1), d = k_cache.size(2);
  TORCH_CHECK(d % 8 == 0 && q_in.size(-1) % d == 0 && k_in.size(-1) == hkv * d &&
                  v_in.size(-1) == hkv * d,
              "decode_attention kernel: projections of whole heads of the cache's head dim");
  const int64_t hq = q_in.size(-1) / d, tokens = q_in.numel() / q_in.size(-1);
  const at::Tensor q = as_rows(q_in, tokens), k = as_rows(k_in, tokens), v = as_rows(v_in, tokens);
  const at::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
  TORCH_CHECK(cos.numel() == tokens * d && sin.numel() == tokens * d,
              "decode_attention kernel: cos and sin [1, tokens, head dim]");
  const at::Tensor slots = slots_in.reshape({-1}).contiguous();
  const at::Tensor lens = lens_in.reshape({-1}).contiguous();
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == tokens,
              "decode_attention kernel: one int64 slot a token");
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(sp[t] >= 0 && sp[t] < k_cache.size(0), "decode_attention kernel: slot ", sp[t],
                " outside the cache's ", k_cache.size(0));
  at::Tensor qf = at::empty({tokens, hq, d}, q.options().dtype(at::kFloat));
  nanoserve::check_paged(qf, k_cache, table, lens);
  if (dtype == at::kFloat)
    rotate_and_store<float>(q, k, v, cos, sin, qf, k_cache, v_cache, sp, tokens, hq, hkv, d);
  else
    rotate_and_store<at::BFloat16>(q, k, v, cos, sin, qf, k_cache, v_cache, sp, tokens, hq, hkv, d);
  at::Tensor scores = at::empty({tokens, hq, table.size(1) * bs}, qf.options());
  nanoserve::paged_scores_into(scores, qf, k_cache, table, lens, bs, scale, window);
  const at::Tensor probs = at::_softmax(scores, -1, false);
  at::Tensor out = at::empty({tokens, hq, d}, qf.options());
  nanoserve::paged_mix_into(out, probs, v_cache, table, lens, bs, window);
  return out.to(dtype).view(q_in.sizes());
}

TORCH_LIBRARY_FRAGMENT(nanoserve, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin, "
        "Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slots, Tensor table, Tensor lens, int bs, "
        "float scale, int window) -> Tensor");
  m.impl("decode_attention", c10::kCPU, &decode_attention);
}
