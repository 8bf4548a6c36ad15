/*
 * Raw NCCL all-reduce timing, the floor for bench/gpu.py's comparison: the
 * same out-of-place sum all-reduce bench/gpu.py has concord issue (from a
 * send buffer into a separate receive buffer), called straight from C on a
 * one-rank communicator, with no Python and no concord in the way. On one
 * rank an in-place all-reduce does no device work at all; out of place,
 * each call copies the buffer on the device.
 *
 * bench/gpu.py compiles this file on the fly and loads it with ctypes:
 *
 *   nvcc -O2 -shared -Xcompiler -fPIC -o libnccl_raw.so nccl_raw.c -lnccl -lcudart
 *
 * Every CUDA and NCCL return code is checked. Nothing is printed: a failure
 * returns a negative code and leaves its message for nccl_raw_last_error().
 */

#include <stddef.h>
#include <stdio.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

#define NCCL_RAW_ERR_CUDA (-1)
#define NCCL_RAW_ERR_NCCL (-2)
#define NCCL_RAW_ERR_ARGUMENT (-3)

static char last_error[512];
static ncclComm_t comm = NULL;
static int comm_device = -1;

static int cuda_failed(cudaError_t rc, const char* what) {
  snprintf(last_error, sizeof last_error, "%s: %s", what, cudaGetErrorString(rc));
  return NCCL_RAW_ERR_CUDA;
}

static int nccl_failed(ncclResult_t rc, const char* what) {
  snprintf(last_error, sizeof last_error, "%s: %s", what, ncclGetErrorString(rc));
  return NCCL_RAW_ERR_NCCL;
}

#define CHECK_CUDA(call)                                     \
  do {                                                       \
    cudaError_t rc_ = (call);                                \
    if (rc_ != cudaSuccess) return cuda_failed(rc_, #call);  \
  } while (0)

#define CHECK_NCCL(call)                                     \
  do {                                                       \
    ncclResult_t rc_ = (call);                               \
    if (rc_ != ncclSuccess) return nccl_failed(rc_, #call);  \
  } while (0)

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* The message of the last failure, or "". */
const char* nccl_raw_last_error(void) { return last_error; }

/* NCCL's version code (ncclGetVersion), or a negative code. */
int nccl_raw_version(void) {
  int version = 0;
  CHECK_NCCL(ncclGetVersion(&version));
  return version;
}

/* Destroys the communicator, if there is one. Returns 0 or a negative code. */
int nccl_raw_finalize(void) {
  if (comm != NULL) {
    ncclComm_t doomed = comm;
    comm = NULL;
    comm_device = -1;
    CHECK_NCCL(ncclCommDestroy(doomed));
  }
  return 0;
}

/* A one-rank communicator on the current CUDA device (made once, remade if
 * the current device changed). Returns 0 or a negative code. */
int nccl_raw_init(void) {
  int device = -1;
  CHECK_CUDA(cudaGetDevice(&device));
  if (comm != NULL && comm_device == device) return 0;
  int rc = nccl_raw_finalize();
  if (rc != 0) return rc;
  ncclComm_t made = NULL;
  CHECK_NCCL(ncclCommInitAll(&made, 1, &device));
  comm = made;
  comm_device = device;
  return 0;
}

static int time_all_reduce(const void* send, void* recv, size_t count, ncclDataType_t dtype,
                           cudaStream_t stream, int warmup, int iters, cudaEvent_t start,
                           cudaEvent_t stop, float* elapsed_ms, double* host_us) {
  for (int i = 0; i < warmup; ++i)
    CHECK_NCCL(ncclAllReduce(send, recv, count, dtype, ncclSum, comm, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaEventRecord(start, stream));
  double host_start = now_us();
  for (int i = 0; i < iters; ++i)
    CHECK_NCCL(ncclAllReduce(send, recv, count, dtype, ncclSum, comm, stream));
  double host_end = now_us();
  CHECK_CUDA(cudaEventRecord(stop, stream));
  CHECK_CUDA(cudaEventSynchronize(stop));
  CHECK_CUDA(cudaEventElapsedTime(elapsed_ms, start, stop));
  if (host_us != NULL) *host_us = (host_end - host_start) / iters;
  return 0;
}

/*
 * Times `iters` sum all-reduces of `count` elements of NCCL data type
 * `dtype` (ncclFloat32 = 7, ...) from device pointer `send` into device
 * pointer `recv` (out of place; send == recv is in place), enqueued on
 * `stream` (a cudaStream_t; NULL is the legacy default stream), after
 * `warmup` untimed ones. The time is the span between CUDA events recorded
 * on the stream before the first and after the last call, with one
 * synchronisation at the end: when enqueueing is slower than the GPU, the
 * span is the host's pace.
 *
 * Returns microseconds per call, or a negative code (see
 * nccl_raw_last_error()). When host_us is not NULL it receives the host's
 * time per call spent in ncclAllReduce (enqueueing only).
 */
double nccl_raw_allreduce_us(const void* send, void* recv, size_t count, int dtype,
                             void* stream, int warmup, int iters, double* host_us) {
  if (iters < 1 || warmup < 0 || ((send == NULL || recv == NULL) && count > 0) || dtype < 0 ||
      dtype >= (int)ncclNumTypes) {
    snprintf(last_error, sizeof last_error,
             "nccl_raw_allreduce_us: bad arguments (send %p, recv %p, count %zu, dtype %d, "
             "warmup %d, iters %d)", send, recv, count, dtype, warmup, iters);
    return NCCL_RAW_ERR_ARGUMENT;
  }
  int rc = nccl_raw_init();
  if (rc != 0) return rc;
  cudaEvent_t start, stop;
  cudaError_t cuda_rc = cudaEventCreate(&start);
  if (cuda_rc != cudaSuccess) return cuda_failed(cuda_rc, "cudaEventCreate(&start)");
  cuda_rc = cudaEventCreate(&stop);
  if (cuda_rc != cudaSuccess) {
    cudaEventDestroy(start);
    return cuda_failed(cuda_rc, "cudaEventCreate(&stop)");
  }
  float elapsed_ms = 0.0f;
  rc = time_all_reduce(send, recv, count, (ncclDataType_t)dtype, (cudaStream_t)stream, warmup,
                       iters, start, stop, &elapsed_ms, host_us);
  /* Destroying the events cannot hide the timing's own error. */
  cudaError_t destroy_start = cudaEventDestroy(start);
  cudaError_t destroy_stop = cudaEventDestroy(stop);
  if (rc != 0) return rc;
  if (destroy_start != cudaSuccess) return cuda_failed(destroy_start, "cudaEventDestroy(start)");
  if (destroy_stop != cudaSuccess) return cuda_failed(destroy_stop, "cudaEventDestroy(stop)");
  return (double)elapsed_ms * 1e3 / iters;
}
