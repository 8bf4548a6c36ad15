"""One AdamW step over ResNet-50's parameters on the CPU: concord's fused
multi-tensor kernel vs a per-tensor NumPy AdamW vs torch.optim.AdamW.

    python3 bench/optim.py            # about half a minute
    python3 bench/optim.py --quick

The parameters are bench/grad_sync.py's 161 float32 ResNet-50 tensors
(25.6M values). Every implementation runs torch.optim.AdamW's update rule on
the same data. A step must read params, grads, exp_avg, exp_avg_sq and
write params, exp_avg, exp_avg_sq: 7 x 4 bytes per value, 716 MB of memory
traffic, the floor any implementation pays. The table shows the median step
time, that traffic per second, and its share of what a plain copy achieves
(NumPy memcpy of 256 MiB, counted as read + write traffic, one thread).

- concord fused: concord.optim.AdamW.step, one C call for all tensors;
- NumPy per tensor: in-place NumPy ufuncs per tensor with one preallocated
  scratch buffer (about ten passes over memory per tensor);
- torch foreach: torch.optim.AdamW(foreach=True), torch's multi-tensor
  path; torch fused: torch.optim.AdamW(fused=True) where this torch has it;
  both with torch's default intra-op threads (printed).

Each implementation's parameters after its steps are compared with
concord's; a mismatch is flagged.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys

import numpy as np

import _timing
from _timing import Budget
from grad_sync import NUMEL, SHAPES

LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01
TRAFFIC_BYTES = 7 * 4 * NUMEL
FULL = Budget(seconds=4.0, min_iters=5, max_iters=100, max_warmup=5)
QUICK = Budget(seconds=1.0, min_iters=3, max_iters=30, max_warmup=2)


def initial_arrays() -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(0)
    params = [rng.standard_normal(s, dtype=np.float32) for s in SHAPES]
    grads = [rng.standard_normal(s, dtype=np.float32) for s in SHAPES]
    return params, grads


class ConcordAdamW:
    name = "concord fused"

    def __init__(self, params, grads):
        from concord import optim

        self.params, self.grads = params, grads
        self.opt = optim.AdamW(LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
        self.state = self.opt.init(params)

    def step(self):
        self.params, self.state = self.opt.step(self.params, self.grads, self.state)

    def result(self):
        return self.params


class NumpyAdamW:
    """torch's AdamW rule with in-place ufuncs, tensor by tensor."""

    name = "NumPy per tensor"

    def __init__(self, params, grads):
        self.params, self.grads = params, grads
        self.exp_avg = [np.zeros_like(p) for p in params]
        self.exp_avg_sq = [np.zeros_like(p) for p in params]
        self.scratch = np.empty(max(p.size for p in params), np.float32)
        self.t = 0

    def step(self):
        self.t += 1
        beta1, beta2 = BETAS
        step_size = LR / (1 - beta1 ** self.t)
        root_bc2 = math.sqrt(1 - beta2 ** self.t)
        for p, g, m, v in zip(self.params, self.grads, self.exp_avg, self.exp_avg_sq):
            tmp = self.scratch[:p.size].reshape(p.shape)
            p *= 1 - LR * WEIGHT_DECAY
            m *= beta1
            np.multiply(g, 1 - beta1, out=tmp)
            m += tmp
            v *= beta2
            np.multiply(g, g, out=tmp)
            tmp *= 1 - beta2
            v += tmp
            np.sqrt(v, out=tmp)
            tmp /= root_bc2
            tmp += EPS
            np.divide(m, tmp, out=tmp)
            tmp *= step_size
            p -= tmp

    def result(self):
        return self.params


class TorchAdamW:
    def __init__(self, params, grads, **flags):
        import torch

        self.torch = torch
        self.params = [torch.nn.Parameter(torch.from_numpy(p)) for p in params]
        for p, g in zip(self.params, grads):
            p.grad = torch.from_numpy(g)
        self.opt = torch.optim.AdamW(self.params, lr=LR, betas=BETAS, eps=EPS,
                                     weight_decay=WEIGHT_DECAY, **flags)

    def step(self):
        with self.torch.no_grad():
            self.opt.step()

    def result(self):
        return [p.detach().numpy() for p in self.params]


class TorchForeach(TorchAdamW):
    name = "torch foreach"

    def __init__(self, params, grads):
        super().__init__(params, grads, foreach=True)


class TorchFused(TorchAdamW):
    name = "torch fused"

    def __init__(self, params, grads):
        super().__init__(params, grads, fused=True)


def implementations() -> list[type]:
    impls = [ConcordAdamW, NumpyAdamW]
    if importlib.util.find_spec("torch") is not None:
        impls += [TorchForeach, TorchFused]
    return impls


def run(impl: type, budget: Budget) -> dict:
    """Median time of impl's step, on fresh copies of the same data."""
    params, grads = initial_arrays()
    try:
        runner = impl(params, grads)
    except (RuntimeError, TypeError, ValueError) as exc:  # e.g. no fused CPU AdamW here
        return {"name": impl.name, "error": f"{type(exc).__name__}: {exc}"}
    times = _timing.measure(runner.step, budget, lambda: None, lambda t: t)
    return {"name": impl.name, "median_s": float(np.median(times)), "iters": len(times)}


def same_trajectory(results: list[dict]) -> dict[str, str]:
    """Re-runs every implementation for 3 steps from the same start and
    compares with concord: the timing loops ran different step counts."""
    notes = {}
    reference = None
    for r in results:
        if "error" in r:
            continue
        impl = next(i for i in implementations() if i.name == r["name"])
        params, grads = initial_arrays()
        runner = impl(params, grads)
        for _ in range(3):
            runner.step()
        got = runner.result()
        if reference is None:
            reference = got
            continue
        worst = max(float(np.max(np.abs(a - b))) for a, b in zip(got, reference))
        notes[r["name"]] = f"max |diff| vs concord after 3 steps {worst:.1e}"
        if worst > 1e-5:
            notes[r["name"]] += " MISMATCH"
    return notes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args(argv)
    budget = QUICK if args.quick else FULL
    memcpy = _timing.memcpy_bandwidth(256 << 20, 5)
    copy_traffic = 2 * memcpy
    threads = ""
    if importlib.util.find_spec("torch") is not None:
        import torch

        threads = f"; torch {torch.__version__}, {torch.get_num_threads()} intra-op threads"
    print(f"AdamW step over ResNet-50's {len(SHAPES)} float32 tensors ({NUMEL / 1e6:.1f}M values, "
          f"{TRAFFIC_BYTES / 1e6:.0f} MB traffic per step); {os.cpu_count()} cores{threads}; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"memcpy, one thread: {memcpy:.2f} GB/s copied = {copy_traffic:.2f} GB/s read + write")
    results = [run(impl, budget) for impl in implementations()]
    notes = same_trajectory(results)
    fused = next(r["median_s"] for r in results if r["name"] == ConcordAdamW.name)
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["name"], "-", "-", "-", "-", f"unavailable: {r['error'][:60]}"])
            continue
        traffic = TRAFFIC_BYTES / r["median_s"] / 1e9
        rows.append([r["name"], f"{r['median_s'] * 1e3:.1f}", f"{traffic:.2f}",
                     f"{traffic / copy_traffic:.0%}", f"{r['median_s'] / fused:.2f}",
                     notes.get(r["name"], "")])
    print()
    print(_timing.format_table(["implementation", "ms/step", "GB/s", "of memcpy", "x/concord",
                                "check"], rows))
    return 1 if any("MISMATCH" in n for n in notes.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
