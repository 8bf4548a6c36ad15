"""Fused multi-tensor optimizers over pytrees of arrays.

    opt = concord.optim.AdamW(lr=1e-3)
    opt_state = opt.init(params)
    params, opt_state = opt.step(params, grads, opt_state)

Parameters are any pytree (optree: dict, list, tuple, namedtuple, None
leaves) of NumPy or DLPack arrays (float32 or float64). A step is one C call
over every leaf: the parameters and the optimizer's buffers are updated in
place, and the same parameter pytree is returned, so functional code
(``params, opt_state = opt.step(...)``) and in-place code both work. JAX
arrays are immutable and never written: a step on JAX parameters (or
buffers) updates new arrays, returned in new pytrees, and leaves its inputs
as they were; use what it returns.

The optimizer state is a dict pytree: ``"step"`` (the number of steps taken,
an int) and one buffer pytree shaped like the parameters per buffer kind
(``"momentum_buffer"`` for SGD with momentum, ``"exp_avg"`` and
``"exp_avg_sq"`` for AdamW). It can be saved and restored like parameters.

Leaves that are ``concord.sharded.ShardedArray`` are updated through
their local shard (an optimizer step is elementwise); their buffers are
shaped like the shard.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from . import _capi, collectives
from ._host import on_cuda
from ._pytree import flatten_like
from .arrays import device, is_immutable, namespace
from .errors import InvalidArgumentError
from .mesh import axis_comm
from .sharded import ShardedArray, flatten, local, writable

__all__ = ["SGD", "AdamW", "clip_grad_norm"]


def _is_sharded(x) -> bool:
    return isinstance(x, ShardedArray)


def _zeros_like(x):
    x = local(x)
    return namespace(x).zeros_like(x)


class _Optimizer:
    """Shared plumbing: the learning rate (a float or a schedule) and
    flattening parameters, gradients and buffers against one structure.

    A subclass sets its options in __init__, then calls _check_options();
    _kernel runs its fused C step, which checks every option before it
    touches anything."""

    _buffers: tuple[str, ...] = ()

    def __init__(self, lr: float | Callable[[int], float]):
        self.lr = lr

    def _check_options(self) -> None:
        """Raises InvalidArgumentError now, as torch.optim does, for options
        the step would refuse: the C step, on no tensors, checks them and
        does nothing else. A schedule's rates are checked at every step."""
        lr = 0.0 if callable(self.lr) else self.lr
        self._kernel([], [], {name: [] for name in self._buffers}, lr, 1)

    def _lr_at(self, step: int) -> float:
        """The learning rate of the 1-based `step`."""
        return self.lr(step) if callable(self.lr) else self.lr

    def init(self, params) -> dict:
        """The state before the first step: step 0 and zeroed buffers
        shaped like `params`."""
        leaves, treespec = flatten(params)
        state = {"step": 0}
        for name in self._buffers:
            state[name] = treespec.unflatten([_zeros_like(x) for x in leaves])
        return state

    def step(self, params, grads, opt_state):
        """One update of every parameter, in place; returns (params,
        opt_state). Immutable (JAX) parameters and buffers are not written:
        new arrays take their place in the pytrees returned."""
        leaves, treespec = flatten(params)
        grad_leaves = flatten_like(treespec, grads, "grads")
        missing = [name for name in ("step", *self._buffers) if name not in opt_state]
        if missing:
            raise ValueError(f"opt_state lacks {', '.join(map(repr, missing))}: "
                             f"make it with {type(self).__name__}.init(params)")
        buffers = {name: flatten_like(treespec, opt_state[name], f"opt_state[{name!r}]")
                   for name in self._buffers}
        updated = [writable(x) for x in leaves]
        updated_buffers = {name: [writable(x) for x in values] for name, values in buffers.items()}
        step = opt_state["step"] + 1
        self._kernel([local(x) for x in updated], [local(g) for g in grad_leaves],
                     {name: [local(x) for x in values] for name, values in updated_buffers.items()},
                     self._lr_at(step), step)
        new_state = {**opt_state, "step": step}
        if all(a is b for a, b in zip(updated, leaves)) and all(
                a is b for name in buffers for a, b in zip(updated_buffers[name], buffers[name])):
            return params, new_state
        new_state.update({name: treespec.unflatten(values)
                          for name, values in updated_buffers.items()})
        return treespec.unflatten(updated), new_state

    def _kernel(self, params: list, grads: list, buffers: dict, lr: float, step: int) -> None:
        raise NotImplementedError


