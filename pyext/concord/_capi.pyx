"""The C ABI as Python objects: handles, status checks and tensor import.

Everything here is thin: one class per C handle, tensors passed to C as
DLTensors filled straight from NumPy arrays (no capsule) or taken from any
object's ``__dlpack__`` capsule. The GIL is released around every C call
that may block.
"""

cimport cython
cimport numpy as cnp
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.exc cimport PyErr_CheckSignals
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.number cimport PyNumber_Index
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_SetName
from libc.stdint cimport int64_t, intptr_t
from posix.unistd cimport getpid

import threading

import numpy as np

from . import errors
from ._constants import COMPRESSIONS, REDUCE_OPS, Status
from ._streams import prepare_export

cnp.import_array()


cdef extern from "Python.h":
    # Runs func on the main thread, from the interpreter's eval loop; an
    # exception it raises is raised in the Python code running there.
    int Py_AddPendingCall(int (*func)(void*) except -1, void* arg)

if sizeof(cnp.npy_intp) != sizeof(int64_t):
    raise ImportError("concord needs a 64-bit platform (NumPy shapes must be int64)")
if concord_version_code() != CONCORD_VERSION_CODE:
    raise ImportError(
        f"libconcord {concord_version().decode()} does not match the "
        f"{CONCORD_VERSION_MAJOR}.{CONCORD_VERSION_MINOR}.{CONCORD_VERSION_PATCH} headers "
        "this extension was built with; reinstall concord")


cdef dict _reduce_ops = REDUCE_OPS
cdef dict _compressions = COMPRESSIONS


def version():
    """Version of the loaded libconcord, "MAJOR.MINOR.PATCH"."""
    return concord_version().decode()


def build_info():
    """JSON text describing the build: version, backends, CUDA, NCCL."""
    return concord_build_info().decode()


# ---- errors ------------------------------------------------------------------

# Each class of errors.py stands for the status its `status` names.
cdef dict _error_classes = {
    cls.status: cls for cls in (getattr(errors, name) for name in errors.__all__)
    if isinstance(cls, type) and issubclass(cls, errors.ConcordError) and cls.status is not None
}


cdef object _error_for(int status):
    """The exception for a failed call; reads the thread's last error, so it
    must run right after the call, before any other C call. An interrupted
    call gives what the signal handler raised."""
    if status == CONCORD_ERR_INTERRUPTED:
        return _take_interruption()
    message = concord_last_error().decode("utf-8", "replace")
    if not message:
        message = concord_status_string(<concord_status>status).decode()
    try:
        code = Status(status)
    except ValueError:
        code = status
    return _error_classes.get(status, errors.ConcordError)(message, code)


cpdef int check_status(int status) except -1:
    """Raises the exception class of `status` with the C library's message."""
    if status == CONCORD_OK:
        return 0
    raise _error_for(status)


# ---- interrupts ----------------------------------------------------------------
# Python runs a signal handler (Ctrl-C's raises KeyboardInterrupt) only when
# the interpreter runs again, which a thread blocked in C never does. The C
# library asks the check below about every 50 ms while a blocking call of
# the main thread waits: it runs the pending handlers, and one that raised
# ends the call (its communicator aborted, so the peers fail at once) with
# CONCORD_ERR_INTERRUPTED; the call then raises what the handler raised.

cdef object _interruption = None  # what a handler raised during a blocking call


cdef int _run_signal_handlers(void* user) noexcept with gil:
    global _interruption
    try:
        PyErr_CheckSignals()
    except BaseException as exc:
        _interruption = exc
        return 1
    return 0


cdef object _take_interruption():
    global _interruption
    exc, _interruption = _interruption, None
    return KeyboardInterrupt() if exc is None else exc


cdef int _raise_interruption(void* unused) except -1:
    raise _take_interruption()


cdef void _raise_interruption_later(concord_status status) noexcept:
    """For a wait that cannot raise (a destructor's): the interpreter raises
    the interruption as soon as it runs Python code again."""
    if status == CONCORD_ERR_INTERRUPTED:
        Py_AddPendingCall(_raise_interruption, NULL)


# Signal handlers run on the main thread only: a check elsewhere would
# never see one.
if threading.current_thread() is threading.main_thread():
    concord_interrupt_set_check(_run_signal_handlers, NULL)


cdef object _invalid(str message):
    return errors.InvalidArgumentError(message)


cdef bytes _c_string(object text, str what):
    if isinstance(text, str):
        encoded = (<str>text).encode()
    elif isinstance(text, bytes):
        encoded = text
    else:
        raise TypeError(f"{what} must be str or bytes, not {type(text).__name__}")
    if b"\0" in encoded:
        raise _invalid(f"{what} contains a NUL character")
    return encoded


cdef int _c_int(object value, str what) except? -1:
    """`value` as a C int; InvalidArgumentError for anything else (a float
    included, which a plain conversion would truncate)."""
    try:
        return PyNumber_Index(value)
    except (TypeError, OverflowError):
        raise _invalid(f"{what} must be an integer within a C int's range, got {value!r}") from None


cdef inline const char* _c_string_or_null(bytes encoded):
    return NULL if encoded is None else PyBytes_AS_STRING(encoded)


cdef inline bint _owned_here(int pid):
    # A forked child inherits handles whose threads live in the parent only:
    # destroying them there could hang, so the child leaves them alone.
    return pid == getpid()


# ---- tensors -------------------------------------------------------------------

