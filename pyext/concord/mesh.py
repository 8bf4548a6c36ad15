"""Meshes: a communicator's ranks as an N-D grid with named axes.

    mesh = cc.make_mesh((2, 2), ("data", "fsdp"))     # 4 ranks
    mesh.coords                      # {"data": 1, "fsdp": 0} on rank 2
    mesh.comm("fsdp")                # the ranks that differ only along fsdp
    with cc.use_mesh(mesh):
        ...                          # axis names now resolve on this mesh

Ranks are laid out in row-major order, as jax.make_mesh does: rank r has the
coordinates ``numpy.unravel_index(r, shape)``, unless `devices` lists the
ranks in another order (then the r-th of them has those coordinates, and
the mesh runs on a communicator of its own, its ranks in that order).
Creating a mesh is collective over its communicator (one ``split`` per
axis, made at once on every rank); sub-communicators for tuples of axes
are made on first use, which is collective too: every rank of the mesh
must ask for the same tuples in the same order.
"""

import contextlib
import contextvars
import math
import operator
import threading
import types

from . import _world
from ._pytree import agree
from .errors import InvalidArgumentError

__all__ = [
    "BATCH_AXIS",
    "DefaultAxisName",
    "DeviceMeshManager",
    "Mesh",
    "NamedSharding",
    "PartitionSpec",
    "axis_comm",
    "current_mesh",
    "make_mesh",
    "use_mesh",
]


def _row_major_index(coords, sizes):
    index = 0
    for coord, size in zip(coords, sizes):
        index = index * size + coord
    return index


def _unravel(index, sizes):
    coords = []
    for size in reversed(sizes):
        index, coord = divmod(index, size)
        coords.append(coord)
    return tuple(reversed(coords))


def _axis_names_tuple(names):
    """`names` (one name or a sequence of them) as a tuple of names."""
    if isinstance(names, str):
        return (names,)
    if isinstance(names, (tuple, list)) and all(isinstance(name, str) for name in names):
        return tuple(names)
    raise InvalidArgumentError(
        f"an axis name must be a string or a tuple of strings, got {names!r}")


class Mesh:
    """An N-D grid of a communicator's ranks with named axes.

    Build one with make_mesh. ``shape`` maps each axis name to its size,
    ``coords`` maps it to this rank's coordinate; ``comm(names)`` is the
    communicator of the ranks that differ from this one only along `names`,
    ordered by their coordinates along `names` (row-major over the names in
    the order given).
    """

    def __init__(self, shape, axis_names, comm, *, owns_comm=False):
        self._comm = comm
        self._owns_comm = owns_comm
        self.axis_names = axis_names
        self.shape = dict(zip(axis_names, shape))
        self.size = math.prod(shape)
        self.coords = dict(zip(axis_names, _unravel(comm.rank, shape)))
        # Sub-communicators this mesh created (and so closes), by axis tuple.
        self._owned = {}
        self._lock = threading.Lock()
        for name in axis_names:
            self.comm(name)

    @property
    def rank(self):
        """This rank's index in the mesh (its rank in the mesh communicator)."""
        return self._comm.rank

    def _check_names(self, names):
        names = _axis_names_tuple(names)
        if not names:
            raise InvalidArgumentError("at least one axis name is needed")
        for name in names:
            if name not in self.shape:
                raise InvalidArgumentError(
                    f"unknown axis {name!r}; mesh axes are {self.axis_names!r}")
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"axis names {names!r} repeat an axis")
        return names

    def axis_size(self, names):
        """Number of ranks along an axis, or along a tuple of axes."""
        return math.prod(self.shape[name] for name in self._check_names(names))

    def axis_index(self, names):
        """This rank's coordinate along an axis; along a tuple of axes, the
        row-major index over them in the order given."""
        names = self._check_names(names)
        return _row_major_index([self.coords[n] for n in names], [self.shape[n] for n in names])

    def comm(self, names=None):
        """The communicator over the ranks that differ from this one only
        along `names` (an axis name or a tuple of them); None gives the
        mesh's whole communicator. Made once, then cached: a tuple's is made
        on first use, collectively, so every rank of the mesh must ask for
        the same tuples in the same order."""
        if names is None:
            return self._comm
        names = self._check_names(names)
        with self._lock:
            if names not in self._owned:
                if self._spans_whole_mesh(names):
                    return self._comm
                self._owned[names] = self._split(names)
            return self._owned[names]

    def _spans_whole_mesh(self, names):
        # The group is every rank, ordered as in the mesh: the mesh's own
        # communicator serves, with no split.
        varying = [n for n in self.axis_names if self.shape[n] > 1]
        return [n for n in names if self.shape[n] > 1] == varying

    def _split(self, names):
        others = [n for n in self.axis_names if n not in names]
        color = _row_major_index([self.coords[n] for n in others],
                                 [self.shape[n] for n in others])
        return self._comm.split(color, self.axis_index(names))

    def close(self):
        """Closes the sub-communicators this mesh created, and its own
        communicator when it made that one (for `devices` in another order
        than the ranks'), not the one it was made from."""
        with self._lock:
            owned, self._owned = self._owned, {}
            if self._owns_comm:
                owned[None] = self._comm
        for comm in owned.values():
            comm.close()

    def __repr__(self):
        return f"Mesh(shape={self.shape}, rank={self.rank})"


