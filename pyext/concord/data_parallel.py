"""Data-parallel and sharded training on pytrees of arrays.

The names follow the JAX libraries they replace (datarax, xlstm-jax,
artifex): placing batches and model state on a mesh's ranks, ZeRO/FSDP-style
parameter sharding (shard_params, gather_params,
gather_array_with_mean_grads), and gradient reductions (sync_gradients,
reduce_gradients_across_devices). Those libraries' other names for them
(shard_batch, DataParallel.*_static, ...) are bound from concord._aliases,
the one table of such names. Gradient buckets (GradientSynchronizer) and
train_step, which those libraries list here too, live in concord.training.

Every rank runs the same program on its own copy of the data (SPMD), so
"placing" means each rank keeps its own block. pytrees are walked with
optree; leaves are NumPy arrays or any DLPack array, and results come back
in the leaves' own array types. Axis names resolve as in concord.mesh.axis_comm.

Inside jax.jit, reduce_gradients_across_devices (and its other names) runs
through concord.jax, in the compiled computation; spmd_train_step and
data_parallel_train_step are whole data-parallel steps of JAX code.

Reductions and gathers are fused: one collective per array kind (type,
dtype, device) on a packed buffer, not one per leaf. Before one, the ranks
compare a fingerprint of the pytree (structure, leaf shapes and dtypes), so
ranks passing different pytrees get MismatchError instead of a hang.
"""

import math
import warnings

import numpy as np
import optree
from array_api_compat import device as array_device

from . import _aliases, _world, collectives
from ._pytree import agree, fused_all_gather, fused_all_reduce, fused_broadcast, group_indices
from ._traced import traced
from .arrays import as_array, front_to_axis, namespace
from .errors import InvalidArgumentError
from .mesh import (
    BATCH_AXIS,
    DeviceMeshManager,
    Mesh,
    NamedSharding,
    PartitionSpec,
    _axis_names_tuple,
    axis_comm,
    current_mesh,
)
from .sharded import ShardedArray, local
from .training import GradientSynchronizer, train_step

__all__ = [
    "DataParallel",
    "GradientSynchronizer",
    "ShardedArray",
    "create_data_parallel_sharding",
    "data_parallel_train_step",
    "gather_array_with_mean_grads",
    "gather_params",
    "place_batch_on_shards",
    "place_model_state_on_shards",
    "reduce_gradients_across_devices",
    "replicate_params",
    "shard_params",
    "spmd_train_step",
    "sync_gradients",
    "train_step",
]


# ---- pytree and array plumbing ----------------------------------------------

def _value(leaf):
    return as_array(local(leaf))


def _rewrap(leaf, value):
    return leaf.replace(value) if isinstance(leaf, ShardedArray) else value


def _cast(x, dtype):
    if dtype is None:
        return x
    if isinstance(x, np.ndarray):
        return x.astype(dtype, copy=False)
    return namespace(x).astype(x, dtype)


def _path_text(path):
    return "/".join(map(str, path))


def _leaf_signature(leaf):
    if isinstance(leaf, ShardedArray):
        return ("sharded", _leaf_signature(leaf.local), leaf.global_shape, leaf.dim,
                leaf.axis_name)
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return tuple(leaf.shape), str(leaf.dtype)
    return type(leaf).__qualname__


def _refuse_sharded(what, tree, why):
    """InvalidArgumentError naming the first ShardedArray leaf of `tree`, if any."""
    paths, leaves, _ = optree.tree_flatten_with_path(tree)
    for path, leaf in zip(paths, leaves):
        if isinstance(leaf, ShardedArray):
            raise InvalidArgumentError(
                f"{what}: leaf {_path_text(path)} is a ShardedArray; {why}")


def _check_same_tree(what, treespec, leaves, comm):
    """Raises MismatchError on every rank of `comm` unless all passed the
    same pytree structure with the same leaf shapes and dtypes."""
    agree(comm, repr((str(treespec), [_leaf_signature(leaf) for leaf in leaves])),
          f"{what}: ranks passed different pytrees (structure, leaf shapes or dtypes)",
          mine=treespec)


# ---- batches and model state ------------------------------------------------

def create_data_parallel_sharding(mesh, data_axis="data"):
    """A NamedSharding splitting the leading (batch) dimension over `data_axis`."""
    return NamedSharding(mesh, PartitionSpec(data_axis))


