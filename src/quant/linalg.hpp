// Small dense fp64 linear algebra for LDLQ: Cholesky and the 16x16 block LDL factor.
#pragma once

#include <cstdint>
#include <vector>

namespace exl3::quant::detail {

// In-place lower Cholesky factor of a symmetric n x n row-major matrix (only the lower triangle is
// read): a = C with H = C C^T, upper triangle zeroed. Returns false when a pivot is not positive
// and finite, i.e. the matrix is not (numerically) positive definite; `a` is then garbage.
bool cholesky_lower(double* a, int64_t n);

// From the Cholesky factor C (n x n, n % 16 == 0), the unit block-lower-triangular L with
// H = L D L^T for 16x16 diagonal blocks D, i.e. L = C . blockdiag(C)^-1, returned with its
// diagonal blocks zeroed (strictly block-lower, docs/format.md, Hessian), as fp32.
std::vector<float> block_ldl_from_cholesky(const double* c, int64_t n);

}  // namespace exl3::quant::detail
