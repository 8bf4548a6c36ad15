"""A DistributedDataParallel training step on backend "concord" vs "gloo".

    python3 bench/ddp.py               # 2 and 4 ranks
    python3 bench/ddp.py --nprocs 2 --quick

One concord-run job per world size initialises torch.distributed with
backend "concord" and makes a group of the same ranks with backend "gloo";
each model is wrapped in DDP twice, once per group, and the four steps
(each backend, with and without no_sync) are timed in rounds that run
each once, so that the load of a shared machine weighs on both backends
alike.
The model has ResNet-50's 161 float32 parameter tensors (25.6M values,
102 MB), as grad_sync.py's two modules:

- "no compute" (communication-bound): the loss is (rank + 1) *
  sum(p.sum()), so backward produces every gradient with almost no compute
  and DDP's bucketed all-reduce is most of the step;
- "simulated backward": a custom autograd function per parameter doing
  `--work` elementwise passes over a tensor of its size, chained so that
  gradients come in reverse order and DDP's hooks start each bucket's
  all-reduce while the rest of backward runs.

A step is zero_grad, forward, backward and an SGD step, with DDP as made
by default (25 MB buckets, the first 1 MB; gradients copied into the
buckets before their all-reduce and back after it) and with
gradient_as_bucket_view=True (the gradients are views of the buckets: no
copies), and that again with concord.torch.allreduce_mean_hook on
concord's group (the mean taken within the all-reduce, where DDP's own
hook first divides each bucket; gloo keeps DDP's hook, having no AVG).
Reported per world size: the median step time of the slowest
rank, the same step under DDP's no_sync() (no communication), and the
communication exposed in the step (the difference), with gloo's times over
concord's. Target: steps at least 2x faster than gloo's on the
communication-bound model. After timing, one step of that model checks
every gradient is the mean over ranks of (rank + 1).

torch runs with one intra-op thread per rank, so ranks do not
oversubscribe the cores.
"""

from __future__ import annotations

import os
import sys
import tempfile
from datetime import timedelta

import numpy as np

import _timing
from _timing import Budget
from grad_sync import (COLLECTIVE_TIMEOUT_S, NUMEL, SHAPES, ddp_models, parse_args, ratio,
                       run_job, torch_max_over_ranks)

BACKENDS = ("concord", "gloo")
WORKER = "ddp"
TARGET_STEP = 2.0
# Seconds of rounds per model and DDP configuration (each round times the
# four steps: both backends, with and without no_sync).
FULL = Budget(seconds=12.0, min_iters=8, max_iters=100)
QUICK = Budget(seconds=3.0, min_iters=3, max_iters=30)
# grad_sync.ddp_models' modules; the first is the communication-bound one.
MODELS = ("no compute", "simulated backward")
DDP_OPTIONS = {"default": {}, "bucket views": {"gradient_as_bucket_view": True}}
# The same with concord's mean hook on concord's group (gloo keeps DDP's
# default hook: it has no ReduceOp.AVG).
MEAN_HOOK = "bucket views + mean hook"
DDP_OPTIONS[MEAN_HOOK] = DDP_OPTIONS["bucket views"]


# ---------------------------------------------------------------- workers


