/*
 * concord C ABI: collectives for data-parallel training, callable from any
 * language. Plain C99.
 *
 * Conventions
 *  - Names are concord_<object>_<verb>: the object is a handle (store,
 *    store_server, comm, work, grad_sync) or a family of stateless calls
 *    (optim, tensors, metric, interrupt); library-wide queries are
 *    concord_<noun> (concord_version, concord_build_info, concord_last_error).
 *  - Every function returns a concord_status; CONCORD_OK is 0.
 *    concord_status_string() gives static text for a status and
 *    concord_last_error() the calling thread's detailed message for the
 *    last failure.
 *  - Handles are opaque; every destroy function accepts NULL.
 *  - Options structs start with struct_size and come with an _INIT macro.
 *    Fields are only ever appended, each starting at or beyond the size of
 *    the struct before it was added, so a caller built against an older
 *    header passes its smaller struct_size and the library fills the fields
 *    it does not know from the _INIT defaults. A struct_size larger than
 *    this library's struct is refused.
 *  - Every call that may run on a CUDA device takes the stream to enqueue
 *    on (a cudaStream_t; NULL is the legacy default stream; ignored for CPU
 *    tensors).
 *  - Collectives take a send and a recv DLTensor (the same pointer for in
 *    place), a stream and an optional out-work: NULL blocks until done,
 *    otherwise *work receives a handle to wait on. Collectives on one
 *    communicator complete in the order they were issued.
 */
#ifndef CONCORD_CONCORD_H_
#define CONCORD_CONCORD_H_

#include <stddef.h>
#include <stdint.h>

#include "concord/dlpack.h"
#include "concord/version.h"

#if defined(_WIN32)
#define CONCORD_API __declspec(dllimport)
#elif defined(CONCORD_BUILDING_LIBRARY)
#define CONCORD_API __attribute__((visibility("default")))
#else
#define CONCORD_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- versions ---------------------------------------------------------- */

/* CONCORD_VERSION_MAJOR, _MINOR, _PATCH, _CODE and _STRING of these
 * headers come from concord/version.h. */

/* "MAJOR.MINOR.PATCH" of the loaded library (static storage). */
CONCORD_API const char* concord_version(void);
/* CONCORD_VERSION_CODE of the loaded library; compare with the header's. */
CONCORD_API int concord_version_code(void);
/* JSON object: version, backends, cuda, nccl (static storage). */
CONCORD_API const char* concord_build_info(void);

/* ---- status ------------------------------------------------------------ */

typedef enum concord_status {
  CONCORD_OK = 0,
  CONCORD_ERR_INVALID_ARGUMENT = 1,
  CONCORD_ERR_UNAVAILABLE = 2,
  CONCORD_ERR_TIMEOUT = 3,
  CONCORD_ERR_REMOTE = 4,   /* a peer failed, died or aborted */
  CONCORD_ERR_MISMATCH = 5, /* ranks disagree on a collective */
  CONCORD_ERR_ABORTED = 6,  /* this communicator was aborted */
  CONCORD_ERR_OUT_OF_MEMORY = 7,
  CONCORD_ERR_INTERNAL = 8,
  CONCORD_ERR_INTERRUPTED = 9 /* the interrupt check asked a blocking call to stop */
} concord_status;

CONCORD_API const char* concord_status_string(concord_status status);
/* Detailed message of the calling thread's last failure; "" if none. */
CONCORD_API const char* concord_last_error(void);

/* ---- interrupting blocking calls ---------------------------------------- */

/* Installs `check` for the calling thread (NULL removes it): every blocking
 * call on that thread (collectives, waits, the rendezvous of init and split)
 * calls check(user) about every 50 ms while it waits, and when it returns
 * nonzero gives up with CONCORD_ERR_INTERRUPTED; a collective given up that
 * way aborts its communicator, so its peers fail at once. A language whose
 * signal handlers only set a flag (Python) checks that flag here. */
typedef int (*concord_interrupt_check)(void* user);
CONCORD_API concord_status concord_interrupt_set_check(concord_interrupt_check check, void* user);

/* ---- reduction operators ---------------------------------------------- */

