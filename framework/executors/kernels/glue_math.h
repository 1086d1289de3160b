// Elementwise arithmetic shared by the layer glue (glue.cpp) and the fused decode attention
// (decode_attention.cpp), written to round where eager PyTorch rounds: a bf16 value is widened
// to fp32 for each operation and every result rounded back to the tensor's dtype, and the build
// passes -ffp-contract=off so that no multiply and add become one rounding.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace nanoserve {

inline float widen(float x) { return x; }
inline float widen(c10::BFloat16 x) { return static_cast<float>(x); }

// A value as the tensor's dtype rounds it, read back as fp32: what eager keeps between ops.
template <typename T>
inline float round_as(float x) {
  return static_cast<float>(static_cast<T>(x));
}

// One head's rotary embedding, as Hugging Face's apply_rotary_pos_emb computes it:
// out = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1), each product and the
// sum rounded to T; written as O (T itself, or fp32 holding the T-rounded value).
template <typename T, typename O>
inline void rotate(const T* x, const T* c, const T* s, O* o, int64_t d) {
  const int64_t h = d / 2;
  for (int64_t i = 0; i < d; ++i) {
    const float xi = widen(x[i]);
    const float rot = i < h ? -widen(x[i + h]) : widen(x[i - h]);
    const float a = round_as<T>(xi * widen(c[i]));
    const float b = round_as<T>(rot * widen(s[i]));
    o[i] = static_cast<O>(static_cast<T>(a + b));
  }
}

}  // namespace nanoserve
