//! Raw declarations of concord's C ABI, one for one with
//! `concord/concord.h` and `concord/dlpack.h`, under their C names.
//!
//! Everything here is `unsafe` to call and follows the header's rules
//! (handles, ownership, option structs with `struct_size`, streams). The
//! `concord` crate is the safe API over it. The build script links
//! `libconcord` (see the crate's README for how it is found) and passes its
//! directories to dependents' build scripts as `DEP_CONCORD_LIBDIR` and
//! `DEP_CONCORD_INCLUDE`.
#![allow(non_camel_case_types, non_upper_case_globals)]

use std::ffi::{c_char, c_int, c_void};

// ---- DLPack ---------------------------------------------------------------------

/// `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLPackVersion {
    pub major: u32,
    pub minor: u32,
}

pub const DLPACK_MAJOR_VERSION: u32 = 1;
pub const DLPACK_MINOR_VERSION: u32 = 1;

/// `DLDeviceType`: a C enum, so an `int`.
pub type DLDeviceType = c_int;
pub const kDLCPU: DLDeviceType = 1;
pub const kDLCUDA: DLDeviceType = 2;
pub const kDLCUDAHost: DLDeviceType = 3;
pub const kDLOpenCL: DLDeviceType = 4;
pub const kDLVulkan: DLDeviceType = 7;
pub const kDLMetal: DLDeviceType = 8;
pub const kDLVPI: DLDeviceType = 9;
pub const kDLROCM: DLDeviceType = 10;
pub const kDLROCMHost: DLDeviceType = 11;
pub const kDLExtDev: DLDeviceType = 12;
pub const kDLCUDAManaged: DLDeviceType = 13;
pub const kDLOneAPI: DLDeviceType = 14;
pub const kDLWebGPU: DLDeviceType = 15;
pub const kDLHexagon: DLDeviceType = 16;
pub const kDLMAIA: DLDeviceType = 17;

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    pub device_type: DLDeviceType,
    pub device_id: i32,
}

/// `DLDataTypeCode` values, as stored in [`DLDataType::code`].
pub type DLDataTypeCode = u8;
pub const kDLInt: DLDataTypeCode = 0;
pub const kDLUInt: DLDataTypeCode = 1;
pub const kDLFloat: DLDataTypeCode = 2;
pub const kDLOpaqueHandle: DLDataTypeCode = 3;
pub const kDLBfloat: DLDataTypeCode = 4;
pub const kDLComplex: DLDataTypeCode = 5;
pub const kDLBool: DLDataTypeCode = 6;

/// `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// `DLTensor`. `strides` NULL means compact row-major.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

/// `DLManagedTensor`.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    pub dl_tensor: DLTensor,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(self_: *mut DLManagedTensor)>,
}

pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;
pub const DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED: u64 = 1 << 2;

/// `DLManagedTensorVersioned`.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    pub version: DLPackVersion,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(self_: *mut DLManagedTensorVersioned)>,
    pub flags: u64,
    pub dl_tensor: DLTensor,
}

// ---- status, operators ----------------------------------------------------------

/// `concord_status`: a C enum, so an `int`.
pub type concord_status = c_int;
pub const CONCORD_OK: concord_status = 0;
pub const CONCORD_ERR_INVALID_ARGUMENT: concord_status = 1;
pub const CONCORD_ERR_UNAVAILABLE: concord_status = 2;
pub const CONCORD_ERR_TIMEOUT: concord_status = 3;
pub const CONCORD_ERR_REMOTE: concord_status = 4;
pub const CONCORD_ERR_MISMATCH: concord_status = 5;
pub const CONCORD_ERR_ABORTED: concord_status = 6;
pub const CONCORD_ERR_OUT_OF_MEMORY: concord_status = 7;
pub const CONCORD_ERR_INTERNAL: concord_status = 8;
pub const CONCORD_ERR_INTERRUPTED: concord_status = 9;

