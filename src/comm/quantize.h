// Block-wise symmetric quantization for ZeRO++ (NOTE [block-wise quantization]): what stage 3's
// quantized weight all-gather (zero_quantized_weights, int8) and quantized gradient
// reduce-scatter (zero_quantized_gradients, int4) send instead of the values.
//
// NOTE [block-wise quantization]
// A tensor of n elements is cut into blocks of `block` consecutive elements (the last may be
// shorter). With L = 2^(bits-1) - 1 levels each side (127 for int8, 7 for int4), block b gets the
// scale s_b = max |x| over the block / L (1 for a block of zeros); each element becomes
// q = round_half_even(x / s_b) in [-L, L], and comes back as q * s_b. The error of an element is
// at most s_b / 2 = max |x| / (2L) of its block. Every rank that dequantizes the same bytes gets
// the same values. int8 codes take a byte each; int4 codes two to a byte (element 2i in the low
// nibble), so blocks have an even length. A block holding a NaN or an infinity gets a NaN
// scale, so it comes back NaN rather than silently finite.
// DeepSpeed's qwZ is symmetric int8 in groups of about 4-8k elements, through fp16; its qgZ is
// symmetric int4 in groups of a tensor's larger dimension. Here the input is read in its own
// dtype (fp32, bf16 or fp16), not narrowed to fp16 first.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dscpp::comm {

struct QuantFormat {
  int bits;       // 8 or 4
  int64_t block;  // elements per scale; even
};
// zero_quantized_weights: n + 4 ceil(n / 2048) bytes for n elements (vs 4n fp32, 2n bf16).
inline constexpr QuantFormat kWeightFormat{8, 2048};
// zero_quantized_gradients: n / 2 + 4 ceil(n / 512) bytes.
inline constexpr QuantFormat kGradientFormat{4, 512};

inline int64_t quant_blocks(int64_t n, QuantFormat f) { return (n + f.block - 1) / f.block; }
inline int64_t code_bytes(int64_t n, QuantFormat f) { return f.bits == 8 ? n : (n + 1) / 2; }

// x: contiguous CPU float, bf16 or half [n]; codes: int8 [code_bytes(n)]; scales: float
// [quant_blocks(n)].
void quantize(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
              QuantFormat f);

// out [n] (float, bf16 or half) = the values `codes` and `scales` stand for; `accumulate`: adds
// them to out instead (the quantized reduce-scatter's sums).
void dequantize(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& out,
                QuantFormat f, bool accumulate = false);

}  // namespace dscpp::comm
