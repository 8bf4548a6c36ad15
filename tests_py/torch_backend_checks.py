"""The rank side of test_torch_backend.py: torch.distributed on the
"concord" backend, checked in the ranks of one job.

- every collective torch's API offers on it, against a reference computed
  here from every rank's data (each rank regenerates all of it from
  (seed, rank, case)), over dtypes and odd shapes, in place, async;
- DistributedDataParallel on "concord" against the same training on
  "gloo" (a gloo group of the same ranks), with its variants;
- subgroups from new_group, members and non-members;
- the errors: unsupported ops and reduce ops, bad input, ranks that
  disagree.

Failures are collected (RankChecks), so every rank keeps issuing the same
collectives and one run reports all of them.
"""

from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import concord.torch  # noqa: F401  (registers the backend)
from concord.torch import allreduce_mean_hook
from helpers import RankChecks, host, rank_data, wide_reference

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
    "int64": torch.int64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
# Types concord has no reduction for, which the collectives that only move
# data carry as bytes.
MOVED_ONLY = ("int16", "complex64")
SHAPES = [(), (0,), (1,), (7,), (3, 5, 2), (65537,)]
TOLERANCE = {"float16": (2e-3, 2e-3), "bfloat16": (1e-2, 1e-2), "float32": (1e-5, 1e-6),
             "float64": (1e-12, 1e-12)}
REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX,
              "min": dist.ReduceOp.MIN, "prod": dist.ReduceOp.PRODUCT}
# Booleans: SUM is "any" and PRODUCT "all" (max and min), AVG is refused.
BOOL_OPS = {"sum": "max", "max": "max", "min": "min", "prod": "min"}


def difference(result, expected):
    """What is wrong with tensor `result`, or None."""
    if not isinstance(result, torch.Tensor):
        return f"result is a {type(result).__name__}, expected a tensor"
    if result.dtype != expected.dtype or result.shape != expected.shape:
        return (f"result is {result.dtype}{list(result.shape)}, "
                f"expected {expected.dtype}{list(expected.shape)}")
    if result.device != expected.device:
        return f"result is on {result.device}, expected {expected.device}"
    name = str(expected.dtype).removeprefix("torch.")
    if name in MOVED_ONLY:  # compared bit for bit
        got, want = host(result.view(torch.uint8)), host(expected.view(torch.uint8))
    else:
        got, want = host(result), host(expected)
    if name in TOLERANCE:
        rtol, atol = TOLERANCE[name]
        equal = np.isclose(got.astype(np.float64), want.astype(np.float64), rtol, atol)
    else:
        equal = got == want
    if np.all(equal):
        return None
    equal = np.atleast_1d(equal)
    first = np.unravel_index(np.argmin(equal), equal.shape)
    return (f"{np.count_nonzero(~equal)} elements differ, first at {tuple(map(int, first))}: "
            f"{np.atleast_1d(got)[first]!r} != {np.atleast_1d(want)[first]!r}")


