//! The element types the library supports, and the Rust types that are
//! them.

use concord_sys as sys;

use crate::half::{BF16, F16};

/// An element type of the library (a DLPack dtype it supports).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F16,
    BF16,
    F32,
    F64,
    I8,
    I32,
    I64,
    U8,
    /// One byte, 0 or 1.
    Bool,
}

impl DType {
    /// Every supported dtype.
    pub const ALL: [DType; 9] = [
        DType::F16, DType::BF16, DType::F32, DType::F64, DType::I8, DType::I32, DType::I64,
        DType::U8, DType::Bool,
    ];

    /// The library's name for it ("float16", "int64", "bool", ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::I8 => "int8",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// Bytes per element.
    pub const fn size(self) -> usize {
        (self.to_dlpack().bits / 8) as usize
    }

    /// The DLPack data type.
    pub const fn to_dlpack(self) -> sys::DLDataType {
        let (code, bits) = match self {
            DType::F16 => (sys::kDLFloat, 16),
            DType::BF16 => (sys::kDLBfloat, 16),
            DType::F32 => (sys::kDLFloat, 32),
            DType::F64 => (sys::kDLFloat, 64),
            DType::I8 => (sys::kDLInt, 8),
            DType::I32 => (sys::kDLInt, 32),
            DType::I64 => (sys::kDLInt, 64),
            DType::U8 => (sys::kDLUInt, 8),
            DType::Bool => (sys::kDLBool, 8),
        };
        sys::DLDataType { code, bits, lanes: 1 }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type whose values are elements of one [`DType`], with the same
/// size and representation. Implemented for `f32`, `f64`, `i8`, `i32`,
/// `i64`, `u8`, `bool`, [`F16`] and [`BF16`] only.
pub trait Element: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The element type of this Rust type.
    const DTYPE: DType;
}

macro_rules! elements {
    ($($ty:ty => $dtype:ident),* $(,)?) => {$(
        impl sealed::Sealed for $ty {}
        impl Element for $ty {
            const DTYPE: DType = DType::$dtype;
        }
        // The C side reads and writes these bytes as that dtype.
        const _: () = assert!(std::mem::size_of::<$ty>() == DType::$dtype.size());
    )*};
}

elements! {
    F16 => F16,
    BF16 => BF16,
    f32 => F32,
    f64 => F64,
    i8 => I8,
    i32 => I32,
    i64 => I64,
    u8 => U8,
    bool => Bool,
}