typedef enum concord_reduce_op {
  CONCORD_SUM = 0,
  CONCORD_PROD = 1,
  CONCORD_MAX = 2,
  CONCORD_MIN = 3,
  CONCORD_MEAN = 4 /* sum, then divide by the communicator size */
} concord_reduce_op;

/* ---- rendezvous store -------------------------------------------------- */

typedef struct concord_store_server* concord_store_server_t;
typedef struct concord_store* concord_store_t;

/* Serves a store on host:port (port 0: any free port). Only clients that
 * present `token` are served; an empty or NULL token is refused
 * (CONCORD_ERR_INVALID_ARGUMENT): a store never serves without a secret. */
CONCORD_API concord_status concord_store_server_create(const char* host, int port,
                                                       const char* token,
                                                       concord_store_server_t* out);
CONCORD_API concord_status concord_store_server_port(concord_store_server_t server, int* port);
CONCORD_API concord_status concord_store_server_destroy(concord_store_server_t server);

/* Connects, retrying until timeout_s seconds have passed. */
CONCORD_API concord_status concord_store_connect(const char* host, int port, const char* token,
                                                 double timeout_s, concord_store_t* out);
CONCORD_API concord_status concord_store_set(concord_store_t store, const char* key,
                                             const void* value, size_t size);
/* Waits up to timeout_s for key, copies min(size, capacity) bytes to value
 * and sets *size to the value's full size (call again with a larger buffer
 * when *size > capacity). */
CONCORD_API concord_status concord_store_get(concord_store_t store, const char* key,
                                             double timeout_s, void* value, size_t capacity,
                                             size_t* size);
CONCORD_API concord_status concord_store_wait(concord_store_t store, const char* const* keys,
                                              size_t num_keys, double timeout_s);
CONCORD_API concord_status concord_store_add(concord_store_t store, const char* key,
                                             int64_t delta, int64_t* result);
CONCORD_API concord_status concord_store_delete(concord_store_t store, const char* key,
                                                int* existed);
CONCORD_API concord_status concord_store_destroy(concord_store_t store);

/* ---- communicators ---------------------------------------------------- */

typedef struct concord_comm* concord_comm_t;
typedef struct concord_work* concord_work_t;

typedef struct concord_comm_options {
  size_t struct_size;      /* sizeof(concord_comm_options) */
  int rank;                /* -1: from the environment */
  int world_size;          /* -1: from the environment */
  const char* master_addr; /* NULL: from the environment */
  int master_port;         /* 0: from the environment */
  const char* token;       /* NULL: CONCORD_JOB_TOKEN */
  double timeout_s;        /* <= 0: CONCORD_TIMEOUT or 600 */
  const char* backend;     /* NULL or "auto": by device; "shm", "gloo", "nccl" */
  int store_served_elsewhere; /* nonzero: rank 0 does not serve the store; another
                                 process does (as CONCORD_STORE_SERVER=launcher) */
} concord_comm_options;

#define CONCORD_COMM_OPTIONS_INIT \
  { sizeof(concord_comm_options), -1, -1, NULL, 0, NULL, 0.0, NULL, 0 }

/* The world communicator. Fields left unset come from the environment in
 * the order: CONCORD_*, torchrun, Open MPI, PMI, SLURM; nothing set gives
 * a world of one. Rank 0 serves the store unless CONCORD_STORE_SERVER=launcher
 * or store_served_elsewhere. A struct_size from before a field was added
 * leaves that field at its CONCORD_COMM_OPTIONS_INIT value. */
CONCORD_API concord_status concord_comm_init(const concord_comm_options* options,
                                             concord_comm_t* out);
CONCORD_API concord_status concord_comm_init_from_env(concord_comm_t* out);
/* A communicator of `size` ranks meeting through an existing store under
 * key prefix `name`; ranks may be processes or threads of one process. */
CONCORD_API concord_status concord_comm_init_with_store(concord_store_t store, const char* name,
                                                        int rank, int size, double timeout_s,
                                                        concord_comm_t* out);
/* Collective over comm: ranks with the same color form a new communicator,
 * ordered by (key, rank). color < 0 yields *out = NULL. */
CONCORD_API concord_status concord_comm_split(concord_comm_t comm, int color, int key,
                                              concord_comm_t* out);
