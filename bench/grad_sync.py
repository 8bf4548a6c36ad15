"""Gradient synchronisation of a ResNet-50-sized model: per-tensor
all-reduce vs concord's GradientSynchronizer vs torch DDP over gloo.

    python3 bench/grad_sync.py               # 2 and 4 ranks
    python3 bench/grad_sync.py --nprocs 2 --quick

The gradients are ResNet-50's 161 float32 parameter tensors (25.6M values,
102 MB; shapes built like torchvision's resnet50: conv, batch-norm weight
and bias, fc). Per world size it prints the median time of one
synchronisation (mean over ranks, in place) of the slowest rank:

- per-tensor: one blocking cc.all_reduce(op="mean") per gradient;
- GradientSynchronizer.synchronize() with 1, 25, 64 and 128 MB buckets
  (first bucket 1 MB, as DDP's default);
- torch DDP over gloo, bucket_cap_mb=25: the cost DDP adds to a step,
  measured as the median forward+backward with DDP minus the median with
  DDP's no_sync() (which skips the all-reduce). The model's forward is
  sum(p.sum()), so backward produces every gradient with almost no compute
  and nothing hides the communication: the difference is DDP's all-reduce
  time, including its bucket copies.

torch runs with one intra-op thread per rank, so ranks do not oversubscribe
the cores. concord's methods are timed in rounds that run each once, and
so are DDP's steps with and without no_sync(), so that a load changing on a
shared machine weighs on the methods compared alike. Ratios are the other method's time over the synchroniser's at
25 MB; targets: >= 1.5x per-tensor and >= 2x DDP. Each concord measurement
ends with a check of the result against NumPy.

With compute (the second table): a simulated backward pass produces the
gradients in reverse order, each after work proportional to its size
(`--work` elementwise passes over a tensor of its size, in torch, one
thread), and hands each over as it is produced: per-tensor, a blocking
all-reduce right away; the synchroniser, mark_ready (a full bucket starts
its all-reduce while the rest of backward runs), then wait(); torch DDP
over gloo, the same work as a custom autograd function per parameter, so
its hooks fire as each gradient is ready. Reported: the step time and the
exposed communication, the step time minus the same backward without any
communication. Targets: exposed communication with 25 MB buckets at most
half that of per-tensor, and at least 2x better than DDP's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from datetime import timedelta

import numpy as np

import _timing
from _timing import Budget

BUCKET_MBS = (1, 25, 64, 128)
TARGET_MB = 25
TARGET_PER_TENSOR = 1.5
TARGET_DDP = 2.0
TARGET_EXPOSED_PER_TENSOR = 2.0
TARGET_EXPOSED_DDP = 2.0
DEFAULT_WORK = 6
COLLECTIVE_TIMEOUT_S = 300
FULL = Budget(seconds=3.0, min_iters=5, max_iters=100, max_warmup=5)
QUICK = Budget(seconds=1.0, min_iters=3, max_iters=30, max_warmup=3)


def resnet50_shapes() -> list[tuple[int, ...]]:
    """Parameter shapes of torchvision's resnet50, in parameter order."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    in_channels = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            out_channels = 4 * width
            shapes += [(width, in_channels, 1, 1), (width,), (width,),
                       (width, width, 3, 3), (width,), (width,),
                       (out_channels, width, 1, 1), (out_channels,), (out_channels,)]
            if block == 0:  # the downsample branch
                shapes += [(out_channels, in_channels, 1, 1), (out_channels,), (out_channels,)]
            in_channels = out_channels
    return shapes + [(1000, 2048), (1000,)]


SHAPES = resnet50_shapes()
NUMEL = sum(int(np.prod(s)) for s in SHAPES)
assert len(SHAPES) == 161 and NUMEL == 25_557_032


def rank_grads(rank: int) -> list[np.ndarray]:
    """Rank-dependent gradients, so a wrong mean shows."""
    return [np.full(shape, rank + 1, np.float32) for shape in SHAPES]