def _mesh_sizes(shape):
    sizes = (shape,) if isinstance(shape, int) else tuple(shape)
    try:
        return tuple(operator.index(size) for size in sizes)
    except TypeError:
        raise InvalidArgumentError(f"mesh shape must be integers, got {shape!r}") from None


def _device_ranks(devices, sizes):
    """`devices` as a list of ranks, which must be as many as the mesh of
    `sizes` holds."""
    try:
        devices = list(devices)
    except TypeError:
        raise InvalidArgumentError(
            f"devices must be a sequence of ranks, got {type(devices).__name__}") from None
    if len(devices) != math.prod(sizes):
        raise InvalidArgumentError(
            f"devices holds {len(devices)} ranks but mesh shape {sizes} holds "
            f"{math.prod(sizes)}")
    try:
        return [operator.index(device) for device in devices]
    except TypeError:
        raise InvalidArgumentError(
            f"devices must be ranks of the communicator (integers), got {devices!r}") from None


def _mesh_over_devices(sizes, names, comm, ranks):
    """The mesh laid over `ranks` (every rank of `comm` once) in that order."""
    in_order = list(range(comm.size))
    if sorted(ranks) != in_order:
        raise InvalidArgumentError(
            f"devices must list every rank of the communicator (0 to {comm.size - 1}) once, "
            f"got {ranks}")
    # Ranks passing different lists would pair different splits with each
    # other, with no error.
    agree(comm, repr(ranks), "make_mesh: ranks passed different devices", mine=ranks)
    if ranks == in_order:
        return Mesh(sizes, names, comm)
    return Mesh(sizes, names, comm.split(0, ranks.index(comm.rank)), owns_comm=True)


def make_mesh(shape, axis_names, *, comm=None, devices=None):
    """A Mesh over `comm` (the world by default) with the given axis sizes
    and names, ranks in row-major order. Collective over `comm`.

    `devices`, as jax.make_mesh takes them, are the ranks of `comm` the mesh
    is laid over, in row-major order: every rank once (a mesh covers its
    communicator), the same list on every rank (MismatchError on every rank
    otherwise). None: the ranks in their own order.

    Raises ValueError when `devices` does not hold as many ranks as the
    mesh (first, before anything else is looked at), when a size is below
    1, names repeat, the sizes do not multiply to the communicator's size,
    or `devices` is not every rank of it once.
    """
    sizes = _mesh_sizes(shape)
    ranks = None if devices is None else _device_ranks(devices, sizes)
    names = _axis_names_tuple(axis_names)
    if len(sizes) != len(names):
        raise InvalidArgumentError(
            f"mesh shape {sizes} has {len(sizes)} axes but {len(names)} axis names {names!r}")
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"mesh axis names {names!r} repeat a name")
    if any(size < 1 for size in sizes):
        raise InvalidArgumentError(f"mesh shape {sizes} has a size below 1")
    comm = comm if comm is not None else _world.current()
    if math.prod(sizes) != comm.size:
        raise InvalidArgumentError(
            f"mesh shape {sizes} holds {math.prod(sizes)} ranks but the communicator "
            f"has {comm.size}")
    if ranks is None:
        return Mesh(sizes, names, comm)
    return _mesh_over_devices(sizes, names, comm, ranks)