CONCORD_API concord_status concord_comm_rank(concord_comm_t comm, int* rank);
CONCORD_API concord_status concord_comm_size(concord_comm_t comm, int* size);
/* Rank among the ranks on this host. */
CONCORD_API concord_status concord_comm_local_rank(concord_comm_t comm, int* local_rank);
/* Name of the backend used for CPU tensors ("shm"), static storage. */
CONCORD_API concord_status concord_comm_backend(concord_comm_t comm, const char** name);
CONCORD_API concord_status concord_comm_timeout(concord_comm_t comm, double* timeout_s);
/* Fails pending and future collectives here and on the peers. */
CONCORD_API concord_status concord_comm_abort(concord_comm_t comm);
CONCORD_API concord_status concord_comm_destroy(concord_comm_t comm);

/* ---- collectives -------------------------------------------------------- */

/* recv = op over ranks of send; same dtype and element count. */
CONCORD_API concord_status concord_comm_all_reduce(concord_comm_t comm, const DLTensor* send,
                                              DLTensor* recv, concord_reduce_op op,
                                              void* stream, concord_work_t* work);
/* recv = concatenation of every rank's send, in rank order
 * (recv holds size * numel(send) elements). */
CONCORD_API concord_status concord_comm_all_gather(concord_comm_t comm, const DLTensor* send,
                                              DLTensor* recv, void* stream,
                                              concord_work_t* work);
/* send holds size blocks; recv = op over ranks of block `rank`. */
CONCORD_API concord_status concord_comm_reduce_scatter(concord_comm_t comm, const DLTensor* send,
                                                  DLTensor* recv, concord_reduce_op op,
                                                  void* stream, concord_work_t* work);
/* recv = root's send on every rank (send is read on root only). */
CONCORD_API concord_status concord_comm_broadcast(concord_comm_t comm, const DLTensor* send,
                                             DLTensor* recv, int root, void* stream,
                                             concord_work_t* work);
CONCORD_API concord_status concord_comm_barrier(concord_comm_t comm, concord_work_t* work);

/* ---- asynchronous work -------------------------------------------------- */

/* Waits until done and returns the collective's own status. timeout_s < 0:
 * no limit of its own (the collective itself ends within its communicator's
 * timeout, with an error naming what it waited for); otherwise at most
 * timeout_s seconds (INFINITY: no limit), after which it returns
 * CONCORD_ERR_TIMEOUT while the collective goes on. NaN: invalid. */
CONCORD_API concord_status concord_work_wait(concord_work_t work, double timeout_s);
/* *done = 1 once finished (then returns the collective's status), else 0. */
CONCORD_API concord_status concord_work_test(concord_work_t work, int* done);
CONCORD_API concord_status concord_work_destroy(concord_work_t work);

/* ---- multi-tensor collectives ------------------------------------------ */

/* All-reduces every tensor in place as one operation: tensors under 256 KiB
 * are packed into one buffer per dtype and reduced together; larger ones
 * are reduced where they are. Every rank passes the same shapes and dtypes. */
CONCORD_API concord_status concord_comm_all_reduce_multi(concord_comm_t comm, DLTensor* const* tensors,
                                                    size_t num_tensors, concord_reduce_op op,
                                                    void* stream, concord_work_t* work);

/* ---- data parallel: gradient buckets ------------------------------------ */

typedef struct concord_grad_sync* concord_grad_sync_t;

typedef enum concord_compress {
  CONCORD_COMPRESS_NONE = 0,
  CONCORD_COMPRESS_BF16 = 1, /* float32 gradients travel as bfloat16 */
  CONCORD_COMPRESS_FP16 = 2  /* float32 gradients travel as float16 */
} concord_compress;

typedef struct concord_grad_sync_options {
  size_t struct_size;      /* sizeof(concord_grad_sync_options) */
  double bucket_cap_mb;    /* capacity of every bucket after the first (MiB) */
  double first_bucket_mb;  /* capacity of the first bucket (MiB) */
  concord_reduce_op op;    /* CONCORD_MEAN or CONCORD_SUM */
  concord_compress compress;
} concord_grad_sync_options;

#define CONCORD_GRAD_SYNC_OPTIONS_INIT \
  { sizeof(concord_grad_sync_options), 25.0, 1.0, CONCORD_MEAN, CONCORD_COMPRESS_NONE }