_UNEVEN_MODES = ("error", "drop", "pad")


def _batch_rows(batch_size, count, index, uneven, axis, path):
    """This rank's rows of a batch: a slice, or a list of indices when
    padding wraps around to the batch's first examples."""
    if batch_size % count == 0 or uneven == "drop":
        per_rank = batch_size // count
        return slice(index * per_rank, (index + 1) * per_rank)
    if uneven == "error":
        raise InvalidArgumentError(
            f"place_batch_on_shards: batch size {batch_size} (leaf {path or '<root>'}) is not "
            f"divisible by {count}, the size of mesh axis {axis!r}; pass uneven='drop' or "
            "uneven='pad'")
    per_rank = -(-batch_size // count)
    start = index * per_rank
    if start + per_rank <= batch_size:
        return slice(start, start + per_rank)
    return [(start + k) % batch_size for k in range(per_rank)]


def _take_rows(x, rows):
    if isinstance(rows, slice):
        return x[rows]
    if isinstance(x, np.ndarray):
        return np.take(x, rows, axis=0)
    xp = namespace(x)
    return xp.take(x, xp.asarray(rows, device=array_device(x)), axis=0)


def place_batch_on_shards(batch, sharding, *, uneven="error"):
    """This rank's shard of every leaf of `batch`, split along the leading
    (batch) dimension as `sharding` says (further spec entries split further
    dimensions evenly).

    Every rank passes the global batch. When the batch size is not
    divisible by the number of shards: "error" raises ValueError naming both,
    "drop" drops the last examples, "pad" wraps around to the first
    examples (as torch's DistributedSampler does) so every shard has
    ceil(batch / shards) rows. Slices are views where the array type has
    them.
    """
    if uneven not in _UNEVEN_MODES:
        raise InvalidArgumentError(f"uneven must be one of {_UNEVEN_MODES}, got {uneven!r}")
    count, index = sharding.dim_shards(0)
    axis = sharding.spec[0] if sharding.spec else None

    def shard(path, leaf):
        x = as_array(leaf)
        if not len(x.shape):
            raise InvalidArgumentError(
                f"place_batch_on_shards: leaf {_path_text(path)} is 0-d; every leaf needs a "
                "leading batch dimension")
        rows = _batch_rows(x.shape[0], count, index, uneven, axis, _path_text(path))
        local = _take_rows(x, rows)
        global_shape = (local.shape[0] * count, *x.shape[1:])
        return local[(slice(None), *sharding.local_slices(global_shape)[1:])]

    return optree.tree_map_with_path(shard, batch)


def _specs_by_path(leaf_paths, specs):
    """PartitionSpec per leaf path from a {path: spec} dict whose keys are
    paths ("a/b/0" or a tuple) or prefixes of paths (the longest wins)."""
    keys = {_path_text(key) if isinstance(key, tuple) else str(key): key for key in specs}
    used, result = set(), []
    for path in leaf_paths:
        spec = None
        for end in range(len(path), -1, -1):
            text = _path_text(path[:end])
            if text in keys:
                used.add(text)
                spec = specs[keys[text]]
                break
        result.append(spec)
    unused = sorted(set(keys) - used)
    if unused:
        raise InvalidArgumentError(
            f"place_model_state_on_shards: no leaf has the path {unused[0]!r}; leaf paths are "
            f"{[_path_text(path) for path in leaf_paths][:20]}")
    return result


def _spec_or_none(spec):
    if spec is None or isinstance(spec, PartitionSpec):
        return spec
    return PartitionSpec(*spec)


def place_model_state_on_shards(state, mesh, param_sharding="replicate"):
    """Places model state (parameters, optimizer state) on the mesh.

    "replicate": every rank gets rank 0's state (a broadcast over the mesh;
    collective). None: the state as it is. "shard": every leaf with at
    least one dimension keeps its block of the leading dimension split over
    the mesh's first axis; 0-d leaves stay whole. {path: PartitionSpec}:
    leaves at those paths (or under those prefixes; "a/b/0" or a tuple)
    keep their block as the spec says, the others stay whole. Blocks are
    plain local arrays; ValueError when a split dimension is not divisible.
    """
    if param_sharding is None:
        return state
    if isinstance(param_sharding, str):
        if param_sharding == "replicate":
            return replicate_params(state, mesh)
        if param_sharding != "shard":
            raise InvalidArgumentError(
                "param_sharding must be 'replicate', 'shard', a {path: PartitionSpec} dict "
                f"or None, got {param_sharding!r}")
    elif not isinstance(param_sharding, dict):
        raise InvalidArgumentError(
            f"param_sharding must be 'replicate', 'shard', a dict or None, got "
            f"{type(param_sharding).__name__}")
    paths, leaves, treespec = optree.tree_flatten_with_path(state)
    if param_sharding == "shard":
        first = PartitionSpec(mesh.axis_names[0])
        specs = [first if len(as_array(leaf).shape) else None for leaf in leaves]
    else:
        specs = [_spec_or_none(spec) for spec in _specs_by_path(paths, param_sharding)]
    placed = []
    for leaf, spec in zip(leaves, specs):
        if spec is None:
            placed.append(leaf)
        else:
            x = as_array(leaf)
            placed.append(x[NamedSharding(mesh, spec).local_slices(tuple(x.shape))])
    return optree.tree_unflatten(treespec, placed)


def _comm_of(mesh_or_comm):
    if mesh_or_comm is None:
        return axis_comm(None)
    if isinstance(mesh_or_comm, Mesh):
        return mesh_or_comm.comm()
    return mesh_or_comm


def replicate_params(params, mesh_or_comm=None, root=0):
    """Every rank gets `root`'s params: one fused broadcast per array kind
    over the mesh's communicator (or the given Communicator; None: the
    active mesh's, else the world). Leaves keep their array types."""
    _refuse_sharded("replicate_params", params,
                    "each rank's block differs, replicate before shard_params")
    comm = _comm_of(mesh_or_comm)
    leaves, treespec = optree.tree_flatten(params)
    _check_same_tree("replicate_params", treespec, leaves, comm)
    values = [as_array(leaf) for leaf in leaves]
    return optree.tree_unflatten(treespec, fused_broadcast(values, root, comm))


# ---- parameter sharding (ZeRO / FSDP, the xlstm-jax rules) ---------------------

# Leaves of at most this many elements stay whole (xlstm-jax's default).
MIN_WEIGHT_SIZE = 2**18


def _axis_extent(axis_name, mesh):
    """(number of ranks, this rank's index) along `axis_name`."""
    mesh = mesh if mesh is not None else current_mesh()
    if mesh is not None:
        return mesh.axis_size(axis_name), mesh.axis_index(axis_name)
    _axis_names_tuple(axis_name)
    comm = _world.current()
    return comm.size, comm.rank


def _shard_dim(shape, count):
    """The largest dimension divisible by `count`, the later one on ties;
    None when there is none."""
    divisible = [dim for dim, size in enumerate(shape) if size % count == 0]
    return max(divisible, key=lambda dim: (shape[dim], dim)) if divisible else None


def shard_params(params, axis_name, min_weight_size=MIN_WEIGHT_SIZE, *, mesh=None):
    """Each rank keeps its block of every large parameter, split over
    `axis_name` (the xlstm-jax rule).

    Leaves with at most `min_weight_size` elements stay whole (replicated).
    Larger ones are split along their largest dimension divisible by the
    axis size (the later one on ties) and become ShardedArray; when no
    dimension is divisible the leaf stays whole and a warning says so.
    ShardedArray leaves are left as they are. No communication.
    """
    count, index = _axis_extent(axis_name, mesh)
    unshardable = []

    def shard(path, leaf):
        if isinstance(leaf, ShardedArray):
            return leaf
        x = as_array(leaf)
        shape = tuple(x.shape)
        if math.prod(shape) <= min_weight_size:
            return leaf
        dim = _shard_dim(shape, count)
        if dim is None:
            unshardable.append(f"{_path_text(path) or '<root>'} {shape}")
            return leaf
        block = shape[dim] // count
        where = [slice(None)] * len(shape)
        where[dim] = slice(index * block, (index + 1) * block)
        # A copy, so the full parameter can be freed: that is the point.
        local = namespace(x).asarray(x[tuple(where)], copy=True)
        return ShardedArray(local, shape, dim, axis_name)

    result = optree.tree_map_with_path(shard, params)
    if unshardable:
        warnings.warn(
            f"shard_params: no dimension divisible by {count} (the size of axis "
            f"{axis_name!r}), so these stay replicated: {', '.join(unshardable)}", stacklevel=2)
    return result


def gather_params(params, axis_name, gather_dtype=None, grad_scatter_dtype=None, *, mesh=None):
    """The full parameters from ShardedArray leaves sharded over
    `axis_name`: one fused all-gather per array kind along each leaf's
    split dimension. With `gather_dtype` the blocks are cast before the
    gather (the results have that dtype). Other leaves pass through.

    Blocks that are JAX tracers (under jax.grad, inside jax.jit) are
    gathered by concord.jax, one leaf at a time, with xlstm-jax's
    gradient: the gradient of a gathered leaf is reduce-scattered back to
    the blocks with a mean over the ranks, in `grad_scatter_dtype` (None:
    the block's dtype), and cast to the block's dtype. Other arrays carry
    no gradients: `grad_scatter_dtype` has nothing to act on there."""
    names = _axis_names_tuple(axis_name)
    comm = axis_comm(axis_name, mesh)
    leaves, treespec = optree.tree_flatten(params)
    picked = [i for i, leaf in enumerate(leaves)
              if isinstance(leaf, ShardedArray) and _axis_names_tuple(leaf.axis_name) == names]
    _check_same_tree("gather_params", treespec, leaves, comm)
    if traced([leaves[i].local for i in picked]):
        from .jax import _trees
        for i in picked:
            leaves[i] = _trees.gather_with_mean_grads(leaves[i].local, leaves[i].dim, comm,
                                                      gather_dtype, grad_scatter_dtype)
        return optree.tree_unflatten(treespec, leaves)
    blocks = fused_all_gather([_cast(as_array(leaves[i].local), gather_dtype) for i in picked],
                              comm)
    for index, stacked in zip(picked, blocks):
        leaves[index] = front_to_axis(stacked, leaves[index].dim, tiled=True)
    return optree.tree_unflatten(treespec, leaves)


def gather_array_with_mean_grads(x, axis, axis_name, gather_dtype=None, grad_scatter_dtype=None,
                                 *, mesh=None):
    """(full, backward): `x` all-gathered along `axis` over `axis_name`
    (cast to `gather_dtype` first, if given), and the matching backward.

    backward(grad_full) reduce-scatters grad_full along `axis` with a mean
    over the ranks, in `grad_scatter_dtype` (None: x's dtype, as in
    xlstm-jax), and casts the result back to x's dtype: each rank gets the
    mean of all ranks' gradients for its own block. Both are collectives
    over `axis_name`. When `x` is a JAX tracer (under jax.grad, inside
    jax.jit), `full` also carries that backward as its derivative, as
    xlstm-jax's result does.
    """
    comm = axis_comm(axis_name, mesh)
    if traced([x]):
        from .jax import _trees
        return _trees.gather_with_backward(x, axis, comm, gather_dtype, grad_scatter_dtype)
    x = as_array(x)
    full = collectives.all_gather(_cast(x, gather_dtype), axis=axis, comm=comm)

    def backward(grad_full):
        grad = _cast(as_array(grad_full), x.dtype if grad_scatter_dtype is None
                     else grad_scatter_dtype)
        return _cast(collectives.reduce_scatter(grad, "mean", axis=axis, comm=comm), x.dtype)

    return full, backward


# ---- gradient reductions ------------------------------------------------------

def _mesh_order(names, mesh):
    """`names` validated, in the mesh's axis order: a mean over axes does not
    depend on their order, so every ordering shares one communicator."""
    names = _axis_names_tuple(names)
    if mesh is None:
        return names
    mesh.axis_size(names)
    return tuple(name for name in mesh.axis_names if name in names)


def _replication_axes(leaf, names, mesh):
    """The axes a gradient leaf is averaged over: all of `names` for a
    replicated leaf, those it is not sharded on for a ShardedArray."""
    if not isinstance(leaf, ShardedArray):
        return names
    if mesh is None:
        # With no mesh every name is the whole world, which the leaf is
        # sharded over: its blocks differ on every rank.
        return ()
    sharded = set(_axis_names_tuple(leaf.axis_name))
    return tuple(name for name in names if name not in sharded)


def sync_gradients(grads, axis_names, *, mesh=None):
    """Gradients averaged over the ranks of `axis_names` (a name or tuple).

    Replicated leaves: the mean over all of `axis_names`. ShardedArray
    leaves: the mean only over the axes they are not sharded on (none left:
    unchanged). One fused all-reduce per set of axes and array kind.
    """
    mesh = mesh if mesh is not None else current_mesh()
    names = _mesh_order(axis_names, mesh)
    leaves, treespec = optree.tree_flatten(grads)
    groups = group_indices(_replication_axes(leaf, names, mesh) for leaf in leaves)
    _check_same_tree("sync_gradients", treespec, leaves, axis_comm(names, mesh))
    for axes, indices in groups.items():
        if not axes:  # sharded over every axis: nothing to average
            continue
        reduced = fused_all_reduce([_value(leaves[i]) for i in indices], "mean",
                                    axis_comm(axes, mesh))
        for index, value in zip(indices, reduced):
            leaves[index] = _rewrap(leaves[index], value)
    return optree.tree_unflatten(treespec, leaves)


def _reduce_type(reduce_type):
    op = reduce_type.lower() if isinstance(reduce_type, str) else None
    if op not in ("mean", "sum"):
        raise InvalidArgumentError(f"reduce_type must be 'mean' or 'sum', got {reduce_type!r}")
    return op


def reduce_gradients_across_devices(grads, reduce_type="mean", axis_name=None, *, mesh=None):
    """Every leaf reduced ("mean" or "sum", any case) over `axis_name`
    (None: the whole mesh, or the world with no mesh): one fused all-reduce
    per array kind; inside jax.jit, per dtype, in the compiled computation.
    ShardedArray leaves are reduced block by block like any array;
    sync_gradients is the sharding-aware reduction."""
    op = _reduce_type(reduce_type)
    comm = axis_comm(axis_name, mesh)
    leaves, treespec = optree.tree_flatten(grads)
    _check_same_tree("reduce_gradients_across_devices", treespec, leaves, comm)
    if traced(leaves):  # inside jax.jit: reduced in the computation, by concord.jax
        from .jax import _trees
        return optree.tree_unflatten(treespec, _trees.reduce_leaves(leaves, [op] * len(leaves),
                                                                    comm))
    reduced = fused_all_reduce([_value(leaf) for leaf in leaves], op, comm)
    return optree.tree_unflatten(treespec, [_rewrap(leaf, value)
                                            for leaf, value in zip(leaves, reduced)])


# ---- compiled training steps of JAX code ------------------------------------------

_SHARDED_STEP = ("these steps average every gradient over the ranks, mixing different "
                 "ranks' blocks; reduce a sharded model's gradients with sync_gradients")


def spmd_train_step(params, optimizer, loss_fn, batch, opt_state, *, axis_name=None, mesh=None):
    """One data-parallel step of JAX code, to call inside your own jax.jit:
    the loss and gradients of loss_fn(params, batch) on this rank's batch,
    both averaged over the ranks of `axis_name` by one concord all-reduce
    inside the same computation, then `optimizer`'s update (optax's
    protocol). Returns (mean loss, params, opt_state). The seeds' form
    takes a flax nnx model and optimizer, which update in place; without
    flax the state goes in and out explicitly. ShardedArray parameters
    are refused (InvalidArgumentError)."""
    _refuse_sharded("spmd_train_step", params, _SHARDED_STEP)
    from .jax import _training
    return _training.spmd_train_step(params, optimizer, loss_fn, batch, opt_state,
                                     axis_comm(axis_name, mesh))


def data_parallel_train_step(loss_fn, optimizer, batch, state, rngs=None, *,
                             axis_name=BATCH_AXIS, mesh=None):
    """datarax's training step, compiled with jax.jit (once per loss_fn,
    optimizer, communicator and shapes). `state` has .params, .opt_state,
    .step, optionally .model_state, and .replace() (a flax TrainState, say);
    loss_fn(variables, batch, rngs=rngs) gets {"params": params,
    **state.model_state}; `optimizer` follows optax's protocol. The mean of
    the gradients over `axis_name` (the seeds' "batch": that axis of the
    mesh, the whole mesh when it has none, the world when no mesh is
    active) is a concord all-reduce inside the computation. Returns
    (the state with step + 1, {"loss": the mean loss over the ranks}).
    ShardedArray parameters are refused (InvalidArgumentError)."""
    _refuse_sharded("data_parallel_train_step", state.params, _SHARDED_STEP)
    from .jax import _training
    return _training.data_parallel_train_step(state, batch, rngs, loss_fn=loss_fn,
                                              optimizer=optimizer,
                                              comm=axis_comm(axis_name, mesh))


# ---- the artifex-style class ----------------------------------------------------

def _create_mesh(mesh_shape=None, *, comm=None, data_axis="data", devices=None):
    """A mesh from {axis name: size} (None: every rank along `data_axis`),
    laid over `devices` (see DeviceMeshManager.create_device_mesh)."""
    manager = DeviceMeshManager(comm)
    if mesh_shape is None:
        mesh_shape = {data_axis: manager.num_devices}
    return manager.create_device_mesh(mesh_shape, devices)


class DataParallel:
    """Data-parallel helpers bound to a mesh (artifex's DataParallel).

    With `mesh` None the methods use the active mesh (concord.use_mesh),
    else a 1-D mesh over the world along `data_axis`, made on first use.
    Every method taking an optional `mesh` uses the given one instead. Each
    method also exists as a ``*_static`` static method: the module-level
    function, which takes the mesh (or sharding) explicitly (bound from
    concord._aliases, with the methods' other names).
    """

    def __init__(self, mesh=None, *, data_axis="data"):
        self._mesh = mesh
        self.data_axis = data_axis

    @property
    def mesh(self):
        """The mesh the methods use."""
        if self._mesh is not None:
            return self._mesh
        active = current_mesh()
        if active is not None:
            return active
        self._mesh = _create_mesh(data_axis=self.data_axis)
        return self._mesh

    def _pick(self, mesh):
        return mesh if mesh is not None else self.mesh

    def create_mesh(self, mesh_shape=None, *, comm=None, devices=None):
        """Builds the mesh this object uses from {axis name: size} (None:
        every rank along the data axis), laid over `devices` (ranks, in
        row-major order; None: in their own), and returns it."""
        self._mesh = _create_mesh(mesh_shape, comm=comm, data_axis=self.data_axis,
                                  devices=devices)
        return self._mesh

    def create_sharding(self, mesh=None, data_axis=None):
        """The NamedSharding splitting batches over the data axis."""
        return create_data_parallel_sharding(self._pick(mesh), data_axis or self.data_axis)

    def shard_batch(self, batch, sharding=None, *, uneven="error"):
        """This rank's shard of the global batch (see place_batch_on_shards)."""
        sharding = sharding if sharding is not None else self.create_sharding()
        return place_batch_on_shards(batch, sharding, uneven=uneven)

    def shard_model_state(self, state, mesh=None, param_sharding="replicate"):
        """See place_model_state_on_shards."""
        return place_model_state_on_shards(state, self._pick(mesh), param_sharding)

    def replicate_params(self, params, mesh=None, root=0):
        """Every rank gets `root`'s params (see replicate_params)."""
        return replicate_params(params, self._pick(mesh), root)

    def shard_params(self, params, axis_name=None, min_weight_size=MIN_WEIGHT_SIZE):
        """See shard_params; the axis defaults to the data axis (ZeRO-3)."""
        return shard_params(params, axis_name or self.data_axis, min_weight_size, mesh=self.mesh)

    def gather_params(self, params, axis_name=None, gather_dtype=None, grad_scatter_dtype=None):
        """See gather_params; the axis defaults to the data axis."""
        return gather_params(params, axis_name or self.data_axis, gather_dtype,
                             grad_scatter_dtype, mesh=self.mesh)

    def sync_gradients(self, grads, axis_names=None):
        """See sync_gradients; the axes default to all the mesh's axes."""
        mesh = self.mesh
        return sync_gradients(grads, axis_names or mesh.axis_names, mesh=mesh)

    def reduce_gradients(self, grads, reduce_type="mean", axis_name=None):
        """See reduce_gradients_across_devices; None: the whole mesh."""
        return reduce_gradients_across_devices(grads, reduce_type, axis_name, mesh=self.mesh)


_aliases.bind_functions(globals())
_aliases.bind_methods(DataParallel, globals())
__all__ += _aliases.FUNCTIONS
