"""What the pytree functions of concord share (data_parallel, metrics, the
optimizers): ranks agreeing on what they pass before the collectives over
it, leaves grouped by kind, and fused collectives, one per kind of array,
over leaves packed into one buffer.
"""

import hashlib
import math

import numpy as np
from array_api_compat import device as array_device

from . import collectives
from .arrays import empty, namespace
from .errors import MismatchError

__all__ = ["agree", "flatten_like", "fused_all_gather", "fused_all_reduce", "fused_broadcast",
           "group_indices", "kind", "pack", "unpack"]


def flatten_like(treespec, tree, what, like="params"):
    """The leaves of `tree`, which must have `treespec`'s structure."""
    try:
        return treespec.flatten_up_to(tree)
    except ValueError as exc:
        raise ValueError(f"{what} must have the structure of {like}: {exc}") from None


# ---- ranks agreeing -------------------------------------------------------------

def _fingerprint(text):
    """64 bits identifying `text`, as an int64."""
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int(np.frombuffer(digest, np.int64)[0])


def agree(comm, text, mismatch, *, extra=(), mine=None):
    """Raises MismatchError on every rank of `comm` unless all passed the
    same `text` (a description of what they are about to communicate);
    returns the `extra` integers of every rank, one row per rank.

    One blocking all-gather of a fingerprint of `text` and `extra` (none on
    a communicator of one). The error starts with `mismatch`, names the
    groups of ranks that agree and ends with `mine`, what this rank passed,
    when given."""
    header = np.array([_fingerprint(text), *extra], np.int64)
    if comm.size == 1:
        return header[None, 1:]
    try:
        gathered = collectives.all_gather(header, tiled=False, comm=comm)
    except MismatchError as exc:  # ranks passed different numbers of extras
        raise MismatchError(f"{mismatch}: {exc}") from exc
    groups = group_indices(gathered[:, 0].tolist())
    if len(groups) > 1:
        parts = "; ".join(f"ranks {ranks}" for ranks in groups.values())
        message = f"{mismatch}; each group agrees within itself: {parts}"
        if mine is not None:
            message += f". This rank ({comm.rank}) passed {mine}"
        raise MismatchError(message)
    return gathered[:, 1:]


# ---- grouping -------------------------------------------------------------------

def group_indices(keys):
    """{key: the indices of `keys` equal to it}, keys in order of first
    appearance: the same on every rank that passed the same pytree."""
    groups = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    return groups


def kind(array):
    """What arrays must share to travel in one buffer: array type, dtype
    and device."""
    return type(array), array.dtype, str(array_device(array))


# ---- fused collectives ----------------------------------------------------------

def pack(values):
    """The values, flattened, one after another in a new buffer, which the
    collectives may write (a concatenation of one array can be that array
    itself: JAX's is)."""
    xp = namespace(values[0])
    flat = [xp.reshape(value, (-1,)) for value in values]
    return xp.concat(flat) if len(flat) > 1 else xp.asarray(flat[0], copy=True)


def unpack(buffer, values):
    """Views of `buffer`'s last axis shaped as `values`, in order; the
    leading axes (the ranks of a gather) are kept in front."""
    xp = namespace(buffer)
    lead = tuple(buffer.shape[:-1])
    parts, offset = [], 0
    for value in values:
        count = math.prod(value.shape)
        parts.append(xp.reshape(buffer[..., offset:offset + count], (*lead, *value.shape)))
        offset += count
    return parts


def _fused(values, start):
    """Calls start(values of one kind) -> Work for every kind, all in flight
    together, and returns the results unpacked in `values`' order."""
    pending = []
    for indices in group_indices(kind(value) for value in values).values():
        members = [values[i] for i in indices]
        pending.append((indices, members, start(members)))
    results = list(values)
    for indices, members, work in pending:
        for index, part in zip(indices, unpack(work.wait(), members)):
            results[index] = part
    return results


def fused_all_reduce(values, op, comm):
    """`values` reduced by `op` over `comm` into new arrays (the values are
    not written): one all-reduce per kind."""
    def start(members):
        buffer = pack(members)  # new: written in place whatever its library
        return comm._handle.all_reduce(buffer, buffer, op, True)
    return _fused(values, start)


def fused_broadcast(values, root, comm):
    """`root`'s values on every rank of `comm`, as new arrays: one broadcast
    per kind."""
    def start(members):
        # Only the root's data travels; the others just need the room.
        if comm.rank == root:
            buffer = pack(members)
        else:
            buffer = empty(members[0], (sum(math.prod(m.shape) for m in members),))
        return comm._handle.broadcast(buffer, buffer, root, True)
    return _fused(values, start)


def fused_all_gather(values, comm):
    """Every rank's values, each with a leading rank axis (ranks, *shape):
    one all-gather per kind."""
    return _fused(values, lambda members: collectives.all_gather(
        pack(members), tiled=False, comm=comm, async_op=True))