class Checks(RankChecks):
    """One rank's checks on `device`, in `group` (None: the world)."""

    def __init__(self, seed, device, group=None):
        super().__init__(seed, dist.get_rank(group), dist.get_world_size(group))
        self.device = device
        self.group = group
        self.checks = 0

    def difference(self, result, expected):
        return difference(result, expected)

    def expect(self, label, result, expected):
        self.checks += 1
        super().expect(label, result, expected)

    def expect_true(self, label, condition):
        self.checks += 1
        super().expect_true(label, condition)

    def expect_raises(self, label, error, words, fn):
        """Checks fn() raises `error` with every one of `words` in its message."""
        self.checks += 1
        try:
            fn()
        except error as exc:
            missing = [w for w in words if w not in str(exc)]
            if missing:
                self.fail(label, f"the message lacks {missing}: {exc}")
        except Exception as exc:  # reported, not raised: the ranks go on together
            self.fail(label, f"raised {type(exc).__name__}: {exc}, expected {error.__name__}")
        else:
            self.fail(label, f"raised nothing, expected {error.__name__}")

    def data(self, dtype, shape, op="sum"):
        """Every rank's tensor for a new case; this rank's is [self.rank]."""
        self.case += 1
        if dtype == "complex64":
            parts = [[rank_data(self.seed, r, self.case, "float32", shape, op) for r in
                      range(self.size)] for _ in range(2)]
            arrays = [re + 1j * im for re, im in zip(*parts)]
            return [torch.from_numpy(a.astype(np.complex64)).to(self.device) for a in arrays]
        torch_dtype = DTYPES.get(dtype) or getattr(torch, dtype)
        return [torch.from_numpy(np.array(rank_data(self.seed, r, self.case, dtype, shape, op)))
                .to(self.device, torch_dtype) for r in range(self.size)]

    def reference(self, tensors, op, dtype):
        """`op` over the tensors as concord defines it, in their dtype."""
        if dtype == "bool":
            op = BOOL_OPS[op]
        wide = wide_reference([host(t) for t in tensors], op, dtype)
        return torch.from_numpy(np.array(wide)).to(self.device, tensors[0].dtype)

    # ---- all_reduce -----------------------------------------------------------

    def ops(self, dtype):
        return [op for op in REDUCE_OPS if not (dtype == "bool" and op == "mean")]

    def all_reduce(self, dtype, shape):
        for op in self.ops(dtype):
            xs = self.data(dtype, shape, op)
            t = xs[self.rank].clone()
            returned = dist.all_reduce(t, REDUCE_OPS[op], group=self.group)
            self.expect_true(f"all_reduce {op} {dtype} {shape}: returned {returned!r}",
                             returned is None)
            self.expect(f"all_reduce {op} {dtype} {shape} in place", t,
                        self.reference(xs, op, dtype))

    def all_reduce_async(self, dtype, shape):
        """Every op issued before any is waited for, then waited for in
        reverse order; results read from the tensors, the works' futures,
        and a callback chained on a future."""
        cases = [(op, self.data(dtype, shape, op)) for op in self.ops(dtype)]
        tensors = [xs[self.rank].clone() for _, xs in cases]
        works = [dist.all_reduce(t, REDUCE_OPS[op], group=self.group, async_op=True)
                 for t, (op, _) in zip(tensors, cases)]
        chained = works[0].get_future().then(lambda fut: fut.value()[0].clone())
        for t, work, (op, xs) in reversed(list(zip(tensors, works, cases))):
            label = f"all_reduce {op} {dtype} {shape} async"
            expected = self.reference(xs, op, dtype)
            self.expect_true(f"{label}: wait() returned False", work.wait())
            self.expect(label, t, expected)
            (result,) = work.get_future().wait()
            self.expect_true(f"{label}: the future gives another tensor", result is t)
        self.expect(f"all_reduce {dtype} {shape}: a callback on the future", chained.wait(),
                    self.reference(cases[0][1], cases[0][0], dtype))

    def all_reduce_coalesced(self, dtype):
        """Tensors of several shapes (torch wants one dtype) in one call."""
        xs = [self.data(dtype, shape) for shape in ((7,), (3, 2), (1,), (0,), (65537,))]
        mine = [x[self.rank].clone() for x in xs]
        dist.all_reduce_coalesced(mine, group=self.group)
        for t, x in zip(mine, xs):
            self.expect(f"all_reduce_coalesced {dtype} {tuple(t.shape)}", t,
                        self.reference(x, "sum", dtype))

    # ---- data movement ----------------------------------------------------------

    def broadcast(self, dtype, shape):
        xs = self.data(dtype, shape)
        root = self.case % self.size
        t = xs[self.rank].clone()
        dist.broadcast(t, self.global_rank(root), group=self.group)
        self.expect(f"broadcast {dtype} {shape} from {root}", t, xs[root])

    def all_gather(self, dtype, shape):
        label = f"all_gather {dtype} {shape}"
        xs = self.data(dtype, shape)
        x = xs[self.rank].clone()
        outputs = [torch.empty(shape, dtype=x.dtype, device=self.device) for _ in xs]
        dist.all_gather(outputs, x, group=self.group)
        for r, (out, expected) in enumerate(zip(outputs, xs)):
            self.expect(f"{label} list [{r}]", out, expected)
        self.expect(f"{label}: the input changed", x, xs[self.rank])

        stacked = torch.empty((self.size, *shape), dtype=x.dtype, device=self.device)
        dist.all_gather_into_tensor(stacked, x, group=self.group)
        self.expect(f"{label} into a stacked tensor", stacked, torch.stack(xs))
        if shape:
            xs = self.data(dtype, shape)
            out = torch.empty((self.size * shape[0], *shape[1:]), dtype=x.dtype,
                              device=self.device)
            work = dist.all_gather_into_tensor(out, xs[self.rank], group=self.group,
                                               async_op=True)
            work.wait()
            self.expect(f"{label} into a concatenated tensor, async", out, torch.cat(xs))

    def reduce_scatter(self, dtype, shape):
        for op in self.ops(dtype):
            label = f"reduce_scatter {op} {dtype} {shape}"
            xs = self.data(dtype, (self.size, *shape), op)
            expected = self.reference([x[self.rank] for x in xs], op, dtype)
            out = torch.empty(shape, dtype=xs[0].dtype, device=self.device)
            x = xs[self.rank].clone()
            dist.reduce_scatter_tensor(out, x, REDUCE_OPS[op], group=self.group)
            self.expect(f"{label} tensor", out, expected)
            self.expect(f"{label}: the input changed", x, xs[self.rank])
            out = torch.empty(shape, dtype=xs[0].dtype, device=self.device)
            dist.reduce_scatter(out, list(x.unbind(0)), REDUCE_OPS[op], group=self.group)
            self.expect(f"{label} list", out, expected)

    def reduce(self, dtype, shape):
        """reduce to a root that moves with the case: the others' tensors
        stay as they were."""
        xs = self.data(dtype, shape)
        root = self.case % self.size
        t = xs[self.rank].clone()
        op = "max" if dtype == "bool" else "sum"
        dist.reduce(t, self.global_rank(root), REDUCE_OPS[op], group=self.group)
        self.expect(f"reduce {op} {dtype} {shape} to {root}", t,
                    self.reference(xs, op, dtype) if self.rank == root else xs[self.rank])

    def gather_and_scatter(self, dtype, shape):
        xs = self.data(dtype, shape)
        root = self.case % self.size
        outputs = None
        if self.rank == root:
            outputs = [torch.empty(shape, dtype=xs[0].dtype, device=self.device) for _ in xs]
        dist.gather(xs[self.rank], outputs, self.global_rank(root), group=self.group)
        for r, out in enumerate(outputs or []):
            self.expect(f"gather {dtype} {shape} to {root} [{r}]", out, xs[r])

        blocks = self.data(dtype, (self.size, *shape))
        root = self.case % self.size
        out = torch.empty(shape, dtype=blocks[0].dtype, device=self.device)
        inputs = list(blocks[root].unbind(0)) if self.rank == root else None
        dist.scatter(out, inputs, self.global_rank(root), group=self.group)
        self.expect(f"scatter {dtype} {shape} from {root}", out, blocks[root][self.rank])

    def global_rank(self, group_rank):
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)