def worker(kind: str, plan: dict) -> dict:
    import torch
    import torch.distributed as dist

    import concord.torch  # the backend, its DDP hook, and env:// under concord-run

    torch.set_num_threads(1)
    dist.init_process_group("concord", timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    groups = {"concord": None, "gloo": dist.new_group(backend="gloo")}
    rank, size = dist.get_rank(), dist.get_world_size()
    budget = Budget(**plan["budget"])
    max_over_ranks = torch_max_over_ranks(torch, dist)

    def steps(model, optimizer):
        def step():
            optimizer.zero_grad(set_to_none=False)
            (model() * (rank + 1)).backward()
            optimizer.step()

        def step_no_sync():
            with model.no_sync():
                step()

        return step, step_no_sync

    results = {"rank": rank, "runs": {}}
    for config, options in DDP_OPTIONS.items():
        for name in MODELS:
            models = {b: torch.nn.parallel.DistributedDataParallel(
                ddp_models(torch, plan["work"])[name], process_group=group, **options)
                for b, group in groups.items()}
            if config == MEAN_HOOK:
                models["concord"].register_comm_hook(groups["concord"],
                                                     concord.torch.allreduce_mean_hook)
            fns = {(b, label): fn for b, model in models.items() for label, fn in zip(
                ("step", "no_sync"), steps(model, torch.optim.SGD(model.parameters(), lr=1e-6)))}
            medians = _timing.interleaved(list(fns.values()), budget, dist.barrier, max_over_ranks)
            run = {b: {} for b in BACKENDS}
            for (backend, label), median in zip(fns, medians):
                run[backend][label] = median
            if name == MODELS[0]:
                for backend, model in models.items():
                    fns[backend, "step"]()
                    correct = all(bool((p.grad == (size + 1) / 2).all())
                                  for p in model.parameters())
                    wrong = max_over_ranks(np.array([0.0 if correct else 1.0]))[0]
                    run[backend]["correct"] = bool(wrong == 0)
            results["runs"][f"{name}, {config}"] = run
            del models, fns
    dist.destroy_process_group()
    return results


def run_worker(kind: str, plan_path: str, out_path: str) -> int:
    result = worker(kind, _timing.read_json(plan_path))
    if result["rank"] == 0:
        _timing.write_json(out_path, result)
    return 0


# ----------------------------------------------------------------- parent


def table(results: dict) -> tuple[list[list[str]], dict]:
    """The rows of one world size, and gloo's step time over concord's on
    the communication-bound model, per DDP configuration."""
    rows = []
    targets = {}
    for config in DDP_OPTIONS:
        for model in MODELS:
            measured = results["runs"][f"{model}, {config}"]
            exposed = {b: max(t["step"] - t["no_sync"], 1e-4) for b, t in measured.items()}
            ours = measured["concord"]
            for backend, t in measured.items():
                note = "" if t.get("correct", True) else "WRONG GRADIENTS"
                rows.append([model, config, backend, f"{t['step'] * 1e3:.1f}",
                             f"{t['no_sync'] * 1e3:.1f}", f"{exposed[backend] * 1e3:.1f}",
                             ratio(t["step"], ours["step"]),
                             ratio(exposed[backend], exposed["concord"]), note])
            if model == MODELS[0]:
                targets[config] = measured["gloo"]["step"] / ours["step"]
    return rows, targets


def run_parent(args) -> int:
    budget = QUICK if args.quick else FULL
    print(f"DDP training step, ResNet-50's parameter shapes: {len(SHAPES)} float32 tensors, "
          f"{NUMEL / 1e6:.1f}M values ({NUMEL * 4 / 1e6:.0f} MB); backends {', '.join(BACKENDS)}; "
          f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
    failed = False
    with tempfile.TemporaryDirectory(prefix="concord-bench-") as workdir:
        for n in args.nprocs:
            results, failure = run_job(WORKER, n, budget, workdir, args.work, __file__)
            if failure:
                failed = True
                print(f"  note: {n} ranks: {failure}")
                continue
            rows, targets = table(results)
            print(f"\n{n} ranks: median step of the slowest rank (with compute: {args.work} "
                  "passes per gradient element in backward)")
            print(_timing.format_table(["model", "DDP", "backend", "step ms", "no_sync ms",
                                        "exposed ms", "step gloo/x", "exposed gloo/x", "note"],
                                       rows))
            for config, target in targets.items():
                verdict = "PASS" if target >= TARGET_STEP else "FAIL"
                print(f"  target, {MODELS[0]} step vs gloo, DDP {config}: "
                      f"{target:.2f}x (target >= {TARGET_STEP}x) {verdict}")
    print(f"\nexposed: step - no_sync step. Load average at the end {os.getloadavg()[0]:.2f}.")
    return 1 if failed else 0


def main(argv=None) -> int:
    args = parse_args(argv, __doc__, (WORKER,))
    if args.worker:
        return run_worker(args.worker, args.plan, args.out)
    return run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
