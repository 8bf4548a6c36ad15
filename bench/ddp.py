"""A DistributedDataParallel training step on backend "concord" vs "gloo".

    python3 bench/ddp.py               # 2 and 4 ranks
    python3 bench/ddp.py --nprocs 2 --quick

The same torch script, the backend passed to init_process_group being the
only difference, run as a concord-run job per backend and world size
(env:// works there once concord.torch is imported, for either backend).
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
copies). Reported per world size: the median step time of the slowest
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
TARGET_STEP = 2.0
FULL = Budget(seconds=4.0, min_iters=5, max_iters=60, max_warmup=3)
QUICK = Budget(seconds=1.5, min_iters=3, max_iters=20, max_warmup=2)
# grad_sync.ddp_models' modules; the first is the communication-bound one.
MODELS = ("no compute", "simulated backward")
DDP_OPTIONS = {"default": {}, "bucket views": {"gradient_as_bucket_view": True}}


# ---------------------------------------------------------------- workers


def worker(backend: str, plan: dict) -> dict:
    import torch
    import torch.distributed as dist

    import concord.torch  # noqa: F401  (the backend, and env:// under concord-run)

    torch.set_num_threads(1)
    dist.init_process_group(backend, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    rank, size = dist.get_rank(), dist.get_world_size()
    budget = Budget(**plan["budget"])

    max_over_ranks = torch_max_over_ranks(torch, dist)
    results = {"rank": rank, "backend": backend, "runs": {}}
    for config, options in DDP_OPTIONS.items():
        for name, module in ddp_models(torch, plan["work"]).items():
            model = torch.nn.parallel.DistributedDataParallel(module, **options)
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)

            def step():
                optimizer.zero_grad(set_to_none=False)
                (model() * (rank + 1)).backward()
                optimizer.step()

            def step_no_sync():
                with model.no_sync():
                    step()

            times = {}
            for label, fn in (("step", step), ("no_sync", step_no_sync)):
                times[label] = float(np.median(_timing.measure(fn, budget, dist.barrier,
                                                               max_over_ranks)))
            if name == MODELS[0]:
                step()
                expected = (size + 1) / 2
                correct = all(bool((p.grad == expected).all()) for p in module.parameters())
                wrong = max_over_ranks(np.array([0.0 if correct else 1.0]))[0]
                times["correct"] = bool(wrong == 0)
            results["runs"][f"{name}, {config}"] = times
            del model, optimizer
    dist.destroy_process_group()
    return results


def run_worker(backend: str, plan_path: str, out_path: str) -> int:
    result = worker(backend, _timing.read_json(plan_path))
    if result["rank"] == 0:
        _timing.write_json(out_path, result)
    return 0


# ----------------------------------------------------------------- parent


def table(by_backend: dict) -> tuple[list[list[str]], dict]:
    """The rows of one world size, and gloo's step time over concord's on
    the communication-bound model, per DDP configuration."""
    rows = []
    targets = {}
    for config in DDP_OPTIONS:
        for model in MODELS:
            run = f"{model}, {config}"
            measured = {b: r["runs"][run] for b, r in by_backend.items() if r}
            exposed = {b: max(t["step"] - t["no_sync"], 1e-4) for b, t in measured.items()}
            for backend, t in measured.items():
                note = "" if t.get("correct", True) else "WRONG GRADIENTS"
                ours = backend == "concord"
                rows.append([model, config, backend, f"{t['step'] * 1e3:.1f}",
                             f"{t['no_sync'] * 1e3:.1f}", f"{exposed[backend] * 1e3:.1f}",
                             "1.00" if ours else ratio(t["step"], measured.get("concord", {})
                                                       .get("step")),
                             "1.00" if ours else ratio(exposed[backend], exposed.get("concord")),
                             note])
            if model == MODELS[0] and len(measured) == len(BACKENDS):
                targets[config] = measured["gloo"]["step"] / measured["concord"]["step"]
    return rows, targets


def run_parent(args) -> int:
    budget = QUICK if args.quick else FULL
    print(f"DDP training step, ResNet-50's parameter shapes: {len(SHAPES)} float32 tensors, "
          f"{NUMEL / 1e6:.1f}M values ({NUMEL * 4 / 1e6:.0f} MB); backends {', '.join(BACKENDS)}; "
          f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}")
    failed = False
    with tempfile.TemporaryDirectory(prefix="concord-bench-") as workdir:
        for n in args.nprocs:
            by_backend = {}
            for backend in BACKENDS:
                by_backend[backend], failure = run_job(backend, n, budget, workdir, args.work,
                                                       __file__)
                if failure:
                    failed = True
                    print(f"  note: {backend} on {n} ranks: {failure}")
            rows, targets = table(by_backend)
            print(f"\n{n} ranks: median step of the slowest rank (with compute: {args.work} "
                  "passes per gradient element in backward)")
            print(_timing.format_table(["model", "DDP", "backend", "step ms", "no_sync ms",
                                        "exposed ms", "step gloo/x", "exposed gloo/x", "note"],
                                       rows))
            for config in DDP_OPTIONS:
                if config not in targets:
                    print(f"  target, {config}: not measured")
                    continue
                verdict = "PASS" if targets[config] >= TARGET_STEP else "FAIL"
                print(f"  target, {MODELS[0]} step vs gloo, DDP {config}: "
                      f"{targets[config]:.2f}x (target >= {TARGET_STEP}x) {verdict}")
    print(f"\nexposed: step - no_sync step. Load average at the end {os.getloadavg()[0]:.2f}.")
    return 1 if failed else 0


def main(argv=None) -> int:
    args = parse_args(argv, __doc__, BACKENDS)
    if args.worker:
        return run_worker(args.worker, args.plan, args.out)
    return run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