_active_mesh = contextvars.ContextVar("concord_active_mesh", default=None)


@contextlib.contextmanager
def use_mesh(mesh):
    """Makes `mesh` the active mesh inside the block (per thread and per
    asyncio task; blocks nest)."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"use_mesh needs a Mesh, got {type(mesh).__name__}")
    token = _active_mesh.set(mesh)
    try:
        yield mesh
    finally:
        _active_mesh.reset(token)


def current_mesh():
    """The active mesh (see use_mesh), or None."""
    return _active_mesh.get()


class DefaultAxisName(str):
    """An axis name a function uses when its caller names none. The caller
    asked for no axis in particular, so on a mesh without an axis of that
    name it stands for the whole mesh, where the same name passed by the
    caller, a plain str, is an error."""

    __slots__ = ()


# The JAX libraries' default axis (datarax's collectives and training step):
# the axis of that name, the whole mesh on a mesh without one, and the
# whole world with no mesh, as every name is there.
BATCH_AXIS = DefaultAxisName("batch")


def axis_comm(axis_name, mesh=None):
    """The communicator an `axis_name` argument stands for.

    None is the whole communicator: the mesh's (`mesh`, else the active
    one) or, with no mesh, the world. With a mesh, a name or tuple of names
    must be its axes (ValueError otherwise), but a DefaultAxisName the mesh
    has no axis of is the whole mesh. With no mesh, every name stands for
    the whole world.
    """
    mesh = mesh if mesh is not None else current_mesh()
    if mesh is not None:
        if isinstance(axis_name, DefaultAxisName) and axis_name not in mesh.shape:
            return mesh.comm()
        return mesh.comm(axis_name)
    if axis_name is not None:
        _axis_names_tuple(axis_name)
    return _world.current()


class PartitionSpec(tuple):
    """How each dimension of an array is split over mesh axes: one entry
    per leading dimension, each None (replicated), an axis name, or a tuple
    of axis names (split over their product, row-major). Dimensions past
    the last entry are replicated."""

    def __new__(cls, *entries):
        return super().__new__(cls, (cls._entry(entry) for entry in entries))

    @staticmethod
    def _entry(entry):
        if entry is None or isinstance(entry, str):
            return entry
        names = _axis_names_tuple(entry)
        return names or None

    def __repr__(self):
        return f"PartitionSpec({', '.join(map(repr, self))})"

    def __reduce__(self):
        return type(self), tuple(self)


class NamedSharding:
    """A PartitionSpec applied on a mesh: which block of a global array
    this rank holds."""

    def __init__(self, mesh, spec):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"NamedSharding needs a Mesh, got {type(mesh).__name__}")
        spec = spec if isinstance(spec, PartitionSpec) else PartitionSpec(*spec)
        used = [name for entry in spec if entry is not None for name in _axis_names_tuple(entry)]
        if used:
            mesh._check_names(used)
        self.mesh = mesh
        self.spec = spec

    def dim_shards(self, dim):
        """(number of blocks, this rank's block) along dimension `dim`."""
        entry = self.spec[dim] if dim < len(self.spec) else None
        if entry is None:
            return 1, 0
        return self.mesh.axis_size(entry), self.mesh.axis_index(entry)

    def _check_rank(self, shape):
        if len(self.spec) > len(shape):
            raise InvalidArgumentError(
                f"{self.spec!r} has {len(self.spec)} entries but the array has shape {shape}")

    def shard_shape(self, global_shape):
        """Shape of each rank's block of an array of `global_shape`; raises
        ValueError when a split dimension is not divisible."""
        shape = tuple(global_shape)
        self._check_rank(shape)
        result = []
        for dim, size in enumerate(shape):
            count, _ = self.dim_shards(dim)
            if size % count:
                raise InvalidArgumentError(
                    f"dimension {dim} of shape {shape} has size {size}, not divisible by "
                    f"{count}, the size of mesh axes {self.spec[dim]!r}")
            result.append(size // count)
        return tuple(result)

    def local_slices(self, global_shape):
        """This rank's block of an array of `global_shape`, one slice per
        dimension; raises ValueError when a split dimension is not divisible."""
        slices = []
        for dim, size in enumerate(self.shard_shape(global_shape)):
            index = self.dim_shards(dim)[1]
            slices.append(slice(index * size, (index + 1) * size))
        return tuple(slices)

    def __repr__(self):
        return f"NamedSharding({self.mesh!r}, {self.spec!r})"


class _ClassCallable:
    """A DeviceMeshManager method that may also be called on the class, as
    datarax's static methods are: it then runs on a new manager of the world."""

    def __init__(self, function):
        self._function = function
        self.__doc__ = function.__doc__
        self.__name__ = function.__name__

    def __get__(self, manager, owner):
        return types.MethodType(self._function, manager if manager is not None else owner())


class DeviceMeshManager:
    """Builds meshes over a communicator (the world by default), with the
    artifex DeviceMeshManager's methods. Every mesh covers every rank. The
    mesh-building methods and get_mesh_info may be called on the class
    itself (datarax's form: DeviceMeshManager.create_data_parallel_mesh()),
    for the world."""

    def __init__(self, comm=None):
        self._comm = comm
        self._last = None

    @property
    def num_devices(self):
        """Number of ranks meshes are built over."""
        return self._resolved_comm().size

    def _resolved_comm(self):
        return self._comm if self._comm is not None else _world.current()

    @_ClassCallable
    def create_device_mesh(self, mesh_shape, devices=None):
        """A mesh from {axis name: size} or [(axis name, size), ...], laid
        over `devices` (datarax's: the ranks, in row-major order; their
        number must be the mesh's) as make_mesh lays it."""
        items = list(mesh_shape.items() if isinstance(mesh_shape, dict) else mesh_shape)
        self._last = make_mesh([size for _, size in items], [name for name, _ in items],
                               comm=self._comm, devices=devices)
        return self._last

    @_ClassCallable
    def create_data_parallel_mesh(self, num_devices=None, axis_name="data"):
        """A 1-D mesh over every rank (num_devices, if given, must be their number)."""
        return self.create_device_mesh({axis_name: self._count(num_devices)})

    @_ClassCallable
    def create_model_parallel_mesh(self, num_devices=None, axis_name="model"):
        """A 1-D mesh over every rank named for model parallelism."""
        return self.create_device_mesh({axis_name: self._count(num_devices)})

    @_ClassCallable
    def create_hybrid_mesh(self, data_parallel_size=1, model_parallel_size=1,
                           data_axis="data", model_axis="model"):
        """A (data, model) mesh; the sizes must multiply to the number of ranks."""
        return self.create_device_mesh([(data_axis, data_parallel_size),
                                        (model_axis, model_parallel_size)])

    def _count(self, num_devices):
        return self.num_devices if num_devices is None else num_devices

    @_ClassCallable
    def get_mesh_info(self, mesh=None):
        """{"total_devices": ranks, "axes": {name: size}} of `mesh`, else of
        the last mesh this manager built, else of its communicator."""
        mesh = mesh if mesh is not None else self._last
        if mesh is None:
            return {"total_devices": self.num_devices, "axes": {}}
        return {"total_devices": mesh.size, "axes": dict(mesh.shape)}
