//! Failures as a Rust enum: one variant per `concord_status`, each carrying
//! the library's detailed message.

use std::ffi::CStr;
use std::fmt;

use concord_sys as sys;

/// A failed call: the kind of failure (the C status) and the library's
/// detailed message for it.
///
/// The message is `concord_last_error()`, read on the calling thread right
/// after the failing call, before anything else can replace it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// `CONCORD_ERR_INVALID_ARGUMENT`: bad input, reported before any
    /// communication.
    InvalidArgument(String),
    /// `CONCORD_ERR_UNAVAILABLE`: a backend or device this build or
    /// machine lacks.
    Unavailable(String),
    /// `CONCORD_ERR_TIMEOUT`.
    Timeout(String),
    /// `CONCORD_ERR_REMOTE`: a peer failed, died or aborted.
    Remote(String),
    /// `CONCORD_ERR_MISMATCH`: ranks disagree on a collective.
    Mismatch(String),
    /// `CONCORD_ERR_ABORTED`: this communicator was aborted.
    Aborted(String),
    /// `CONCORD_ERR_OUT_OF_MEMORY`.
    OutOfMemory(String),
    /// `CONCORD_ERR_INTERNAL`.
    Internal(String),
    /// `CONCORD_ERR_INTERRUPTED`: the interrupt check asked a blocking call
    /// to stop (see [`set_interrupt_check`](crate::set_interrupt_check)).
    Interrupted(String),
    /// A status this crate does not know, from a newer library.
    Unknown { status: i32, message: String },
}

/// The result of every fallible call of this crate.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    fn new(status: sys::concord_status, message: String) -> Self {
        match status {
            sys::CONCORD_ERR_INVALID_ARGUMENT => Error::InvalidArgument(message),
            sys::CONCORD_ERR_UNAVAILABLE => Error::Unavailable(message),
            sys::CONCORD_ERR_TIMEOUT => Error::Timeout(message),
            sys::CONCORD_ERR_REMOTE => Error::Remote(message),
            sys::CONCORD_ERR_MISMATCH => Error::Mismatch(message),
            sys::CONCORD_ERR_ABORTED => Error::Aborted(message),
            sys::CONCORD_ERR_OUT_OF_MEMORY => Error::OutOfMemory(message),
            sys::CONCORD_ERR_INTERNAL => Error::Internal(message),
            sys::CONCORD_ERR_INTERRUPTED => Error::Interrupted(message),
            status => Error::Unknown { status, message },
        }
    }

    /// An invalid argument found on the Rust side (what a C caller would
    /// get from the library, for what only Rust can see, such as a slice's
    /// length against a shape).
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidArgument(message.into())
    }

    /// The C status (`concord_status`), e.g. `CONCORD_ERR_TIMEOUT` = 3.
    pub fn status(&self) -> i32 {
        match self {
            Error::InvalidArgument(_) => sys::CONCORD_ERR_INVALID_ARGUMENT,
            Error::Unavailable(_) => sys::CONCORD_ERR_UNAVAILABLE,
            Error::Timeout(_) => sys::CONCORD_ERR_TIMEOUT,
            Error::Remote(_) => sys::CONCORD_ERR_REMOTE,
            Error::Mismatch(_) => sys::CONCORD_ERR_MISMATCH,
            Error::Aborted(_) => sys::CONCORD_ERR_ABORTED,
            Error::OutOfMemory(_) => sys::CONCORD_ERR_OUT_OF_MEMORY,
            Error::Internal(_) => sys::CONCORD_ERR_INTERNAL,
            Error::Interrupted(_) => sys::CONCORD_ERR_INTERRUPTED,
            Error::Unknown { status, .. } => *status,
        }
    }

    /// The library's detailed message.
    pub fn message(&self) -> &str {
        match self {
            Error::InvalidArgument(m)
            | Error::Unavailable(m)
            | Error::Timeout(m)
            | Error::Remote(m)
            | Error::Mismatch(m)
            | Error::Aborted(m)
            | Error::OutOfMemory(m)
            | Error::Internal(m)
            | Error::Interrupted(m) => m,
            Error::Unknown { message, .. } => message,
        }
    }
}

/// `concord_status_string`: static text of the library.
fn status_text(status: i32) -> &'static str {
    let text = unsafe { CStr::from_ptr(sys::concord_status_string(status)) };
    text.to_str().unwrap_or("(status text is not UTF-8)")
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", status_text(self.status()), self.message())
    }
}

impl std::error::Error for Error {}

/// Ok for `CONCORD_OK`; otherwise the error, with this thread's last-error
/// text read at once (the library keeps one message per OS thread, and the
/// next failing call replaces it).
pub(crate) fn check(status: sys::concord_status) -> Result<()> {
    if status == sys::CONCORD_OK {
        return Ok(());
    }
    let message = unsafe { CStr::from_ptr(sys::concord_last_error()) };
    Err(Error::new(status, message.to_string_lossy().into_owned()))
}
