//! Metric update kernels: local accumulation into state tensors the caller
//! owns, with no communication (syncing the states is an ordinary
//! all-reduce or all-gather).

use std::ptr;

use concord_sys as sys;

use crate::comm::c_string;
use crate::error::{check, Result};
use crate::tensor::{const_pointers, TensorMut, TensorRef};

/// The options of the update kernels (`concord_metric_options`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MetricOptions {
    /// binary_confusion, multilabel_counts: positive at or above it.
    pub threshold: f64,
    /// topk_correct: 1 <= k <= number of classes.
    pub k: i64,
}

impl Default for MetricOptions {
    /// `CONCORD_METRIC_OPTIONS_INIT`: threshold 0.5, k 1.
    fn default() -> Self {
        let init = sys::concord_metric_options::default();
        MetricOptions { threshold: init.threshold, k: init.k }
    }
}

/// Runs the update `kernel` on `state` with `inputs`, as
/// `concord_metric_update` does: "weighted_sum", "max", "min",
/// "confusion_matrix", "binary_confusion", "multilabel_counts",
/// "topk_correct", "binary_histogram" (the C ABI's documentation lists each
/// kernel's state and inputs). Shapes, dtypes and values are checked, and a
/// failed update leaves the state as it was.
pub fn metric_update(kernel: &str, state: &mut TensorMut<'_>, inputs: &[TensorRef<'_>],
                     options: &MetricOptions) -> Result<()> {
    let kernel = c_string(kernel, "kernel")?;
    let c_options = sys::concord_metric_options {
        threshold: options.threshold,
        k: options.k,
        ..Default::default()
    };
    let inputs = const_pointers(inputs);
    check(unsafe {
        sys::concord_metric_update(kernel.as_ptr(), state.as_dlpack(), inputs.as_ptr(),
                                   inputs.len(), &c_options, ptr::null_mut())
    })
}
