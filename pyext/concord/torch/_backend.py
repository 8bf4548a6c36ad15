"""The torch.distributed backend "concord": each collective torch issues on
a process group runs as a concord collective on the group's communicator.

torch calls the methods below with lists of tensors that are also the
outputs (in place, as torch expects), and takes the Work they return.
Tensors on the host go to concord's CPU backend, CUDA tensors to NCCL
through concord, on torch's current stream. Every check below runs before
any communication.
"""

import torch
import torch.distributed as dist

from ..errors import ConcordError, InvalidArgumentError
from ._errors import backend_error, translated
from ._group import GroupComm
from ._work import Completions, Work

NAME = "concord"

_REDUCE_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "mean",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.PRODUCT: "prod",
}
# Booleans sum as "any" and multiply as "all", as torch's NCCL backend
# reduces them; concord reduces booleans with max and min.
_BOOLEAN_OPS = {"sum": "max", "prod": "min", "max": "max", "min": "min"}

# The element types concord reduces. Collectives that only move data move
# tensors of other types (int16, complex, float8, ...) as their bytes.
_CONCORD_DTYPES = frozenset({
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool,
})

# The backend methods torch calls for what concord has no collective for,
# with the torch.distributed calls that reach them.
_UNSUPPORTED = {
    "send": "send and isend (point-to-point)",
    "recv": "recv and irecv (point-to-point)",
    "recv_anysource": "recv and irecv from any source (point-to-point)",
    "alltoall": "all_to_all",
    "all_to_all_single": "all_to_all_single",
    "allgather_coalesced": "all_gather_coalesced",
    "all_gather_single_coalesced": "all_gather_into_tensor in a coalescing manager",
    "reduce_scatter_single_coalesced": "reduce_scatter_tensor in a coalescing manager",
    "allreduce_sparse": "all_reduce of sparse tensors",
}
# Host collectives moving at most this many bytes per rank run in the call
# (see ConcordBackend._issue).
EAGER_BYTES = 64 << 10

SUPPORTED = ("all_reduce (SUM, AVG, MAX, MIN, PRODUCT), all_reduce_coalesced, broadcast, "
             "all_gather, all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, "
             "barrier, reduce, gather, scatter")


def _op(opts, what, dtype):
    """concord's name of the reduce op torch passed in `opts`."""
    op = opts.reduceOp.op
    name = _REDUCE_OPS.get(op)
    if name is None:
        raise ValueError(f"concord: {what} does not support ReduceOp.{op.name}; "
                         "it supports SUM, AVG, MAX, MIN and PRODUCT")
    if dtype == torch.bool:
        if name not in _BOOLEAN_OPS:
            raise ValueError(f"concord: {what} does not support ReduceOp.{op.name} on bool "
                             "tensors; it supports SUM (any), PRODUCT (all), MAX and MIN")
        return _BOOLEAN_OPS[name]
    return name


def _check(tensors, what):
    """The device all of `tensors` are on, after checking concord can read
    and write each in place."""
    device = tensors[0].device
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"concord: {what} takes CPU or CUDA tensors, got {device}")
    for t in tensors:
        if t.layout != torch.strided:
            raise ValueError(f"concord: {what} takes dense tensors, got a {t.layout} tensor")
        if not t.is_contiguous():
            raise ValueError(f"concord: {what} takes contiguous tensors, got one of shape "
                             f"{tuple(t.shape)} with strides {t.stride()}")
        if t.device != device:
            raise ValueError(f"concord: {what} takes tensors on one device, got {device} "
                             f"and {t.device}")
    return device


def _check_like(tensors, template, numel, what, role):
    """Checks every tensor of `tensors` (`role` in messages) has
    `template`'s dtype and `numel` elements (any number when None)."""
    for t in tensors:
        if t.dtype != template.dtype:
            raise ValueError(f"concord: {what}: {role} has dtype {t.dtype}, "
                             f"expected {template.dtype}")
        if numel is not None and t.numel() != numel:
            raise ValueError(f"concord: {what}: {role} has {t.numel()} elements, "
                             f"expected {numel}")


def _one(tensors, what, role="tensor"):
    if len(tensors) != 1:
        raise ValueError(f"concord: {what} takes one {role} per rank, got {len(tensors)}")
    return tensors[0]


def _flat(t):
    """`t` as a 1-d view of its memory, as bytes when concord does not
    know its dtype."""
    flat = t.view(-1)
    return flat if t.dtype in _CONCORD_DTYPES else flat.view(torch.uint8)


