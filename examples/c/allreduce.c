/*
 * All-reduce through concord's C ABI.
 *
 * Each rank fills N floats with (rank + 1) * (i % 97 + 1) and sums them over
 * all ranks; every element of the result must equal
 * (i % 97 + 1) * W * (W + 1) / 2 for a world of W ranks. The values are
 * small integers, exact in float whatever the order of the additions.
 *
 *   make                                   # or see Makefile for the cc line
 *   python -m concord.run -n 4 ./allreduce [N]
 *   ./allreduce [N]                        # a world of one
 */
#include <concord/concord.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define DEFAULT_COUNT 1000003 /* prime: not divisible by any world size */

static float element(int rank, int64_t i) { return (float)(rank + 1) * (float)(i % 97 + 1); }

/* Prints the failure of `what`, with the library's detailed message. */
static int check(concord_status status, const char* what) {
  if (status == CONCORD_OK) return 1;
  fprintf(stderr, "allreduce: %s failed: %s: %s\n", what, concord_status_string(status),
          concord_last_error());
  return 0;
}

static DLTensor float_vector(float* data, int64_t* shape) {
  DLTensor tensor = {0};
  tensor.data = data;
  tensor.device.device_type = kDLCPU;
  tensor.device.device_id = 0;
  tensor.ndim = 1;
  tensor.dtype.code = kDLFloat;
  tensor.dtype.bits = 32;
  tensor.dtype.lanes = 1;
  tensor.shape = shape;
  tensor.strides = NULL; /* compact row-major */
  tensor.byte_offset = 0;
  return tensor;
}

/* Index of the first wrong element, or -1 when all are right. */
static int64_t first_mismatch(const float* values, int64_t count, int world_size) {
  const float ranks_sum = (float)(world_size * (world_size + 1) / 2);
  for (int64_t i = 0; i < count; ++i)
    if (values[i] != (float)(i % 97 + 1) * ranks_sum) return i;
  return -1;
}

static int all_reduce_and_verify(concord_comm_t comm, int64_t count) {
  int rank = 0, world_size = 0;
  if (!check(concord_comm_rank(comm, &rank), "concord_comm_rank") ||
      !check(concord_comm_size(comm, &world_size), "concord_comm_size"))
    return 0;

  float* values = malloc((size_t)(count > 0 ? count : 1) * sizeof(float));
  if (values == NULL) {
    fprintf(stderr, "allreduce: cannot allocate %lld floats\n", (long long)count);
    return 0;
  }
  for (int64_t i = 0; i < count; ++i) values[i] = element(rank, i);

  int64_t shape[1] = {count};
  DLTensor tensor = float_vector(values, shape);
  /* Same tensor as send and recv: in place. Blocking: no work handle. */
  int ok = check(concord_comm_all_reduce(comm, &tensor, &tensor, CONCORD_SUM, NULL, NULL),
                 "concord_comm_all_reduce");
  if (ok) {
    int64_t bad = first_mismatch(values, count, world_size);
    if (bad >= 0) {
      fprintf(stderr, "allreduce: rank %d: element %lld is %g, expected %g\n", rank,
              (long long)bad, values[bad],
              (double)(bad % 97 + 1) * (world_size * (world_size + 1) / 2));
      ok = 0;
    } else {
      printf("rank %d: all_reduce of %lld floats verified\n", rank, (long long)count);
    }
  }
  free(values);
  return ok;
}

int main(int argc, char** argv) {
  int64_t count = DEFAULT_COUNT;
  if (argc > 1) {
    char* end = NULL;
    count = strtoll(argv[1], &end, 10);
    if (*argv[1] == '\0' || *end != '\0' || count < 0) {
      fprintf(stderr, "usage: %s [element count >= 0]\n", argv[0]);
      return 2;
    }
  }

  /* Rank, world size and store come from the launcher's environment; run
   * alone, this is a world of one. */
  concord_comm_t comm = NULL;
  if (!check(concord_comm_init_from_env(&comm), "concord_comm_init_from_env")) return 1;

  int ok = all_reduce_and_verify(comm, count);
  /* A rank that fails aborts the communicator so its peers fail fast
   * instead of waiting for it until their timeout. */
  if (!ok) check(concord_comm_abort(comm), "concord_comm_abort");
  if (!check(concord_comm_destroy(comm), "concord_comm_destroy")) ok = 0;
  return ok ? 0 : 1;
}