def collectives(checks):
    for dtype in DTYPES:
        for shape in SHAPES:
            checks.all_reduce(dtype, shape)
            checks.all_reduce_async(dtype, shape)
            checks.broadcast(dtype, shape)
            checks.all_gather(dtype, shape)
            checks.reduce_scatter(dtype, shape)
            checks.reduce(dtype, shape)
            checks.gather_and_scatter(dtype, shape)
    for dtype in MOVED_ONLY:
        for shape in ((7,), (3, 5, 2)):
            checks.broadcast(dtype, shape)
            checks.all_gather(dtype, shape)
            checks.gather_and_scatter(dtype, shape)
    for dtype in ("float32", "bfloat16", "int64", "bool"):
        checks.all_reduce_coalesced(dtype)
    dist.barrier(group=checks.group)
    work = dist.barrier(group=checks.group, async_op=True)
    checks.expect_true("barrier async: wait() returned False", work.wait())


# ---- DistributedDataParallel ----------------------------------------------------------

DDP_STEPS = 4
DDP_VARIANTS = {
    "default": {},
    "one bucket per parameter": {"bucket_cap_mb": 0.0005},
    "gradient as bucket view": {"gradient_as_bucket_view": True},
    "unused parameters": {"find_unused_parameters": True},
    "bf16 compression hook": {"hook": default_hooks.bf16_compress_hook},
    # concord's hook against torch's default one, which gloo runs (gloo has
    # no ReduceOp.AVG).
    "concord's mean hook, gradient as bucket view": {
        "hook": (allreduce_mean_hook, default_hooks.allreduce_hook),
        "gradient_as_bucket_view": True},
}
DDP_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
# The hook all-reduces bfloat16 gradients: gloo sums them in bfloat16 rank
# after rank, concord in float32 rounded once, an ulp or two apart.
DDP_HOOK_TOLERANCE = {"rtol": 1e-2, "atol": 5e-3}


