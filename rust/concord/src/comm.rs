//! Communicators and their collectives on slices.

use std::cell::Cell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::marker::PhantomData;
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

use concord_sys as sys;

use crate::dtype::Element;
use crate::error::{check, Error, Result};
use crate::store::Store;
use crate::tensor::{flat, mut_pointers, TensorMut};
use crate::work::Work;

/// A reduction over ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Prod,
    Max,
    Min,
    /// The sum divided by the number of ranks (integers truncate toward
    /// zero).
    Mean,
}

impl ReduceOp {
    pub(crate) fn to_c(self) -> sys::concord_reduce_op {
        match self {
            ReduceOp::Sum => sys::CONCORD_SUM,
            ReduceOp::Prod => sys::CONCORD_PROD,
            ReduceOp::Max => sys::CONCORD_MAX,
            ReduceOp::Min => sys::CONCORD_MIN,
            ReduceOp::Mean => sys::CONCORD_MEAN,
        }
    }
}

/// How to start the world communicator ([`Communicator::init_with`]).
/// Every field left `None` comes from the environment (concord-run,
/// torchrun, Open MPI, PMI, SLURM), as `concord_comm_options` fields left at
/// their `CONCORD_COMM_OPTIONS_INIT` values do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommOptions {
    /// This process's rank.
    pub rank: Option<usize>,
    /// The number of ranks.
    pub world_size: Option<usize>,
    /// Where the rendezvous store is (rank 0 serves it unless the launcher
    /// does).
    pub master_addr: Option<String>,
    pub master_port: Option<u16>,
    /// The job's secret for the store (CONCORD_JOB_TOKEN).
    pub token: Option<String>,
    /// The bound on every blocking step (CONCORD_TIMEOUT, else 600 s).
    pub timeout: Option<Duration>,
    /// "auto" (by device), "shm", "gloo" or "nccl".
    pub backend: Option<String>,
}

/// A C string for an optional text option; `field` names it in the error.
fn c_text(value: &Option<String>, field: &str) -> Result<Option<CString>> {
    value
        .as_deref()
        .map(|text| CString::new(text).map_err(|_| Error::invalid(format!(
            "{field} {text:?} contains a NUL byte"))))
        .transpose()
}

pub(crate) fn c_string(text: &str, what: &str) -> Result<CString> {
    CString::new(text).map_err(|_| Error::invalid(format!("{what} {text:?} contains a NUL byte")))
}

/// A rank, size, root or color as the C `int` the library takes.
pub(crate) fn c_count(value: usize, what: &str) -> Result<c_int> {
    c_int::try_from(value).map_err(|_| Error::invalid(format!(
        "{what} {value} is larger than a C int holds")))
}

/// The communicator handle. A split-off communicator keeps its parent's
/// alive: on the rank that serves the store, the parent's handle holds the
/// server the child meets its peers through.
struct Handle {
    raw: sys::concord_comm_t,
    _parent: Option<Arc<Handle>>,
}

// The library's communicator may be used and destroyed from any thread;
// this handle is only shared with split-off children, which destroy it.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // Finishes queued work first; a failure has no one left to tell.
        unsafe { sys::concord_comm_destroy(self.raw) };
    }
}

/// A group of ranks that run collectives together: the world of a job, a
/// group split from it, or ranks meeting through a [`Store`].
///
/// Collectives issued on a communicator complete in the order they were
/// issued, and every rank must issue the same ones in the same order. A
/// communicator may move to another thread (`Send`) but is not shared
/// between threads (`!Sync`), which keeps that order one thread's.
/// Dropping it finishes its queued collectives and frees it.
pub struct Communicator {
    handle: Arc<Handle>,
    rank: usize,
    size: usize,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator").field("rank", &self.rank).field("size", &self.size).finish()
    }
}

impl Communicator {
    /// The world communicator from the environment (`concord-run`,
    /// torchrun, Open MPI, PMI, SLURM); with nothing set, a world of one.
    pub fn init() -> Result<Communicator> {
        let mut raw = ptr::null_mut();
        check(unsafe { sys::concord_comm_init_from_env(&mut raw) })?;
        Communicator::own(raw, None)
    }

