/* Simulated ranks meeting at concord's store, for bench/store_load.py.
 *
 * Each thread is one rank: it connects with the job token and makes, through
 * concord's C API, the store calls a rank's init makes (the sequence is
 * spelled out in store_load.py), all threads released at once. Prints one
 * JSON object: the time from the release to the last rank done, per-rank
 * times, the bytes the ranks read, and the first error.
 *
 *   store_load HOST PORT TOKEN RANKS PATTERN PREFIX TIMEOUT_S
 *
 * PATTERN: "shm" (ranks of one host) or "gloo" (one rank a host). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <concord/concord.h>

/* Gloo's TCP pair address: a sockaddr_storage and a sequence number. */
#define GLOO_ADDRESS_BYTES 136
/* A host identity as comm/hosts.cpp makes it: "<host name>/<8 hex digits>". */
#define HOST_ID "node-0000.cluster.example/0123abcd"
#define KEY_BYTES 256
/* The set-up's waits (comm/gloo/setup_agreement.cpp) ask the store in
 * slices of kInterruptPeriod (base/interrupt.hpp). */
#define SLICE_S 0.05

typedef struct {
  const char* host;
  int port;
  const char* token;
  int ranks;
  const char* pattern;
  const char* prefix;
  double timeout_s;
  pthread_barrier_t start;
  struct timespec released;
} Job;

typedef struct {
  Job* job;
  int rank;
  double connected_s; /* from the release */
  double done_s;
  uint64_t bytes_read;
  char error[256];
} Rank;

static double seconds_between(const struct timespec* a, const struct timespec* b) {
  return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) * 1e-9;
}

static double since_release(const Job* job) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return seconds_between(&job->released, &now);
}

/* Records the first failure of a rank; returns nonzero when `status` is one. */
static int failed(Rank* r, concord_status status, const char* call) {
  if (status == CONCORD_OK) return 0;
  snprintf(r->error, sizeof r->error, "rank %d: %s: %s", r->rank, call, concord_last_error());
  return 1;
}

/* concord_store_get into a buffer that grows to the value's size. */
static concord_status get_value(Rank* r, concord_store_t store, const char* key, char** buffer,
                                size_t* capacity, size_t* size) {
  concord_status status =
      concord_store_get(store, key, r->job->timeout_s, *buffer, *capacity, size);
  if (status == CONCORD_OK && *size > *capacity) {
    free(*buffer);
    *capacity = *size;
    *buffer = malloc(*capacity);
    status = concord_store_get(store, key, 0.0, *buffer, *capacity, size);
  }
  if (status == CONCORD_OK) r->bytes_read += *size;
  return status;
}

/* comm/world.cpp's generation and comm/hosts.cpp's exchange: every rank
 * publishes its host, rank 0 gets each of them and publishes the list, which
 * every other rank gets. */
static concord_status exchange_hosts(Rank* r, concord_store_t store, char** buffer,
                                     size_t* capacity) {
  const Job* job = r->job;
  char key[KEY_BYTES];
  int64_t generation = 0;
  size_t size = 0;
  snprintf(key, sizeof key, "%s/generation/%d", job->prefix, r->rank);
  concord_status status = concord_store_add(store, key, 1, &generation);
  if (failed(r, status, "add generation")) return status;
  if (r->rank != 0) {
    snprintf(key, sizeof key, "%s#1/host/%d", job->prefix, r->rank);
    status = concord_store_set(store, key, HOST_ID, strlen(HOST_ID));
    if (failed(r, status, "set host")) return status;
    snprintf(key, sizeof key, "%s#1/hosts", job->prefix);
    status = get_value(r, store, key, buffer, capacity, &size);
    return failed(r, status, "get hosts") ? status : CONCORD_OK;
  }
  char* list = malloc((size_t)job->ranks * (strlen(HOST_ID) + 24));
  if (list == NULL) {
    snprintf(r->error, sizeof r->error, "rank 0: no memory for the list of hosts");
    return CONCORD_ERR_OUT_OF_MEMORY;
  }
  size_t used = (size_t)sprintf(list, "%zu:%s", strlen(HOST_ID), HOST_ID);
  for (int q = 1; q < job->ranks; ++q) {
    snprintf(key, sizeof key, "%s#1/host/%d", job->prefix, q);
    status = get_value(r, store, key, buffer, capacity, &size);
    if (failed(r, status, "get host")) break;
    used += (size_t)sprintf(list + used, "%zu:%.*s", size, (int)size, *buffer);
  }
  if (status == CONCORD_OK) {
    snprintf(key, sizeof key, "%s#1/hosts", job->prefix);
    status = concord_store_set(store, key, list, used);
    failed(r, status, "set hosts");
  }
  free(list);
  return status;
}

