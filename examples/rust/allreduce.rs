//! All-reduce across ranks from Rust through concord's C ABI, with no crate
//! beyond the standard library: the declarations below mirror
//! concord/concord.h and concord/dlpack.h.
//!
//!   rustc -O --edition 2021 allreduce.rs -L "$(python -m concord --libdir)" -l concord \
//!         -C link-arg=-Wl,-rpath,"$(python -m concord --libdir)"
//!   concord-run -n 4 ./allreduce 1000

use std::ffi::{c_char, c_int, c_void, CStr};
use std::process::ExitCode;
use std::ptr;

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

const K_DL_CPU: i32 = 1;
const K_DL_FLOAT: u8 = 2;
const CONCORD_OK: c_int = 0;
const CONCORD_SUM: c_int = 0;

#[repr(C)]
struct ConcordComm {
    _private: [u8; 0],
}

#[link(name = "concord")]
extern "C" {
    fn concord_version() -> *const c_char;
    fn concord_status_string(status: c_int) -> *const c_char;
    fn concord_last_error() -> *const c_char;
    fn concord_comm_init_from_env(out: *mut *mut ConcordComm) -> c_int;
    fn concord_comm_rank(comm: *mut ConcordComm, rank: *mut c_int) -> c_int;
    fn concord_comm_size(comm: *mut ConcordComm, size: *mut c_int) -> c_int;
    fn concord_comm_all_reduce(comm: *mut ConcordComm, send: *const DLTensor, recv: *mut DLTensor,
                          op: c_int, stream: *mut c_void, work: *mut *mut c_void) -> c_int;
    fn concord_comm_destroy(comm: *mut ConcordComm) -> c_int;
}

/// The status as an error naming the call, its status text and the detail.
fn check(status: c_int, call: &str) -> Result<(), String> {
    if status == CONCORD_OK {
        return Ok(());
    }
    // Static text and a thread-local message owned by the library.
    let (text, detail) = unsafe {
        (CStr::from_ptr(concord_status_string(status)).to_string_lossy(),
         CStr::from_ptr(concord_last_error()).to_string_lossy())
    };
    Err(format!("{call} failed: {text}: {detail}"))
}

fn run(count: usize) -> Result<String, String> {
    let mut comm: *mut ConcordComm = ptr::null_mut();
    check(unsafe { concord_comm_init_from_env(&mut comm) }, "concord_comm_init_from_env")?;
    let (mut rank, mut size) = (0, 0);
    let result = (|| {
        check(unsafe { concord_comm_rank(comm, &mut rank) }, "concord_comm_rank")?;
        check(unsafe { concord_comm_size(comm, &mut size) }, "concord_comm_size")?;
        // Element i of rank r holds (r + 1) * (i % 97): the sum over ranks is
        // (i % 97) * size * (size + 1) / 2, exact in float32.
        let mut data: Vec<f32> = (0..count).map(|i| ((rank + 1) as f32) * ((i % 97) as f32)).collect();
        let mut shape = [count as i64];
        let mut tensor = DLTensor {
            data: data.as_mut_ptr() as *mut c_void,
            device: DLDevice { device_type: K_DL_CPU, device_id: 0 },
            ndim: 1,
            dtype: DLDataType { code: K_DL_FLOAT, bits: 32, lanes: 1 },
            shape: shape.as_mut_ptr(),
            strides: ptr::null_mut(),
            byte_offset: 0,
        };
        let tensor_ptr: *mut DLTensor = &mut tensor;
        check(unsafe { concord_comm_all_reduce(comm, tensor_ptr, tensor_ptr, CONCORD_SUM, ptr::null_mut(),
                                          ptr::null_mut()) },
              "concord_comm_all_reduce")?;
        let ranks_sum = (size * (size + 1) / 2) as f32;
        if let Some(i) = (0..count).find(|&i| data[i] != ((i % 97) as f32) * ranks_sum) {
            return Err(format!("element {i} is {}, expected {}", data[i], ((i % 97) as f32) * ranks_sum));
        }
        Ok(format!("rank {rank}: all_reduce of {count} floats verified from Rust"))
    })();
    check(unsafe { concord_comm_destroy(comm) }, "concord_comm_destroy")?;
    result
}

fn main() -> ExitCode {
    let count = match std::env::args().nth(1).map(|a| a.parse::<usize>()) {
        None => 1000,
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            eprintln!("usage: allreduce [count]: {e}");
            return ExitCode::from(2);
        }
    };
    match run(count) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            let version = unsafe { CStr::from_ptr(concord_version()).to_string_lossy() };
            eprintln!("concord {version}: {message}");
            ExitCode::FAILURE
        }
    }
}