@cython.final
@cython.freelist(8)
cdef class _Tensor:
    """One array seen as a DLTensor; owns the DLPack managed tensor, if any,
    and calls its deleter exactly once."""
    cdef DLTensor dl
    cdef object array
    cdef DLManagedTensor* managed
    cdef DLManagedTensorVersioned* managed_versioned
    cdef bint read_only
    cdef bint copied
    # The CUDA stream the data was made ready on (the array's framework's
    # current stream, see _streams.py); 0 on the CPU and for the legacy
    # default stream. Work on the array is enqueued on it.
    cdef intptr_t stream
    cdef int64_t strides[cnp.NPY_MAXDIMS]  # element strides of a NumPy array

    def __dealloc__(self):
        self.release()

    cdef void release(self) noexcept:
        cdef DLManagedTensorVersioned* versioned = self.managed_versioned
        cdef DLManagedTensor* legacy = self.managed
        self.managed_versioned = NULL
        self.managed = NULL
        if versioned != NULL and versioned.deleter != NULL:
            versioned.deleter(versioned)
        if legacy != NULL and legacy.deleter != NULL:
            legacy.deleter(legacy)


cdef int _set_numpy_dtype(DLTensor* dl, cnp.dtype descr, str role) except -1:
    cdef char kind = descr.kind
    cdef Py_ssize_t itemsize = descr.itemsize
    if kind == c'f':
        dl.dtype.code = kDLFloat
    elif kind == c'i':
        dl.dtype.code = kDLInt
    elif kind == c'u':
        dl.dtype.code = kDLUInt
    elif kind == c'b':
        dl.dtype.code = kDLBool
    elif kind == c'c':
        dl.dtype.code = kDLComplex
    elif descr.name == "bfloat16":  # ml_dtypes' NumPy bfloat16
        dl.dtype.code = kDLBfloat
    else:
        raise _invalid(f"{role} has dtype {descr}, which has no DLPack equivalent")
    if itemsize * 8 > 255:
        raise _invalid(f"{role} has dtype {descr}, which has no DLPack equivalent")
    if not cnp.PyDataType_ISNOTSWAPPED(descr):
        raise _invalid(f"{role} has non-native byte order ({descr}); convert it with astype()")
    dl.dtype.bits = <unsigned char>(itemsize * 8)
    dl.dtype.lanes = 1
    return 0


cdef int _fill_from_numpy(_Tensor t, cnp.ndarray array, str role) except -1:
    cdef cnp.dtype descr = array.descr
    cdef Py_ssize_t itemsize = descr.itemsize
    cdef int ndim = cnp.PyArray_NDIM(array)
    cdef cnp.npy_intp* byte_strides = cnp.PyArray_STRIDES(array)
    cdef int d
    _set_numpy_dtype(&t.dl, descr, role)
    for d in range(ndim):
        if byte_strides[d] % itemsize:
            raise _invalid(f"{role} has a stride of {byte_strides[d]} bytes, not a multiple "
                           f"of its {itemsize}-byte elements; pass a contiguous array")
        t.strides[d] = byte_strides[d] // itemsize
    t.array = array
    t.dl.data = cnp.PyArray_DATA(array)
    t.dl.device.device_type = kDLCPU
    t.dl.device.device_id = 0
    t.dl.ndim = ndim
    t.dl.shape = <int64_t*>cnp.PyArray_DIMS(array)
    t.dl.strides = t.strides
    t.dl.byte_offset = 0
    t.read_only = not cnp.PyArray_ISWRITEABLE(array)
    return 0


cdef object _export_dlpack(_Tensor t, object array, str role):
    if getattr(array, "__dlpack__", None) is None:
        raise _invalid(f"{role} is a {type(array).__module__}.{type(array).__qualname__}, "
                       "neither a NumPy array nor an object with __dlpack__")
    array, stream, handshake = prepare_export(array)
    exporter = array.__dlpack__
    # DLPack's stream handshake: a CUDA producer makes its data ready on the
    # stream we name; the work is then enqueued on that stream.
    kwargs = {}
    if stream is not None:
        t.stream = stream
        kwargs["stream"] = handshake
    try:
        try:
            return exporter(max_version=(DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION), **kwargs)
        except TypeError:  # a producer older than DLPack 1.0
            return exporter(**kwargs)
    except BufferError as error:
        raise _invalid(f"{role} cannot be exported through DLPack: {error}") from None


