"""Data-parallel training of a NumPy MLP on scikit-learn's digits, checked
against one process.

    python -m concord.run -n 4 examples/train_mlp.py [--epochs 15]

Every rank loads the same data and draws the same shuffled global batches;
each trains on its contiguous shard of every global batch. Gradients are
averaged over the ranks with a GradientSynchronizer and the parameters are
updated with concord's fused AdamW, so every rank keeps identical
parameters. Rank 0 shows a progress bar and, per epoch, the global training
loss and the test accuracy (counted on every rank's part of the test set and
all-reduced). At the end rank 0 trains the same model in one process on the
same global batches and prints the largest parameter difference; the exit
status is non-zero when the replicas disagree or the difference exceeds the
tolerance.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from sklearn.datasets import load_digits

import concord
from concord.optim import AdamW
from concord.training import GradientSynchronizer, train_step

SEED = 20240611
GLOBAL_BATCH = 48  # divisible by 1, 2, 3, 4, 6 and 8 ranks
TEST_FRACTION = 0.2
HIDDEN = 128
LEARNING_RATE = 3e-3
# float32 data-parallel training adds the ranks' gradients in another order
# than one process does. AdamW divides by sqrt(v): for weights whose
# gradients stay near zero it turns that rounding noise into steps of up to
# lr, so over hundreds of steps such weights may drift by a fraction of lr
# (measured: 1e-6 on 3 and 4 ranks, 4.5e-4 on 2). A real error (a missing
# rank, a wrong scale) moves weights by many lr.
TOLERANCE = LEARNING_RATE / 2
BAR_WIDTH = 30


# ---------------------------------------------------------------- the model


def init_params(n_in: int, n_classes: int) -> dict:
    """He-initialised 64-128-10 MLP, the same on every rank (fixed seed)."""
    rng = np.random.default_rng(SEED)
    return {
        "hidden": {"w": (rng.standard_normal((n_in, HIDDEN)) * np.sqrt(2 / n_in)).astype(np.float32),
                   "b": np.zeros(HIDDEN, np.float32)},
        "out": {"w": (rng.standard_normal((HIDDEN, n_classes)) * np.sqrt(2 / HIDDEN))
                .astype(np.float32),
                "b": np.zeros(n_classes, np.float32)},
    }


def forward(params: dict, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hidden activations, logits)."""
    hidden = np.maximum(x @ params["hidden"]["w"] + params["hidden"]["b"], 0)
    return hidden, hidden @ params["out"]["w"] + params["out"]["b"]


def grad_fn(params: dict, batch: tuple[np.ndarray, np.ndarray]) -> tuple[float, dict]:
    """Mean softmax cross-entropy over the batch and its gradients."""
    x, y = batch
    hidden, logits = forward(params, x)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -float(log_probs[np.arange(len(y)), y].mean())
    d_logits = np.exp(log_probs)
    d_logits[np.arange(len(y)), y] -= 1
    d_logits /= np.float32(len(y))
    d_hidden = (d_logits @ params["out"]["w"].T) * (hidden > 0)
    grads = {"hidden": {"w": x.T @ d_hidden, "b": d_hidden.sum(axis=0)},
             "out": {"w": hidden.T @ d_logits, "b": d_logits.sum(axis=0)}}
    return loss, grads


# ---------------------------------------------------------------- data


