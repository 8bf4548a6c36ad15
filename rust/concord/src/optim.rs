//! Fused optimizer steps and gradient norms over many tensors at once
//! (float32 or float64; each call checks every tensor before writing any).

use std::ptr;

use concord_sys as sys;

use crate::error::{check, Error, Result};
use crate::tensor::{const_pointers, mut_pointers, TensorMut, TensorRef};

/// SGD's hyperparameters (torch.optim.SGD's rule, dampening 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdOptions {
    pub lr: f64,
    pub momentum: f64,
    pub weight_decay: f64,
    /// Nesterov momentum (needs momentum > 0).
    pub nesterov: bool,
    /// 1 on the first step: the momentum buffers start as the gradient.
    pub step: i64,
}

impl Default for SgdOptions {
    /// `CONCORD_SGD_OPTIONS_INIT`: lr 0.01, no momentum or weight decay, step 1.
    fn default() -> Self {
        let init = sys::concord_sgd_options::default();
        SgdOptions { lr: init.lr, momentum: init.momentum, weight_decay: init.weight_decay,
                     nesterov: init.nesterov != 0, step: init.step }
    }
}

/// AdamW's hyperparameters (torch.optim.AdamW's rule, no amsgrad).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWOptions {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// The 1-based count of steps including this one (bias correction).
    pub step: i64,
}

impl Default for AdamWOptions {
    /// `CONCORD_ADAMW_OPTIONS_INIT`: lr 1e-3, betas (0.9, 0.999), eps 1e-8,
    /// weight decay 0.01, step 1.
    fn default() -> Self {
        let init = sys::concord_adamw_options::default();
        AdamWOptions { lr: init.lr, beta1: init.beta1, beta2: init.beta2, eps: init.eps,
                       weight_decay: init.weight_decay, step: init.step }
    }
}

/// The library takes one count for several arrays: each must hold one
/// tensor per parameter.
fn same_count(call: &str, params: usize, others: &[(&str, usize)]) -> Result<()> {
    for &(name, count) in others {
        if count != params {
            return Err(Error::invalid(format!(
                "{call}: {params} params but {count} {name}; pass one per parameter")));
        }
    }
    Ok(())
}

/// One SGD step over every parameter: `params[i]` from `grads[i]`, with
/// `momentum_buffers[i]` (empty when `momentum` is 0).
pub fn sgd_step(options: &SgdOptions, params: &mut [TensorMut<'_>], grads: &[TensorRef<'_>],
                momentum_buffers: &mut [TensorMut<'_>]) -> Result<()> {
    same_count("sgd_step", params.len(), &[("grads", grads.len())])?;
    if !momentum_buffers.is_empty() {
        same_count("sgd_step", params.len(), &[("momentum_buffers", momentum_buffers.len())])?;
    }
    let c_options = sys::concord_sgd_options {
        lr: options.lr,
        momentum: options.momentum,
        weight_decay: options.weight_decay,
        nesterov: options.nesterov.into(),
        step: options.step,
        ..Default::default()
    };
    let (p, g, m) = (mut_pointers(params), const_pointers(grads), mut_pointers(momentum_buffers));
    let m = if m.is_empty() { ptr::null() } else { m.as_ptr() };
    check(unsafe {
        sys::concord_optim_sgd_step(&c_options, p.len(), p.as_ptr(), g.as_ptr(), m,
                                    ptr::null_mut())
    })
}

/// One AdamW step over every parameter, with its moment estimates
/// `exp_avg[i]` and `exp_avg_sq[i]` (zero before the first step).
pub fn adamw_step(options: &AdamWOptions, params: &mut [TensorMut<'_>], grads: &[TensorRef<'_>],
                  exp_avg: &mut [TensorMut<'_>], exp_avg_sq: &mut [TensorMut<'_>])
    -> Result<()> {
    same_count("adamw_step", params.len(), &[("grads", grads.len()), ("exp_avg", exp_avg.len()),
                                             ("exp_avg_sq", exp_avg_sq.len())])?;
    let c_options = sys::concord_adamw_options {
        lr: options.lr,
        beta1: options.beta1,
        beta2: options.beta2,
        eps: options.eps,
        weight_decay: options.weight_decay,
        step: options.step,
        ..Default::default()
    };
    let (p, g) = (mut_pointers(params), const_pointers(grads));
    let (m, v) = (mut_pointers(exp_avg), mut_pointers(exp_avg_sq));
    check(unsafe {
        sys::concord_optim_adamw_step(&c_options, p.len(), p.as_ptr(), g.as_ptr(), m.as_ptr(),
                                      v.as_ptr(), ptr::null_mut())
    })
}

/// The sum of squares of every element of every tensor (floating dtypes),
/// accumulated in float64; its square root is the global L2 norm.
pub fn sum_of_squares(tensors: &[TensorRef<'_>]) -> Result<f64> {
    let pointers = const_pointers(tensors);
    let mut result = 0.0;
    check(unsafe {
        sys::concord_tensors_sum_of_squares(pointers.len(), pointers.as_ptr(), &mut result,
                                            ptr::null_mut())
    })?;
    Ok(result)
}

/// [`sum_of_squares`] written into `result`, a float64 tensor of one
/// element (for [`clip_by_sum_of_squares`], or an all-reduce first).
pub fn sum_of_squares_into(tensors: &[TensorRef<'_>], result: &mut TensorMut<'_>) -> Result<()> {
    let pointers = const_pointers(tensors);
    check(unsafe {
        sys::concord_tensors_sum_of_squares_into(pointers.len(), pointers.as_ptr(),
                                                 result.as_dlpack(), ptr::null_mut())
    })
}

/// Multiplies every element of every tensor by `factor`.
pub fn scale(tensors: &mut [TensorMut<'_>], factor: f64) -> Result<()> {
    let pointers = mut_pointers(tensors);
    check(unsafe {
        sys::concord_tensors_scale(pointers.len(), pointers.as_ptr(), factor, ptr::null_mut())
    })
}

/// Gradient clipping by global norm (torch.nn.utils.clip_grad_norm_'s
/// rule): every tensor times min(1, max_norm / (sqrt(s) + 1e-6)), with `s`
/// the value of `sum_of_squares` (a float64 tensor of one element).
pub fn clip_by_sum_of_squares(tensors: &mut [TensorMut<'_>], sum_of_squares: &TensorRef<'_>,
                              max_norm: f64) -> Result<()> {
    let pointers = mut_pointers(tensors);
    check(unsafe {
        sys::concord_tensors_clip_by_sum_of_squares(pointers.len(), pointers.as_ptr(),
                                                    sum_of_squares.as_dlpack(), max_norm,
                                                    ptr::null_mut())
    })
}
