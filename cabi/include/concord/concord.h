/*
 * concord C ABI: collectives for data-parallel training, callable from any
 * language. Plain C99.
 *
 * Conventions
 *  - Every function returns a concord_status; CONCORD_OK is 0.
 *    concord_status_string() gives static text for a status and
 *    concord_last_error() the calling thread's detailed message for the
 *    last failure.
 *  - Handles are opaque; every destroy function accepts NULL.
 *  - Options structs start with struct_size and come with an _INIT macro;
 *    fields are only ever appended.
 *  - Collectives take a send and a recv DLTensor (the same pointer for in
 *    place), a stream (NULL on CPU) and an optional out-work: NULL blocks
 *    until done, otherwise *work receives a handle to wait on. Collectives on
 *    one communicator complete in the order they were issued.
 */
#ifndef CONCORD_CONCORD_H_
#define CONCORD_CONCORD_H_

#include <stddef.h>
#include <stdint.h>

#include "concord/dlpack.h"

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

#define CONCORD_VERSION_MAJOR 0
#define CONCORD_VERSION_MINOR 1
#define CONCORD_VERSION_PATCH 0
#define CONCORD_VERSION_CODE \
  (CONCORD_VERSION_MAJOR * 10000 + CONCORD_VERSION_MINOR * 100 + CONCORD_VERSION_PATCH)

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
  CONCORD_ERR_INTERNAL = 8
} concord_status;

CONCORD_API const char* concord_status_string(concord_status status);
/* Detailed message of the calling thread's last failure; "" if none. */
CONCORD_API const char* concord_last_error(void);

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
 * present `token` are served; token may be "" (no check). */
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
  const char* backend;     /* NULL or "auto": by device; "shm" for CPU */
} concord_comm_options;

#define CONCORD_COMM_OPTIONS_INIT \
  { sizeof(concord_comm_options), -1, -1, NULL, 0, NULL, 0.0, NULL }

/* The world communicator. Fields left unset come from the environment in
 * the order: CONCORD_*, torchrun, Open MPI, PMI, SLURM; nothing set gives
 * a world of one. Rank 0 serves the store unless CONCORD_STORE_SERVER=launcher. */
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
CONCORD_API concord_status concord_all_reduce(concord_comm_t comm, const DLTensor* send,
                                              DLTensor* recv, concord_reduce_op op,
                                              void* stream, concord_work_t* work);
/* recv = concatenation of every rank's send, in rank order
 * (recv holds size * numel(send) elements). */
CONCORD_API concord_status concord_all_gather(concord_comm_t comm, const DLTensor* send,
                                              DLTensor* recv, void* stream,
                                              concord_work_t* work);
/* send holds size blocks; recv = op over ranks of block `rank`. */
CONCORD_API concord_status concord_reduce_scatter(concord_comm_t comm, const DLTensor* send,
                                                  DLTensor* recv, concord_reduce_op op,
                                                  void* stream, concord_work_t* work);
/* recv = root's send on every rank (send is read on root only). */
CONCORD_API concord_status concord_broadcast(concord_comm_t comm, const DLTensor* send,
                                             DLTensor* recv, int root, void* stream,
                                             concord_work_t* work);
CONCORD_API concord_status concord_barrier(concord_comm_t comm, concord_work_t* work);

/* ---- asynchronous work -------------------------------------------------- */

/* Waits until done; timeout_s < 0 uses the communicator's timeout. Returns
 * the collective's own status once it finished. */
CONCORD_API concord_status concord_work_wait(concord_work_t work, double timeout_s);
/* *done = 1 once finished (then returns the collective's status), else 0. */
CONCORD_API concord_status concord_work_test(concord_work_t work, int* done);
CONCORD_API concord_status concord_work_destroy(concord_work_t work);

#ifdef __cplusplus
}  /* extern "C" */
#endif
#endif /* CONCORD_CONCORD_H_ */