def _nbytes(tensors):
    """Bytes in a (nested) list of tensors."""
    return sum(_nbytes(t) if isinstance(t, list) else t.numel() * t.element_size()
               for t in tensors)


def _unsupported(method, calls):
    def raise_unsupported(self, *args):
        raise NotImplementedError(f"concord: the backend does not support {calls} "
                                  f"(torch called {method}); it supports {SUPPORTED}")

    raise_unsupported.__name__ = method
    return raise_unsupported


class ConcordBackend(torch._C._distributed_c10d.Backend):
    """One process group's backend: its concord communicator and the thread
    that completes its asynchronous collectives."""

    def __init__(self, group_name, store, rank, size, timeout):
        super().__init__(rank, size)
        with translated():
            self._group = GroupComm(store, rank, size, timeout.total_seconds())
        self._comm = self._group.comm
        self._completions = Completions(f"concord-torch-group-{group_name}")
        self._group_name = group_name

    def getBackendName(self):
        return NAME

    def __repr__(self):
        return (f"ConcordBackend(group={self._group_name!r}, rank={self.rank()}, "
                f"size={self.size()})")

    # ---- issuing ---------------------------------------------------------------

    def _issue(self, device, result, start, finish=None):
        """Starts a collective and returns torch's Work giving `result`.
        start(async_op) calls concord (returning its Work when async_op);
        finish() runs once the data arrived.

        On CUDA concord enqueues the collective on the current stream and
        returns: the Work is complete at once, ordered on that stream as
        NCCL's are. On the host, collectives of at most EAGER_BYTES (and
        barriers) run before the call returns: they take microseconds,
        less than handing them to a thread, which costs well over a
        hundred on a busy host. Larger ones run asynchronously, completed
        in issue order by the group's thread."""
        if device.type == "cuda" or _nbytes(result) <= EAGER_BYTES:
            work = Work(result, [device] if device.type == "cuda" else ())
            try:
                start(False)
                if finish is not None:
                    finish()
            except InvalidArgumentError as error:
                raise backend_error(error) from error
            except ConcordError as error:  # in communication: the Work reports it, as if async
                work.complete(backend_error(error))
            else:
                work.complete()
            return work
        work = Work(result)
        with translated():
            concord_work = start(True)
        self._completions.add(concord_work, finish, work)
        return work

    # ---- collectives -------------------------------------------------------------

    def allreduce(self, tensors, opts):
        t = _one(tensors, "all_reduce")
        device = _check(tensors, "all_reduce")
        op = _op(opts, "all_reduce", t.dtype)
        return self._issue(device, tensors, lambda async_op: self._comm.all_reduce(
            t, t, op, async_op))

    def allreduce_coalesced(self, tensors, opts):
        if not tensors:
            raise ValueError("concord: all_reduce_coalesced takes at least one tensor")
        device = _check(tensors, "all_reduce_coalesced")
        _check_like(tensors, tensors[0], None, "all_reduce_coalesced", "a tensor")
        op = _op(opts, "all_reduce_coalesced", tensors[0].dtype)
        return self._issue(device, tensors, lambda async_op: self._comm.all_reduce_multi(
            tensors, op, async_op))

    def broadcast(self, tensors, opts):
        t = _one(tensors, "broadcast")
        device = _check(tensors, "broadcast")
        flat = _flat(t)
        root = opts.rootRank
        return self._issue(device, tensors, lambda async_op: self._comm.broadcast(
            flat, flat, root, async_op))

    def allgather(self, output_tensors, input_tensors, opts):
        x = _one(input_tensors, "all_gather", "input")
        outputs = self._per_rank(output_tensors, "all_gather", "output list")
        return self._gather(x, outputs, output_tensors, "all_gather")

    def _gather(self, x, outputs, result, what):
        """All-gathers `x` into a staging buffer, then copies rank r's block
        into outputs[r] (if any)."""
        device = _check([x, *outputs], what)
        _check_like(outputs, x, x.numel(), what, "an output")
        gathered = torch.empty((self.size(), x.numel()), dtype=x.dtype, device=device)

        def finish():
            for out, block in zip(outputs, gathered):
                out.view(-1).copy_(block)

        return self._issue(device, result, lambda async_op: self._comm.all_gather(
            _flat(x), _flat(gathered), async_op, None), finish)

    def all_gather_single(self, output, input, opts):
        device = _check([input, output], "all_gather_into_tensor")
        _check_like([output], input, self.size() * input.numel(), "all_gather_into_tensor",
                    "the output")
        return self._issue(device, [output], lambda async_op: self._comm.all_gather(
            _flat(input), _flat(output), async_op, None))

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        out = _one(output_tensors, "reduce_scatter", "output")
        inputs = self._per_rank(input_tensors, "reduce_scatter", "input list")
        device = _check([out, *inputs], "reduce_scatter")
        _check_like(inputs, out, out.numel(), "reduce_scatter", "an input")
        op = _op(opts, "reduce_scatter", out.dtype)
        blocks = torch.cat([t.view(-1) for t in inputs])
        return self._issue(device, output_tensors, lambda async_op: self._comm.reduce_scatter(
            blocks, out.view(-1), op, async_op))

    def reduce_scatter_single(self, output, input, opts):
        device = _check([output, input], "reduce_scatter_tensor")
        _check_like([input], output, self.size() * output.numel(), "reduce_scatter_tensor",
                    "the input")
        op = _op(opts, "reduce_scatter_tensor", output.dtype)
        return self._issue(device, [output], lambda async_op: self._comm.reduce_scatter(
            input.view(-1), output.view(-1), op, async_op))

    def barrier(self, opts):
        # A host barrier: ranks issue it in order with their other collectives.
        return self._issue(torch.device("cpu"), [], self._comm.barrier)

    # The three below are collectives with a root, which concord has none of:
    # each runs as the collective every rank receives the result of, which
    # moves more data (said in each) but gives torch's results.

    def reduce(self, tensors, opts):
        """An all-reduce whose result only the root keeps."""
        t = _one(tensors, "reduce")
        device = _check(tensors, "reduce")
        op = _op(opts, "reduce", t.dtype)
        out = t if self.rank() == opts.rootRank else torch.empty_like(t)
        return self._issue(device, tensors, lambda async_op: self._comm.all_reduce(
            t, out, op, async_op))

    def gather(self, output_tensors, input_tensors, opts):
        """An all-gather that only the root copies out: every rank receives
        every rank's tensor."""
        x = _one(input_tensors, "gather", "input")
        outputs = []
        if self.rank() == opts.rootRank:
            outputs = self._per_rank(output_tensors, "gather", "output list")
        return self._gather(x, outputs, output_tensors, "gather")

    def scatter(self, output_tensors, input_tensors, opts):
        """A broadcast of the root's whole list, of which each rank copies
        its block: every rank receives every block."""
        out = _one(output_tensors, "scatter", "output")
        root = opts.rootRank
        inputs = []
        if self.rank() == root:
            inputs = self._per_rank(input_tensors, "scatter", "input list")
        device = _check([out, *inputs], "scatter")
        _check_like(inputs, out, out.numel(), "scatter", "an input")
        if inputs:
            blocks = torch.stack([t.view(-1) for t in inputs])
        else:
            blocks = torch.empty((self.size(), out.numel()), dtype=out.dtype, device=device)

        def finish():
            out.view(-1).copy_(blocks[self.rank()])

        return self._issue(device, output_tensors, lambda async_op: self._comm.broadcast(
            _flat(blocks), _flat(blocks), root, async_op), finish)

    def _per_rank(self, lists, what, role):
        """The one list of a tensor per rank that torch passes in `lists`."""
        tensors = _one(lists, what, role)
        if len(tensors) != self.size():
            raise ValueError(f"concord: {what}: the {role} holds {len(tensors)} tensors, "
                             f"expected one per rank ({self.size()})")
        return tensors

    # ---- lifetime ------------------------------------------------------------------

    def shutdown(self):
        """Finishes the collectives issued, then closes the communicator;
        torch calls it once per device the backend serves."""
        self._completions.close()
        self._group.close()

    def abort(self):
        """Fails the pending collectives here and on the peers."""
        self._group.abort()
        self.shutdown()


for _method, _calls in _UNSUPPORTED.items():
    setattr(ConcordBackend, _method, _unsupported(_method, _calls))


def create(options, backend_options):
    """torch's constructor of a group's backend (extended API: `options`
    carries the group's store, rank, size, timeout and name)."""
    if backend_options is not None:
        raise ValueError(f"concord: the backend takes no pg_options, got {backend_options!r}")
    return ConcordBackend(options.group_id, options.store, options.group_rank,
                          options.group_size, options.timeout)


def register():
    """Makes "concord" a torch.distributed backend for CPU and CUDA tensors."""
    dist.Backend.register_backend(NAME, create, extended_api=True, devices=["cpu", "cuda"])