/* Plans buckets for gradients shaped like `grads` (dtype, shape, device;
 * data is not read). Buckets are filled in `ready_order` (a permutation of
 * 0..num_grads-1; NULL = reverse parameter order, as backward produces
 * them): the first holds up to first_bucket_mb, later ones bucket_cap_mb,
 * counted in gradient bytes; a gradient is never split, so only a gradient
 * larger than the cap makes a bucket larger than it. A bucket holds one
 * dtype. All gradients are on one device, the CPU or one CUDA device
 * (CONCORD_ERR_INVALID_ARGUMENT naming two that differ); the buckets are
 * buffers there, allocated once. CUDA gradients without a usable CUDA
 * plugin, device or NCCL: CONCORD_ERR_UNAVAILABLE with the reason, before
 * any communication. options NULL: CONCORD_GRAD_SYNC_OPTIONS_INIT.
 * A mean of floating gradients is applied while packing (each rank adds
 * grad / size), so the wire carries a sum; integer gradients are averaged
 * by the all-reduce itself, which truncates (as NCCL's avg), on the CPU and
 * on CUDA alike. Compression applies to float32 gradients only: each
 * rank's value is rounded once, summed in float32 and the sum rounded once,
 * so a result differs from the exact one by at most 2^-7 (bf16) or 2^-10
 * (fp16, plus 2^-24 absolute) times the same reduction of |grad| over the
 * ranks; fp16 overflows beyond 65504 (after the mean's scaling).
 * Collective: every rank must plan the same, which is checked
 * (CONCORD_ERR_MISMATCH otherwise). `comm` is borrowed: destroy the
 * synchronizer before its communicator. */
CONCORD_API concord_status concord_grad_sync_create(concord_comm_t comm, const DLTensor* const* grads,
                                                    size_t num_grads, const int64_t* ready_order,
                                                    const concord_grad_sync_options* options,
                                                    concord_grad_sync_t* out);
CONCORD_API concord_status concord_grad_sync_num_buckets(concord_grad_sync_t sync, size_t* num_buckets);
/* Buckets are numbered in the order they fill and start. */
CONCORD_API concord_status concord_grad_sync_bucket_of(concord_grad_sync_t sync, size_t index,
                                                       size_t* bucket);
/* Packs gradient `index` into its bucket (scaling and compressing on the
 * way; without compression, gradients of 256 KiB and more are not packed
 * but all-reduced in place when the bucket starts, and a collective that
 * fails part-way may leave them partially reduced); once every gradient of
 * the bucket is marked, the bucket's
 * all-reduce starts asynchronously (buckets start in bucket order, so a
 * full bucket waits for the ones before it). Marking an index twice in one
 * step, or a gradient on another device than planned, is an error, raised
 * before anything is written. `grad` must stay valid until wait.
 * CUDA gradients: the pack is enqueued on `stream`, and a bucket's
 * all-reduce is enqueued on NCCL after that stream's work, with the stream
 * waiting for its result; nothing waits on the host. Use one stream for every mark_ready and wait of the
 * synchronizer, or order the streams yourself (CUDA events) so that each
 * call's stream follows the streams of the calls before it. */
CONCORD_API concord_status concord_grad_sync_mark_ready(concord_grad_sync_t sync, size_t index,
                                                        DLTensor* grad, void* stream);
/* Gradients not yet marked: CONCORD_ERR_INVALID_ARGUMENT naming them,
 * before anything else, and the step stays open. Otherwise:
 * - CPU gradients: waits for every bucket (each within the communicator's
 *   timeout), then unpacks the results into the gradients given to
 *   mark_ready; a failed collective returns its error here and leaves every
 *   packed gradient untouched.
 * - CUDA gradients: enqueues the unpacks on `stream`, after the
 *   all-reduces (that stream waited for them), and returns
 *   without waiting on the host. The gradients hold the results once that
 *   stream's work has run; they must stay allocated until then. A failed
 *   collective (a lost peer, the timeout) is caught by the communicator's
 *   watchdog, which aborts the communicator: its error is returned by a
 *   later call that reaches the communicator (the next step's mark_ready or
 *   wait, or any collective), not necessarily by this one. A failed
 *   collective cannot promise that any gradient of that step, packed or
 *   not, was left untouched: it may hold a partial or unreduced result.
 * Ready for the next step afterwards, also after an error. */