/* A wait for one key: whole (shm) or in slices until the timeout (gloo). */
static concord_status wait_key(Rank* r, concord_store_t store, const char* key, int sliced) {
  if (!sliced) return concord_store_wait(store, &key, 1, r->job->timeout_s);
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    concord_status status = concord_store_wait(store, &key, 1, SLICE_S);
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (status != CONCORD_ERR_TIMEOUT || seconds_between(&start, &now) >= r->job->timeout_s)
      return status;
  }
}

/* Counts the rank in under `count_key`; the last one in sets `done_key`;
 * then every rank waits for it and reads the count again for failures
 * (shm's agree_on_attaching, gloo's SetupAgreement::conclude). */
static concord_status count_in(Rank* r, concord_store_t store, const char* count_key,
                               const char* done_key, int sliced) {
  int64_t counted = 0;
  concord_status status = concord_store_add(store, count_key, 1, &counted);
  if (failed(r, status, "add count")) return status;
  if (counted == r->job->ranks) {
    status = concord_store_set(store, done_key, "1", 1);
    if (failed(r, status, "set done")) return status;
  }
  status = wait_key(r, store, done_key, sliced);
  if (failed(r, status, "wait done")) return status;
  status = concord_store_add(store, count_key, 0, &counted);
  failed(r, status, "add 0");
  return status;
}

/* comm/shm/shm_backend.cpp: rank 0 publishes the segment, the others read it. */
static concord_status shm_attach(Rank* r, concord_store_t store, char** buffer, size_t* capacity) {
  const Job* job = r->job;
  char segment_key[KEY_BYTES], count_key[KEY_BYTES], done_key[KEY_BYTES];
  size_t size = 0;
  snprintf(segment_key, sizeof segment_key, "%s#1/shm/segment", job->prefix);
  snprintf(count_key, sizeof count_key, "%s#1/shm/attached", job->prefix);
  snprintf(done_key, sizeof done_key, "%s#1/shm/all_counted", job->prefix);
  concord_status status;
  if (r->rank == 0) {
    const char* segment = "/concord-0123456789abcdef 4198400";
    status = concord_store_set(store, segment_key, segment, strlen(segment));
    if (failed(r, status, "set segment")) return status;
  } else {
    status = get_value(r, store, segment_key, buffer, capacity, &size);
    if (failed(r, status, "get segment")) return status;
  }
  return count_in(r, store, count_key, done_key, 0);
}

/* Gloo's connectFullMesh through comm/gloo/store_adapter.cpp: the rank
 * publishes its host name and reads those of the ranks before it, then
 * publishes the addresses of its n-1 pairs in one value and reads every
 * peer's whole value (the adapter waits, then gets) to take its own pair's
 * address from it. Then comm/gloo/setup_agreement.cpp counts the rank in. */
static concord_status gloo_mesh(Rank* r, concord_store_t store, char** buffer, size_t* capacity) {
  const Job* job = r->job;
  char key[KEY_BYTES], count_key[KEY_BYTES], done_key[KEY_BYTES];
  size_t size = 0;
  snprintf(key, sizeof key, "%s#1/gloo/rank_%d", job->prefix, r->rank);
  concord_status status = concord_store_set(store, key, "node-0000", 9);
  if (failed(r, status, "set rank_")) return status;
  for (int q = 0; q < r->rank; ++q) {
    snprintf(key, sizeof key, "%s#1/gloo/rank_%d", job->prefix, q);
    status = wait_key(r, store, key, 1);
    if (failed(r, status, "wait rank_")) return status;
    status = get_value(r, store, key, buffer, capacity, &size);
    if (failed(r, status, "get rank_")) return status;
  }
  const size_t addresses_bytes = (size_t)(job->ranks - 1) * GLOO_ADDRESS_BYTES;
  char* addresses = calloc(addresses_bytes ? addresses_bytes : 1, 1);
  snprintf(key, sizeof key, "%s#1/gloo/%d", job->prefix, r->rank);
  status = concord_store_set(store, key, addresses, addresses_bytes);
  free(addresses);
  if (failed(r, status, "set addresses")) return status;
  for (int q = 0; q < job->ranks; ++q) {
    if (q == r->rank) continue;
    snprintf(key, sizeof key, "%s#1/gloo/%d", job->prefix, q);
    for (int waits = 0; waits < 2; ++waits) { /* gloo's wait, then the adapter's */
      status = wait_key(r, store, key, 1);
      if (failed(r, status, "wait addresses")) return status;
    }
    status = get_value(r, store, key, buffer, capacity, &size);
    if (failed(r, status, "get addresses")) return status;
  }
  snprintf(count_key, sizeof count_key, "%s#1/gloo-setup/counted", job->prefix);
  snprintf(done_key, sizeof done_key, "%s#1/gloo-setup/all_counted", job->prefix);
  return count_in(r, store, count_key, done_key, 1);
}

