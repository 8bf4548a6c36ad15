"""ShardedArray: this rank's block of an array split over mesh axes.

concord's functions take pytrees (optree) whose leaves may be
ShardedArray: data_parallel makes and gathers them (shard_params,
gather_params) and reduces gradients by how each leaf is sharded; the
optimizers, clip_grad_norm and GradientSynchronizer work on each leaf's
local block.

To JAX a ShardedArray is a pytree node, registered once JAX is imported
(concord never imports it).
"""

import operator

import optree

from ._on_import import when_imported
from .arrays import writable_copy
from .errors import InvalidArgumentError

__all__ = ["SHARDED_ARRAY_NAMESPACE", "ShardedArray", "flatten", "local", "writable"]

SHARDED_ARRAY_NAMESPACE = "concord"


class ShardedArray:
    """This rank's block `local` of an array of `global_shape` split evenly
    along dimension `dim` over the ranks of mesh axis (or axes) `axis_name`.

    In optree's default registry a ShardedArray is a leaf, so concord's
    functions see each sharded parameter whole. In the "concord" namespace
    it is a node whose one child is `local`:
    ``optree.tree_map(f, tree, namespace="concord")`` maps f over the local
    blocks and keeps the sharding (an optimizer step on shards, say). It is
    the same node in JAX's registry: jax.tree.map maps over `local`,
    jax.jit and jax.grad take and return ShardedArrays, and global_shape,
    dim and axis_name are static (a jitted function is traced again for
    another sharding).
    """

    __slots__ = ("local", "global_shape", "dim", "axis_name")

    def __init__(self, local, global_shape, dim, axis_name):
        self.local = local
        self.global_shape = tuple(operator.index(size) for size in global_shape)
        self.dim = operator.index(dim)
        if not 0 <= self.dim < len(self.global_shape):
            raise InvalidArgumentError(
                f"ShardedArray: dim {dim} is out of range for shape {self.global_shape}")
        # A tuple, not a list: a jitted function hashes it (a static part
        # of the pytree node).
        self.axis_name = tuple(axis_name) if isinstance(axis_name, list) else axis_name

    @property
    def dtype(self):
        """The local block's dtype."""
        return self.local.dtype

    def replace(self, local):
        """The same sharding with another local block."""
        return ShardedArray(local, self.global_shape, self.dim, self.axis_name)

    def __repr__(self):
        return (f"ShardedArray(local shape {tuple(self.local.shape)}, global_shape="
                f"{self.global_shape}, dim={self.dim}, axis_name={self.axis_name!r})")


def _children(array):
    """(the one child, the static sharding) of a ShardedArray pytree node."""
    return (array.local,), (array.global_shape, array.dim, array.axis_name)


def _from_children(sharding, children):
    return ShardedArray(children[0], *sharding)


optree.register_pytree_node(ShardedArray, _children, _from_children,
                            namespace=SHARDED_ARRAY_NAMESPACE)


def _register_with_jax(jax):
    """ShardedArray in JAX's pytree registry, its child's key path `.local`."""
    local = jax.tree_util.GetAttrKey("local")

    def children_with_keys(array):
        (child,), sharding = _children(array)
        return ((local, child),), sharding

    jax.tree_util.register_pytree_with_keys(ShardedArray, children_with_keys, _from_children,
                                            flatten_func=_children)


when_imported("jax", _register_with_jax)


def local(leaf):
    """The array a leaf stores here: a ShardedArray's local block, else the leaf."""
    return leaf.local if isinstance(leaf, ShardedArray) else leaf


def writable(leaf):
    """`leaf`, or, when its array (a ShardedArray's local block) is
    immutable (JAX), the same leaf around a new copy that work done in
    place may write."""
    array = local(leaf)
    copy = writable_copy(array)
    if copy is array:
        return leaf
    return leaf.replace(copy) if isinstance(leaf, ShardedArray) else copy


def flatten(tree):
    """(leaves, treespec) of a pytree whose leaves are arrays. ShardedArray
    leaves stay whole: its optree node is registered only in concord's own
    namespace, so the default registry sees a leaf."""
    return optree.tree_flatten(tree)