/// `concord_reduce_op`.
pub type concord_reduce_op = c_int;
pub const CONCORD_SUM: concord_reduce_op = 0;
pub const CONCORD_PROD: concord_reduce_op = 1;
pub const CONCORD_MAX: concord_reduce_op = 2;
pub const CONCORD_MIN: concord_reduce_op = 3;
pub const CONCORD_MEAN: concord_reduce_op = 4;

/// `concord_compress`.
pub type concord_compress = c_int;
pub const CONCORD_COMPRESS_NONE: concord_compress = 0;
pub const CONCORD_COMPRESS_BF16: concord_compress = 1;
pub const CONCORD_COMPRESS_FP16: concord_compress = 2;

/// `concord_interrupt_check`.
pub type concord_interrupt_check = Option<unsafe extern "C" fn(user: *mut c_void) -> c_int>;

// ---- handles --------------------------------------------------------------------

macro_rules! opaque {
    ($($name:ident => $handle:ident),* $(,)?) => {$(
        /// An opaque struct of the library, only ever behind a pointer.
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
            // Neither Send, Sync nor Unpin: the library owns it.
            _marker: core::marker::PhantomData<(*mut u8, core::marker::PhantomPinned)>,
        }
        pub type $handle = *mut $name;
    )*};
}

opaque! {
    concord_store_server => concord_store_server_t,
    concord_store => concord_store_t,
    concord_comm => concord_comm_t,
    concord_work => concord_work_t,
    concord_grad_sync => concord_grad_sync_t,
}

// ---- option structs -------------------------------------------------------------
// Each has a `Default` that is its C `_INIT` macro.

/// `concord_comm_options`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct concord_comm_options {
    pub struct_size: usize,
    pub rank: c_int,
    pub world_size: c_int,
    pub master_addr: *const c_char,
    pub master_port: c_int,
    pub token: *const c_char,
    pub timeout_s: f64,
    pub backend: *const c_char,
    pub store_served_elsewhere: c_int,
}

impl Default for concord_comm_options {
    /// `CONCORD_COMM_OPTIONS_INIT`.
    fn default() -> Self {
        Self {
            struct_size: core::mem::size_of::<Self>(),
            rank: -1,
            world_size: -1,
            master_addr: core::ptr::null(),
            master_port: 0,
            token: core::ptr::null(),
            timeout_s: 0.0,
            backend: core::ptr::null(),
            store_served_elsewhere: 0,
        }
    }
}

/// `concord_grad_sync_options`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct concord_grad_sync_options {
    pub struct_size: usize,
    pub bucket_cap_mb: f64,
    pub first_bucket_mb: f64,
    pub op: concord_reduce_op,
    pub compress: concord_compress,
}

impl Default for concord_grad_sync_options {
    /// `CONCORD_GRAD_SYNC_OPTIONS_INIT`.
    fn default() -> Self {
        Self {
            struct_size: core::mem::size_of::<Self>(),
            bucket_cap_mb: 25.0,
            first_bucket_mb: 1.0,
            op: CONCORD_MEAN,
            compress: CONCORD_COMPRESS_NONE,
        }
    }
}

/// `concord_sgd_options`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct concord_sgd_options {
    pub struct_size: usize,
    pub lr: f64,
    pub momentum: f64,
    pub weight_decay: f64,
    pub nesterov: c_int,
    pub step: i64,
}

impl Default for concord_sgd_options {
    /// `CONCORD_SGD_OPTIONS_INIT`.
    fn default() -> Self {
        Self {
            struct_size: core::mem::size_of::<Self>(),
            lr: 0.01,
            momentum: 0.0,
            weight_decay: 0.0,
            nesterov: 0,
            step: 1,
        }
    }
}

/// `concord_adamw_options`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct concord_adamw_options {
    pub struct_size: usize,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub step: i64,
}

impl Default for concord_adamw_options {
    /// `CONCORD_ADAMW_OPTIONS_INIT`.
    fn default() -> Self {
        Self {
            struct_size: core::mem::size_of::<Self>(),
            lr: 0.001,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            step: 1,
        }
    }
}