static void* run_rank(void* arg) {
  Rank* r = arg;
  Job* job = r->job;
  pthread_barrier_wait(&job->start);
  concord_store_t store = NULL;
  concord_status status =
      concord_store_connect(job->host, job->port, job->token, job->timeout_s, &store);
  r->connected_s = since_release(job);
  if (!failed(r, status, "connect")) {
    size_t capacity = 4096;
    char* buffer = malloc(capacity);
    status = exchange_hosts(r, store, &buffer, &capacity);
    if (status == CONCORD_OK)
      status = strcmp(job->pattern, "shm") == 0 ? shm_attach(r, store, &buffer, &capacity)
                                                : gloo_mesh(r, store, &buffer, &capacity);
    free(buffer);
    concord_store_destroy(store);
  }
  r->done_s = since_release(job);
  return NULL;
}

static int by_value(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* Every rank is a connection of this process: allow as many descriptors
 * as the hard limit does. */
static void raise_fd_limit(void) {
  struct rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

int main(int argc, char** argv) {
  if (argc != 8 || (strcmp(argv[5], "shm") != 0 && strcmp(argv[5], "gloo") != 0)) {
    fprintf(stderr, "usage: %s HOST PORT TOKEN RANKS shm|gloo PREFIX TIMEOUT_S\n", argv[0]);
    return 2;
  }
  const long count = strtol(argv[4], NULL, 10);
  if (count < 1 || count > 65536) {
    fprintf(stderr, "RANKS must be in 1..65536\n");
    return 2;
  }
  Job job = {argv[1], atoi(argv[2]), argv[3], (int)count, argv[5], argv[6], atof(argv[7])};
  raise_fd_limit();
  Rank* ranks = calloc((size_t)count, sizeof *ranks);
  pthread_t* threads = calloc((size_t)count, sizeof *threads);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  pthread_barrier_init(&job.start, NULL, (unsigned)job.ranks + 1);
  for (int i = 0; i < job.ranks; ++i) {
    ranks[i].job = &job;
    ranks[i].rank = i;
    if (pthread_create(&threads[i], &attr, run_rank, &ranks[i]) != 0) {
      fprintf(stderr, "could not start thread %d\n", i);
      return 1;
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &job.released);
  pthread_barrier_wait(&job.start);
  for (int i = 0; i < job.ranks; ++i) pthread_join(threads[i], NULL);

  double* done = calloc((size_t)count, sizeof *done);
  double slowest_connect = 0, last_done = 0;
  uint64_t bytes_read = 0;
  int errors = 0;
  const char* first_error = "";
  for (int i = 0; i < job.ranks; ++i) {
    done[i] = ranks[i].done_s;
    if (ranks[i].connected_s > slowest_connect) slowest_connect = ranks[i].connected_s;
    if (ranks[i].done_s > last_done) last_done = ranks[i].done_s;
    bytes_read += ranks[i].bytes_read;
    if (ranks[i].error[0] != '\0' && errors++ == 0) first_error = ranks[i].error;
  }
  qsort(done, (size_t)count, sizeof *done, by_value);
  printf("{\"ranks\": %d, \"pattern\": \"%s\", \"all_done_s\": %.6f, \"median_done_s\": %.6f, "
         "\"slowest_connect_s\": %.6f, \"bytes_read\": %llu, \"errors\": %d, \"first_error\": \"",
         job.ranks, job.pattern, last_done, done[job.ranks / 2], slowest_connect,
         (unsigned long long)bytes_read, errors);
  for (const char* c = first_error; *c; ++c) {
    if (*c == '"' || *c == '\\') putchar('\\');
    putchar(*c >= 0x20 ? *c : ' ');
  }
  printf("\"}\n");
  return 0;
}
