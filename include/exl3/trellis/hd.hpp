// Host/device annotation shared by every header under exl3/trellis/.
//
// The trellis headers are the single source of truth for EXL3's arithmetic: the same inline
// functions are compiled by the host compiler (CPU reference path, quantizer, tests) and by nvcc
// (kernels). They use only fixed-width integer and IEEE float operations so both sides produce
// identical bits.
#pragma once

#if defined(__CUDACC__)
#define EXL3_HD __host__ __device__ __forceinline__
#else
#define EXL3_HD inline
#endif