/// `concord_metric_options`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct concord_metric_options {
    pub struct_size: usize,
    pub threshold: f64,
    pub k: i64,
}

impl Default for concord_metric_options {
    /// `CONCORD_METRIC_OPTIONS_INIT`.
    fn default() -> Self {
        Self { struct_size: core::mem::size_of::<Self>(), threshold: 0.5, k: 1 }
    }
}

// ---- functions ------------------------------------------------------------------

extern "C" {
    // versions
    pub fn concord_version() -> *const c_char;
    pub fn concord_version_code() -> c_int;
    pub fn concord_build_info() -> *const c_char;

    // status
    pub fn concord_status_string(status: concord_status) -> *const c_char;
    pub fn concord_last_error() -> *const c_char;

    // interrupting blocking calls
    pub fn concord_interrupt_set_check(check: concord_interrupt_check, user: *mut c_void)
        -> concord_status;

    // rendezvous store
    pub fn concord_store_server_create(host: *const c_char, port: c_int, token: *const c_char,
                                       out: *mut concord_store_server_t) -> concord_status;
    pub fn concord_store_server_port(server: concord_store_server_t, port: *mut c_int)
        -> concord_status;
    pub fn concord_store_server_destroy(server: concord_store_server_t) -> concord_status;
    pub fn concord_store_connect(host: *const c_char, port: c_int, token: *const c_char,
                                 timeout_s: f64, out: *mut concord_store_t) -> concord_status;
    pub fn concord_store_set(store: concord_store_t, key: *const c_char, value: *const c_void,
                             size: usize) -> concord_status;
    pub fn concord_store_get(store: concord_store_t, key: *const c_char, timeout_s: f64,
                             value: *mut c_void, capacity: usize, size: *mut usize)
        -> concord_status;
    pub fn concord_store_wait(store: concord_store_t, keys: *const *const c_char, num_keys: usize,
                              timeout_s: f64) -> concord_status;
    pub fn concord_store_add(store: concord_store_t, key: *const c_char, delta: i64,
                             result: *mut i64) -> concord_status;
    pub fn concord_store_delete(store: concord_store_t, key: *const c_char, existed: *mut c_int)
        -> concord_status;
    pub fn concord_store_destroy(store: concord_store_t) -> concord_status;

    // communicators
    pub fn concord_comm_init(options: *const concord_comm_options, out: *mut concord_comm_t)
        -> concord_status;
    pub fn concord_comm_init_from_env(out: *mut concord_comm_t) -> concord_status;
    pub fn concord_comm_init_with_store(store: concord_store_t, name: *const c_char, rank: c_int,
                                        size: c_int, timeout_s: f64, out: *mut concord_comm_t)
        -> concord_status;
    pub fn concord_comm_split(comm: concord_comm_t, color: c_int, key: c_int,
                              out: *mut concord_comm_t) -> concord_status;
    pub fn concord_comm_rank(comm: concord_comm_t, rank: *mut c_int) -> concord_status;
    pub fn concord_comm_size(comm: concord_comm_t, size: *mut c_int) -> concord_status;
    pub fn concord_comm_local_rank(comm: concord_comm_t, local_rank: *mut c_int)
        -> concord_status;
    pub fn concord_comm_backend(comm: concord_comm_t, name: *mut *const c_char) -> concord_status;
    pub fn concord_comm_timeout(comm: concord_comm_t, timeout_s: *mut f64) -> concord_status;
    pub fn concord_comm_abort(comm: concord_comm_t) -> concord_status;
    pub fn concord_comm_destroy(comm: concord_comm_t) -> concord_status;

    // collectives
    pub fn concord_comm_all_reduce(comm: concord_comm_t, send: *const DLTensor,
                                   recv: *mut DLTensor, op: concord_reduce_op,
                                   stream: *mut c_void, work: *mut concord_work_t)
        -> concord_status;
    pub fn concord_comm_all_gather(comm: concord_comm_t, send: *const DLTensor,
                                   recv: *mut DLTensor, stream: *mut c_void,
                                   work: *mut concord_work_t) -> concord_status;
    pub fn concord_comm_reduce_scatter(comm: concord_comm_t, send: *const DLTensor,
                                       recv: *mut DLTensor, op: concord_reduce_op,
                                       stream: *mut c_void, work: *mut concord_work_t)
        -> concord_status;
    pub fn concord_comm_broadcast(comm: concord_comm_t, send: *const DLTensor,
                                  recv: *mut DLTensor, root: c_int, stream: *mut c_void,
                                  work: *mut concord_work_t) -> concord_status;
    pub fn concord_comm_barrier(comm: concord_comm_t, work: *mut concord_work_t)
        -> concord_status;

    // asynchronous work
    pub fn concord_work_wait(work: concord_work_t, timeout_s: f64) -> concord_status;
    pub fn concord_work_test(work: concord_work_t, done: *mut c_int) -> concord_status;
    pub fn concord_work_destroy(work: concord_work_t) -> concord_status;

    // multi-tensor collectives
    pub fn concord_comm_all_reduce_multi(comm: concord_comm_t, tensors: *const *mut DLTensor,
                                         num_tensors: usize, op: concord_reduce_op,
                                         stream: *mut c_void, work: *mut concord_work_t)
        -> concord_status;

    // data parallel: gradient buckets
    pub fn concord_grad_sync_create(comm: concord_comm_t, grads: *const *const DLTensor,
                                    num_grads: usize, ready_order: *const i64,
                                    options: *const concord_grad_sync_options,
                                    out: *mut concord_grad_sync_t) -> concord_status;
    pub fn concord_grad_sync_num_buckets(sync: concord_grad_sync_t, num_buckets: *mut usize)
        -> concord_status;
    pub fn concord_grad_sync_bucket_of(sync: concord_grad_sync_t, index: usize,
                                       bucket: *mut usize) -> concord_status;
    pub fn concord_grad_sync_mark_ready(sync: concord_grad_sync_t, index: usize,
                                        grad: *mut DLTensor, stream: *mut c_void)
        -> concord_status;
    pub fn concord_grad_sync_wait(sync: concord_grad_sync_t, stream: *mut c_void)
        -> concord_status;
    pub fn concord_grad_sync_destroy(sync: concord_grad_sync_t) -> concord_status;

    // data parallel: fused optimizers and gradient norms
    pub fn concord_optim_sgd_step(options: *const concord_sgd_options, num_tensors: usize,
                                  params: *const *mut DLTensor, grads: *const *const DLTensor,
                                  momentum_buffers: *const *mut DLTensor, stream: *mut c_void)
        -> concord_status;
    pub fn concord_optim_adamw_step(options: *const concord_adamw_options, num_tensors: usize,
                                    params: *const *mut DLTensor, grads: *const *const DLTensor,
                                    exp_avg: *const *mut DLTensor,
                                    exp_avg_sq: *const *mut DLTensor, stream: *mut c_void)
        -> concord_status;
    pub fn concord_tensors_sum_of_squares(num_tensors: usize, tensors: *const *const DLTensor,
                                          result: *mut f64, stream: *mut c_void)
        -> concord_status;
    pub fn concord_tensors_sum_of_squares_into(num_tensors: usize,
                                               tensors: *const *const DLTensor,
                                               result: *mut DLTensor, stream: *mut c_void)
        -> concord_status;
    pub fn concord_tensors_scale(num_tensors: usize, tensors: *const *mut DLTensor, scale: f64,
                                 stream: *mut c_void) -> concord_status;
    pub fn concord_tensors_clip_by_sum_of_squares(num_tensors: usize,
                                                  tensors: *const *mut DLTensor,
                                                  sum_of_squares: *const DLTensor,
                                                  max_norm: f64, stream: *mut c_void)
        -> concord_status;

    // metrics
    pub fn concord_metric_update(kernel: *const c_char, state: *mut DLTensor,
                                 inputs: *const *const DLTensor, num_inputs: usize,
                                 options: *const concord_metric_options, stream: *mut c_void)
        -> concord_status;
}
