"""Data-parallel training steps: bucketed gradient synchronisation and a
framework-agnostic train_step.

    sync = GradientSynchronizer(params)              # plan buckets once
    opt = concord.optim.AdamW(lr=1e-3)
    state = {"params": params, "opt_state": opt.init(params)}
    for batch in shards:                              # this rank's part of each global batch
        state, metrics = train_step(grad_fn, opt, state, batch, sync=sync)

Gradients are any pytree of NumPy or DLPack arrays shaped like the
parameters; they are synchronised in place, except JAX arrays (immutable),
whose synchronised values are new arrays, returned.
"""

from __future__ import annotations

import operator

import numpy as np

from . import collectives
from ._capi import GradSync
from ._pytree import flatten_like
from .arrays import is_immutable
from .communicator import Communicator, world
from .errors import InvalidArgumentError
from .sharded import flatten, local, writable

__all__ = ["GradientSynchronizer", "train_step"]


def _communicator(comm):
    return world() if comm is None else comm


class GradientSynchronizer:
    """Averages (or sums) gradients over a communicator in buckets, as
    torch DDP and Horovod's tensor fusion do.

    `params` (a pytree of arrays, or anything shaped like the gradients)
    fixes the plan: buckets are filled in `ready_order` (leaf indices in the
    order backward produces their gradients; default: reverse leaf order),
    the first up to `first_bucket_mb` MiB so communication starts early, the
    rest up to `bucket_cap_mb` MiB; a gradient is never split, and a bucket
    holds one dtype. Creating it is collective: every rank must pass the
    same structure, shapes and options (MismatchError otherwise).

    Each step either calls ``mark_ready(index, grad)`` as each gradient is
    produced (a full bucket starts its all-reduce at once, overlapping the
    rest of backward) and then ``wait()``, or ``synchronize(grads)`` with
    all of them. The mean's 1/size scaling is applied while packing.

    `compress` ("bf16" or "fp16") sends float32 gradients as 16-bit floats
    with float32 accumulation: each result is within 2**-7 (bf16) or 2**-10
    (fp16) times the mean of |grad| over the ranks of the exact one.

    ShardedArray leaves are synchronised through their local shard, so
    `comm` should be the communicator of the data-parallel axis. Close it
    (or use it as a context manager) before closing its communicator.
    """

    def __init__(self, params, *, comm=None, bucket_cap_mb=25, first_bucket_mb=1,
                 reduce="mean", compress=None, ready_order=None):
        leaves, self._treespec = flatten(params)
        if not leaves:
            raise ValueError("params has no array leaves to synchronise")
        self.comm = _communicator(comm)
        # The C library checks every option, before any communication.
        self._sync = GradSync(self.comm._handle, [local(x) for x in leaves], ready_order,
                              bucket_cap_mb, first_bucket_mb,
                              reduce.lower() if isinstance(reduce, str) else reduce, compress)
        self._marked: list = [None] * len(leaves)
        # synchronize() marks in bucket order, so every bucket starts as soon
        # as its own gradients are in.
        self._order = sorted(range(len(leaves)), key=self._sync.bucket_of)

    @property
    def num_grads(self) -> int:
        return len(self._marked)

    @property
    def num_buckets(self) -> int:
        return self._sync.num_buckets

    def bucket_of(self, index: int) -> int:
        """The bucket gradient `index` travels in; buckets are numbered in
        the order they fill and start."""
        return self._sync.bucket_of(self._check_index(index))

    def _check_index(self, index) -> int:
        # The C library checks the upper bound; a negative index has no size_t.
        index = operator.index(index)
        if index < 0:
            raise InvalidArgumentError(
                f"gradient index {index} is outside [0, {len(self._marked)})")
        return index

    def mark_ready(self, index: int, grad) -> None:
        """Hands over gradient `index` (leaf order of `params`); it must stay
        alive and unmodified until wait(), which writes the result into it
        (into a copy of it for a JAX array, which is never written).
        Marking an index twice in one step raises ValueError."""
        index = self._check_index(index)
        grad = writable(grad)
        self._sync.mark_ready(index, local(grad))
        self._marked[index] = grad

    def wait(self):
        """Finishes every bucket and returns the marked gradients, now
        synchronised, as a pytree shaped like `params`. Raises ValueError
        naming the gradients not marked yet (the step then stays open)."""
        self._sync.wait()
        marked, self._marked = self._marked, [None] * len(self._marked)
        return self._treespec.unflatten(marked)

    def synchronize(self, grads):
        """Synchronises a whole pytree of gradients in place (marked in the
        planned ready order) and returns it; with JAX leaves, which are
        never written, a new pytree holding new arrays in their place."""
        leaves = flatten_like(self._treespec, grads, "grads")
        for index in self._order:
            self.mark_ready(index, leaves[index])
        synchronised = self.wait()
        return synchronised if any(is_immutable(local(leaf)) for leaf in leaves) else grads

    def close(self) -> None:
        """Releases the buckets (waiting for any still in flight)."""
        self._sync.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def _batch_size(batch) -> int:
    """Samples in a batch: the leading dimension of its first leaf (1 for a
    batch of scalars)."""
    leaves, _ = flatten(batch)
    shape = getattr(leaves[0], "shape", ()) if leaves else ()
    return int(shape[0]) if len(shape) else 1


