"""The Metric lifecycle: local updates, asynchronous fused sync, compute.

Every state is linearly additive under its reduce op (sums and counts, maxima,
minima, concatenations; never ratios), and is kept as two parts:

- ``synced``: the data of every rank up to the last completed sync, the same
  on every rank;
- ``window``: what this rank added since then.

``trigger_sync()`` starts the collectives over copies of the window's arrays
(nothing may update the metric until ``wait_sync()``); ``wait_sync()`` adds
the reduced windows of all ranks to ``synced`` and empties the window, or,
when the sync failed, leaves the window exactly as it was. Each datum is
thus sent exactly once: the synced part is never sent again, and the window
restarts empty, so ``update()`` after a sync builds a new local window on
top of the synced totals without double counting. ``compute()`` reads
``synced`` combined with the current window (on a rank that updated since
the last sync, that includes its own unsynced data). Metrics never sync on
their own: call ``sync()`` (or ``trigger_sync()`` / ``wait_sync()``) before
``compute()`` for global values.

States live where the inputs live (the metric's "home"): in the array
library and on the device of the first update's inputs. NumPy arrays,
Python values and host DLPack arrays that are not of an array-API library
(and JAX arrays on the host: JAX arrays cannot be updated in place) give
NumPy states on the host, as before; torch or CuPy arrays give states of
that library on that array's device (torch CPU tensors: torch CPU states;
torch CUDA tensors: torch CUDA states on that GPU). The C update kernels
read the inputs and write the states through DLPack without copies; on a
GPU they run asynchronously on the library's current stream, so update()
never waits for the device: it reads shapes, dtypes and devices, never
data. Checks of the data (labels in range, probabilities in [0, 1]) run on
host homes only; on a GPU the kernels skip such samples instead.

A fresh metric has no home: it holds NumPy identity states until its
first update, which fixes the home. States that still hold no data are
then allocated anew in the home (no host-to-device copy); states that do
(loaded by load_state_dict(), or synced, before any update) are copied
there, so nothing is lost. Later updates whose arrays are of another
library or device raise ValueError naming both, before anything is
written. Within one update, NumPy arrays beside host arrays of another
library (torch CPU scores with NumPy labels, say) are host data that joins
that library's home, as the kernels read both where they are; beside
device arrays they are refused. Plain Python values (scalars, lists) carry
no home and are converted into the metric's (copied to the device for a
GPU home). reset() keeps the home; to(device) moves the states into the
home on that device (torchmetrics' Metric.to).

compute() returns array results (ConfusionMatrix, Cat, per-class scores)
as arrays of the home and scalar results as Python floats; it may wait for
the device. state_dict() always returns host NumPy copies
(np.savez-able); load_state_dict() checks the values as NumPy arrays and
places them in the metric's home.

A sync needs every rank to hold each state in the same kind of place (the
host, or a GPU): a rank whose metric never saw an update holds host states,
so a rank without data should still update with empty arrays of its
device, or a sync with GPU peers raises MismatchError.
"""

from __future__ import annotations

import importlib
import re
import warnings

import numpy as np
from array_api_compat import device as array_device
from array_api_compat import is_jax_array, is_torch_array

from .. import _capi
from .._host import device_key, is_host, to_host
from ..arrays import namespace
from ..errors import UnavailableError
from .sync import Entry, StateSpec, start_sync

__all__ = ["Metric", "run_kernel", "to_numpy"]


def run_kernel(kernel, state, *inputs, threshold=0.0, k=0):
    """Adds `inputs` into `state` with the C update kernel named `kernel`
    ("confusion_matrix", ...; concord.h lists them), where the state lives.
    `threshold` and `k` are read only by the kernels that take them
    (binary_confusion and multilabel_counts; topk_correct)."""
    _capi.metric_update(kernel, state, inputs, threshold, k)


