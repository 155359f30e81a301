// The GPT kernels one float at a time: the table for CPUs without AVX-512 (and for
// DSCPP_GPT_KERNELS=scalar). Compiled with the project's default flags only.
#include <cstdint>

#include "models/kernels/kernels.h"

namespace dscpp::models::kernels {
namespace {
#include "models/kernels/scalar_ops.h"
using Vec = Scalar;
#include "models/kernels/kernels_impl.h"
}  // namespace

const Table kScalarTable = {"scalar",           softmax_forward,     softmax_backward,
                            layer_norm_forward, layer_norm_backward, gelu_forward,
                            gelu_backward};

}  // namespace dscpp::models::kernels
