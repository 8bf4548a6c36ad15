/* The layouts docs/julia.md gives its Julia mirrors of the C structs
 * (64-bit Linux and macOS), asserted at compile time, and printed with the
 * option defaults and constants the document fills in by hand, for
 * tests_py/test_julia_layout.py to compare with the document's numbers. */
#include <concord/concord.h>
#include <stddef.h>
#include <stdio.h>

#define SIZE(type, bytes)                                              \
  do {                                                                 \
    _Static_assert(sizeof(type) == (bytes), #type " is " #bytes " bytes"); \
    printf("%s size %zu\n", #type, sizeof(type));                      \
  } while (0)

#define OFFSET(type, field, at)                                               \
  do {                                                                        \
    _Static_assert(offsetof(type, field) == (at), #type "." #field " at " #at); \
    printf("%s.%s offset %zu\n", #type, #field, offsetof(type, field));       \
  } while (0)

#define INT_DEFAULT(value, type, field) printf("%s.%s default %lld\n", #type, #field, (long long)value.field)
#define DOUBLE_DEFAULT(value, type, field) printf("%s.%s default %.17g\n", #type, #field, value.field)
#define NULL_DEFAULT(value, type, field) \
  printf("%s.%s default %s\n", #type, #field, value.field == NULL ? "NULL" : "not NULL")
#define CONSTANT(name) printf("%s = %lld\n", #name, (long long)(name))

static void layouts(void) {
  SIZE(DLDevice, 8);
  OFFSET(DLDevice, device_type, 0);
  OFFSET(DLDevice, device_id, 4);

  SIZE(DLDataType, 4);
  OFFSET(DLDataType, code, 0);
  OFFSET(DLDataType, bits, 1);
  OFFSET(DLDataType, lanes, 2);

  SIZE(DLTensor, 48);
  OFFSET(DLTensor, data, 0);
  OFFSET(DLTensor, device, 8);
  OFFSET(DLTensor, ndim, 16);
  OFFSET(DLTensor, dtype, 20);
  OFFSET(DLTensor, shape, 24);
  OFFSET(DLTensor, strides, 32);
  OFFSET(DLTensor, byte_offset, 40);

  SIZE(concord_comm_options, 64);
  OFFSET(concord_comm_options, struct_size, 0);
  OFFSET(concord_comm_options, rank, 8);
  OFFSET(concord_comm_options, world_size, 12);
  OFFSET(concord_comm_options, master_addr, 16);
  OFFSET(concord_comm_options, master_port, 24);
  OFFSET(concord_comm_options, token, 32);
  OFFSET(concord_comm_options, timeout_s, 40);
  OFFSET(concord_comm_options, backend, 48);
  OFFSET(concord_comm_options, store_served_elsewhere, 56);

  SIZE(concord_grad_sync_options, 32);
  OFFSET(concord_grad_sync_options, struct_size, 0);
  OFFSET(concord_grad_sync_options, bucket_cap_mb, 8);
  OFFSET(concord_grad_sync_options, first_bucket_mb, 16);
  OFFSET(concord_grad_sync_options, op, 24);
  OFFSET(concord_grad_sync_options, compress, 28);

  SIZE(concord_sgd_options, 48);
  OFFSET(concord_sgd_options, struct_size, 0);
  OFFSET(concord_sgd_options, lr, 8);
  OFFSET(concord_sgd_options, momentum, 16);
  OFFSET(concord_sgd_options, weight_decay, 24);
  OFFSET(concord_sgd_options, nesterov, 32);
  OFFSET(concord_sgd_options, step, 40);

  SIZE(concord_adamw_options, 56);
  OFFSET(concord_adamw_options, struct_size, 0);
  OFFSET(concord_adamw_options, lr, 8);
  OFFSET(concord_adamw_options, beta1, 16);
  OFFSET(concord_adamw_options, beta2, 24);
  OFFSET(concord_adamw_options, eps, 32);
  OFFSET(concord_adamw_options, weight_decay, 40);
  OFFSET(concord_adamw_options, step, 48);

  SIZE(concord_metric_options, 24);
  OFFSET(concord_metric_options, struct_size, 0);
  OFFSET(concord_metric_options, threshold, 8);
  OFFSET(concord_metric_options, k, 16);
}

/* What each _INIT macro fills, which a Julia constructor fills itself. */
static void defaults(void) {
  const concord_comm_options comm = CONCORD_COMM_OPTIONS_INIT;
  INT_DEFAULT(comm, concord_comm_options, struct_size);
  INT_DEFAULT(comm, concord_comm_options, rank);
  INT_DEFAULT(comm, concord_comm_options, world_size);
  NULL_DEFAULT(comm, concord_comm_options, master_addr);
  INT_DEFAULT(comm, concord_comm_options, master_port);
  NULL_DEFAULT(comm, concord_comm_options, token);
  DOUBLE_DEFAULT(comm, concord_comm_options, timeout_s);
  NULL_DEFAULT(comm, concord_comm_options, backend);
  INT_DEFAULT(comm, concord_comm_options, store_served_elsewhere);

  const concord_grad_sync_options sync = CONCORD_GRAD_SYNC_OPTIONS_INIT;
  INT_DEFAULT(sync, concord_grad_sync_options, struct_size);
  DOUBLE_DEFAULT(sync, concord_grad_sync_options, bucket_cap_mb);
  DOUBLE_DEFAULT(sync, concord_grad_sync_options, first_bucket_mb);
  INT_DEFAULT(sync, concord_grad_sync_options, op);
  INT_DEFAULT(sync, concord_grad_sync_options, compress);

  const concord_sgd_options sgd = CONCORD_SGD_OPTIONS_INIT;
  INT_DEFAULT(sgd, concord_sgd_options, struct_size);
  DOUBLE_DEFAULT(sgd, concord_sgd_options, lr);
  DOUBLE_DEFAULT(sgd, concord_sgd_options, momentum);
  DOUBLE_DEFAULT(sgd, concord_sgd_options, weight_decay);
  INT_DEFAULT(sgd, concord_sgd_options, nesterov);
  INT_DEFAULT(sgd, concord_sgd_options, step);

  const concord_adamw_options adamw = CONCORD_ADAMW_OPTIONS_INIT;
  INT_DEFAULT(adamw, concord_adamw_options, struct_size);
  DOUBLE_DEFAULT(adamw, concord_adamw_options, lr);
  DOUBLE_DEFAULT(adamw, concord_adamw_options, beta1);
  DOUBLE_DEFAULT(adamw, concord_adamw_options, beta2);
  DOUBLE_DEFAULT(adamw, concord_adamw_options, eps);
  DOUBLE_DEFAULT(adamw, concord_adamw_options, weight_decay);
  INT_DEFAULT(adamw, concord_adamw_options, step);

  const concord_metric_options metric = CONCORD_METRIC_OPTIONS_INIT;
  INT_DEFAULT(metric, concord_metric_options, struct_size);
  DOUBLE_DEFAULT(metric, concord_metric_options, threshold);
  INT_DEFAULT(metric, concord_metric_options, k);
}

static void constants(void) {
  CONSTANT(kDLCPU);
  CONSTANT(kDLInt);
  CONSTANT(kDLUInt);
  CONSTANT(kDLFloat);
  CONSTANT(kDLBfloat);
  CONSTANT(kDLBool);
  CONSTANT(CONCORD_OK);
  CONSTANT(CONCORD_ERR_TIMEOUT);
  CONSTANT(CONCORD_SUM);
  CONSTANT(CONCORD_PROD);
  CONSTANT(CONCORD_MAX);
  CONSTANT(CONCORD_MIN);
  CONSTANT(CONCORD_MEAN);
  CONSTANT(CONCORD_COMPRESS_NONE);
}

int main(void) {
  layouts();
  defaults();
  constants();
  return 0;
}
