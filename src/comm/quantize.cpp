// Implements the block-wise quantization of quantize.h (NOTE [block-wise quantization]).
#include "comm/quantize.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "dscpp/error.h"

namespace dscpp::comm {
namespace {

// Code i of a block as a signed level, and storing one.
int level_at(const int8_t* codes, int64_t i, int bits) {
  if (bits == 8) return codes[i];
  const uint8_t byte = static_cast<uint8_t>(codes[i / 2]);
  const int nibble = i % 2 ? byte >> 4 : byte & 0xF;
  return nibble >= 8 ? nibble - 16 : nibble;
}

template <typename T>
void quantize_blocks(const T* x, int8_t* codes, float* scales, int64_t n, QuantFormat f, int64_t b0,
                     int64_t b1) {
  const float levels = static_cast<float>((1 << (f.bits - 1)) - 1);
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t from = b * f.block, len = std::min(f.block, n - from);
    float amax = 0;
    bool finite = true;
    for (int64_t i = 0; i < len; ++i) {
      const float v = static_cast<float>(x[from + i]);
      finite = finite && std::isfinite(v);
      amax = std::max(amax, std::fabs(v));
    }
    // A block of tiny values keeps a normal scale (at least FLT_MIN), so 1 / scale is finite
    // and x / scale never meets 0 * inf; the error stays below FLT_MIN / 2.
    const float scale = !finite    ? std::numeric_limits<float>::quiet_NaN()
                        : amax > 0 ? std::max(amax / levels, std::numeric_limits<float>::min())
                                   : 1.0f;
    scales[b] = scale;
    const float inv = finite ? 1.0f / scale : 0.0f;
    // round(x / scale) in [-levels, levels]; a non-finite block codes zeros (its scale is NaN).
    auto level = [&](int64_t k) {
      const float v = std::nearbyint(static_cast<float>(x[from + k]) * inv);
      return finite ? static_cast<int>(std::clamp(v, -levels, levels)) : 0;
    };
    if (f.bits == 8) {
      for (int64_t i = 0; i < len; ++i) codes[from + i] = static_cast<int8_t>(level(i));
    } else {
      // Blocks have an even length and start on a byte: element pairs never straddle blocks.
      for (int64_t i = 0; i < len; i += 2) {
        auto code = [&](int64_t k) { return k < len ? level(k) & 0xF : 0; };
        codes[(from + i) / 2] = static_cast<int8_t>(code(i) | (code(i + 1) << 4));
      }
    }
  }
}

template <typename T>
void dequantize_blocks(const int8_t* codes, const float* scales, T* out, int64_t n, QuantFormat f,
                       bool accumulate, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t from = b * f.block, len = std::min(f.block, n - from);
    const float scale = scales[b];
    for (int64_t i = 0; i < len; ++i) {
      const float v = level_at(codes, from + i, f.bits) * scale;
      out[from + i] = static_cast<T>(accumulate ? static_cast<float>(out[from + i]) + v : v);
    }
  }
}

void check(const at::Tensor& values, const at::Tensor& codes, const at::Tensor& scales,
           QuantFormat f, const char* what) {
  DSCPP_CHECK((f.bits == 8 || f.bits == 4) && f.block > 0 && f.block % 2 == 0, Error, what, ": ",
              f.bits, "-bit codes in blocks of ", f.block, " are not a format");
  DSCPP_CHECK(values.device().is_cpu() && values.is_contiguous() && codes.is_contiguous() &&
                  scales.is_contiguous(),
              Error, what, ": contiguous CPU tensors only");
  const int64_t n = values.numel();
  DSCPP_CHECK(codes.scalar_type() == at::kChar && scales.scalar_type() == at::kFloat &&
                  codes.numel() == code_bytes(n, f) && scales.numel() == quant_blocks(n, f),
              Error, what, ": needs int8 [", code_bytes(n, f), "] and float [", quant_blocks(n, f),
              "], got ", codes.scalar_type(), " [", codes.numel(), "] and ", scales.scalar_type(),
              " [", scales.numel(), "]");
}

template <typename Fn>
void for_dtype(const at::Tensor& t, const char* what, Fn&& fn) {
  switch (t.scalar_type()) {
    case at::kFloat:
      fn(t.data_ptr<float>());
      break;
    case at::kBFloat16:
      fn(t.data_ptr<c10::BFloat16>());
      break;
    case at::kHalf:
      fn(t.data_ptr<c10::Half>());
      break;
    default:
      DSCPP_FAIL(Error, what, ": float, bf16 or fp16 only, got ", t.scalar_type());
  }
}

}  // namespace

void quantize(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
              QuantFormat f) {
  check(x, codes, scales, f, "quantize");
  const int64_t n = x.numel();
  int8_t* cp = codes.data_ptr<int8_t>();
  float* sp = scales.data_ptr<float>();
  for_dtype(x, "quantize", [&](auto* xp) {
    at::parallel_for(0, quant_blocks(n, f), 16,
                     [&](int64_t b0, int64_t b1) { quantize_blocks(xp, cp, sp, n, f, b0, b1); });
  });
}

void dequantize(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& out,
                QuantFormat f, bool accumulate) {
  check(out, codes, scales, f, "dequantize");
  const int64_t n = out.numel();
  const int8_t* cp = codes.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  for_dtype(out, "dequantize", [&](auto* op) {
    at::parallel_for(0, quant_blocks(n, f), 16, [&](int64_t b0, int64_t b1) {
      dequantize_blocks(cp, sp, op, n, f, accumulate, b0, b1);
    });
  });
}

}  // namespace dscpp::comm
