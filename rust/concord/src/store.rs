//! The rendezvous store: a key-value server that ranks meet through, and
//! clients of it.

use std::ffi::{c_char, c_int, c_void, CString};
use std::ptr;
use std::time::Duration;

use concord_sys as sys;

use crate::comm::c_string;
use crate::error::{check, Result};

/// A store served by this process on `host:port`, for clients that present
/// its token. Dropping it stops serving.
#[derive(Debug)]
pub struct StoreServer {
    raw: sys::concord_store_server_t,
}

// The server runs on threads of its own; the handle only starts and stops it.
unsafe impl Send for StoreServer {}

impl StoreServer {
    /// Serves on `host:port` (port 0: any free port, see [`port`](Self::port)).
    /// `token` must not be empty: a store never serves without a secret.
    pub fn new(host: &str, port: u16, token: &str) -> Result<StoreServer> {
        let (host, token) = (c_string(host, "host")?, c_string(token, "token")?);
        let mut raw = ptr::null_mut();
        check(unsafe {
            sys::concord_store_server_create(host.as_ptr(), c_int::from(port), token.as_ptr(),
                                             &mut raw)
        })?;
        Ok(StoreServer { raw })
    }

    /// The port it serves on.
    pub fn port(&self) -> Result<u16> {
        let mut port: c_int = 0;
        check(unsafe { sys::concord_store_server_port(self.raw, &mut port) })?;
        Ok(port as u16)
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        unsafe { sys::concord_store_server_destroy(self.raw) };
    }
}

/// A client of a store. Dropping it disconnects.
#[derive(Debug)]
pub struct Store {
    raw: sys::concord_store_t,
}

// One connection, used by one thread at a time (&mut self for requests).
unsafe impl Send for Store {}

fn seconds(timeout: Duration) -> f64 {
    timeout.as_secs_f64()
}

impl Store {
    /// Connects to `host:port`, retrying until `timeout` has passed.
    pub fn connect(host: &str, port: u16, token: &str, timeout: Duration) -> Result<Store> {
        let (host, token) = (c_string(host, "host")?, c_string(token, "token")?);
        let mut raw = ptr::null_mut();
        check(unsafe {
            sys::concord_store_connect(host.as_ptr(), c_int::from(port), token.as_ptr(),
                                       seconds(timeout), &mut raw)
        })?;
        Ok(Store { raw })
    }

    pub(crate) fn raw(&self) -> sys::concord_store_t {
        self.raw
    }

    /// Sets `key` to `value`.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let key = c_string(key, "key")?;
        check(unsafe {
            sys::concord_store_set(self.raw, key.as_ptr(), value.as_ptr().cast(), value.len())
        })
    }

    /// The value of `key`, waiting up to `timeout` for it to be set.
    pub fn get(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let key = c_string(key, "key")?;
        let mut value = vec![0u8; 256];
        loop {
            let mut size = 0usize;
            check(unsafe {
                sys::concord_store_get(self.raw, key.as_ptr(), seconds(timeout),
                                       value.as_mut_ptr() as *mut c_void, value.len(), &mut size)
            })?;
            if size <= value.len() {
                value.truncate(size);
                return Ok(value);
            }
            // The value is larger than the buffer: ask again with its size.
            value.resize(size, 0);
        }
    }

    /// Waits up to `timeout` until every key in `keys` is set.
    pub fn wait(&mut self, keys: &[&str], timeout: Duration) -> Result<()> {
        let keys: Vec<CString> = keys.iter().map(|k| c_string(k, "key")).collect::<Result<_>>()?;
        let pointers: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
        check(unsafe {
            sys::concord_store_wait(self.raw, pointers.as_ptr(), pointers.len(), seconds(timeout))
        })
    }

    /// Adds `delta` to the integer at `key` (0 when unset) and returns the
    /// new value.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        let key = c_string(key, "key")?;
        let mut result = 0i64;
        check(unsafe { sys::concord_store_add(self.raw, key.as_ptr(), delta, &mut result) })?;
        Ok(result)
    }

    /// Deletes `key`; whether it existed.
    pub fn delete(&mut self, key: &str) -> Result<bool> {
        let key = c_string(key, "key")?;
        let mut existed: c_int = 0;
        check(unsafe { sys::concord_store_delete(self.raw, key.as_ptr(), &mut existed) })?;
        Ok(existed != 0)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        unsafe { sys::concord_store_destroy(self.raw) };
    }
}