    /// The world communicator, with what `options` sets taking the place of
    /// the environment's.
    pub fn init_with(options: &CommOptions) -> Result<Communicator> {
        let master_addr = c_text(&options.master_addr, "master_addr")?;
        let token = c_text(&options.token, "token")?;
        let backend = c_text(&options.backend, "backend")?;
        let text = |value: &Option<CString>| value.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        let unset_or = |value: Option<usize>, what| value.map_or(Ok(-1), |v| c_count(v, what));
        let c_options = sys::concord_comm_options {
            rank: unset_or(options.rank, "rank")?,
            world_size: unset_or(options.world_size, "world_size")?,
            master_addr: text(&master_addr),
            master_port: options.master_port.map_or(0, c_int::from),
            token: text(&token),
            timeout_s: options.timeout.map_or(0.0, |t| t.as_secs_f64()),
            backend: text(&backend),
            ..sys::concord_comm_options::default()
        };
        let mut raw = ptr::null_mut();
        check(unsafe { sys::concord_comm_init(&c_options, &mut raw) })?;
        Communicator::own(raw, None)
    }

    /// A communicator of `size` ranks meeting through `store` under the key
    /// prefix `name`; the ranks may be processes or threads of one process.
    /// `timeout` None: CONCORD_TIMEOUT, else 600 s.
    pub fn with_store(store: &Store, name: &str, rank: usize, size: usize,
                      timeout: Option<Duration>) -> Result<Communicator> {
        let name = c_string(name, "name")?;
        let mut raw = ptr::null_mut();
        check(unsafe {
            sys::concord_comm_init_with_store(store.raw(), name.as_ptr(), c_count(rank, "rank")?,
                                              c_count(size, "size")?,
                                              timeout.map_or(0.0, |t| t.as_secs_f64()), &mut raw)
        })?;
        Communicator::own(raw, None)
    }

    fn own(raw: sys::concord_comm_t, parent: Option<Arc<Handle>>) -> Result<Communicator> {
        let handle = Arc::new(Handle { raw, _parent: parent });
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        check(unsafe { sys::concord_comm_rank(raw, &mut rank) })?;
        check(unsafe { sys::concord_comm_size(raw, &mut size) })?;
        Ok(Communicator { handle, rank: rank as usize, size: size as usize,
                          _not_sync: PhantomData })
    }

    pub(crate) fn raw(&self) -> sys::concord_comm_t {
        self.handle.raw
    }

    /// Collective: ranks passing the same `color` form a new communicator,
    /// ranked by (`key`, rank here). `None`: this rank joins none, and gets
    /// `Ok(None)`; every rank of this communicator must call it.
    pub fn split(&self, color: Option<usize>, key: i32) -> Result<Option<Communicator>> {
        let color = color.map_or(Ok(-1), |c| c_count(c, "color"))?;
        let mut raw = ptr::null_mut();
        check(unsafe { sys::concord_comm_split(self.raw(), color, key, &mut raw) })?;
        if raw.is_null() {
            return Ok(None);
        }
        Communicator::own(raw, Some(Arc::clone(&self.handle))).map(Some)
    }

    /// This process's rank, in `0..size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The rank among the ranks on this host.
    pub fn local_rank(&self) -> Result<usize> {
        let mut local: c_int = 0;
        check(unsafe { sys::concord_comm_local_rank(self.raw(), &mut local) })?;
        Ok(local as usize)
    }

