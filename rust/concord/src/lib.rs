//! concord from Rust: collectives for data-parallel training and
//! distributed metrics, a safe API over the C ABI (`concord-sys`).
//!
//! ```no_run
//! use concord::{Communicator, ReduceOp};
//!
//! fn main() -> concord::Result<()> {
//!     // Rank and world from concord-run (or torchrun, mpirun, SLURM);
//!     // alone, a world of one.
//!     let comm = Communicator::init()?;
//!     let mut x = vec![comm.rank() as f32; 4];
//!     comm.all_reduce(&mut x, ReduceOp::Sum)?;
//!
//!     let mut gathered = vec![0.0f32; 4 * comm.size()];
//!     let work = comm.all_gather_async(&x, &mut gathered)?;
//!     // `x` and `gathered` stay borrowed until the work is waited for.
//!     work.wait()?;
//!     Ok(())
//! }
//! ```
//!
//! Buffers are host slices of any [`Element`] type (`f32`, `f64`, `i8`,
//! `i32`, `i64`, `u8`, `bool`, [`F16`], [`BF16`]); calls that need shapes
//! or several tensors take [`TensorRef`] / [`TensorMut`] views. Every
//! failure is an [`Error`] carrying the library's message. Every handle is
//! freed on drop; an asynchronous [`Work`] waits when dropped.

mod comm;
mod dtype;
mod error;
mod grad_sync;
mod half;
mod interrupt;
mod metric;
mod optim;
mod store;
mod tensor;
mod work;

use std::ffi::CStr;

pub use comm::{CommOptions, Communicator, ReduceOp};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use grad_sync::{Compression, GradSync, GradSyncOptions, Layout, Step};
pub use half::{BF16, F16};
pub use interrupt::set_interrupt_check;
pub use metric::{metric_update, MetricOptions};
pub use optim::{adamw_step, clip_by_sum_of_squares, scale, sgd_step, sum_of_squares,
                sum_of_squares_into, AdamWOptions, SgdOptions};
pub use store::{Store, StoreServer};
pub use tensor::{TensorMut, TensorRef};
pub use work::Work;

/// Re-exported raw declarations, for what this crate does not wrap (device
/// memory, streams).
pub use concord_sys as sys;

/// The loaded library's version, "MAJOR.MINOR.PATCH".
pub fn version() -> &'static str {
    unsafe { CStr::from_ptr(sys::concord_version()) }.to_str().unwrap_or("(not UTF-8)")
}

/// The loaded library's build, as JSON (version, backends, cuda, nccl).
pub fn build_info() -> &'static str {
    unsafe { CStr::from_ptr(sys::concord_build_info()) }.to_str().unwrap_or("{}")
}