cdef int _fill_from_dlpack(_Tensor t, object array, str role) except -1:
    cdef object capsule = _export_dlpack(t, array, role)
    cdef DLManagedTensorVersioned* versioned
    cdef DLManagedTensor* legacy
    cdef unsigned int major
    t.array = array
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        versioned = <DLManagedTensorVersioned*>PyCapsule_GetPointer(
            capsule, b"dltensor_versioned")
        PyCapsule_SetName(capsule, b"used_dltensor_versioned")
        t.managed_versioned = versioned
        major = versioned.version.major
        if major != DLPACK_MAJOR_VERSION:
            # Only the deleter may be touched across major versions.
            t.release()
            raise _invalid(f"{role} was exported with DLPack {major}.x; "
                           f"concord reads DLPack {DLPACK_MAJOR_VERSION}.x")
        t.dl = versioned.dl_tensor
        t.read_only = (versioned.flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0
        t.copied = (versioned.flags & DLPACK_FLAG_BITMASK_IS_COPIED) != 0
    elif PyCapsule_IsValid(capsule, b"dltensor"):
        legacy = <DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
        PyCapsule_SetName(capsule, b"used_dltensor")
        t.managed = legacy
        t.dl = legacy.dl_tensor
    else:
        raise _invalid(f"{role}.__dlpack__() returned a {type(capsule).__name__}, "
                       "not an unused DLPack capsule")
    return 0


cdef _Tensor _import(object array, str role):
    cdef _Tensor t = _Tensor.__new__(_Tensor)
    if cnp.PyArray_CheckExact(array):
        _fill_from_numpy(t, <cnp.ndarray>array, role)
    else:
        _fill_from_dlpack(t, array, role)
    return t


cdef str _device_name(DLDevice device):
    if device.device_type == kDLCPU or device.device_type == kDLCUDAHost:
        return "cpu"
    if device.device_type == kDLCUDA or device.device_type == kDLCUDAManaged:
        return f"cuda:{device.device_id}"
    return f"DLPack device {<int>device.device_type}:{device.device_id}"


cdef _Tensor _import_out(object out, object x, _Tensor send):
    """The output tensor (the input itself when in place), checked to be
    writable in place and on the input's device."""
    cdef _Tensor recv = send if out is x else _import(out, "out")
    if recv.read_only:
        raise _invalid("out is read-only")
    if recv.copied:
        raise _invalid("out cannot be written in place: its __dlpack__ made a copy")
    if (recv.dl.device.device_type != send.dl.device.device_type
            or recv.dl.device.device_id != send.dl.device.device_id):
        x_device = _device_name(send.dl.device)
        out_device = _device_name(recv.dl.device)
        if x_device != out_device:
            raise _invalid(f"x is on {x_device} but out is on {out_device}; "
                           "both must be on the same device")
    return recv


@cython.final
cdef class _TensorList:
    """Several arrays seen as an array of DLTensor pointers, for the
    multi-tensor calls; keeps every _Tensor alive as long as itself."""
    cdef list tensors
    cdef DLTensor** ptrs
    cdef size_t count

    def __dealloc__(self):
        PyMem_Free(self.ptrs)


cdef int _check_in_place(_Tensor t, str role, str verb) except -1:
    """Raises unless `t` can be `verb` ("written", "updated") in place."""
    if t.read_only or t.copied:
        raise _invalid(f"{role} cannot be {verb} in place "
                       f"({'it is read-only' if t.read_only else 'its __dlpack__ made a copy'})")
    return 0


cdef _TensorList _import_list(object arrays, str role, bint writable):
    cdef _TensorList result = _TensorList.__new__(_TensorList)
    cdef _Tensor t
    cdef size_t i
    arrays = list(arrays)
    result.count = len(arrays)
    result.tensors = []
    result.ptrs = <DLTensor**>PyMem_Malloc(max(result.count, 1) * sizeof(DLTensor*))
    if result.ptrs == NULL:
        raise MemoryError()
    for i in range(result.count):
        t = _import(arrays[i], f"{role}[{i}]")
        if writable:
            _check_in_place(t, f"{role}[{i}]", "written")
        result.tensors.append(t)
        result.ptrs[i] = &t.dl
    return result


cdef inline void* _list_stream(_TensorList tensors):
    """The stream of a call's first tensor (they share a device): where the
    kernels of a call on CUDA tensors are enqueued."""
    cdef _Tensor first
    if tensors.count == 0:
        return NULL
    first = tensors.tensors[0]
    return <void*>first.stream


cdef _Tensor _import_state(object state, str role):
    """A state array updated in place."""
    cdef _Tensor t = _import(state, role)
    _check_in_place(t, role, "updated")
    return t


cdef int _same_length(object first, str first_role, object other, str other_role) except -1:
    if len(other) != len(first):
        raise _invalid(f"{first_role} has {len(first)} arrays but {other_role} has {len(other)}")
    return 0


def check_output(x, out):
    """Raises InvalidArgumentError unless `out` can be written in place on
    `x`'s device; for outputs filled after the collective, checked before it."""
    _import_out(out, x, _import(x, "x"))


def numpy_out_fits(out, x, Py_ssize_t out_rows=0, Py_ssize_t x_rows=0):
    """Whether `out` and `x` are NumPy arrays of one dtype and of one shape,
    or, given the rows, of shapes that differ only in their leading
    extents, which are in the ratio out_rows : x_rows (n : 1 gathered from
    n ranks, 1 : n scattered over n). The common case, tested in C so that
    it costs no Python calls; anything else goes through arrays.check_out,
    which says what is wrong."""
    if not (cnp.PyArray_CheckExact(out) and cnp.PyArray_CheckExact(x)):
        return False
    cdef cnp.ndarray o = <cnp.ndarray>out
    cdef cnp.ndarray a = <cnp.ndarray>x
    cdef int ndim = cnp.PyArray_NDIM(a)
    cdef cnp.npy_intp* out_dims = cnp.PyArray_DIMS(o)
    cdef cnp.npy_intp* x_dims = cnp.PyArray_DIMS(a)
    cdef int first = 0
    cdef int d
    if cnp.PyArray_NDIM(o) != ndim or not cnp.PyArray_EquivTypes(o.descr, a.descr):
        return False
    if out_rows != 0:
        if ndim == 0 or out_dims[0] * x_rows != x_dims[0] * out_rows:
            return False
        first = 1
    for d in range(first, ndim):
        if out_dims[d] != x_dims[d]:
            return False
    return True


cdef int _reduce_op(object op) except -1:
    code = _reduce_ops.get(op) if isinstance(op, str) else None
    if code is None:
        raise _invalid(f"unknown op {op!r}; valid ops: {', '.join(REDUCE_OPS)}")
    return code


cdef int _compression(object compress) except -1:
    code = _compressions.get(compress) if compress is None or isinstance(compress, str) else None
    if code is None:
        raise _invalid(f"compress must be one of {', '.join(map(repr, COMPRESSIONS))}, "
                       f"got {compress!r}")
    return code


# ---- store ---------------------------------------------------------------------

@cython.final
cdef class StoreServer:
    """A rendezvous store served on a background thread until closed."""
    cdef concord_store_server_t handle
    cdef readonly int port
    cdef int pid

    def __cinit__(self):
        self.handle = NULL
        self.pid = getpid()

    def __init__(self, host, int port, token):
        cdef bytes host_c = _c_string(host, "host")
        cdef bytes token_c = _c_string(token, "token")
        cdef const char* host_p = host_c
        cdef const char* token_p = token_c
        cdef concord_status status
        cdef int bound = 0
        with nogil:
            status = concord_store_server_create(host_p, port, token_p, &self.handle)
        check_status(status)
        check_status(concord_store_server_port(self.handle, &bound))
        self.port = bound

    def close(self):
        cdef concord_store_server_t handle = self.handle
        self.handle = NULL
        if handle != NULL and _owned_here(self.pid):
            with nogil:
                concord_store_server_destroy(handle)

    def __dealloc__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


@cython.final
cdef class Store:
    """A client of a rendezvous store. Values are bytes."""
    cdef concord_store_t handle
    cdef readonly double timeout
    cdef int pid

    def __cinit__(self):
        self.handle = NULL
        self.pid = getpid()

    def __init__(self, host, int port, token, double timeout):
        cdef bytes host_c = _c_string(host, "host")
        cdef bytes token_c = _c_string(token, "token")
        cdef const char* host_p = host_c
        cdef const char* token_p = token_c
        cdef concord_status status
        with nogil:
            status = concord_store_connect(host_p, port, token_p, timeout, &self.handle)
        check_status(status)
        self.timeout = timeout

    cdef concord_store_t _checked(self) except NULL:
        if self.handle == NULL:
            raise errors.ConcordError("the store client is closed")
        return self.handle

    cdef double _timeout(self, object timeout) except? -1:
        return self.timeout if timeout is None else timeout

    def set(self, key, const unsigned char[::1] value not None):
        cdef concord_store_t handle = self._checked()
        cdef bytes key_c = _c_string(key, "key")
        cdef const char* key_p = key_c
        cdef const void* data = &value[0] if value.shape[0] else NULL
        cdef size_t size = value.shape[0]
        cdef concord_status status
        with nogil:
            status = concord_store_set(handle, key_p, data, size)
        check_status(status)

    def get(self, key, timeout=None):
        """The value of `key`, waiting up to `timeout` seconds for it to appear."""
        cdef concord_store_t handle = self._checked()
        cdef bytes key_c = _c_string(key, "key")
        cdef const char* key_p = key_c
        cdef double wait_s = self._timeout(timeout)
        cdef char small[1024]
        cdef size_t size = 0
        cdef size_t capacity
        cdef char* buffer
        cdef concord_status status
        cdef bytes value
        with nogil:
            status = concord_store_get(handle, key_p, wait_s, small, sizeof(small), &size)
        check_status(status)
        if size <= sizeof(small):
            return small[:size]
        # The value is larger than the first buffer: fetch it again in full
        # (repeat if it grew in between).
        while True:
            value = PyBytes_FromStringAndSize(NULL, size)
            buffer = PyBytes_AS_STRING(value)
            capacity = size
            with nogil:
                status = concord_store_get(handle, key_p, wait_s, buffer, capacity, &size)
            check_status(status)
            if size <= capacity:
                return value[:size] if size < capacity else value

    def wait(self, keys, timeout=None):
        """Waits until every key in `keys` exists."""
        cdef concord_store_t handle = self._checked()
        cdef list encoded = [_c_string(key, "key") for key in keys]
        cdef size_t n = len(encoded)
        cdef double wait_s = self._timeout(timeout)
        cdef const char** pointers = <const char**>PyMem_Malloc((n if n else 1) * sizeof(char*))
        cdef concord_status status
        cdef size_t i
        if pointers == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                pointers[i] = PyBytes_AS_STRING(encoded[i])
            with nogil:
                status = concord_store_wait(handle, pointers, n, wait_s)
            check_status(status)
        finally:
            PyMem_Free(pointers)

    def add(self, key, int64_t delta):
        """Atomically adds `delta` to the integer at `key` (missing: 0); returns the sum."""
        cdef concord_store_t handle = self._checked()
        cdef bytes key_c = _c_string(key, "key")
        cdef const char* key_p = key_c
        cdef int64_t result = 0
        cdef concord_status status
        with nogil:
            status = concord_store_add(handle, key_p, delta, &result)
        check_status(status)
        return result

    def delete(self, key):
        """Removes `key`; returns whether it existed."""
        cdef concord_store_t handle = self._checked()
        cdef bytes key_c = _c_string(key, "key")
        cdef const char* key_p = key_c
        cdef int existed = 0
        cdef concord_status status
        with nogil:
            status = concord_store_delete(handle, key_p, &existed)
        check_status(status)
        return bool(existed)

    def close(self):
        cdef concord_store_t handle = self.handle
        self.handle = NULL
        if handle != NULL and _owned_here(self.pid):
            with nogil:
                concord_store_destroy(handle)

    def __dealloc__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


# ---- communicators -------------------------------------------------------------

# C code that calls the C ABI on a communicator this module owns (concord.jax's
# XLA handlers) borrows its handle (Comm.address) and must let go before the
# handle is destroyed: each listener is called with the handle's address
# right before that, from close() or garbage collection.
cdef list _close_listeners = []


def add_close_listener(listener):
    """Calls listener(address) before any communicator handle is destroyed."""
    _close_listeners.append(listener)


@cython.final
cdef class Comm:
    """A communicator handle. rank, size and local_rank never change."""
    cdef concord_comm_t handle
    cdef readonly int rank
    cdef readonly int size
    cdef readonly int local_rank
    cdef object keepalive  # the store, parent or store server it relies on
    cdef int pid

    def __cinit__(self):
        self.handle = NULL
        self.pid = getpid()

    def __init__(self):
        raise TypeError("use Comm.init(), Comm.from_store() or Comm.split()")

    @staticmethod
    cdef Comm _wrap(concord_comm_t handle, object keepalive):
        cdef Comm comm = Comm.__new__(Comm)
        comm.handle = handle
        comm.keepalive = keepalive
        check_status(concord_comm_rank(handle, &comm.rank))
        check_status(concord_comm_size(handle, &comm.size))
        check_status(concord_comm_local_rank(handle, &comm.local_rank))
        return comm

    @staticmethod
    def init(int rank, int world_size, master_addr, int master_port, token, double timeout,
             backend, StoreServer store_server=None):
        """The world communicator; unset arguments (-1, None, 0) come from
        the environment. `store_server`: the store this process serves for
        the job (then not served by the C library), kept alive with the
        communicator."""
        cdef bytes addr_c = None if master_addr is None else _c_string(master_addr, "master_addr")
        cdef bytes token_c = None if token is None else _c_string(token, "token")
        cdef bytes backend_c = None if backend is None else _c_string(backend, "backend")
        cdef concord_comm_options options
        cdef concord_comm_t handle = NULL
        cdef concord_status status
        options.struct_size = sizeof(concord_comm_options)
        options.rank = rank
        options.world_size = world_size
        options.master_addr = _c_string_or_null(addr_c)
        options.master_port = master_port
        options.token = _c_string_or_null(token_c)
        options.timeout_s = timeout
        options.backend = _c_string_or_null(backend_c)
        options.store_served_elsewhere = store_server is not None
        with nogil:
            status = concord_comm_init(&options, &handle)
        check_status(status)
        return Comm._wrap(handle, store_server)

    @staticmethod
    def from_store(Store store not None, name, int rank, int size, double timeout):
        """A communicator of `size` ranks meeting through `store` under the
        key prefix `name`; ranks may be threads of one process."""
        cdef concord_store_t store_handle = store._checked()
        cdef bytes name_c = _c_string(name, "name")
        cdef const char* name_p = name_c
        cdef concord_comm_t handle = NULL
        cdef concord_status status
        with nogil:
            status = concord_comm_init_with_store(store_handle, name_p, rank, size, timeout,
                                                  &handle)
        check_status(status)
        return Comm._wrap(handle, store)

    cdef concord_comm_t _checked(self) except NULL:
        if self.handle == NULL:
            raise errors.ConcordError("the communicator is closed")
        return self.handle

    @property
    def closed(self):
        return self.handle == NULL

    @property
    def address(self):
        """The C handle (a concord_comm_t) as an integer, for C code that
        calls the C ABI on it; valid until the close listeners are told."""
        return <intptr_t>self._checked()

    @property
    def backend(self):
        cdef const char* name = NULL
        check_status(concord_comm_backend(self._checked(), &name))
        return name.decode()

    @property
    def timeout(self):
        cdef double seconds = 0.0
        check_status(concord_comm_timeout(self._checked(), &seconds))
        return seconds

    def split(self, int color, int key):
        """Collective: ranks passing the same color form a communicator,
        ordered by (key, rank); a negative color gives None."""
        cdef concord_comm_t handle = self._checked()
        cdef concord_comm_t child = NULL
        cdef concord_status status
        with nogil:
            status = concord_comm_split(handle, color, key, &child)
        check_status(status)
        return None if child == NULL else Comm._wrap(child, self)

    def abort(self):
        """Fails pending and future collectives here and on the peers."""
        cdef concord_comm_t handle = self._checked()
        cdef concord_status status
        with nogil:
            status = concord_comm_abort(handle)
        check_status(status)

    def close(self):
        cdef concord_comm_t handle = self.handle
        self.handle = NULL
        if handle != NULL and _owned_here(self.pid):
            for listener in _close_listeners:
                listener(<intptr_t>handle)
            with nogil:
                concord_comm_destroy(handle)

    def __dealloc__(self):
        self.close()

    # Collectives: `out` is the result buffer, allocated by the caller (the
    # input itself for in place). They return `out`, or a Work when async_op.
    # On CUDA they are enqueued on the input's stream (_Tensor.stream), which
    # waits for the result: the call returns without waiting on the device.

    def all_reduce(self, x, out, op, bint async_op):
        cdef concord_reduce_op code = <concord_reduce_op>_reduce_op(op)
        cdef concord_comm_t handle = self._checked()
        cdef _Tensor send = _import(x, "x")
        cdef _Tensor recv = _import_out(out, x, send)
        cdef concord_work_t work = NULL
        cdef concord_work_t* work_p = &work if async_op else NULL
        cdef concord_status status
        with nogil:
            status = concord_comm_all_reduce(handle, &send.dl, &recv.dl, code, <void*>send.stream, work_p)
        check_status(status)
        return Work._wrap(work, self, (send, recv), out, None) if async_op else out

    def all_gather(self, x, out, bint async_op, finish):
        """`finish(out)`, unless None, makes the result once the data arrived."""
        cdef concord_comm_t handle = self._checked()
        cdef _Tensor send = _import(x, "x")
        cdef _Tensor recv = _import_out(out, x, send)
        cdef concord_work_t work = NULL
        cdef concord_work_t* work_p = &work if async_op else NULL
        cdef concord_status status
        with nogil:
            status = concord_comm_all_gather(handle, &send.dl, &recv.dl, <void*>send.stream, work_p)
        check_status(status)
        if async_op:
            return Work._wrap(work, self, (send, recv), out, finish)
        return out if finish is None else finish(out)

    def reduce_scatter(self, x, out, op, bint async_op):
        cdef concord_reduce_op code = <concord_reduce_op>_reduce_op(op)
        cdef concord_comm_t handle = self._checked()
        cdef _Tensor send = _import(x, "x")
        cdef _Tensor recv = _import_out(out, x, send)
        cdef concord_work_t work = NULL
        cdef concord_work_t* work_p = &work if async_op else NULL
        cdef concord_status status
        with nogil:
            status = concord_comm_reduce_scatter(handle, &send.dl, &recv.dl, code, <void*>send.stream, work_p)
        check_status(status)
        return Work._wrap(work, self, (send, recv), out, None) if async_op else out

    def broadcast(self, x, out, root, bint async_op):
        cdef int c_root = _c_int(root, "broadcast: root")
        cdef concord_comm_t handle = self._checked()
        cdef _Tensor send = _import(x, "x")
        cdef _Tensor recv = _import_out(out, x, send)
        cdef concord_work_t work = NULL
        cdef concord_work_t* work_p = &work if async_op else NULL
        cdef concord_status status
        with nogil:
            status = concord_comm_broadcast(handle, &send.dl, &recv.dl, c_root, <void*>send.stream,
                                       work_p)
        check_status(status)
        return Work._wrap(work, self, (send, recv), out, None) if async_op else out

    def all_reduce_multi(self, arrays, op, bint async_op):
        """All-reduces every array in place as one collective per dtype;
        returns the list (or a Work giving it)."""
        cdef concord_reduce_op code = <concord_reduce_op>_reduce_op(op)
        cdef concord_comm_t handle = self._checked()
        arrays = list(arrays)
        cdef _TensorList tensors = _import_list(arrays, "arrays", True)
        cdef concord_work_t work = NULL
        cdef concord_work_t* work_p = &work if async_op else NULL
        cdef concord_status status
        cdef void* stream = _list_stream(tensors)
        with nogil:
            status = concord_comm_all_reduce_multi(handle, tensors.ptrs, tensors.count, code, stream,
                                              work_p)
        check_status(status)
        return Work._wrap(work, self, (tensors,), arrays, None) if async_op else arrays

    def barrier(self, bint async_op=False):
        """Returns once every rank reached it; a Work (giving None) when async_op."""
        cdef concord_comm_t handle = self._checked()
        cdef concord_work_t work = NULL
        cdef concord_work_t* work_p = &work if async_op else NULL
        cdef concord_status status
        with nogil:
            status = concord_comm_barrier(handle, work_p)
        check_status(status)
        return Work._wrap(work, self, (), None, None) if async_op else None


@cython.final
cdef class Work:
    """An asynchronous collective. wait() returns its result; the arrays it
    reads and writes stay alive until it finished."""
    cdef concord_work_t handle
    cdef Comm comm
    cdef object operands
    cdef object result
    cdef object finish
    cdef object error
    cdef bint finished
    cdef int pid

    def __cinit__(self):
        self.handle = NULL
        self.pid = getpid()

    def __init__(self):
        raise TypeError("Work objects come from collectives called with async_op=True")

    @staticmethod
    cdef Work _wrap(concord_work_t handle, Comm comm, tuple operands, object result,
                    object finish):
        cdef Work work = Work.__new__(Work)
        work.handle = handle
        work.comm = comm
        work.operands = operands
        work.result = result
        work.finish = finish
        return work

    cdef int _complete(self, object error) except -1:
        """Records the outcome and lets go of the handle and the arrays."""
        cdef concord_work_t handle = self.handle
        self.handle = NULL
        self.finished = True
        self.operands = None
        self.comm = None
        concord_work_destroy(handle)
        finish, self.finish = self.finish, None
        if error is None and finish is not None:
            try:
                self.result = finish(self.result)
            except BaseException as exc:
                error = exc
        self.error = error
        return 0

    def wait(self, timeout=None):
        """Waits until done and returns the result, or raises the
        collective's error. timeout None: as long as the collective itself
        may take (it ends within its communicator's timeout); otherwise at
        most `timeout` seconds (inf: no limit), after which
        CollectiveTimeoutError is raised while the collective goes on."""
        cdef double wait_s = -1.0
        cdef concord_status status
        cdef int done = 0
        if timeout is not None:
            wait_s = timeout
            # C takes a negative timeout for "no limit of its own", which a
            # caller's negative number does not mean.
            if not wait_s >= 0:
                raise _invalid(f"Work.wait: timeout must be None or a number of seconds >= 0, "
                               f"got {timeout!r}")
        if not self.finished:
            with nogil:
                status = concord_work_wait(self.handle, wait_s)
            if status == CONCORD_OK:
                self._complete(None)
            else:
                error = _error_for(status)
                with nogil:
                    concord_work_test(self.handle, &done)
                if not done:  # this wait timed out; the collective goes on
                    raise error
                self._complete(error)
        if self.error is not None:
            raise self.error
        return self.result

    def test(self):
        """Whether the collective finished (successfully or not); never blocks."""
        cdef concord_status status
        cdef int done = 0
        if self.finished:
            return True
        status = concord_work_test(self.handle, &done)
        if not done:
            check_status(status)
            return False
        self._complete(None if status == CONCORD_OK else _error_for(status))
        return True

    def done(self):
        """Same as test()."""
        return self.test()

    def __dealloc__(self):
        if self.handle == NULL or not _owned_here(self.pid):
            return
        cdef concord_status status
        # The collective may still write into the arrays released next.
        with nogil:
            status = concord_work_wait(self.handle, -1.0)
            concord_work_destroy(self.handle)
        self.handle = NULL
        _raise_interruption_later(status)


# ---- data parallel ---------------------------------------------------------------

@cython.final
cdef class GradSync:
    """Gradient buckets over a communicator: mark_ready(i, grad) packs a
    gradient and starts its bucket's all-reduce once the bucket is full;
    wait() unpacks every result into the gradients."""
    cdef concord_grad_sync_t handle
    cdef Comm comm
    cdef dict marked  # index -> _Tensor, alive until wait() unpacked into it
    cdef int pid

    def __cinit__(self):
        self.handle = NULL
        self.pid = getpid()

    def __init__(self, Comm comm not None, templates, ready_order, double bucket_cap_mb,
                 double first_bucket_mb, op, compress):
        cdef _TensorList grads = _import_list(templates, "templates", False)
        cdef concord_grad_sync_options options
        cdef cnp.ndarray order
        cdef const int64_t* order_p = NULL
        cdef concord_comm_t comm_handle = comm._checked()
        cdef concord_status status
        if ready_order is not None:
            order = np.ascontiguousarray(ready_order, dtype=np.int64)
            if order.ndim != 1 or <size_t>order.shape[0] != grads.count:
                raise _invalid(f"ready_order must list {grads.count} indices, "
                               f"got shape {np.shape(ready_order)}")
            order_p = <const int64_t*>cnp.PyArray_DATA(order)
        options.struct_size = sizeof(concord_grad_sync_options)
        options.bucket_cap_mb = bucket_cap_mb
        options.first_bucket_mb = first_bucket_mb
        options.op = <concord_reduce_op>_reduce_op(op)
        options.compress = <concord_compress>_compression(compress)
        with nogil:
            status = concord_grad_sync_create(comm_handle, <const DLTensor**>grads.ptrs,
                                              grads.count, order_p, &options, &self.handle)
        check_status(status)
        self.comm = comm
        self.marked = {}

    cdef concord_grad_sync_t _checked(self) except NULL:
        if self.handle == NULL:
            raise errors.ConcordError("the gradient synchronizer is closed")
        return self.handle

    @property
    def num_buckets(self):
        cdef size_t n = 0
        check_status(concord_grad_sync_num_buckets(self._checked(), &n))
        return n

    def bucket_of(self, size_t index):
        cdef size_t bucket = 0
        check_status(concord_grad_sync_bucket_of(self._checked(), index, &bucket))
        return bucket

    def mark_ready(self, size_t index, grad):
        cdef concord_grad_sync_t handle = self._checked()
        cdef _Tensor t = _import_state(grad, "grad")
        cdef concord_status status
        with nogil:
            status = concord_grad_sync_mark_ready(handle, index, &t.dl, <void*>t.stream)
        check_status(status)
        self.marked[index] = t

    def wait(self):
        cdef concord_grad_sync_t handle = self._checked()
        cdef concord_status status
        cdef void* stream = NULL
        cdef _Tensor first
        if self.marked:
            first = next(iter(self.marked.values()))
            stream = <void*>first.stream
        with nogil:
            status = concord_grad_sync_wait(handle, stream)
        self.marked = {}
        check_status(status)

    def close(self):
        cdef concord_grad_sync_t handle = self.handle
        self.handle = NULL
        if handle != NULL and _owned_here(self.pid):
            with nogil:
                concord_grad_sync_destroy(handle)  # waits for buckets in flight
        self.marked = None
        self.comm = None

    def __dealloc__(self):
        self.close()


def sgd_step(params, grads, momentum_buffers, double lr, double momentum, double weight_decay,
             bint nesterov, int64_t step):
    """One fused SGD step over every array, in place."""
    params, grads = list(params), list(grads)
    _same_length(params, "params", grads, "grads")
    cdef _TensorList p = _import_list(params, "params", True)
    cdef _TensorList g = _import_list(grads, "grads", False)
    cdef _TensorList b = None
    cdef DLTensor** b_ptrs = NULL
    if momentum_buffers is not None:
        momentum_buffers = list(momentum_buffers)
        _same_length(params, "params", momentum_buffers, "momentum_buffers")
        b = _import_list(momentum_buffers, "momentum_buffers", True)
        b_ptrs = b.ptrs
    cdef concord_sgd_options options
    cdef concord_status status
    options.struct_size = sizeof(concord_sgd_options)
    options.lr = lr
    options.momentum = momentum
    options.weight_decay = weight_decay
    options.nesterov = nesterov
    options.step = step
    cdef void* stream = _list_stream(p)
    with nogil:
        status = concord_optim_sgd_step(&options, p.count, p.ptrs, <const DLTensor**>g.ptrs, b_ptrs,
                                        stream)
    check_status(status)


def adamw_step(params, grads, exp_avg, exp_avg_sq, double lr, double beta1, double beta2,
               double eps, double weight_decay, int64_t step):
    """One fused AdamW step over every array, in place."""
    params, grads, exp_avg, exp_avg_sq = list(params), list(grads), list(exp_avg), list(exp_avg_sq)
    _same_length(params, "params", grads, "grads")
    _same_length(params, "params", exp_avg, "exp_avg")
    _same_length(params, "params", exp_avg_sq, "exp_avg_sq")
    cdef _TensorList p = _import_list(params, "params", True)
    cdef _TensorList g = _import_list(grads, "grads", False)
    cdef _TensorList m = _import_list(exp_avg, "exp_avg", True)
    cdef _TensorList v = _import_list(exp_avg_sq, "exp_avg_sq", True)
    cdef concord_adamw_options options
    cdef concord_status status
    options.struct_size = sizeof(concord_adamw_options)
    options.lr = lr
    options.beta1 = beta1
    options.beta2 = beta2
    options.eps = eps
    options.weight_decay = weight_decay
    options.step = step
    cdef void* stream = _list_stream(p)
    with nogil:
        status = concord_optim_adamw_step(&options, p.count, p.ptrs, <const DLTensor**>g.ptrs,
                                    m.ptrs, v.ptrs, stream)
    check_status(status)


def sum_of_squares(arrays):
    """Sum of the squares of every element of every array (float64)."""
    cdef _TensorList t = _import_list(arrays, "arrays", False)
    cdef double result = 0.0
    cdef concord_status status
    cdef void* stream = _list_stream(t)
    with nogil:
        status = concord_tensors_sum_of_squares(t.count, <const DLTensor**>t.ptrs, &result, stream)
    check_status(status)
    return result


def sum_of_squares_into(arrays, result):
    """Writes the sum of squares of every element of every array into
    `result` (float64, one element, on the arrays' device); on CUDA with no
    host synchronisation."""
    cdef _TensorList t = _import_list(arrays, "arrays", False)
    cdef _Tensor r = _import_state(result, "result")
    cdef concord_status status
    with nogil:
        status = concord_tensors_sum_of_squares_into(t.count, <const DLTensor**>t.ptrs, &r.dl,
                                                     <void*>r.stream)
    check_status(status)


def clip_by_sum_of_squares(arrays, sum_of_squares, double max_norm):
    """Multiplies every array in place by min(1, max_norm / (sqrt(s) + 1e-6)),
    s read where it lives (on the device for CUDA arrays)."""
    cdef _TensorList t = _import_list(arrays, "arrays", True)
    cdef _Tensor s = _import(sum_of_squares, "sum_of_squares")
    cdef concord_status status
    with nogil:
        status = concord_tensors_clip_by_sum_of_squares(t.count, t.ptrs, &s.dl, max_norm,
                                                        <void*>s.stream)
    check_status(status)


def scale(arrays, double factor):
    """Multiplies every array by factor, in place."""
    cdef _TensorList t = _import_list(arrays, "arrays", True)
    cdef concord_status status
    cdef void* stream = _list_stream(t)
    with nogil:
        status = concord_tensors_scale(t.count, t.ptrs, factor, stream)
    check_status(status)


# ---- metric updates --------------------------------------------------------------

def metric_update(kernel, state, inputs, double threshold, int64_t k):
    """Runs the C update kernel named `kernel` ("confusion_matrix", ...) on
    a caller-owned state array, in place, with `inputs` (None entries are
    optional inputs left out); no communication. On CUDA arrays it is
    enqueued on the state's stream."""
    cdef bytes kernel_c = _c_string(kernel, "kernel")
    cdef const char* kernel_p = kernel_c
    cdef _Tensor s = _import_state(state, "state")
    cdef list imported = [None if x is None else _import(x, f"{kernel} input {i}")
                          for i, x in enumerate(inputs)]
    cdef const DLTensor* ptrs[4]
    cdef size_t n = len(imported)
    cdef size_t i
    cdef _Tensor t
    cdef concord_metric_options options
    cdef concord_status status
    if n > 4:
        raise _invalid(f"{kernel}: {n} inputs given, at most 4 are passed")
    for i in range(n):
        t = imported[i]
        ptrs[i] = NULL if t is None else &t.dl
    options.struct_size = sizeof(concord_metric_options)
    options.threshold = threshold
    options.k = k
    with nogil:
        status = concord_metric_update(kernel_p, &s.dl, ptrs, n, &options, <void*>s.stream)
    check_status(status)