def to_numpy(x):
    """`x` as a NumPy array, sharing memory with CPU DLPack arrays."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    return np.asarray(x)


class _Home:
    """Where a metric's states live: an array namespace (of `library`) and a device."""

    __slots__ = ("xp", "library", "device", "name", "on_host")

    def __init__(self, xp, library, device, on_host, name=None):
        self.xp = xp
        self.library = library
        self.device = device
        self.name = name or f"{library} arrays on {device}"
        self.on_host = on_host

    def same(self, other):
        return self.xp is other.xp and str(self.device) == str(other.device)

    def put(self, array):
        """A copy of a host NumPy array in this home (the array itself for NumPy)."""
        if self.xp is np:
            return array
        return self.xp.asarray(array, device=self.device, copy=True)

    def move(self, array):
        """A copy of a state of any home in this one."""
        return self.put(array if isinstance(array, np.ndarray) else to_host(array))

    def take(self, array):
        """Host input data (a NumPy array) as an array of this home: shared,
        not copied, where the home is on the host."""
        if self.xp is np:
            return array
        if not self.on_host:
            return self.put(array)
        if not array.flags.writeable:  # libraries warn on sharing read-only memory
            array = array.copy()
        return self.xp.asarray(array)


NUMPY_HOME = _Home(np, "numpy", "cpu", True, "NumPy arrays (host)")


# Homes by (array type, device): where an array lives is then read once per
# kind of input, not on every update (DLPack's device query is slow in torch).
_homes = {}


def _home_of(x):
    """The home of an update input: None for plain Python values, which
    carry none; raises ValueError for arrays no metric state can live with."""
    if isinstance(x, (np.ndarray, np.generic)):
        return NUMPY_HOME
    if not hasattr(x, "__dlpack__"):
        return None
    key = home = None
    device = getattr(x, "device", None)
    if device is not None and not callable(device):  # older JAX: a method
        try:
            key = (type(x), device)
            home = _homes.get(key)
        except TypeError:  # not hashable
            key = None
    if home is None:
        home = _find_home(x)
        if key is not None:
            _homes[key] = home
    return home


def _find_home(x):
    library = type(x).__module__.split(".")[0]
    if is_jax_array(x):
        if is_host(x):
            return NUMPY_HOME  # immutable: read by the kernels, states kept in NumPy
        raise ValueError(f"metrics: JAX arrays on {device_key(x)[0]} cannot hold metric states "
                         "(they are immutable); pass torch or CuPy arrays, or host arrays")
    try:
        xp = namespace(x)
    except TypeError:  # not an array-API library: read through DLPack, as before
        if is_host(x):
            return NUMPY_HOME
        raise ValueError(f"metrics: {library} arrays on {device_key(x)[0]} are not of an "
                         "array-API library (array-api-compat); metric states cannot live "
                         "with them") from None
    return _Home(xp, library, array_device(x), is_host(x))


_DEVICE_FORMS = ("'cpu', 'cuda', 'cuda:N', an int N (CUDA device N), a torch.device or a "
                 "cupy.cuda.Device")


def _parsed_device(device):
    """(library or None, "cpu" or "cuda", index or None) of a Metric.to()
    argument: device objects name their library, strings and ints none."""
    kind = type(device)
    library = kind.__module__.split(".")[0]
    if library == "torch" and kind.__name__ == "device":
        parsed = ("torch", device.type, device.index)
    elif library == "cupy" and kind.__name__ == "Device":
        parsed = ("cupy", "cuda", device.id)
    elif isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        parsed = (None, "cuda", device)
    elif isinstance(device, str) and (match := re.fullmatch(r"(cpu|cuda)(?::(\d+))?", device)):
        index = match.group(2)
        parsed = (None, match.group(1), None if index is None else int(index))
    else:
        parsed = (None, None, None)
    if parsed[1] not in ("cpu", "cuda"):
        raise ValueError(f"Metric.to: unknown device {device!r}; expected {_DEVICE_FORMS}")
    return parsed


def _cuda_probe(library, index):
    """An empty array of `library` ("torch" or "cupy") on CUDA device
    `index` (None: the library's current one); UnavailableError when that
    device is not there."""
    try:
        module = importlib.import_module(library)
    except ImportError:
        raise UnavailableError(f"Metric.to: CUDA states need {library}, which is not "
                               "installed") from None
    if library == "torch":
        count = module.cuda.device_count() if module.cuda.is_available() else 0
    else:
        try:
            count = module.cuda.runtime.getDeviceCount()
        except module.cuda.runtime.CUDARuntimeError:
            count = 0
    if count == 0 or (index is not None and index >= count):
        wanted = "a CUDA device" if index is None else f"CUDA device {index}"
        raise UnavailableError(f"Metric.to: {wanted} is not there: {library} sees {count}")
    if library == "torch":
        return module.empty(0, device="cuda" if index is None else f"cuda:{index}")
    with module.cuda.Device(module.cuda.Device().id if index is None else index):
        return module.empty(0)