CONCORD_API concord_status concord_grad_sync_wait(concord_grad_sync_t sync, void* stream);
/* Waits for bucket all-reduces still in flight first: they use its buffers.
 * CUDA gradients: blocks the host once, until the stream that last used
 * each bucket (the stream of the latest mark_ready or wait) has finished,
 * then frees the buffers; that stream must still exist. */
CONCORD_API concord_status concord_grad_sync_destroy(concord_grad_sync_t sync);

/* ---- kernels on CPU or CUDA tensors ------------------------------------
 * The calls below (optimizer steps, sums of squares, scaling, clipping,
 * metric updates) run where their tensors live. On CUDA tensors they are
 * asynchronous: each is enqueued on `stream` and returns without waiting
 * for the device (only concord_tensors_sum_of_squares, which returns a host
 * double, waits for it). Shapes, dtypes, devices and options are checked
 * before anything is enqueued. Without a usable CUDA plugin (a CPU-only
 * build, no driver, no GPU) calls on CUDA tensors give
 * CONCORD_ERR_UNAVAILABLE. */

/* ---- data parallel: fused optimizers ------------------------------------ */

typedef struct concord_sgd_options {
  size_t struct_size;
  double lr;
  double momentum;
  double weight_decay;
  int nesterov;
  int64_t step; /* 1 on the first step: momentum buffers start as the gradient */
} concord_sgd_options;

#define CONCORD_SGD_OPTIONS_INIT { sizeof(concord_sgd_options), 0.01, 0.0, 0.0, 0, 1 }

/* One SGD step over all tensors in one call (torch.optim.SGD semantics,
 * dampening 0; nesterov needs momentum > 0). momentum_buffers may be NULL
 * when momentum == 0 (and are ignored then). params[i], grads[i] and
 * buffers[i] share a dtype (float32 or float64; it may differ between i)
 * and a shape, and no two share memory; all are on one device (CPU, or one
 * CUDA device: then the step is enqueued on `stream`). Options (non-NULL,
 * lr, momentum, weight_decay >= 0, step >= 1) and every tensor are checked
 * before any is written. */
CONCORD_API concord_status concord_optim_sgd_step(const concord_sgd_options* options,
                                                  size_t num_tensors, DLTensor* const* params,
                                                  const DLTensor* const* grads,
                                                  DLTensor* const* momentum_buffers, void* stream);

typedef struct concord_adamw_options {
  size_t struct_size;
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  int64_t step; /* 1-based count including this step, for bias correction */
} concord_adamw_options;

#define CONCORD_ADAMW_OPTIONS_INIT \
  { sizeof(concord_adamw_options), 0.001, 0.9, 0.999, 1e-8, 0.01, 1 }

/* One AdamW step over all tensors in one call (torch.optim.AdamW semantics,
 * decoupled weight decay, no amsgrad). Tensors as for concord_optim_sgd_step;
 * options need lr, eps, weight_decay >= 0, betas in [0, 1), step >= 1. */
CONCORD_API concord_status concord_optim_adamw_step(const concord_adamw_options* options,
                                                    size_t num_tensors, DLTensor* const* params,
                                                    const DLTensor* const* grads,
                                                    DLTensor* const* exp_avg,
                                                    DLTensor* const* exp_avg_sq, void* stream);

/* Sum of squares of every element of every tensor (any floating dtypes, all
 * on one device), in one pass with float64 accumulation; the L2 norm is its
 * square root. On CUDA tensors this waits for `stream`, to return the value
 * on the host; concord_tensors_sum_of_squares_into does not. */
CONCORD_API concord_status concord_tensors_sum_of_squares(size_t num_tensors,
                                                          const DLTensor* const* tensors,
                                                          double* result, void* stream);
/* The same sum written (not added) into `result`: a float64 tensor of one
 * element on the tensors' device, sharing no memory with them. On CUDA
 * tensors it is enqueued on `stream`, with no host sync. */
CONCORD_API concord_status concord_tensors_sum_of_squares_into(size_t num_tensors,
                                                               const DLTensor* const* tensors,
                                                               DLTensor* result, void* stream);