    /// The name of the backend for CPU buffers ("shm").
    pub fn backend(&self) -> Result<&'static str> {
        let mut name: *const c_char = ptr::null();
        check(unsafe { sys::concord_comm_backend(self.raw(), &mut name) })?;
        // Static storage of the library.
        Ok(unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("(not UTF-8)"))
    }

    /// The bound on each blocking step of this communicator.
    pub fn timeout(&self) -> Result<Duration> {
        let mut seconds = 0.0;
        check(unsafe { sys::concord_comm_timeout(self.raw(), &mut seconds) })?;
        Ok(Duration::from_secs_f64(seconds))
    }

    /// Fails the pending and future collectives here and on the peers, so
    /// that a rank that cannot go on does not leave the others waiting for
    /// their timeout.
    pub fn abort(&self) -> Result<()> {
        check(unsafe { sys::concord_comm_abort(self.raw()) })
    }

    // ---- collectives ---------------------------------------------------------------
    // Blocking calls pass no work pointer; asynchronous ones return the
    // handle in a Work that borrows the buffers for as long as it lives.

    fn issue<'a>(&'a self, asynchronous: bool,
                 call: impl FnOnce(*mut sys::concord_work_t) -> sys::concord_status)
        -> Result<Option<Work<'a>>> {
        if !asynchronous {
            return check(call(ptr::null_mut())).map(|()| None);
        }
        let mut raw = ptr::null_mut();
        check(call(&mut raw))?;
        Ok(Some(Work::new(raw)))
    }

    /// One collective over a send and a recv slice. The DLTensors only need
    /// to live through the call: the library takes what it keeps from them.
    fn collective<'a, T: Element>(
        &'a self, send: SendBuf<'_, T>, recv: &mut [T], asynchronous: bool,
        call: impl FnOnce(*const sys::DLTensor, *mut sys::DLTensor, *mut sys::concord_work_t)
            -> sys::concord_status,
    ) -> Result<Option<Work<'a>>> {
        let (mut send_extent, mut recv_extent) = ([0i64], [0i64]);
        let mut recv_tensor = flat(recv, &mut recv_extent);
        let recv_dl: *mut sys::DLTensor = &mut recv_tensor;
        let send_tensor;
        let send_dl: *const sys::DLTensor = match send {
            SendBuf::Slice(data) => {
                send_tensor = flat(data, &mut send_extent);
                &send_tensor
            }
            SendBuf::InPlace => recv_dl,
            SendBuf::Absent => ptr::null(),
        };
        self.issue(asynchronous, |work| call(send_dl, recv_dl, work))
    }

    fn all_reduce_impl<'a, T: Element>(&'a self, send: SendBuf<'_, T>, recv: &mut [T], op: ReduceOp,
                                       asynchronous: bool) -> Result<Option<Work<'a>>> {
        self.collective(send, recv, asynchronous, |send, recv, work| unsafe {
            sys::concord_comm_all_reduce(self.raw(), send, recv, op.to_c(), ptr::null_mut(), work)
        })
    }

    fn all_gather_impl<'a, T: Element>(&'a self, send: &[T], recv: &mut [T], asynchronous: bool)
        -> Result<Option<Work<'a>>> {
        self.collective(SendBuf::Slice(send), recv, asynchronous, |send, recv, work| unsafe {
            sys::concord_comm_all_gather(self.raw(), send, recv, ptr::null_mut(), work)
        })
    }

    fn reduce_scatter_impl<'a, T: Element>(&'a self, send: &[T], recv: &mut [T], op: ReduceOp,
                                           asynchronous: bool) -> Result<Option<Work<'a>>> {
        self.collective(SendBuf::Slice(send), recv, asynchronous, |send, recv, work| unsafe {
            sys::concord_comm_reduce_scatter(self.raw(), send, recv, op.to_c(), ptr::null_mut(),
                                             work)
        })
    }

    fn broadcast_impl<'a, T: Element>(&'a self, send: SendBuf<'_, T>, recv: &mut [T], root: usize,
                                      asynchronous: bool) -> Result<Option<Work<'a>>> {
        let root = c_count(root, "root")?;
        self.collective(send, recv, asynchronous, |send, recv, work| unsafe {
            sys::concord_comm_broadcast(self.raw(), send, recv, root, ptr::null_mut(), work)
        })
    }

    fn all_reduce_multi_impl<'a>(&'a self, tensors: &mut [TensorMut<'_>], op: ReduceOp,
                                 asynchronous: bool) -> Result<Option<Work<'a>>> {
        let pointers = mut_pointers(tensors);
        self.issue(asynchronous, |work| unsafe {
            sys::concord_comm_all_reduce_multi(self.raw(), pointers.as_ptr(), pointers.len(),
                                               op.to_c(), ptr::null_mut(), work)
        })
    }

    /// `data` = `op` over every rank's `data`, in place.
    pub fn all_reduce<T: Element>(&self, data: &mut [T], op: ReduceOp) -> Result<()> {
        self.all_reduce_impl(SendBuf::InPlace, data, op, false).map(drop)
    }

    /// `recv` = `op` over every rank's `send` (same length).
    pub fn all_reduce_into<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp)
        -> Result<()> {
        self.all_reduce_impl(SendBuf::Slice(send), recv, op, false).map(drop)
    }

    /// [`all_reduce`](Self::all_reduce), asynchronously.
    pub fn all_reduce_async<'a, T: Element>(&'a self, data: &'a mut [T], op: ReduceOp)
        -> Result<Work<'a>> {
        self.all_reduce_impl(SendBuf::InPlace, data, op, true).map(started)
    }

    /// [`all_reduce_into`](Self::all_reduce_into), asynchronously.
    pub fn all_reduce_into_async<'a, T: Element>(&'a self, send: &'a [T], recv: &'a mut [T],
                                                 op: ReduceOp) -> Result<Work<'a>> {
        self.all_reduce_impl(SendBuf::Slice(send), recv, op, true).map(started)
    }

    /// `recv` = every rank's `send`, concatenated in rank order (`recv`
    /// holds `size()` times as many elements).
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.all_gather_impl(send, recv, false).map(drop)
    }

    /// [`all_gather`](Self::all_gather), asynchronously.
    pub fn all_gather_async<'a, T: Element>(&'a self, send: &'a [T], recv: &'a mut [T])
        -> Result<Work<'a>> {
        self.all_gather_impl(send, recv, true).map(started)
    }

    /// `send` holds `size()` blocks of `recv.len()` elements; `recv` =
    /// `op` over every rank's block number `rank()`.
    pub fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp)
        -> Result<()> {
        self.reduce_scatter_impl(send, recv, op, false).map(drop)
    }

    /// [`reduce_scatter`](Self::reduce_scatter), asynchronously.
    pub fn reduce_scatter_async<'a, T: Element>(&'a self, send: &'a [T], recv: &'a mut [T],
                                                op: ReduceOp) -> Result<Work<'a>> {
        self.reduce_scatter_impl(send, recv, op, true).map(started)
    }

    /// `data` = rank `root`'s `data`, in place.
    pub fn broadcast<T: Element>(&self, data: &mut [T], root: usize) -> Result<()> {
        self.broadcast_impl(SendBuf::InPlace, data, root, false).map(drop)
    }

    /// `recv` = rank `root`'s `send`. `send` is read on the root only, and
    /// may be `None` on the other ranks.
    pub fn broadcast_into<T: Element>(&self, send: Option<&[T]>, recv: &mut [T], root: usize)
        -> Result<()> {
        self.broadcast_impl(SendBuf::from(send), recv, root, false).map(drop)
    }

    /// [`broadcast`](Self::broadcast), asynchronously.
    pub fn broadcast_async<'a, T: Element>(&'a self, data: &'a mut [T], root: usize)
        -> Result<Work<'a>> {
        self.broadcast_impl(SendBuf::InPlace, data, root, true).map(started)
    }

    /// [`broadcast_into`](Self::broadcast_into), asynchronously.
    pub fn broadcast_into_async<'a, T: Element>(&'a self, send: Option<&'a [T]>,
                                                recv: &'a mut [T], root: usize)
        -> Result<Work<'a>> {
        self.broadcast_impl(SendBuf::from(send), recv, root, true).map(started)
    }

    /// Returns once every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        self.issue(false, |work| unsafe { sys::concord_comm_barrier(self.raw(), work) }).map(drop)
    }

    /// [`barrier`](Self::barrier), asynchronously.
    pub fn barrier_async(&self) -> Result<Work<'_>> {
        self.issue(true, |work| unsafe { sys::concord_comm_barrier(self.raw(), work) })
            .map(started)
    }

    /// All-reduces every tensor in place as one operation (small tensors
    /// travel packed, one buffer per dtype). Every rank passes the same
    /// shapes and dtypes.
    pub fn all_reduce_multi(&self, tensors: &mut [TensorMut<'_>], op: ReduceOp) -> Result<()> {
        self.all_reduce_multi_impl(tensors, op, false).map(drop)
    }

    /// [`all_reduce_multi`](Self::all_reduce_multi), asynchronously.
    pub fn all_reduce_multi_async<'a>(&'a self, tensors: &'a mut [TensorMut<'_>], op: ReduceOp)
        -> Result<Work<'a>> {
        self.all_reduce_multi_impl(tensors, op, true).map(started)
    }
}

/// What a collective sends: the recv buffer itself (in place), a slice, or
/// nothing (a broadcast's non-root ranks).
enum SendBuf<'s, T> {
    InPlace,
    Slice(&'s [T]),
    Absent,
}

impl<'s, T> From<Option<&'s [T]>> for SendBuf<'s, T> {
    fn from(send: Option<&'s [T]>) -> Self {
        send.map_or(SendBuf::Absent, SendBuf::Slice)
    }
}

/// The work of an asynchronous call (which always has one).
fn started(work: Option<Work<'_>>) -> Work<'_> {
    work.expect("an asynchronous collective returns its work")
}