def _home_on(device, current):
    """The home Metric.to(device) moves states into from `current` (see to())."""
    library, kind, index = _parsed_device(device)
    if kind == "cpu":
        if current.on_host:
            return current
        if "torch" in (library, current.library):
            return _find_home(importlib.import_module("torch").empty(0))
        return NUMPY_HOME
    if library is None:
        library = current.library if current.library in ("torch", "cupy") else "torch"
    return _find_home(_cuda_probe(library, index))


def _fresh_window(spec, home):
    # A cat window collects the rows of each update; they are joined once,
    # when the window is read or sent.
    return [] if spec.op == "cat" else spec.identity(home.xp, home.device)


class Metric:
    """Base class of the metrics: named states, each with a reduce op.

    Subclasses declare states with ``_add_state`` in ``__init__``, start
    ``update`` with ``inputs = self._begin_update(*inputs)`` and add into
    ``self._window[name]`` (with the C kernels, or the home's array-API
    namespace ``self._where.xp``, never reading device data), and implement
    ``_compute`` from ``self._value(name)`` (in the home) or
    ``self._host(name)`` (a host NumPy copy, for scalar results).
    """

    def __init__(self):
        self._specs = {}
        self._synced = {}
        self._window = {}
        self._home = None  # fixed by the first update; NumPy states until then
        # Whether the states hold only their identities, never data (the
        # home is then taken by allocating them anew, not by copying).
        self._pristine = True
        self._pending = None  # (PendingSync, entries) between trigger and wait
        # The copies a finished sync reduced, reused by the next one: large
        # states (a 1000-class confusion matrix) are not reallocated, and
        # their pages not faulted in again, on every sync.
        self._spare = {}

    # ---- for subclasses

    def _add_state(self, name, op, shape=(), dtype=np.float64):
        spec = StateSpec(op, tuple(shape), np.dtype(dtype))
        self._specs[name] = spec
        self._synced[name] = spec.identity()
        self._window[name] = _fresh_window(spec, NUMPY_HOME)

    @property
    def _where(self):
        """The home, or NumPy while there is none."""
        return self._home or NUMPY_HOME

    def _input_home(self, inputs):
        """The home of an update's inputs (None entries skipped), or None
        when all are plain Python values.

        It is the home of the arrays of libraries other than NumPy, which
        must share it. NumPy arrays (and other host data that gives NumPy
        homes) beside them are host data the kernels read as they are: they
        join a host home, and are refused beside device arrays. Arrays of
        NumPy only give the NumPy home."""
        found = None
        host_data = None
        for x in inputs:
            home = None if x is None else (NUMPY_HOME if type(x) is np.ndarray else _home_of(x))
            if home is None:
                continue
            if home is NUMPY_HOME:
                host_data = home
            elif found is None:
                found = home
            elif not home.same(found):
                raise ValueError(f"{type(self).__name__}.update: the inputs mix {found.name} and "
                                 f"{home.name}; pass arrays of one library on one device")
        if found is None:
            return host_data
        if host_data is not None and not found.on_host:
            raise ValueError(f"{type(self).__name__}.update: the inputs mix {found.name} and "
                             f"{host_data.name}; pass arrays of one library on one device")
        return found

    def _check_home(self, inputs):
        """Raises ValueError unless the inputs can update this metric; returns
        their home (the metric's own, or the one they would give it)."""
        return self._check_input_home(self._input_home(inputs))

    def _check_input_home(self, home):
        """_check_home for inputs whose home (or None) is already known."""
        if home is None:
            return self._where
        if self._home is not None and not home.same(self._home):
            raise ValueError(f"{type(self).__name__}.update: the inputs are {home.name} but the "
                             f"states are {self._home.name} (the home fixed by the first update; "
                             "reset() keeps it); pass arrays of that library on that device")
        return home

    def _begin_update(self, *inputs):
        """Checks that the metric can take an update and that the inputs
        share its home (fixing it at the first update); returns the inputs
        as arrays the kernels and the home's namespace take: host data and
        plain Python values in a home of another library converted (without
        a copy where possible), None kept."""
        self._check_idle("update")
        home = self._check_home(inputs)
        if self._home is None:
            self._adopt(home)
        converted = []
        for x in inputs:
            if x is None or (type(x) is np.ndarray and home.xp is np):
                pass
            elif home.xp is np:
                if not hasattr(x, "__dlpack__"):
                    x = np.asarray(x)
            elif is_torch_array(x) and home.xp is namespace(x):
                if x.requires_grad:  # metrics take no gradients; DLPack refuses such tensors
                    x = x.detach()
            elif not (hasattr(x, "__dlpack__") and _home_of(x) is not NUMPY_HOME):
                x = home.take(to_numpy(x))
            converted.append(x)
        return converted

    def _adopt(self, home):
        """Moves the states into `home` (the first update's, or to()'s)."""
        if not home.same(self._where):
            for name, spec in self._specs.items():
                if self._pristine:
                    self._synced[name] = spec.identity(home.xp, home.device)
                    self._window[name] = _fresh_window(spec, home)
                    continue
                self._synced[name] = home.move(self._synced[name])
                window = self._window[name]
                self._window[name] = ([home.move(part) for part in window] if spec.op == "cat"
                                      else home.move(window))
            self._spare = {}  # buffers of the old home
        self._home = home

    def _home_for(self, device):
        """The home to(device) moves the states into; raises before anything moves."""
        return _home_on(device, self._where)

    def _move_to(self, home):
        if home is not self._where:  # a host target leaves a metric with no home without one
            self._adopt(home)

    def _window_value(self, name):
        window = self._window[name]
        spec = self._specs[name]
        if spec.op != "cat":
            return window
        home = self._where
        return home.xp.concat([spec.identity(home.xp, home.device), *window])

    def _value(self, name):
        """The state over the synced data and this rank's current window."""
        return self._specs[name].combine(self._synced[name], self._window_value(name))

    def _host(self, name):
        """_value(name) as a host NumPy array (waits for device states)."""
        value = self._value(name)
        return value if isinstance(value, np.ndarray) else to_host(value)

    def _to_home(self, array):
        """A host NumPy result as an array of the home."""
        return self._where.put(array)

    def _ratio(self, numerator, denominator):
        """numerator / denominator as a float; NaN with a RuntimeWarning when
        the denominator is zero (no samples yet, or none for this score)."""
        if denominator == 0:
            warnings.warn(f"{type(self).__name__}.compute(): zero division (no samples, or none "
                          "that this score counts); returning NaN", RuntimeWarning, stacklevel=3)
            return float("nan")
        return float(numerator / denominator)

    def _compute(self):
        raise NotImplementedError

    # ---- sync plumbing shared with MetricCollection

    def _check_idle(self, action):
        if self._pending is not None:
            raise RuntimeError(
                f"{type(self).__name__}.{action}() called while a sync is in flight: "
                "call wait_sync() first (the states are being reduced across ranks)")

    def _entries(self, prefix):
        return [Entry((*prefix, name), spec, self._window_value(name), self._spare.pop(name, None))
                for name, spec in self._specs.items()]

    def _hand_over(self, pending, entries):
        """The sync of `entries` is in flight until wait_sync()."""
        self._pending = (pending, entries)

    # ---- public lifecycle

    def trigger_sync(self, comm=None):
        """Starts syncing this rank's window with every rank of `comm` (the
        world when None): one asynchronous collective per reduce op. Every
        rank must call it, with the same metric. Returns immediately."""
        self._check_idle("trigger_sync")
        entries = self._entries(())
        self._hand_over(start_sync(entries, comm), entries)

    def wait_sync(self, comm=None):
        """Waits for the sync started by trigger_sync() and folds the data of
        all ranks into the synced state. If the collective fails, the error
        is raised and the window is as it was (the collectives reduced
        copies): nothing is lost. `comm`, when given, must be the
        communicator of the sync (d9d passes its context to both calls):
        InvalidArgumentError otherwise, and the sync is still pending."""
        if self._pending is None:
            raise RuntimeError(f"{type(self).__name__}.wait_sync() without trigger_sync()")
        pending, entries = self._pending
        pending.check_comm(comm, f"{type(self).__name__}.wait_sync")
        self._pending = None
        results = pending.wait()
        for entry in entries:
            name = entry.key[-1]
            self._synced[name] = entry.spec.fold(self._synced[name], results[entry.key])
            self._pristine = False
            if entry.spec.op == "cat":
                self._window[name] = _fresh_window(entry.spec, self._where)
            else:
                entry.spec.clear(self._window[name])
                self._spare[name] = results[entry.key]

    def to(self, device):
        """Moves the states to `device` and returns the metric (torchmetrics'
        and d9d's Metric.to); later updates must come from there.

        `device` is "cpu", "cuda", "cuda:N", an int N (CUDA device N), a
        torch.device or a cupy.cuda.Device. To the host, states on the host
        stay as they are (NumPy or torch CPU); torch CUDA states become
        torch CPU ones, CuPy states NumPy ones. To a GPU, states go to the
        library the device object names, else to the home's own GPU library
        (torch or CuPy), else to torch. A metric with no home yet gets the
        one on the GPU (a host target leaves it without). Unknown devices
        raise ValueError, a GPU that is not there UnavailableError, before
        anything moves."""
        self._check_idle("to")
        self._move_to(self._home_for(device))
        return self

    def sync(self, comm=None):
        """trigger_sync() then wait_sync()."""
        self.trigger_sync(comm)
        self.wait_sync()

    def compute(self):
        """The metric over the synced data and this rank's current window."""
        self._check_idle("compute")
        return self._compute()

    def reset(self):
        """Forgets all data, synced and local."""
        self._check_idle("reset")
        home = self._where
        for name, spec in self._specs.items():
            self._synced[name] = spec.identity(home.xp, home.device)
            self._window[name] = _fresh_window(spec, home)
        self._pristine = True

    def state_dict(self):
        """{"metric": class name, "synced": {state: array}, "window": {state:
        array}}: copies of both parts, host NumPy arrays only (np.savez-able),
        whatever the home (device states are copied back, which waits for them)."""
        self._check_idle("state_dict")
        return {
            "metric": type(self).__name__,
            "synced": {name: to_host(array) for name, array in self._synced.items()},
            "window": {name: to_host(self._window_value(name)) for name in self._specs},
        }

    def load_state_dict(self, state_dict):
        """Restores both parts from state_dict(); raises ValueError when the
        states do not match this metric's names, shapes or dtypes. The values
        (arrays of any library) are checked as host NumPy copies and placed in
        the metric's home (NumPy while it has none; the first update then
        moves them to its inputs' home)."""
        self._check_idle("load_state_dict")
        kind = state_dict.get("metric", type(self).__name__)
        if kind != type(self).__name__:
            raise ValueError(f"state_dict is of a {kind}, not a {type(self).__name__}")
        synced = {n: self._checked_state(n, a, "synced") for n, a in state_dict["synced"].items()}
        window = {n: self._checked_state(n, a, "window") for n, a in state_dict["window"].items()}
        for part, loaded in (("synced", synced), ("window", window)):
            if set(loaded) != set(self._specs):
                raise ValueError(f"state_dict[{part!r}] has states {sorted(loaded)}, "
                                 f"expected {sorted(self._specs)}")
        home = self._where
        self._synced = {n: home.put(a) for n, a in synced.items()}
        self._window = {n: [home.put(a)] if self._specs[n].op == "cat" else home.put(a)
                        for n, a in window.items()}
        self._pristine = False

    def _checked_state(self, name, array, part):
        spec = self._specs.get(name)
        if spec is None:
            raise ValueError(f"state_dict[{part!r}] has an unknown state {name!r}; "
                             f"expected {sorted(self._specs)}")
        array = to_host(array)
        expected = spec.shape
        if spec.op == "cat":  # any number of rows
            expected = (array.shape[0] if array.ndim else "rows", *spec.shape)
        if array.shape != expected or array.dtype != spec.dtype:
            raise ValueError(f"state_dict[{part!r}][{name!r}] has shape {array.shape} and dtype "
                             f"{array.dtype}, expected {expected} and {spec.dtype}")
        return array
