"""Metric sync and update throughput: concord.metrics against torchmetrics.

    python3 bench/metrics_sync.py               # 2 and 4 ranks, then updates on 1M samples
    python3 bench/metrics_sync.py --nprocs 2 --quick

Sync: a collection of 10 scalar metrics (4 means, 2 sums, 2 maxima, 2
minima), a 1000-class confusion matrix and a binary AUROC with 10000 bins.
concord syncs the whole collection with one collective per reduce op;
torchmetrics syncs each metric over torch.distributed (gloo), state by
state, as its Metric.sync() does. Both run in the same ranks of one job
(concord's launcher; torch rendezvous on a second port the parent picks).
Times: median over iterations of the slowest rank's time.

Update: samples/s of Accuracy (multiclass, 10-class scores) and
ConfusionMatrix (1000 classes, label predictions) on 1M samples, in this
process, against torchmetrics on CPU tensors.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import asdict
from datetime import timedelta

import numpy as np

import _timing
from _timing import Budget

SCALARS = {"mean": 4, "sum": 2, "max": 2, "min": 2}
CM_CLASSES = 1000
AUROC_BINS = 10000
UPDATE_SAMPLES = 1_000_000
ACC_CLASSES = 10
TARGET_RATIO = 10.0
FULL = Budget(seconds=1.5, min_iters=10, max_iters=2000)
QUICK = Budget(seconds=0.3, min_iters=5, max_iters=300)


# ---------------------------------------------------------------- workers


def concord_collection(M):
    kinds = {"mean": M.Mean, "sum": M.Sum, "max": M.Max, "min": M.Min}
    metrics = {f"{kind}{i}": kinds[kind]() for kind, n in SCALARS.items() for i in range(n)}
    metrics["cm"] = M.ConfusionMatrix(CM_CLASSES)
    metrics["auroc"] = M.BinaryAUROC(AUROC_BINS)
    return M.MetricCollection(metrics)


def torchmetrics_collection():
    import torchmetrics as tm
    from torchmetrics.classification import BinaryAUROC, MulticlassConfusionMatrix

    kinds = {"mean": tm.MeanMetric, "sum": tm.SumMetric, "max": tm.MaxMetric, "min": tm.MinMetric}
    metrics = {f"{kind}{i}": kinds[kind]() for kind, n in SCALARS.items() for i in range(n)}
    metrics["cm"] = MulticlassConfusionMatrix(CM_CLASSES)
    metrics["auroc"] = BinaryAUROC(thresholds=AUROC_BINS)
    return metrics


def rank_data(rank):
    rng = np.random.default_rng(rank)
    return {"values": rng.normal(size=100), "labels": rng.integers(0, CM_CLASSES, 1000),
            "preds": rng.integers(0, CM_CLASSES, 1000), "scores": rng.random(1000),
            "binary": rng.integers(0, 2, 1000)}


def fill(collection, d, to_array):
    for name, metric in collection.items():
        if name == "cm":
            metric.update(to_array(d["preds"]), to_array(d["labels"]))
        elif name == "auroc":
            metric.update(to_array(d["scores"]), to_array(d["binary"]))
        else:
            metric.update(to_array(d["values"]))


def run_worker(plan: dict, out: str) -> int:
    import torch
    import torch.distributed as dist

    import concord as cc
    from concord import metrics as M

    cc.init()
    rank = cc.rank()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{plan['torch_port']}",
                            rank=rank, world_size=cc.world_size(), timeout=timedelta(seconds=300))
    budget = Budget(**plan["budget"])

    def max_over_ranks(values):
        return cc.all_reduce(values, op="max")

    d = rank_data(rank)
    ours = concord_collection(M)
    fill(ours, d, lambda x: x)
    theirs = torchmetrics_collection()
    fill(theirs, d, torch.from_numpy)

    def sync_theirs():
        for metric in theirs.values():
            metric.sync()
            metric.unsync()

    results = {
        "concord_s": float(np.median(_timing.measure(ours.sync, budget, cc.barrier,
                                                      max_over_ranks))),
        "torchmetrics_s": float(np.median(_timing.measure(sync_theirs, budget, dist.barrier,
                                                           max_over_ranks))),
    }
    # Correctness guard: both libraries end with the same global confusion matrix.
    ours.sync()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results["same_result"] = bool(np.array_equal(ours["cm"].compute(),
                                                     theirs["cm"].compute().numpy()))
    if rank == 0:
        _timing.write_json(out, results)
    dist.destroy_process_group()
    cc.shutdown()
    return 0


# ---------------------------------------------------------------- updates


def median_seconds(fn, reps):
    fn()  # first call: allocations, lazy imports
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def update_throughput(reps: int) -> list[list[str]]:
    import torch
    from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

    from concord import metrics as M

    rng = np.random.default_rng(0)
    scores = rng.random((UPDATE_SAMPLES, ACC_CLASSES), dtype=np.float32)
    acc_target = rng.integers(0, ACC_CLASSES, UPDATE_SAMPLES)
    preds = rng.integers(0, CM_CLASSES, UPDATE_SAMPLES)
    target = rng.integers(0, CM_CLASSES, UPDATE_SAMPLES)
    cases = [
        (f"Accuracy, ({UPDATE_SAMPLES:,}, {ACC_CLASSES}) scores",
         M.Accuracy("multiclass", num_classes=ACC_CLASSES), (scores, acc_target),
         MulticlassAccuracy(ACC_CLASSES, average="micro"),
         (torch.from_numpy(scores), torch.from_numpy(acc_target))),
        (f"ConfusionMatrix {CM_CLASSES} classes, labels", M.ConfusionMatrix(CM_CLASSES),
         (preds, target), MulticlassConfusionMatrix(CM_CLASSES),
         (torch.from_numpy(preds), torch.from_numpy(target))),
    ]
    rows = []
    for label, ours, args, theirs, targs in cases:
        ours_s = median_seconds(lambda: ours.update(*args), reps)
        theirs_s = median_seconds(lambda: theirs.update(*targs), reps)
        rows.append([label, f"{UPDATE_SAMPLES / ours_s / 1e6:.1f}",
                     f"{UPDATE_SAMPLES / theirs_s / 1e6:.1f}", f"{theirs_s / ours_s:.1f}"])
    return rows


# ---------------------------------------------------------------- parent


def missing_peers() -> str | None:
    absent = [m for m in ("torch", "torchmetrics") if importlib.util.find_spec(m) is None]
    return f"{', '.join(absent)} not installed (pip install torch torchmetrics)" if absent else None


def run_sync(n: int, budget: Budget, workdir: str) -> dict:
    plan_path = os.path.join(workdir, f"plan{n}.json")
    out = os.path.join(workdir, f"out{n}.json")
    _timing.write_json(plan_path, {"torch_port": _timing.free_port(),
                                   "budget": asdict(budget)})
    command = [sys.executable, "-m", "concord.run", "-n", str(n), os.path.abspath(__file__),
               "--worker", "--plan", plan_path, "--out", out]
    outcome = _timing.run_job(command, dict(os.environ), timeout_s=600)
    results = _timing.read_json(out) or {}
    results["failure"] = outcome.failure()
    return results


def print_sync(nprocs: list[int], budget: Budget) -> None:
    print(f"\nsync: {sum(SCALARS.values())} scalar metrics + {CM_CLASSES}-class confusion matrix"
          f" + AUROC with {AUROC_BINS} bins; median of the slowest rank")
    rows, notes = [], []
    with tempfile.TemporaryDirectory(prefix="concord-bench-") as workdir:
        for n in nprocs:
            r = run_sync(n, budget, workdir)
            if r["failure"] or "concord_s" not in r:
                notes.append(f"{n} ranks: job failed: {r['failure']}")
                continue
            ratio = r["torchmetrics_s"] / r["concord_s"]
            rows.append([str(n), f"{r['concord_s'] * 1e6:.0f}", f"{r['torchmetrics_s'] * 1e6:.0f}",
                         f"{ratio:.1f}", "yes" if r["same_result"] else "NO",
                         "PASS" if ratio >= TARGET_RATIO else "FAIL"])
    print(_timing.format_table(["ranks", "concord us", "torchmetrics us", "tm/cc", "same cm",
                                f">= {TARGET_RATIO:g}x"], rows))
    for note in notes:
        print(f"  note: {note}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nprocs", default="2,4", type=lambda s: [int(v) for v in s.split(",")])
    parser.add_argument("--quick", action="store_true", help="shorter timing budgets")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return run_worker(_timing.read_json(args.plan), args.out)
    why = missing_peers()
    if why:
        print(f"metrics_sync: {why}")
        return 1
    import torch
    import torchmetrics

    import concord

    print(f"concord.metrics vs torchmetrics {torchmetrics.__version__} (torch {torch.__version__}, "
          f"gloo); concord {concord.__version__}; {os.cpu_count()} cores")
    _timing_load("start")
    print_sync(args.nprocs, QUICK if args.quick else FULL)
    print(f"\nupdate throughput on {UPDATE_SAMPLES:,} samples, one process, CPU "
          "(M samples/s, median of 5)")
    print(_timing.format_table(["metric", "concord", "torchmetrics", "cc/tm"],
                               update_throughput(5)))
    _timing_load("end")
    return 0


def _timing_load(when: str) -> None:
    # Other work on the machine skews every column; the load says how much to trust them.
    print("load average (1, 5, 15 min) at " + when + ": "
          + ", ".join(f"{load:.2f}" for load in os.getloadavg()), flush=True)


if __name__ == "__main__":
    sys.exit(main())
