# Declarations of the C ABI (cabi/include/concord/concord.h). The enum
# values below are the only source of C constants for the Python package.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "concord/dlpack.h" nogil:
    int DLPACK_MAJOR_VERSION
    int DLPACK_MINOR_VERSION

    ctypedef struct DLPackVersion:
        uint32_t major
        uint32_t minor

    ctypedef enum DLDeviceType:
        kDLCPU
        kDLCUDA
        kDLCUDAHost
        kDLOpenCL
        kDLVulkan
        kDLMetal
        kDLVPI
        kDLROCM
        kDLROCMHost
        kDLExtDev
        kDLCUDAManaged
        kDLOneAPI
        kDLWebGPU
        kDLHexagon
        kDLMAIA

    ctypedef struct DLDevice:
        DLDeviceType device_type
        int32_t device_id

    ctypedef enum DLDataTypeCode:
        kDLInt
        kDLUInt
        kDLFloat
        kDLOpaqueHandle
        kDLBfloat
        kDLComplex
        kDLBool

    ctypedef struct DLDataType:
        uint8_t code
        uint8_t bits
        uint16_t lanes

    ctypedef struct DLTensor:
        void* data
        DLDevice device
        int32_t ndim
        DLDataType dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset

    ctypedef struct DLManagedTensor:
        DLTensor dl_tensor
        void* manager_ctx
        void (*deleter)(DLManagedTensor* self)

    uint64_t DLPACK_FLAG_BITMASK_READ_ONLY
    uint64_t DLPACK_FLAG_BITMASK_IS_COPIED
    uint64_t DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED

    ctypedef struct DLManagedTensorVersioned:
        DLPackVersion version
        void* manager_ctx
        void (*deleter)(DLManagedTensorVersioned* self)
        uint64_t flags
        DLTensor dl_tensor