def backward_work(torch, scratch, work: int):
    """The simulated backward of one layer: `work` elementwise passes over a
    tensor of its gradient's size (the same in every method)."""
    for _ in range(work):
        scratch.mul_(0.5).add_(1.0)


def overlap_runs(torch, work: int, handlers: dict) -> dict:
    """Backward passes producing gradients in reverse order, each handed to
    `handle(index, grad)` as it is produced and `finish()` at the end, per
    method; returns {method: fn running one step}."""
    scratch = [torch.zeros(shape) for shape in SHAPES]
    grads = [torch.zeros(shape) for shape in SHAPES]

    def step(handle, finish):
        for index in reversed(range(len(SHAPES))):
            backward_work(torch, scratch[index], work)
            grads[index].copy_(scratch[index])
            handle(index, grads[index])
        finish()

    return {name: (lambda h=h, f=f: step(h, f)) for name, (h, f) in handlers.items()}, grads


def ddp_models(torch, work: int) -> dict:
    """ResNet-50's parameters as torch modules for DDP: "no compute", whose
    forward is sum(p.sum()) (backward produces every gradient with almost no
    compute), and "simulated backward", one custom autograd function per
    parameter doing backward_work, chained so that backward produces the
    gradients in reverse order and DDP's hooks fire as each is ready."""

    class Shapes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = torch.nn.ParameterList(
                torch.nn.Parameter(torch.zeros(shape)) for shape in SHAPES)

        def forward(self):
            return sum(p.sum() for p in self.weights)

    class LayerWork(torch.autograd.Function):
        @staticmethod
        def forward(ctx, carry, parameter):
            ctx.shape = parameter.shape
            return carry + 0.0

        @staticmethod
        def backward(ctx, grad_carry):
            scratch = torch.zeros(ctx.shape)
            backward_work(torch, scratch, work)
            return grad_carry, scratch

    class Chain(Shapes):
        def forward(self):
            carry = torch.zeros((), requires_grad=True)
            for p in self.weights:
                carry = LayerWork.apply(carry, p)
            return carry

    return {"no compute": Shapes(), "simulated backward": Chain()}


def torch_max_over_ranks(torch, dist):
    """_timing's MaxOverRanks through torch.distributed's default group."""

    def max_over_ranks(values):
        dist.all_reduce(torch.from_numpy(values), op=dist.ReduceOp.MAX)
        return values

    return max_over_ranks


# ---------------------------------------------------------------- workers


def concord_worker(plan: dict) -> dict:
    import concord as cc
    from concord.training import GradientSynchronizer

    cc.init(timeout=COLLECTIVE_TIMEOUT_S)
    rank, size = cc.rank(), cc.world_size()
    budget = Budget(**plan["budget"])
    expected = (size + 1) / 2

    def max_over_ranks(values):
        return cc.all_reduce(values, op="max", out=values)

    def correct(fn, grads):
        for g, value in zip(grads, rank_grads(rank)):
            g[...] = value
        fn()
        return bool(all(np.all(g == np.float32(expected)) for g in grads))

    grads = rank_grads(rank)
    methods = {"per-tensor all_reduce": (lambda: [cc.all_reduce(g, op="mean", out=g)
                                                  for g in grads], len(SHAPES))}
    syncs = [GradientSynchronizer(grads, bucket_cap_mb=mb, first_bucket_mb=1) for mb in BUCKET_MBS]
    for mb, sync in zip(BUCKET_MBS, syncs):
        methods[f"GradientSynchronizer {mb} MB"] = (lambda s=sync: s.synchronize(grads),
                                                    sync.num_buckets)
    fns = [fn for fn, _ in methods.values()]
    medians = _timing.interleaved(fns, budget, cc.barrier, max_over_ranks)
    results = [{"name": name, "median_s": median, "buckets": buckets, "correct": correct(fn, grads)}
               for (name, (fn, buckets)), median in zip(methods.items(), medians)]
    for sync in syncs:
        sync.close()
    overlap = concord_overlap(cc, GradientSynchronizer, plan, budget, max_over_ranks)
    cc.shutdown()
    return {"rank": rank, "measurements": results, "overlap": overlap}


