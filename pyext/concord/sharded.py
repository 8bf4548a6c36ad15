"""ShardedArray: this rank's block of an array split over mesh axes.

concord's functions take pytrees (optree) whose leaves may be
ShardedArray: data_parallel makes and gathers them (shard_params,
gather_params) and reduces gradients by how each leaf is sharded; the
optimizers, clip_grad_norm and GradientSynchronizer work on each leaf's
local block.
"""

import operator

import optree

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
    blocks and keeps the sharding (an optimizer step on shards, say).
    """

    __slots__ = ("local", "global_shape", "dim", "axis_name")

    def __init__(self, local, global_shape, dim, axis_name):
        self.local = local
        self.global_shape = tuple(operator.index(size) for size in global_shape)
        self.dim = operator.index(dim)
        if not 0 <= self.dim < len(self.global_shape):
            raise InvalidArgumentError(
                f"ShardedArray: dim {dim} is out of range for shape {self.global_shape}")
        self.axis_name = axis_name

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


optree.register_pytree_node(
    ShardedArray,
    lambda array: ((array.local,), (array.global_shape, array.dim, array.axis_name)),
    lambda metadata, children: ShardedArray(children[0], *metadata),
    namespace=SHARDED_ARRAY_NAMESPACE,
)


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
    leaves stay whole: its pytree node is registered only in concord's own
    optree namespace, so the default registry sees a leaf."""
    return optree.tree_flatten(tree)
