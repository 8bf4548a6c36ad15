//! The repr(C) structs, enum sizes, constants and option defaults of this
//! crate against the C compiler's view of concord/concord.h: a C program
//! generated here prints each value, and the Rust side prints the same
//! lines from its own declarations.

use std::ffi::c_int;
use std::fmt::Write as _;
use std::mem::{align_of, offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use concord_sys::*;

/// One line per struct (size, alignment) and per field (offset), as Rust
/// lays them out, and the C statements that print the same lines.
macro_rules! struct_layouts {
    ($($ty:ident { $($field:ident),* $(,)? })*) => {{
        let mut rust = String::new();
        let mut c = String::new();
        $(
            writeln!(rust, "{} size {} align {}", stringify!($ty), size_of::<$ty>(),
                     align_of::<$ty>()).unwrap();
            writeln!(c, "  printf(\"{0} size %zu align %zu\\n\", sizeof({0}), _Alignof({0}));",
                     stringify!($ty)).unwrap();
            $(
                writeln!(rust, "{}.{} offset {}", stringify!($ty), stringify!($field),
                         offset_of!($ty, $field)).unwrap();
                writeln!(c, "  printf(\"{0}.{1} offset %zu\\n\", offsetof({0}, {1}));",
                         stringify!($ty), stringify!($field)).unwrap();
            )*
        )*
        (rust, c)
    }};
}

/// The size of each C enum type the Rust side declares as `c_int`.
macro_rules! enum_sizes {
    ($($ty:ident),*) => {{
        let mut rust = String::new();
        let mut c = String::new();
        $(
            writeln!(rust, "{} size {}", stringify!($ty), size_of::<$ty>()).unwrap();
            writeln!(c, "  printf(\"{0} size %zu\\n\", sizeof({0}));", stringify!($ty)).unwrap();
        )*
        (rust, c)
    }};
}

/// Integer constants, by name.
macro_rules! constants {
    ($($name:ident),* $(,)?) => {{
        let mut rust = String::new();
        let mut c = String::new();
        $(
            writeln!(rust, "{} = {}", stringify!($name), $name as i64).unwrap();
            writeln!(c, "  printf(\"{0} = %lld\\n\", (long long)({0}));", stringify!($name))
                .unwrap();
        )*
        (rust, c)
    }};
}

/// Every field of an options struct's `Default` against its `_INIT` macro:
/// numbers printed exactly, pointers as null or not.
macro_rules! defaults {
    ($($ty:ident = $init:ident { $($field:ident : $kind:ident),* $(,)? })*) => {{
        let mut rust = String::new();
        let mut c = String::new();
        $(
            let value = $ty::default();
            writeln!(c, "  {{ {} v = {}; (void)v;", stringify!($ty), stringify!($init)).unwrap();
            $( defaults!(@field rust, c, value, $ty, $field, $kind); )*
            writeln!(c, "  }}").unwrap();
        )*
        (rust, c)
    }};
    (@field $rust:ident, $c:ident, $value:ident, $ty:ident, $field:ident, int) => {
        writeln!($rust, "{}.{} = {}", stringify!($ty), stringify!($field), $value.$field as i64)
            .unwrap();
        writeln!($c, "  printf(\"{}.{} = %lld\\n\", (long long)v.{});", stringify!($ty),
                 stringify!($field), stringify!($field)).unwrap();
    };
    (@field $rust:ident, $c:ident, $value:ident, $ty:ident, $field:ident, float) => {
        // The bits, so that equal means exactly equal.
        writeln!($rust, "{}.{} bits {}", stringify!($ty), stringify!($field),
                 $value.$field.to_bits()).unwrap();
        writeln!($c, "  {{ double d = v.{2}; unsigned long long b; memcpy(&b, &d, sizeof b); \
                       printf(\"{0}.{1} bits %llu\\n\", b); }}",
                 stringify!($ty), stringify!($field), stringify!($field)).unwrap();
    };
    (@field $rust:ident, $c:ident, $value:ident, $ty:ident, $field:ident, pointer) => {
        writeln!($rust, "{}.{} null {}", stringify!($ty), stringify!($field),
                 $value.$field.is_null() as i32).unwrap();
        writeln!($c, "  printf(\"{}.{} null %d\\n\", v.{} == NULL);", stringify!($ty),
                 stringify!($field), stringify!($field)).unwrap();
    };
}

fn include_dirs() -> Vec<PathBuf> {
    std::env::split_paths(env!("CONCORD_SYS_INCLUDE")).collect()
}

/// Compiles and runs `body` (statements of main) with the header included,
/// as program `name` (tests run in parallel); returns what it printed.
fn c_prints(name: &str, body: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("concord_sys_layout");
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join(format!("{name}.c"));
    let binary = dir.join(name);
    let program = format!(
        "#include <concord/concord.h>\n#include <stddef.h>\n#include <stdio.h>\n\
         #include <string.h>\n\nint main(void) {{\n{body}  return 0;\n}}\n"
    );
    std::fs::write(&source, program).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let mut command = Command::new(&cc);
    command.args(["-std=c11", "-Wall", "-Werror", "-o"]).arg(&binary).arg(&source);
    for dir in include_dirs() {
        command.arg("-I").arg(dir);
    }
    let output = command.output().unwrap_or_else(|e| panic!("cannot run the C compiler {cc}: {e}"));
    assert!(output.status.success(), "{cc} failed:\n{}", String::from_utf8_lossy(&output.stderr));
    let output = Command::new(&binary).output().unwrap();
    assert!(output.status.success());
    String::from_utf8(output.stdout).unwrap()
}

fn assert_same_lines(rust: &str, c: &str) {
    let rust_lines: Vec<&str> = rust.lines().collect();
    let c_lines: Vec<&str> = c.lines().collect();
    for (r, c) in rust_lines.iter().zip(&c_lines) {
        assert_eq!(r, c, "Rust and C disagree");
    }
    assert_eq!(rust_lines.len(), c_lines.len(), "Rust and C print different numbers of lines");
}

#[test]
fn structs_have_the_c_layout() {
    let (rust, c) = struct_layouts! {
        DLPackVersion { major, minor }
        DLDevice { device_type, device_id }
        DLDataType { code, bits, lanes }
        DLTensor { data, device, ndim, dtype, shape, strides, byte_offset }
        DLManagedTensor { dl_tensor, manager_ctx, deleter }
        DLManagedTensorVersioned { version, manager_ctx, deleter, flags, dl_tensor }
        concord_comm_options {
            struct_size, rank, world_size, master_addr, master_port, token, timeout_s, backend,
            store_served_elsewhere
        }
        concord_grad_sync_options { struct_size, bucket_cap_mb, first_bucket_mb, op, compress }
        concord_sgd_options { struct_size, lr, momentum, weight_decay, nesterov, step }
        concord_adamw_options { struct_size, lr, beta1, beta2, eps, weight_decay, step }
        concord_metric_options { struct_size, threshold, k }
    };
    assert_same_lines(&rust, &c_prints("structs", &c));
}

#[test]
fn enums_are_c_ints() {
    let (rust, c) = enum_sizes!(DLDeviceType, concord_status, concord_reduce_op, concord_compress);
    assert_eq!(size_of::<c_int>(), 4);
    assert_same_lines(&rust, &c_prints("enums", &c));
}

#[test]
fn constants_have_the_c_values() {
    let (rust, c) = constants!(
        DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION,
        kDLCPU, kDLCUDA, kDLCUDAHost, kDLOpenCL, kDLVulkan, kDLMetal, kDLVPI, kDLROCM,
        kDLROCMHost, kDLExtDev, kDLCUDAManaged, kDLOneAPI, kDLWebGPU, kDLHexagon, kDLMAIA,
        kDLInt, kDLUInt, kDLFloat, kDLOpaqueHandle, kDLBfloat, kDLComplex, kDLBool,
        DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_FLAG_BITMASK_IS_COPIED,
        DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED,
        CONCORD_OK, CONCORD_ERR_INVALID_ARGUMENT, CONCORD_ERR_UNAVAILABLE, CONCORD_ERR_TIMEOUT,
        CONCORD_ERR_REMOTE, CONCORD_ERR_MISMATCH, CONCORD_ERR_ABORTED,
        CONCORD_ERR_OUT_OF_MEMORY, CONCORD_ERR_INTERNAL, CONCORD_ERR_INTERRUPTED,
        CONCORD_SUM, CONCORD_PROD, CONCORD_MAX, CONCORD_MIN, CONCORD_MEAN,
        CONCORD_COMPRESS_NONE, CONCORD_COMPRESS_BF16, CONCORD_COMPRESS_FP16,
    );
    assert_same_lines(&rust, &c_prints("constants", &c));
}

#[test]
fn option_defaults_are_the_init_macros() {
    let (rust, c) = defaults! {
        concord_comm_options = CONCORD_COMM_OPTIONS_INIT {
            struct_size: int, rank: int, world_size: int, master_addr: pointer,
            master_port: int, token: pointer, timeout_s: float, backend: pointer,
        }
        concord_grad_sync_options = CONCORD_GRAD_SYNC_OPTIONS_INIT {
            struct_size: int, bucket_cap_mb: float, first_bucket_mb: float, op: int,
            compress: int,
        }
        concord_sgd_options = CONCORD_SGD_OPTIONS_INIT {
            struct_size: int, lr: float, momentum: float, weight_decay: float, nesterov: int,
            step: int,
        }
        concord_adamw_options = CONCORD_ADAMW_OPTIONS_INIT {
            struct_size: int, lr: float, beta1: float, beta2: float, eps: float,
            weight_decay: float, step: int,
        }
        concord_metric_options = CONCORD_METRIC_OPTIONS_INIT {
            struct_size: int, threshold: float, k: int,
        }
    };
    assert_same_lines(&rust, &c_prints("defaults", &c));
}