/* tensors[i] *= scale for every tensor (any floating dtypes, all on one
 * device), in one call. */
CONCORD_API concord_status concord_tensors_scale(size_t num_tensors, DLTensor* const* tensors,
                                                 double scale, void* stream);
/* Gradient clipping by global norm, torch.nn.utils.clip_grad_norm_'s rule:
 * tensors[i] *= min(1, max_norm / (sqrt(s) + 1e-6)) with s the value of
 * `sum_of_squares` (a float64 tensor of one element on the tensors' device,
 * sharing no memory with them, e.g. from concord_tensors_sum_of_squares_into). s is
 * read where it lives: on CUDA the factor is computed on the device, so
 * clipping needs no host sync. A NaN s makes every tensor NaN (as torch);
 * a factor of 1 leaves them untouched. max_norm >= 0 (INFINITY: no
 * clipping). Works on CPU and CUDA tensors. */
CONCORD_API concord_status concord_tensors_clip_by_sum_of_squares(size_t num_tensors,
                                                                  DLTensor* const* tensors,
                                                                  const DLTensor* sum_of_squares,
                                                                  double max_norm, void* stream);

/* ---- metrics: update kernels --------------------------------------------
 * States are tensors the caller owns, on the CPU or a CUDA device, with
 * their inputs on the same device; an update accumulates into its state
 * with no communication. Shapes, dtypes and devices are checked and
 * reported as CONCORD_ERR_INVALID_ARGUMENT, and a failed update leaves the
 * state unchanged. Labels are int8, int32, int64, uint8 or bool; scores and
 * probabilities float16, bfloat16, float32 or float64. On the CPU the input
 * values are checked too (labels in range, binary labels 0 or 1, histogram
 * scores in [0, 1]); on CUDA tensors an update is enqueued on `stream` with
 * no host sync, so such samples are skipped, not rejected.
 *
 * The kernels, by name (inputs in order; those in brackets may be NULL):
 *  "weighted_sum"      state float64 [2] += [sum(values * weights), sum(weights)];
 *                      inputs values, [weights] (NULL: 1 per value); any dtype,
 *                      NaN propagates.
 *  "max", "min"        state float64 [1] = max / min of the state and values;
 *                      input values; NaN values are skipped.
 *  "confusion_matrix"  state int64 [C, C] (row target, column prediction) +=
 *                      counts; inputs preds: labels (N,) or scores (N, C)
 *                      whose argmax (first of ties, NaN highest) is the
 *                      prediction, target: labels (N,) in [0, C).
 *  "binary_confusion"  state int64 [2, 2]; inputs preds (N,) probabilities
 *                      (positive when >= threshold; NaN is negative) or 0/1
 *                      labels, target (N,) 0/1.
 *  "multilabel_counts" state int64 [L, 4] += per label [tp, fp, fn, tn];
 *                      inputs preds (N, L) as for binary, target (N, L) 0/1.
 *  "topk_correct"      state int64 [2] += [samples whose target is among the
 *                      top k scores, N]; inputs preds (N, C) scores, target
 *                      (N,) labels; ties as in torchmetrics.
 *  "binary_histogram"  state int64 [2, B]: row 0 negatives, row 1 positives,
 *                      by bin min(floor(score * B), B - 1); inputs scores
 *                      (N,) in [0, 1], target (N,) 0/1. */

typedef struct concord_metric_options {
  size_t struct_size;
  double threshold; /* binary_confusion, multilabel_counts: positive at or above it */
  int64_t k;        /* topk_correct: 1 <= k <= C */
} concord_metric_options;

#define CONCORD_METRIC_OPTIONS_INIT { sizeof(concord_metric_options), 0.5, 1 }

/* Runs update `kernel` (a name above; an unknown one is
 * CONCORD_ERR_INVALID_ARGUMENT listing the valid names) on `state` with
 * `inputs[0..num_inputs)`. options NULL: CONCORD_METRIC_OPTIONS_INIT. */
CONCORD_API concord_status concord_metric_update(const char* kernel, DLTensor* state,
                                                 const DLTensor* const* inputs, size_t num_inputs,
                                                 const concord_metric_options* options,
                                                 void* stream);

#ifdef __cplusplus
}  /* extern "C" */
#endif
#endif /* CONCORD_CONCORD_H_ */
