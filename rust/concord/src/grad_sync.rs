//! Gradient buckets: the all-reduce of a model's gradients, started bucket
//! by bucket as the gradients become ready, so that communication overlaps
//! the backward pass.

use std::marker::PhantomData;
use std::ptr::{self, NonNull};

use concord_sys as sys;

use crate::comm::{Communicator, ReduceOp};
use crate::dtype::{DType, Element};
use crate::error::{check, Error, Result};
use crate::tensor::{cpu_tensor, flat};

/// How float32 gradients travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compression {
    None,
    /// Each rank's value rounded once to bfloat16; within 2^-7 relative.
    BF16,
    /// Each rank's value rounded once to float16; within 2^-10 relative,
    /// overflowing beyond 65504.
    FP16,
}

/// The bucket plan's options (`concord_grad_sync_options`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradSyncOptions {
    /// Capacity of every bucket after the first, in MiB of gradients.
    pub bucket_cap_mb: f64,
    /// Capacity of the first bucket, in MiB.
    pub first_bucket_mb: f64,
    /// [`ReduceOp::Mean`] or [`ReduceOp::Sum`].
    pub op: ReduceOp,
    pub compress: Compression,
}

impl Default for GradSyncOptions {
    /// `CONCORD_GRAD_SYNC_OPTIONS_INIT`: 25 MiB buckets after a first of
    /// 1 MiB, mean, no compression.
    fn default() -> Self {
        let init = sys::concord_grad_sync_options::default();
        GradSyncOptions { bucket_cap_mb: init.bucket_cap_mb, first_bucket_mb: init.first_bucket_mb,
                          op: ReduceOp::Mean, compress: Compression::None }
    }
}

/// The dtype and shape of one gradient, which is all a plan needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl Layout {
    /// The layout of a gradient of `T` elements and `shape`.
    pub fn of<T: Element>(shape: &[usize]) -> Layout {
        Layout { dtype: T::DTYPE, shape: shape.to_vec() }
    }

    fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The extents as the library takes them.
    fn extents(&self) -> Vec<i64> {
        self.shape.iter().map(|&e| e as i64).collect()
    }
}

/// A plan of gradient buckets on a communicator, reused every step. It
/// borrows the communicator, which therefore outlives it.
pub struct GradSync<'c> {
    /// None once a step was abandoned part-way (see [`Step`]).
    raw: Option<NonNull<sys::concord_grad_sync>>,
    layouts: Vec<Layout>,
    _comm: PhantomData<&'c Communicator>,
}

impl<'c> GradSync<'c> {
    /// Plans buckets for gradients of `layouts`, filled in `ready_order`
    /// (a permutation of the indices; None: reverse index order, as a
    /// backward pass produces them). Collective: every rank plans the same,
    /// which is checked ([`Error::Mismatch`] otherwise).
    pub fn new(comm: &'c Communicator, layouts: &[Layout], ready_order: Option<&[usize]>,
               options: &GradSyncOptions) -> Result<GradSync<'c>> {
        if let Some(order) = ready_order {
            if order.len() != layouts.len() {
                return Err(Error::invalid(format!(
                    "GradSync: ready_order has {} indices for {} gradients", order.len(),
                    layouts.len())));
            }
        }
        // The plan reads dtypes and shapes only; a dangling, aligned
        // pointer stands for the data, which is not read.
        let mut extents: Vec<Vec<i64>> = layouts.iter().map(Layout::extents).collect();
        let tensors: Vec<sys::DLTensor> = layouts
            .iter()
            .zip(extents.iter_mut())
            .map(|(layout, extents)| {
                cpu_tensor(NonNull::<f64>::dangling().as_ptr().cast(), layout.dtype, extents)
            })
            .collect();
        let pointers: Vec<*const sys::DLTensor> = tensors.iter().map(|t| t as *const _).collect();
        let order: Option<Vec<i64>> = ready_order.map(|o| o.iter().map(|&i| i as i64).collect());
        let c_options = sys::concord_grad_sync_options {
            bucket_cap_mb: options.bucket_cap_mb,
            first_bucket_mb: options.first_bucket_mb,
            op: options.op.to_c(),
            compress: match options.compress {
                Compression::None => sys::CONCORD_COMPRESS_NONE,
                Compression::BF16 => sys::CONCORD_COMPRESS_BF16,
                Compression::FP16 => sys::CONCORD_COMPRESS_FP16,
            },
            ..Default::default()
        };
        let mut raw = ptr::null_mut();
        check(unsafe {
            sys::concord_grad_sync_create(comm.raw(), pointers.as_ptr(), pointers.len(),
                                          order.as_ref().map_or(ptr::null(), |o| o.as_ptr()),
                                          &c_options, &mut raw)
        })?;
        Ok(GradSync { raw: NonNull::new(raw), layouts: layouts.to_vec(), _comm: PhantomData })
    }

    fn raw(&self) -> Result<*mut sys::concord_grad_sync> {
        self.raw.map(NonNull::as_ptr).ok_or_else(|| Error::invalid(
            "GradSync: a step was dropped with gradients marked but not waited for, which \
             freed the plan; make a new GradSync"))
    }

    /// The number of buckets.
    pub fn num_buckets(&self) -> Result<usize> {
        let mut count = 0;
        check(unsafe { sys::concord_grad_sync_num_buckets(self.raw()?, &mut count) })?;
        Ok(count)
    }

    /// The bucket gradient `index` is in (buckets are numbered in the order
    /// they fill and start).
    pub fn bucket_of(&self, index: usize) -> Result<usize> {
        let mut bucket = 0;
        check(unsafe { sys::concord_grad_sync_bucket_of(self.raw()?, index, &mut bucket) })?;
        Ok(bucket)
    }

    /// Starts a step: mark each gradient ready as it is produced, then wait.
    pub fn step<'s, 'g>(&'s mut self) -> Step<'s, 'c, 'g> {
        Step { sync: self, marked: 0, finished: false, _grads: PhantomData }
    }
}