def load_data() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(train, test) splits of digits: 8x8 images scaled to [0, 1]."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(x))
    n_test = int(len(x) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def global_batches(n_train: int, epoch: int) -> list[np.ndarray]:
    """Sample indices of each global batch of an epoch (the same on every
    rank; the last partial batch is dropped)."""
    order = np.random.default_rng([SEED, epoch]).permutation(n_train)
    return [order[i:i + GLOBAL_BATCH] for i in range(0, n_train - GLOBAL_BATCH + 1, GLOBAL_BATCH)]


def my_shard(indices: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    per_rank = len(indices) // world_size
    return indices[rank * per_rank:(rank + 1) * per_rank]


# ---------------------------------------------------------------- reporting


def progress(epoch: int, epochs: int, step: int, steps: int, loss: float) -> None:
    done = BAR_WIDTH * step // steps
    bar = "#" * done + "-" * (BAR_WIDTH - done)
    print(f"\repoch {epoch + 1:2d}/{epochs} [{bar}] {step:3d}/{steps} loss {loss:.4f}",
          end="", flush=True)


def test_accuracy(params: dict, test: tuple[np.ndarray, np.ndarray], rank: int,
                  world_size: int) -> float:
    """Accuracy on the whole test set: each rank counts its part, one
    all-reduce adds the counts."""
    x, y = (np.array_split(a, world_size)[rank] for a in test)
    correct = float(np.sum(forward(params, x)[1].argmax(axis=1) == y))
    counts = concord.all_reduce(np.array([correct, len(y)], dtype=np.float64))
    return counts[0] / counts[1]


# ---------------------------------------------------------------- training


def train_data_parallel(train, test, epochs: int, rank: int, world_size: int) -> dict:
    x, y = train
    params = init_params(x.shape[1], int(y.max()) + 1)
    optimizer = AdamW(LEARNING_RATE)
    state = {"params": params, "opt_state": optimizer.init(params)}
    with GradientSynchronizer(params) as sync:
        for epoch in range(epochs):
            batches = global_batches(len(x), epoch)
            losses = []
            for step, indices in enumerate(batches, 1):
                mine = my_shard(indices, rank, world_size)
                state, metrics = train_step(grad_fn, optimizer, state, (x[mine], y[mine]),
                                            sync=sync)
                losses.append(metrics["loss"])
                if rank == 0:
                    progress(epoch, epochs, step, len(batches), float(np.mean(losses)))
            accuracy = test_accuracy(state["params"], test, rank, world_size)
            if rank == 0:
                print(f"  test accuracy {accuracy:6.2%}", flush=True)
    return state["params"]


def train_one_process(train, epochs: int) -> dict:
    """The same training on the whole global batches, no communication."""
    x, y = train
    params = init_params(x.shape[1], int(y.max()) + 1)
    optimizer = AdamW(LEARNING_RATE)
    opt_state = optimizer.init(params)
    for epoch in range(epochs):
        for indices in global_batches(len(x), epoch):
            _, grads = grad_fn(params, (x[indices], y[indices]))
            params, opt_state = optimizer.step(params, grads, opt_state)
    return params


def leaves(params: dict) -> list[np.ndarray]:
    return [params[layer][name] for layer in sorted(params) for name in sorted(params[layer])]


def replicas_differ(params: dict) -> float:
    """Largest difference between any two ranks' parameters."""
    flat = np.concatenate([p.ravel() for p in leaves(params)])
    return float(np.max(concord.all_reduce(flat, op="max") - concord.all_reduce(flat, op="min")))


def verify(params: dict, train, epochs: int, rank: int, world_size: int) -> bool:
    """Rank 0 compares with one process; every rank learns the verdict."""
    spread = replicas_differ(params)
    verdict = np.zeros(1, np.float64)
    if rank == 0:
        reference = train_one_process(train, epochs)
        difference = max(float(np.max(np.abs(a - b))) for a, b in
                         zip(leaves(params), leaves(reference)))
        ok = spread == 0.0 and difference <= TOLERANCE
        steps = epochs * len(global_batches(len(train[0]), 0))
        print(f"{world_size} ranks vs one process on the same {steps} global batches: "
              f"max |param difference| {difference:.2e} (tolerance {TOLERANCE:g}), "
              f"replicas {'identical' if spread == 0.0 else f'differ by {spread:.2e}'}: "
              f"{'OK' if ok else 'MISMATCH'}")
        verdict[0] = float(ok)
    concord.broadcast(verdict, root=0, out=verdict)
    return bool(verdict[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=15)
    args = parser.parse_args()
    concord.init()
    rank, world_size = concord.rank(), concord.world_size()
    if GLOBAL_BATCH % world_size:
        raise SystemExit(f"the global batch of {GLOBAL_BATCH} does not split over {world_size} ranks")
    train, test = load_data()
    if rank == 0:
        print(f"digits: {len(train[0])} training and {len(test[0])} test images; MLP "
              f"{train[0].shape[1]}-{HIDDEN}-10, AdamW lr {LEARNING_RATE:g}; global batch "
              f"{GLOBAL_BATCH} = {world_size} ranks x {GLOBAL_BATCH // world_size}", flush=True)
    start = time.perf_counter()
    params = train_data_parallel(train, test, args.epochs, rank, world_size)
    if rank == 0:
        print(f"trained {args.epochs} epochs in {time.perf_counter() - start:.1f} s", flush=True)
    ok = verify(params, train, args.epochs, rank, world_size)
    concord.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