class Net(torch.nn.Module):
    """An MLP of odd sizes with a batch norm (buffers DDP broadcasts) and a
    last layer that the "unused parameters" variant skips every other step.
    fc2's weight is larger than the backend's EAGER_BYTES, the others
    smaller: buckets take both of its paths."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(13, 31)
        self.bn = torch.nn.BatchNorm1d(31)
        self.fc2 = torch.nn.Linear(31, 601)
        self.fc3 = torch.nn.Linear(601, 7)
        self.last = torch.nn.Linear(7, 7)

    def forward(self, x, use_last=True):
        y = self.fc3(torch.relu(self.fc2(torch.relu(self.bn(self.fc1(x))))))
        return self.last(y) if use_last else y


def train(seed, device, group, options, side=0):
    """DDP_STEPS steps of SGD with momentum on rank-dependent batches from a
    rank-dependent initialisation (DDP starts from rank 0's); the second
    step accumulates two micro-batches, the first under no_sync. A variant
    with a pair of hooks uses the first on concord (side 0), the second on
    gloo (side 1). Returns the parameters and buffers after the last step."""
    rank = dist.get_rank()
    torch.manual_seed(seed * 1009 + rank)
    model = Net().to(device)
    options = dict(options)
    hook = options.pop("hook", None)
    if isinstance(hook, tuple):  # (concord's, gloo's)
        hook = hook[side]
    skips = options.get("find_unused_parameters", False)
    device_ids = [device] if device.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids,
                                                    process_group=group, **options)
    if hook is not None:
        ddp.register_comm_hook(group, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(seed * 1009 + rank)
    for step in range(DDP_STEPS):
        x = torch.randn(6, 13, generator=generator).to(device)
        target = torch.randn(6, 7, generator=generator).to(device)
        use_last = not (skips and step % 2)

        def loss(rows):
            return torch.nn.functional.mse_loss(ddp(x[rows], use_last), target[rows])

        optimizer.zero_grad()
        if step == 1:
            with ddp.no_sync():
                loss(slice(0, 3)).backward()
            loss(slice(3, 6)).backward()
        else:
            loss(slice(0, 6)).backward()
        optimizer.step()
    return [t.detach().clone() for t in (*model.parameters(), *model.buffers())]


def ddp(checks, gloo):
    """DDP on the world's concord group against DDP on `gloo` (the same
    ranks), from the same data; the replicas must also stay identical."""
    for name, options in DDP_VARIANTS.items():
        ours = train(checks.seed, checks.device, None, options)
        theirs = train(checks.seed, checks.device, gloo, options, side=1)
        compressed = options.get("hook") is default_hooks.bf16_compress_hook
        tolerance = DDP_HOOK_TOLERANCE if compressed else DDP_TOLERANCE
        for i, (a, b) in enumerate(zip(ours, theirs)):
            checks.checks += 1
            if not torch.allclose(a.double(), b.double(), **tolerance):
                checks.fail(f"DDP {name} tensor {i}", "concord's differs from gloo's by "
                            f"{(a.double() - b.double()).abs().max().item():.3g}")
        # Parameters only: each rank's batch norm updates its running
        # statistics after DDP broadcast rank 0's at the forward's start.
        parameters = ours[:len(list(Net().parameters()))]
        flat = torch.cat([t.reshape(-1).double() for t in parameters])
        replicas = torch.empty((checks.size, flat.numel()), dtype=flat.dtype, device=flat.device)
        dist.all_gather_into_tensor(replicas, flat)
        checks.expect_true(f"DDP {name}: the ranks' parameters differ",
                           all(torch.equal(replica, flat) for replica in replicas))


# ---- subgroups ---------------------------------------------------------------------------

def group_collectives(checks):
    for dtype in ("float32", "bfloat16", "int64", "bool"):
        checks.all_reduce(dtype, (7,))
        checks.all_reduce_async(dtype, (5,))
        checks.broadcast(dtype, (3, 5, 2))
        checks.all_gather(dtype, (7,))
        checks.reduce_scatter(dtype, (7,))
        checks.reduce(dtype, (7,))
        checks.gather_and_scatter(dtype, (7,))


def subgroups(checks):
    """A subset made by every rank (non-members get NON_GROUP_MEMBER), a
    group of every rank, then a subset made by its members alone; their
    collectives use group ranks and global roots. Returns each member
    group's checks."""
    rank, size = checks.rank, checks.size
    results = []
    subset = [0, size - 1] if size > 2 else [size - 1]
    group = dist.new_group(subset)
    if rank in subset:
        checks.expect_true("new_group: the backend is not concord",
                           dist.get_backend(group) == "concord")
        results.append(Checks(checks.seed, checks.device, group))
    else:
        checks.expect_true("new_group: a non-member got a group",
                           group is dist.GroupMember.NON_GROUP_MEMBER)
    results.append(Checks(checks.seed + 1, checks.device, dist.new_group(list(range(size)))))
    # Last: torch numbers the groups it names on the ranks that call
    # new_group, so groups made by every rank after this one would get
    # other names on its non-members.
    local = list(range(1, size))
    if rank in local:
        results.append(Checks(checks.seed + 2, checks.device,
                              dist.new_group(local, use_local_synchronization=True)))
    for sub in results:
        group_collectives(sub)
    return results


