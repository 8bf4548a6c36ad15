//! Shaped views of host slices, of any element type, for the calls that
//! take several tensors or need a shape (optimizers, metric updates,
//! multi-tensor all-reduce). They borrow the slice like a `&[T]` or a
//! `&mut [T]` would, and describe it to the library as a C-contiguous
//! (row-major) DLPack tensor on the CPU.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;

use concord_sys as sys;

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

/// What both views hold: the DLTensor, and its shape on the heap (so the
/// tensor's shape pointer stays valid when the view moves).
#[derive(Clone, Debug)]
struct View {
    dl: sys::DLTensor,
    shape: Box<[i64]>,
}

// A view is a pointer into a slice of `Element`s, which are Send + Sync.
unsafe impl Send for View {}

impl View {
    fn new<T: Element>(data: *const T, len: usize, shape: &[usize]) -> Result<View> {
        let mut numel: usize = 1;
        let mut extents = Vec::with_capacity(shape.len());
        for &extent in shape {
            numel = numel.checked_mul(extent).ok_or_else(|| Error::invalid(format!(
                "shape {shape:?} holds more elements than a usize counts")))?;
            extents.push(i64::try_from(extent).map_err(|_| Error::invalid(format!(
                "extent {extent} of shape {shape:?} does not fit an int64")))?);
        }
        if numel != len {
            return Err(Error::invalid(format!(
                "a slice of {len} elements cannot have shape {shape:?} ({numel} elements)")));
        }
        let mut shape: Box<[i64]> = extents.into_boxed_slice();
        let dl = cpu_tensor(data.cast(), T::DTYPE, &mut shape);
        Ok(View { dl, shape })
    }

    fn dtype(&self) -> DType {
        *DType::ALL.iter().find(|d| d.to_dlpack() == self.dl.dtype).expect("a view's own dtype")
    }
}

/// A read-only shaped view of a slice (like `&'a [T]`, of any [`Element`]).
#[derive(Clone, Debug)]
pub struct TensorRef<'a> {
    view: View,
    _data: PhantomData<&'a [u8]>,
}

/// A writable shaped view of a slice (like `&'a mut [T]`).
#[derive(Debug)]
pub struct TensorMut<'a> {
    view: View,
    _data: PhantomData<&'a mut [u8]>,
}

impl<'a> TensorRef<'a> {
    /// `data` as a tensor of `shape` (row-major; the product of the extents
    /// must be `data.len()`; `&[]` is a scalar of one element).
    pub fn new<T: Element>(data: &'a [T], shape: &[usize]) -> Result<Self> {
        Ok(TensorRef { view: View::new(data.as_ptr(), data.len(), shape)?, _data: PhantomData })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.view.dtype()
    }

    /// The extents, outermost first.
    pub fn shape(&self) -> &[i64] {
        &self.view.shape
    }

    /// The DLTensor the library reads; valid while `self` is borrowed.
    pub fn as_dlpack(&self) -> *const sys::DLTensor {
        &self.view.dl
    }
}

impl<'a> TensorMut<'a> {
    /// `data` as a tensor of `shape` (see [`TensorRef::new`]).
    pub fn new<T: Element>(data: &'a mut [T], shape: &[usize]) -> Result<Self> {
        Ok(TensorMut { view: View::new(data.as_ptr(), data.len(), shape)?, _data: PhantomData })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.view.dtype()
    }

    /// The extents, outermost first.
    pub fn shape(&self) -> &[i64] {
        &self.view.shape
    }

    /// A read-only view of the same data, for as long as this one is
    /// borrowed.
    pub fn read_only(&self) -> TensorRef<'_> {
        TensorRef { view: self.view.clone(), _data: PhantomData }
    }

    /// The DLTensor the library writes; valid while `self` is borrowed
    /// mutably.
    pub fn as_dlpack(&mut self) -> *mut sys::DLTensor {
        &mut self.view.dl
    }
}

impl<'a, T: Element> From<&'a [T]> for TensorRef<'a> {
    /// A one-dimensional view.
    fn from(data: &'a [T]) -> Self {
        TensorRef::new(data, &[data.len()]).expect("a slice is a 1-d tensor of its length")
    }
}

impl<'a, T: Element> From<&'a Vec<T>> for TensorRef<'a> {
    fn from(data: &'a Vec<T>) -> Self {
        data.as_slice().into()
    }
}

impl<'a, T: Element> From<&'a mut [T]> for TensorMut<'a> {
    /// A one-dimensional view.
    fn from(data: &'a mut [T]) -> Self {
        let len = data.len();
        TensorMut::new(data, &[len]).expect("a slice is a 1-d tensor of its length")
    }
}

impl<'a, T: Element> From<&'a mut Vec<T>> for TensorMut<'a> {
    fn from(data: &'a mut Vec<T>) -> Self {
        data.as_mut_slice().into()
    }
}

/// The DLTensor pointers of `tensors`, for the C calls that take an array
/// of them (valid while `tensors` is borrowed).
pub(crate) fn const_pointers(tensors: &[TensorRef<'_>]) -> Vec<*const sys::DLTensor> {
    tensors.iter().map(TensorRef::as_dlpack).collect()
}

/// The DLTensor pointers of `tensors`, writable.
pub(crate) fn mut_pointers(tensors: &mut [TensorMut<'_>]) -> Vec<*mut sys::DLTensor> {
    tensors.iter_mut().map(TensorMut::as_dlpack).collect()
}

/// A DLTensor over `dtype` elements at `data`, C-contiguous on the CPU,
/// with the extents in `shape` (which must outlive the tensor's use).
pub(crate) fn cpu_tensor(data: *const c_void, dtype: DType, shape: &mut [i64]) -> sys::DLTensor {
    sys::DLTensor {
        data: data as *mut c_void,
        device: sys::DLDevice { device_type: sys::kDLCPU, device_id: 0 },
        ndim: shape.len() as i32,
        dtype: dtype.to_dlpack(),
        shape: shape.as_mut_ptr(),
        strides: ptr::null_mut(), // compact row-major
        byte_offset: 0,
    }
}

/// A one-dimensional DLTensor over a slice, with its extent in `extent`
/// (which must outlive the tensor's use).
pub(crate) fn flat<T: Element>(data: &[T], extent: &mut [i64; 1]) -> sys::DLTensor {
    extent[0] = data.len() as i64; // a slice's length is at most isize::MAX
    cpu_tensor(data.as_ptr().cast(), T::DTYPE, extent)
}