impl Drop for GradSync<'_> {
    fn drop(&mut self) {
        if let Some(raw) = self.raw {
            // Waits for bucket all-reduces still in flight, then frees.
            unsafe { sys::concord_grad_sync_destroy(raw.as_ptr()) };
        }
    }
}

/// One step of a [`GradSync`]: every gradient marked ready, then
/// [`wait`](Step::wait). The gradients stay borrowed for `'g`, until the
/// step is over, since the library reads and writes them until then.
///
/// Dropping a step without waiting waits when every gradient was marked;
/// when only some were, it cannot finish the step (the others' ranks are
/// mid-step too), so it frees the plan once its in-flight all-reduces end,
/// and the `GradSync` refuses further use.
pub struct Step<'s, 'c, 'g> {
    sync: &'s mut GradSync<'c>,
    marked: usize,
    finished: bool,
    _grads: PhantomData<&'g mut [u8]>,
}

impl<'g> Step<'_, '_, 'g> {
    /// Gradient `index` is ready: it is packed into its bucket, and a bucket
    /// whose gradients are all ready starts its all-reduce. `grad` holds
    /// the planned number of elements, of the planned dtype.
    pub fn mark_ready<T: Element>(&mut self, index: usize, grad: &'g mut [T]) -> Result<()> {
        let raw = self.sync.raw()?;
        let mut extents: Vec<i64>;
        let mut one = [0i64];
        let mut tensor = match self.sync.layouts.get(index) {
            // The plan's shape, over a slice that holds that many elements
            // of its own dtype (which the library checks against the plan).
            Some(layout) if layout.numel() == grad.len() => {
                extents = layout.extents();
                cpu_tensor(grad.as_ptr().cast(), T::DTYPE, &mut extents)
            }
            Some(layout) => {
                return Err(Error::invalid(format!(
                    "GradSync::mark_ready: gradient {index} has {} elements but was planned with \
                     shape {:?} ({} elements)", grad.len(), layout.shape, layout.numel())));
            }
            // The library names the index out of range.
            None => flat(grad, &mut one),
        };
        check(unsafe { sys::concord_grad_sync_mark_ready(raw, index, &mut tensor,
                                                         ptr::null_mut()) })?;
        self.marked += 1;
        Ok(())
    }

    /// Waits for every bucket and writes the results into the gradients.
    /// A failed collective returns its error and leaves the gradients
    /// untouched; the plan is ready for the next step either way.
    pub fn wait(mut self) -> Result<()> {
        let raw = self.sync.raw()?;
        let result = check(unsafe { sys::concord_grad_sync_wait(raw, ptr::null_mut()) });
        // With gradients unmarked the library refuses (naming them) and
        // keeps the step open; dropping the step then deals with it.
        self.finished = self.marked == self.sync.layouts.len();
        result
    }
}

impl Drop for Step<'_, '_, '_> {
    fn drop(&mut self) {
        if self.finished || self.marked == 0 {
            return;
        }
        let Some(raw) = self.sync.raw else { return };
        if self.marked == self.sync.layouts.len() {
            unsafe { sys::concord_grad_sync_wait(raw.as_ptr(), ptr::null_mut()) };
        } else {
            // The library holds the marked gradients until a wait that can
            // never come: free the plan (which waits for the all-reduces in
            // flight) before their borrow ends.
            self.sync.raw = None;
            unsafe { sys::concord_grad_sync_destroy(raw.as_ptr()) };
        }
    }
}
