// CONCORD_HD marks functions that run on the host and, compiled by nvcc, on
// the device: the arithmetic of a kernel is written once, for the CPU and
// the CUDA executors alike.
#pragma once

#if defined(__CUDACC__)
#define CONCORD_HD __host__ __device__ __forceinline__
#else
#define CONCORD_HD inline
#endif
