//! Interrupting blocking calls from the calling thread.

use std::ffi::{c_int, c_void};
use std::panic;

use concord_sys as sys;

use crate::error::{check, Result};

/// Called by the library with the `fn` given to [`set_interrupt_check`].
unsafe extern "C" fn call_check(user: *mut c_void) -> c_int {
    // A fn pointer was stored in `user` (same size on every target Rust
    // supports with this library).
    let check: fn() -> bool = unsafe { std::mem::transmute::<*mut c_void, fn() -> bool>(user) };
    // A panic must not cross into C; a check that panics asks to stop.
    panic::catch_unwind(check).unwrap_or(true) as c_int
}

/// Installs `check` for the calling thread (`None` removes it): while this
/// thread blocks in the library (a collective, a wait, the rendezvous of
/// init or split), `check()` is called about every 50 ms, and when it
/// returns true the call gives up with [`Error::Interrupted`]. A collective
/// given up that way aborts its communicator, so the peers fail at once.
///
/// A signal handler that only sets an `AtomicBool` makes Ctrl-C end a
/// blocked collective: `set_interrupt_check(Some(|| STOP.load(Relaxed)))`.
///
/// [`Error::Interrupted`]: crate::Error::Interrupted
pub fn set_interrupt_check(check_fn: Option<fn() -> bool>) -> Result<()> {
    let (callback, user): (sys::concord_interrupt_check, *mut c_void) = match check_fn {
        Some(f) => (Some(call_check), f as *mut c_void),
        None => (None, std::ptr::null_mut()),
    };
    check(unsafe { sys::concord_interrupt_set_check(callback, user) })
}