# ---- errors ---------------------------------------------------------------------------------

def errors(checks):
    """Unsupported calls and bad input fail on every rank before any
    communication; ranks that disagree get concord's MismatchError as
    DistBackendError (synchronously and from a Work), and the group goes on."""
    rank, size, device = checks.rank, checks.size, checks.device
    t = torch.ones(4, device=device)
    checks.expect_raises("send", NotImplementedError, ["concord", "send"],
                         lambda: dist.send(t, (rank + 1) % size))
    checks.expect_raises("all_to_all_single", NotImplementedError, ["concord", "all_to_all_single"],
                         lambda: dist.all_to_all_single(torch.empty(size, device=device),
                                                        torch.ones(size, device=device)))
    checks.expect_raises("all_to_all", NotImplementedError, ["concord", "all_to_all"],
                         lambda: dist.all_to_all([torch.empty(1, device=device)] * size,
                                                 [torch.ones(1, device=device)] * size))
    for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR,
               dist._make_nccl_premul_sum(2.0)):
        name = "PREMUL_SUM" if not isinstance(op, dist.ReduceOp.RedOpType) else op.name
        checks.expect_raises(f"all_reduce {name}", ValueError, ["concord", name],
                             lambda op=op: dist.all_reduce(torch.ones(3, dtype=torch.int32,
                                                                      device=device), op))
    checks.expect_raises("all_reduce AVG on bool", ValueError, ["AVG", "bool"],
                         lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool, device=device),
                                                 dist.ReduceOp.AVG))
    checks.expect_raises("all_reduce of a transposed tensor", ValueError, ["contiguous"],
                         lambda: dist.all_reduce(torch.ones(4, 3, device=device).t()))
    checks.expect_raises("reduce_scatter of int16", dist.DistBackendError, ["int16"],
                         lambda: dist.reduce_scatter_tensor(
                             torch.empty(2, dtype=torch.int16, device=device),
                             torch.ones(2 * size, dtype=torch.int16, device=device)))

    for numel in (3, 30011):  # in the call, and on the group's thread (EAGER_BYTES)
        disagreeing = torch.ones(numel + rank, device=device)
        label = f"ranks that disagree on {numel} or {numel + 1} elements"
        checks.expect_raises(label, dist.DistBackendError, ["ranks disagree"],
                             lambda: dist.all_reduce(disagreeing))
        work = dist.all_reduce(disagreeing, async_op=True)
        checks.expect_raises(f"{label}, async: wait()", dist.DistBackendError,
                             ["ranks disagree"], work.wait)
        checks.expect_raises(f"{label}, async: the future", RuntimeError,
                             ["ranks disagree"], work.get_future().wait)
        try:
            work.wait()
        except dist.DistBackendError as exc:
            checks.expect_true(f"{label}: the error is not caused by concord's MismatchError",
                               isinstance(exc.__cause__, concord.MismatchError))
        checks.all_reduce("float32", (7,))


def ddp_against_gloo(checks):
    ddp(checks, dist.new_group(backend="gloo"))


def subgroup_collectives(checks):
    for sub in subgroups(checks):
        checks.failures += sub.failures
        checks.checks += sub.checks


SECTIONS = {"collectives": collectives, "ddp": ddp_against_gloo,
            "subgroups": subgroup_collectives, "errors": errors}


def run(seed, device_name, sections):
    """Runs `sections` (names of SECTIONS) in this rank of a job started by
    concord-run or torchrun; returns the failed checks and how many checks
    each section made."""
    device = torch.device(device_name)
    dist.init_process_group("concord", timeout=timedelta(seconds=120))
    checks = Checks(seed, device)
    counts = {}
    for section in sections:
        before = checks.checks
        SECTIONS[section](checks)
        counts[section] = checks.checks - before
    dist.destroy_process_group()
    return {"failures": checks.failures, "counts": counts}