def _sync_communicator(sync):
    if isinstance(sync, GradientSynchronizer):
        return sync.comm
    if sync is True:
        return world()
    if isinstance(sync, Communicator):
        return sync
    raise TypeError(f"sync must be a GradientSynchronizer, a Communicator or True, "
                    f"got {type(sync).__name__}")


def _synchronize(grads, sync, comm):
    """`grads` averaged over the ranks as `sync` says: in place, except
    JAX leaves, replaced by new arrays."""
    if isinstance(sync, GradientSynchronizer):
        return sync.synchronize(grads)
    leaves, treespec = flatten(grads)
    leaves = [writable(g) for g in leaves]
    comm._handle.all_reduce_multi([local(g) for g in leaves], "mean", False)
    return treespec.unflatten(leaves)


def train_step(grad_fn, optimizer, state: dict, batch, *, sync):
    """One data-parallel step; returns (new_state, {"loss": global mean loss}).

    - `grad_fn(params, batch) -> (loss, grads)`: the user's forward and
      backward in any framework; `loss` is this rank's mean over its batch
      (a scalar), `grads` a pytree shaped like the parameters.
    - `optimizer`: a concord.optim optimizer (anything with
      ``step(params, grads, opt_state) -> (params, opt_state)``).
    - `state`: ``{"params": pytree, "opt_state": optimizer.init(params),
      ...}``; other keys are carried over unchanged.
    - `batch`: this rank's shard of the global batch (any pytree).
    - `sync`: a GradientSynchronizer (bucketed); or a Communicator, or True
      for the world, to average every gradient with one fused all-reduce per
      dtype.

    Gradients are averaged over ranks with equal weights, as DDP does, so
    equal shards give exactly the gradient of the global batch. The loss
    returned is the global mean over samples: each rank's loss is weighted
    by its batch size (the leading dimension of the batch's first leaf), so
    it is also right when the last batch is uneven.
    """
    comm = _sync_communicator(sync)
    loss, grads = grad_fn(state["params"], batch)
    size = _batch_size(batch)
    totals = np.array([float(loss) * size, size], dtype=np.float64)
    # The loss travels while the gradients are being synchronised.
    loss_work = collectives.all_reduce(totals, comm=comm, out=totals, async_op=True)
    grads = _synchronize(grads, sync, comm)
    params, opt_state = optimizer.step(state["params"], grads, state["opt_state"])
    loss_sum, samples = loss_work.wait()
    return ({**state, "params": params, "opt_state": opt_state},
            {"loss": float(loss_sum / samples)})
