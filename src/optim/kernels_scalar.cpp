// The optimizer kernels one float at a time: the table for CPUs without AVX2 (and for
// DSCPP_OPTIM_SIMD=scalar). Compiled with the project's default flags only.
#include <cstdint>

#include "optim/kernels.h"

namespace dscpp::optim::kernels {
namespace {
#include "optim/kernels_scalar_ops.h"
using Vec = Scalar;
#include "optim/kernels_impl.h"
}  // namespace

const Table kScalarTable = {"scalar", adam, sgd, adagrad, lion, lamb_norms, lamb_apply, sum_sq};

}  // namespace dscpp::optim::kernels