cdef extern from "concord/concord.h" nogil:
    int CONCORD_VERSION_MAJOR
    int CONCORD_VERSION_MINOR
    int CONCORD_VERSION_PATCH
    int CONCORD_VERSION_CODE

    const char* concord_version()
    int concord_version_code()
    const char* concord_build_info()

    ctypedef enum concord_status:
        CONCORD_OK
        CONCORD_ERR_INVALID_ARGUMENT
        CONCORD_ERR_UNAVAILABLE
        CONCORD_ERR_TIMEOUT
        CONCORD_ERR_REMOTE
        CONCORD_ERR_MISMATCH
        CONCORD_ERR_ABORTED
        CONCORD_ERR_OUT_OF_MEMORY
        CONCORD_ERR_INTERNAL
        CONCORD_ERR_INTERRUPTED

    const char* concord_status_string(concord_status status)
    const char* concord_last_error()

    # interrupting blocking calls
    ctypedef int (*concord_interrupt_check)(void* user) noexcept nogil
    concord_status concord_interrupt_set_check(concord_interrupt_check check, void* user)

    ctypedef enum concord_reduce_op:
        CONCORD_SUM
        CONCORD_PROD
        CONCORD_MAX
        CONCORD_MIN
        CONCORD_MEAN

    # rendezvous store
    ctypedef struct concord_store_server:
        pass
    ctypedef concord_store_server* concord_store_server_t
    ctypedef struct concord_store:
        pass
    ctypedef concord_store* concord_store_t

    concord_status concord_store_server_create(const char* host, int port, const char* token,
                                               concord_store_server_t* out)
    concord_status concord_store_server_port(concord_store_server_t server, int* port)
    concord_status concord_store_server_destroy(concord_store_server_t server)

    concord_status concord_store_connect(const char* host, int port, const char* token,
                                         double timeout_s, concord_store_t* out)
    concord_status concord_store_set(concord_store_t store, const char* key, const void* value,
                                     size_t size)
    concord_status concord_store_get(concord_store_t store, const char* key, double timeout_s,
                                     void* value, size_t capacity, size_t* size)
    concord_status concord_store_wait(concord_store_t store, const char* const* keys,
                                      size_t num_keys, double timeout_s)
    concord_status concord_store_add(concord_store_t store, const char* key, int64_t delta,
                                     int64_t* result)
    concord_status concord_store_delete(concord_store_t store, const char* key, int* existed)
    concord_status concord_store_destroy(concord_store_t store)

    # communicators
    ctypedef struct concord_comm:
        pass
    ctypedef concord_comm* concord_comm_t
    ctypedef struct concord_work:
        pass
    ctypedef concord_work* concord_work_t

    ctypedef struct concord_comm_options:
        size_t struct_size
        int rank
        int world_size
        const char* master_addr
        int master_port
        const char* token
        double timeout_s
        const char* backend
        int store_served_elsewhere

    # CONCORD_COMM_OPTIONS_INIT is a brace initializer, which Cython cannot
    # assign; callers set every field (struct_size first) instead.

    concord_status concord_comm_init(const concord_comm_options* options, concord_comm_t* out)
    concord_status concord_comm_init_from_env(concord_comm_t* out)
    concord_status concord_comm_init_with_store(concord_store_t store, const char* name,
                                                int rank, int size, double timeout_s,
                                                concord_comm_t* out)
    concord_status concord_comm_split(concord_comm_t comm, int color, int key,
                                      concord_comm_t* out)
    concord_status concord_comm_rank(concord_comm_t comm, int* rank)
    concord_status concord_comm_size(concord_comm_t comm, int* size)
    concord_status concord_comm_local_rank(concord_comm_t comm, int* local_rank)
    concord_status concord_comm_backend(concord_comm_t comm, const char** name)
    concord_status concord_comm_timeout(concord_comm_t comm, double* timeout_s)
    concord_status concord_comm_abort(concord_comm_t comm)
    concord_status concord_comm_destroy(concord_comm_t comm)

    # collectives
    concord_status concord_comm_all_reduce(concord_comm_t comm, const DLTensor* send, DLTensor* recv,
                                      concord_reduce_op op, void* stream, concord_work_t* work)
    concord_status concord_comm_all_gather(concord_comm_t comm, const DLTensor* send, DLTensor* recv,
                                      void* stream, concord_work_t* work)
    concord_status concord_comm_reduce_scatter(concord_comm_t comm, const DLTensor* send,
                                          DLTensor* recv, concord_reduce_op op, void* stream,
                                          concord_work_t* work)
    concord_status concord_comm_broadcast(concord_comm_t comm, const DLTensor* send, DLTensor* recv,
                                     int root, void* stream, concord_work_t* work)
    concord_status concord_comm_barrier(concord_comm_t comm, concord_work_t* work)

    # asynchronous work
    concord_status concord_work_wait(concord_work_t work, double timeout_s)
    concord_status concord_work_test(concord_work_t work, int* done)
    concord_status concord_work_destroy(concord_work_t work)

    # multi-tensor collectives
    concord_status concord_comm_all_reduce_multi(concord_comm_t comm, DLTensor** tensors,
                                            size_t num_tensors, concord_reduce_op op,
                                            void* stream, concord_work_t* work)

    # data parallel: gradient buckets
    ctypedef struct concord_grad_sync:
        pass
    ctypedef concord_grad_sync* concord_grad_sync_t

    ctypedef enum concord_compress:
        CONCORD_COMPRESS_NONE
        CONCORD_COMPRESS_BF16
        CONCORD_COMPRESS_FP16

    ctypedef struct concord_grad_sync_options:
        size_t struct_size
        double bucket_cap_mb
        double first_bucket_mb
        concord_reduce_op op
        concord_compress compress

    concord_status concord_grad_sync_create(concord_comm_t comm, const DLTensor** grads,
                                            size_t num_grads, const int64_t* ready_order,
                                            const concord_grad_sync_options* options,
                                            concord_grad_sync_t* out)
    concord_status concord_grad_sync_num_buckets(concord_grad_sync_t sync, size_t* num_buckets)
    concord_status concord_grad_sync_bucket_of(concord_grad_sync_t sync, size_t index,
                                               size_t* bucket)
    concord_status concord_grad_sync_mark_ready(concord_grad_sync_t sync, size_t index,
                                                DLTensor* grad, void* stream)
    concord_status concord_grad_sync_wait(concord_grad_sync_t sync, void* stream)
    concord_status concord_grad_sync_destroy(concord_grad_sync_t sync)

    # data parallel: fused optimizers
    ctypedef struct concord_sgd_options:
        size_t struct_size
        double lr
        double momentum
        double weight_decay
        int nesterov
        int64_t step

    concord_status concord_optim_sgd_step(const concord_sgd_options* options, size_t num_tensors,
                                          DLTensor** params, const DLTensor** grads,
                                          DLTensor** momentum_buffers, void* stream)

    ctypedef struct concord_adamw_options:
        size_t struct_size
        double lr
        double beta1
        double beta2
        double eps
        double weight_decay
        int64_t step

    concord_status concord_optim_adamw_step(const concord_adamw_options* options,
                                            size_t num_tensors, DLTensor** params,
                                            const DLTensor** grads, DLTensor** exp_avg,
                                            DLTensor** exp_avg_sq, void* stream)
    concord_status concord_tensors_sum_of_squares(size_t num_tensors, const DLTensor** tensors,
                                                  double* result, void* stream)
    concord_status concord_tensors_sum_of_squares_into(size_t num_tensors,
                                                       const DLTensor** tensors, DLTensor* result,
                                                       void* stream)
    concord_status concord_tensors_scale(size_t num_tensors, DLTensor** tensors, double scale,
                                         void* stream)
    concord_status concord_tensors_clip_by_sum_of_squares(size_t num_tensors, DLTensor** tensors,
                                                          const DLTensor* sum_of_squares,
                                                          double max_norm, void* stream)

    # metrics: update kernels
    ctypedef struct concord_metric_options:
        size_t struct_size
        double threshold
        int64_t k

    concord_status concord_metric_update(const char* kernel, DLTensor* state,
                                         const DLTensor** inputs, size_t num_inputs,
                                         const concord_metric_options* options, void* stream)