class SGD(_Optimizer):
    """Stochastic gradient descent with torch.optim.SGD's update rule
    (dampening 0):

        g = grad + weight_decay * p
        b = g on the first step, else momentum * b + g       (momentum > 0)
        g = g + momentum * b if nesterov else b              (momentum > 0)
        p = p - lr * g

    `lr` is a float or a schedule: a function of the 1-based step count.
    """

    def __init__(self, lr, momentum=0.0, nesterov=False, weight_decay=0.0):
        super().__init__(lr)
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.weight_decay = float(weight_decay)
        self._buffers = ("momentum_buffer",) if self.momentum else ()
        self._check_options()

    def _kernel(self, params, grads, buffers, lr, step):
        _capi.sgd_step(params, grads, buffers.get("momentum_buffer"), lr, self.momentum,
                       self.weight_decay, self.nesterov, step)

    def __repr__(self):
        return (f"SGD(lr={self.lr!r}, momentum={self.momentum}, nesterov={self.nesterov}, "
                f"weight_decay={self.weight_decay})")


class AdamW(_Optimizer):
    """Adam with decoupled weight decay, torch.optim.AdamW's update rule:

        p = p * (1 - lr * weight_decay)
        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * grad**2
        p = p - lr / (1 - beta1**t) * m / (sqrt(v / (1 - beta2**t)) + eps)

    `lr` is a float or a schedule: a function of the 1-based step count t.
    """

    _buffers = ("exp_avg", "exp_avg_sq")

    def __init__(self, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(lr)
        beta1, beta2 = betas
        self.betas = (float(beta1), float(beta2))
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)
        self._check_options()

    def _kernel(self, params, grads, buffers, lr, step):
        beta1, beta2 = self.betas
        _capi.adamw_step(params, grads, buffers["exp_avg"], buffers["exp_avg_sq"], lr, beta1,
                         beta2, self.eps, self.weight_decay, step)

    def __repr__(self):
        return (f"AdamW(lr={self.lr!r}, betas={self.betas}, eps={self.eps}, "
                f"weight_decay={self.weight_decay})")


def _shard_groups(sharded: list, comm) -> list:
    """(communicator, local shards) pairs: ShardedArray leaves grouped by the
    communicator of the axis each is sharded on (or `comm`)."""
    groups: dict = {}
    for leaf in sharded:
        over = axis_comm(leaf.axis_name) if comm is None else comm
        groups.setdefault(id(over), (over, []))[1].append(leaf.local)
    return list(groups.values())


def _zero_sum(like):
    """A one-element float64 zero where `like` lives: on its CUDA device, or
    a NumPy array on the host."""
    if like is not None and on_cuda(like):
        xp = namespace(like)
        return xp.zeros((1,), dtype=xp.float64, device=device(like))
    return np.zeros(1)


def clip_grad_norm(grads, max_norm: float, *, comm=None):
    """Scales `grads` in place so their global L2 norm is at most `max_norm`
    and returns the norm before clipping: a float for host arrays; for CUDA
    arrays a 0-d array of their type on their device, as nothing here waits
    for the device (``float(norm)`` does). As
    torch.nn.utils.clip_grad_norm_, the factor is
    min(1, max_norm / (norm + 1e-6)): a NaN norm makes every gradient NaN,
    an infinite one multiplies them by 0.

    The norm covers every leaf in one fused pass (float64 accumulation).
    Leaves that are ShardedArray hold a shard of a larger gradient: their
    squares are summed over the axis they are sharded on (resolved against
    the active mesh; with none, the world), or over `comm` when it is given,
    so every rank gets the norm of the full gradients. Replicated leaves are
    counted once, as they are: call this after the gradients were
    synchronised.

    The sum of squares stays where the leaves live (on the device for CUDA
    leaves, with no host synchronisation), and the C kernel that scales
    them computes the factor from it, on the host as on a device.

    JAX gradients are refused (InvalidArgumentError, before any
    communication): they are immutable, and this function's contract is
    to scale in place.
    """
    leaves, _ = flatten(grads)
    arrays = [local(leaf) for leaf in leaves]
    if any(map(is_immutable, arrays)):
        raise InvalidArgumentError(
            "clip_grad_norm scales the gradients in place, and JAX arrays are immutable: "
            "clip JAX gradients in JAX (optax.clip_by_global_norm, say)")
    total = _zero_sum(arrays[0] if arrays else None)
    sharded = [leaf for leaf in leaves if _is_sharded(leaf)]
    if sharded:  # max_norm is checked (by the kernel, on no arrays) before sums travel
        _capi.clip_by_sum_of_squares([], total, max_norm)
    replicated = [local(leaf) for leaf in leaves if not _is_sharded(leaf)]
    if replicated:
        _capi.sum_of_squares_into(replicated, total)
    for over, shards in _shard_groups(sharded, comm):
        partial = _zero_sum(shards[0])
        _capi.sum_of_squares_into(shards, partial)
        collectives.all_reduce(partial, comm=over, out=partial)
        total = total + partial
    _capi.clip_by_sum_of_squares(arrays, total, max_norm)
    if isinstance(total, np.ndarray):
        return math.sqrt(total[0])
    return namespace(total).sqrt(total)[0]
