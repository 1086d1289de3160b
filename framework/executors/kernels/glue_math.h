// Elementwise arithmetic shared by the layer glue (glue.cpp) and the fused decode attention
// (decode_attention.cpp), written to round where eager PyTorch rounds: a bf16 value is widened
// to fp32 for each operation and every result rounded back to the tensor's dtype, and the build
// passes -ffp-contract=off so that no multiply and add become one rounding.
//
// The bf16 conversions are c10's own (round to nearest even, NaN to 0x7FC0) written without a
// branch, so that the compiler vectorises the loops around them: with c10's branching
// conversion a bf16 rotary at 64 rows took 8x its fp32 time.
#pragma once

#include <c10/util/BFloat16.h>

#include <bit>
#include <cstdint>

namespace nanoserve {

// fp32 -> bf16 bits, as c10::BFloat16(float) rounds.
inline uint16_t bf16_bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (u + UINT32_C(0x7FFF) + ((u >> 16) & 1)) >> 16;
  return x != x ? UINT16_C(0x7FC0) : static_cast<uint16_t>(rounded);
}

inline float widen(float x) { return x; }
inline float widen(c10::BFloat16 x) { return std::bit_cast<float>(static_cast<uint32_t>(x.x) << 16); }

// A value as the dtype T rounds it, read back as fp32: what eager keeps between ops.
template <typename T>
inline float round_as(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return std::bit_cast<float>(static_cast<uint32_t>(bf16_bits(x)) << 16);
  }
}

// A value stored as O, rounded as T: T itself, or fp32 holding the T-rounded value.
template <typename T, typename O>
inline O store(float x) {
  if constexpr (std::is_same_v<O, c10::BFloat16>) {
    return c10::BFloat16(bf16_bits(x), c10::BFloat16::from_bits());
  } else {
    return round_as<T>(x);
  }
}

// One head's rotary embedding, as Hugging Face's apply_rotary_pos_emb computes it:
// out = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1), each product and the
// sum rounded to T. Two loops (the halves), so that each vectorises.
template <typename T, typename O>
inline void rotate(const T* x, const T* c, const T* s, O* o, int64_t d) {
  const int64_t h = d / 2;
  for (int64_t i = 0; i < h; ++i) {
    const float a = round_as<T>(widen(x[i]) * widen(c[i]));
    const float b = round_as<T>(-widen(x[i + h]) * widen(s[i]));
    o[i] = store<T, O>(a + b);
  }
  for (int64_t i = h; i < d; ++i) {
    const float a = round_as<T>(widen(x[i]) * widen(c[i]));
    const float b = round_as<T>(widen(x[i - h]) * widen(s[i]));
    o[i] = store<T, O>(a + b);
  }
}

}  // namespace nanoserve