def concord_overlap(cc, GradientSynchronizer, plan: dict, budget: Budget, max_over_ranks) -> list:
    """Step times of the simulated backward with each method (see the top)."""
    import torch

    torch.set_num_threads(1)
    nothing = lambda *args: None  # noqa: E731
    handlers = {"compute alone": (nothing, nothing),
                "per-tensor all_reduce": (lambda i, g: cc.all_reduce(g, op="mean", out=g), nothing)}
    syncs = {}
    template = [torch.zeros(shape) for shape in SHAPES]
    for mb in BUCKET_MBS:
        sync = syncs[mb] = GradientSynchronizer(template, bucket_cap_mb=mb, first_bucket_mb=1)
        handlers[f"GradientSynchronizer {mb} MB"] = (sync.mark_ready, sync.wait)
    runs, _ = overlap_runs(torch, plan["work"], handlers)
    medians = _timing.interleaved(list(runs.values()), budget, cc.barrier, max_over_ranks)
    for sync in syncs.values():
        sync.close()
    return [{"name": name, "median_s": median} for name, median in zip(runs, medians)]


def ddp_worker(plan: dict) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    address = os.environ.get("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{plan['torch_port']}",
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    budget = Budget(**plan["budget"])

    model = DistributedDataParallel(ddp_models(torch, 0)["no compute"], bucket_cap_mb=TARGET_MB)

    def step():
        model.zero_grad(set_to_none=False)
        model().backward()

    def step_no_sync():
        with model.no_sync():
            step()

    max_over_ranks = torch_max_over_ranks(torch, dist)
    names = ("DDP forward+backward", "no_sync forward+backward")
    medians = _timing.interleaved([step, step_no_sync], budget, dist.barrier, max_over_ranks)
    results = [{"name": name, "median_s": median} for name, median in zip(names, medians)]
    overlap = ddp_overlap(torch, DistributedDataParallel, plan["work"], budget, dist.barrier,
                          max_over_ranks)
    rank = dist.get_rank()
    dist.destroy_process_group()
    return {"rank": rank, "measurements": results, "overlap": overlap}


def ddp_overlap(torch, DistributedDataParallel, work: int, budget: Budget, barrier,
                max_over_ranks) -> list:
    """The simulated backward under DDP (ddp_models)."""
    model = DistributedDataParallel(ddp_models(torch, work)["simulated backward"],
                                    bucket_cap_mb=TARGET_MB)

    def step():
        model.zero_grad(set_to_none=False)
        model().backward()

    def alone():
        with model.no_sync():
            step()

    names = ("DDP compute alone (no_sync)", "DDP gloo 25 MB")
    medians = _timing.interleaved([alone, step], budget, barrier, max_over_ranks)
    return [{"name": name, "median_s": median} for name, median in zip(names, medians)]


WORKERS = {"concord": concord_worker, "ddp": ddp_worker}


def run_worker(kind: str, plan_path: str, out_path: str) -> int:
    result = WORKERS[kind](_timing.read_json(plan_path))
    if result["rank"] == 0:
        _timing.write_json(out_path, result)
    return 0


# ----------------------------------------------------------------- parent


def run_job(kind: str, n: int, budget: Budget, workdir: str, work: int,
            script: str = __file__) -> tuple[dict, str | None]:
    """Runs `script` (this one, or another bench script sharing its
    arguments) as `n` ranks of worker `kind` under concord-run; returns rank
    0's results and why the job failed, if it did."""
    plan_path = os.path.join(workdir, f"plan-{kind}-{n}.json")
    out_path = os.path.join(workdir, f"result-{kind}-{n}.json")
    _timing.write_json(plan_path, {"budget": budget.__dict__, "torch_port": _timing.free_port(),
                                   "work": work})
    command = [sys.executable, "-m", "concord.run", "-n", str(n), os.path.abspath(script),
               "--worker", kind, "--plan", plan_path, "--out", out_path]
    print(f"bench: {kind} on {n} ranks ...", file=sys.stderr, flush=True)
    outcome = _timing.run_job(command, dict(os.environ), 1200)
    results = _timing.read_json(out_path) or {}
    failure = outcome.failure() or (None if results else "wrote no results")
    print(f"bench: {kind} on {n} ranks: {outcome.seconds:.0f} s"
          + (f", FAILED: {failure}" if failure else ""), file=sys.stderr, flush=True)
    return results, failure


def median_of(results: dict, name: str) -> float | None:
    for m in results.get("measurements", []):
        if m["name"] == name:
            return m["median_s"]
    return None


def rows_for(concord_results: dict, ddp_results: dict) -> tuple[list[list[str]], dict]:
    """Table rows and the times the targets need."""
    ddp = None
    if ddp_results:
        with_sync = median_of(ddp_results, "DDP forward+backward")
        without = median_of(ddp_results, "no_sync forward+backward")
        ddp = with_sync - without
    reference = median_of(concord_results, f"GradientSynchronizer {TARGET_MB} MB")
    per_tensor = median_of(concord_results, "per-tensor all_reduce")
    rows = []
    for m in concord_results.get("measurements", []):
        rows.append([m["name"], str(m["buckets"]), f"{m['median_s'] * 1e3:.1f}",
                     f"{NUMEL * 4 / m['median_s'] / 1e9:.2f}", ratio(per_tensor, m["median_s"]),
                     ratio(ddp, m["median_s"]), "" if m["correct"] else "WRONG RESULT"])
    if ddp is not None:
        rows.append([f"torch DDP gloo {TARGET_MB} MB (DDP - no_sync)", "-", f"{ddp * 1e3:.1f}",
                     f"{NUMEL * 4 / ddp / 1e9:.2f}", ratio(per_tensor, ddp), "1.00",
                     f"{with_sync * 1e3:.1f} - {without * 1e3:.1f} ms"])
    return rows, {"sync": reference, "per_tensor": per_tensor, "ddp": ddp}


def print_overlap(n: int, work: int, concord_results: dict, ddp_results: dict) -> None:
    """The second table: steps with the simulated backward (see the top)."""
    ours = {m["name"]: m["median_s"] for m in concord_results.get("overlap", [])}
    theirs = {m["name"]: m["median_s"] for m in ddp_results.get("overlap", [])}
    if not ours:
        return
    alone = ours["compute alone"]
    rows = [["compute alone (no communication)", f"{alone * 1e3:.1f}", "-", "-"]]
    exposed = {}
    for name, t in ours.items():
        if name == "compute alone":
            continue
        exposed[name] = t - alone
        rows.append([name, f"{t * 1e3:.1f}", f"{(t - alone) * 1e3:.1f}", ""])
    if theirs:
        ddp_alone, ddp = theirs["DDP compute alone (no_sync)"], theirs["DDP gloo 25 MB"]
        exposed["ddp"] = ddp - ddp_alone
        rows.append(["torch DDP compute alone (no_sync)", f"{ddp_alone * 1e3:.1f}", "-", "-"])
        rows.append(["torch DDP over gloo, 25 MB", f"{ddp * 1e3:.1f}", f"{exposed['ddp'] * 1e3:.1f}",
                     ""])
    # A step can come out a hair faster than compute alone (noise): count
    # at least 0.1 ms exposed, so ratios stay meaningful.
    exposed = {name: max(value, 1e-4) for name, value in exposed.items()}
    ours25 = exposed.get(f"GradientSynchronizer {TARGET_MB} MB")
    for row in rows:
        for name, value in exposed.items():
            if row[0] in (name, "torch DDP over gloo, 25 MB" if name == "ddp" else None):
                row[3] = ratio(value, ours25)
    print(f"\n{n} ranks, with compute ({work} passes per gradient element in backward): "
          "step time and exposed communication (step - compute alone), median of the slowest rank")
    print(_timing.format_table(["method", "step ms", "exposed ms", "exposed/x (25 MB)"], rows))
    print(f"targets, exposed communication with {TARGET_MB} MB buckets on {n} ranks:")
    print(verdict("vs per-tensor all_reduce (at most half)", exposed.get("per-tensor all_reduce"),
                  ours25, TARGET_EXPOSED_PER_TENSOR))
    print(verdict("vs torch DDP over gloo", exposed.get("ddp"), ours25, TARGET_EXPOSED_DDP))


def ratio(theirs: float | None, ours: float | None) -> str:
    return "-" if theirs is None or ours is None else f"{theirs / ours:.2f}"


def verdict(label: str, theirs: float | None, ours: float | None, target: float) -> str:
    if theirs is None or ours is None:
        return f"  {label}: not measured"
    value = theirs / ours
    return f"  {label}: {value:.2f}x (target >= {target}x) {'PASS' if value >= target else 'FAIL'}"


def run_parent(args) -> int:
    budget = QUICK if args.quick else FULL
    have_torch = importlib.util.find_spec("torch") is not None
    print(f"gradient synchronisation, ResNet-50 gradients: {len(SHAPES)} float32 tensors, "
          f"{NUMEL / 1e6:.1f}M values ({NUMEL * 4 / 1e6:.0f} MB); {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"memcpy, one thread (NumPy copy of 256 MiB, median of 5): "
          f"{_timing.memcpy_bandwidth(256 << 20, 5):.2f} GB/s")
    failed = False
    with tempfile.TemporaryDirectory(prefix="concord-bench-") as workdir:
        for n in args.nprocs:
            concord_results, failure = run_job("concord", n, budget, workdir, args.work)
            ddp_results, ddp_failure = (run_job("ddp", n, budget, workdir, args.work) if have_torch
                                        else ({}, "torch is not installed"))
            rows, times = rows_for(concord_results, ddp_results)
            print(f"\n{n} ranks: one synchronisation (mean, in place), median of the slowest rank")
            print(_timing.format_table(
                ["method", "buckets", "ms", "GB/s", "per-tensor/x", "DDP/x", "note"], rows))
            for what, why in (("concord", failure), ("torch DDP", ddp_failure)):
                if why:
                    failed = True
                    print(f"  note: {what}: {why}")
            print(f"targets, {TARGET_MB} MB buckets on {n} ranks:")
            print(verdict("vs per-tensor all_reduce", times["per_tensor"], times["sync"],
                          TARGET_PER_TENSOR))
            print(verdict("vs torch DDP over gloo", times["ddp"], times["sync"], TARGET_DDP))
            print_overlap(n, args.work, concord_results, ddp_results)
    print(f"\nGB/s: gradient bytes ({NUMEL * 4 / 1e6:.0f} MB) per second of synchronisation. "
          f"Load average at the end {os.getloadavg()[0]:.2f}.")
    return 1 if failed else 0


def parse_args(argv, doc: str = __doc__, workers=tuple(WORKERS)):
    """The arguments of this script, or of another bench script (`doc`,
    `workers`) that runs its jobs with run_job."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--nprocs", default="2,4", type=lambda s: [int(v) for v in s.split(",")],
                        help="world sizes, comma-separated (default 2,4)")
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--work", type=int, default=DEFAULT_WORK,
                        help=f"elementwise passes per gradient element in the simulated backward "
                             f"(default {DEFAULT_WORK})")
    parser.add_argument("--worker", choices=sorted(workers), help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return run_worker(args.worker, args.plan, args.out)
    return run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
