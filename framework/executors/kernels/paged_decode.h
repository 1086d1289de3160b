// The two passes of decode attention over paged KV (paged_decode.cpp), for other operators of
// the same extension that attend in the middle of their own work.
#pragma once

#include <ATen/ATen.h>

namespace nanoserve {

// Checks the operands as the paged_scores / paged_mix operators do.
void check_paged(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& table,
                 const at::Tensor& lens);

// q [B, Hq, D] fp32 -> s [B, Hq, nb * bs]: scaled scores, -inf where a row does not look.
void paged_scores_into(at::Tensor& s, const at::Tensor& q, const at::Tensor& k,
                       const at::Tensor& table, const at::Tensor& lens, int64_t bs, double scale,
                       int64_t window);

// probs [B, Hq, nb * bs] -> out [B, Hq, D] fp32: the probabilities' weighted values.
void paged_mix_into(at::Tensor& out, const at::Tensor& probs, const at::Tensor& v,
                    const at::Tensor& table, const at::Tensor& lens, int64_t bs, int64_t window);

}  // namespace nanoserve
