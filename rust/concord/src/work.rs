//! Collectives in flight.

use std::ffi::c_int;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::time::Duration;

use concord_sys as sys;

use crate::comm::Communicator;
use crate::error::{check, Error, Result};

/// An asynchronous collective. It borrows the communicator and the buffers
/// of the collective for `'a`, so they can be neither touched nor freed
/// until the work is waited for or dropped; dropping it waits.
#[must_use = "dropping a Work waits for it; call wait() to see its result"]
pub struct Work<'a> {
    raw: NonNull<sys::concord_work>,
    finished: bool,
    _borrows: PhantomData<(&'a Communicator, &'a mut [u8])>,
}

impl<'a> Work<'a> {
    /// Owns `raw`, a work handle the library returned.
    pub(crate) fn new(raw: sys::concord_work_t) -> Work<'a> {
        let raw = NonNull::new(raw).expect("the library returned a work handle");
        Work { raw, finished: false, _borrows: PhantomData }
    }

    /// Waits until the collective is done and returns its own result. It
    /// ends within its communicator's timeout.
    pub fn wait(mut self) -> Result<()> {
        self.finished = true;
        check(unsafe { sys::concord_work_wait(self.raw.as_ptr(), -1.0) })
    }

    /// Waits at most `timeout`: `Ok(true)` once the collective succeeded,
    /// `Ok(false)` while it is still running, its error if it failed.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<bool> {
        match check(unsafe { sys::concord_work_wait(self.raw.as_ptr(), timeout.as_secs_f64()) }) {
            Ok(()) => {
                self.finished = true;
                Ok(true)
            }
            // The wait's own limit and the collective's timeout share a
            // status; the collective's state tells them apart (it may also
            // have finished in between).
            Err(Error::Timeout(_)) => self.test(),
            Err(error) => {
                self.finished = true;
                Err(error)
            }
        }
    }

    /// Without blocking: `Ok(true)` once the collective succeeded,
    /// `Ok(false)` while it runs, its error if it failed.
    pub fn test(&mut self) -> Result<bool> {
        let mut done: c_int = 0;
        let result = check(unsafe { sys::concord_work_test(self.raw.as_ptr(), &mut done) });
        if done != 0 {
            self.finished = true;
        }
        result.map(|()| done != 0)
    }
}

impl Drop for Work<'_> {
    fn drop(&mut self) {
        unsafe {
            if !self.finished {
                // The buffers are released when this returns: the collective
                // must be over. Its error went unobserved, as dropped.
                sys::concord_work_wait(self.raw.as_ptr(), -1.0);
            }
            sys::concord_work_destroy(self.raw.as_ptr());
        }
    }
}
