"""Collectives on real NumPy arrays, each checked against NumPy.

    python -m concord.run -n 4 examples/train_mlp.py

Every rank draws its arrays from a seed derived from its rank, so every rank
can also draw all other ranks' arrays and compute the expected result with
NumPy. Rank 0 prints, per collective, the largest error seen on any rank;
the exit status is non-zero when any rank saw a mismatch.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

import concord

SEED = 20240611


@dataclass(frozen=True)
class Case:
    collective: str
    op: str | None
    dtype: str
    shape: tuple[int, ...]  # each rank's input; for reduce_scatter, each rank's output


# Sizes: tiny, prime (not divisible by the world size), several MB.
CASES = [
    Case("all_reduce", "sum", "float32", (1,)),
    Case("all_reduce", "sum", "float32", (1_000_003,)),
    Case("all_reduce", "sum", "float64", (257, 129)),
    Case("all_reduce", "mean", "float32", (3, 1024, 1024)),
    Case("all_reduce", "max", "int32", (65_537,)),
    Case("all_reduce", "min", "float16", (4099,)),
    Case("all_gather", None, "float32", (257, 1024)),
    Case("all_gather", None, "int64", (1_000_003,)),
    Case("reduce_scatter", "sum", "float32", (1024, 512)),
    Case("reduce_scatter", "max", "float64", (65_537,)),
]

# Largest error allowed, relative to the largest expected magnitude (>= 1):
# ranks may add floats in another order than NumPy does.
TOLERANCE = {"float16": 1e-3, "float32": 1e-6, "float64": 1e-14, "int32": 0.0, "int64": 0.0}


def input_shape(case: Case, world_size: int) -> tuple[int, ...]:
    if case.collective == "reduce_scatter":
        return (case.shape[0] * world_size, *case.shape[1:])
    return case.shape


def rank_input(case_index: int, rank: int, case: Case, world_size: int) -> np.ndarray:
    shape = input_shape(case, world_size)
    rng = np.random.default_rng([SEED, case_index, rank])
    if np.dtype(case.dtype).kind == "i":
        return rng.integers(-1_000_000, 1_000_000, size=shape, dtype=case.dtype)
    return rng.standard_normal(shape).astype(case.dtype)


def reference(case: Case, inputs: list[np.ndarray], rank: int) -> np.ndarray:
    """The expected result on `rank`, computed by NumPy (in float64 for
    floats, then rounded to the dtype once)."""
    if case.collective == "all_gather":
        return np.concatenate(inputs, axis=0)
    wide = np.stack([x.astype(np.float64) if x.dtype.kind == "f" else x for x in inputs])
    reduce = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[case.op]
    reduced = reduce(wide, axis=0).astype(inputs[0].dtype)
    if case.collective == "reduce_scatter":
        return np.split(reduced, len(inputs), axis=0)[rank]
    return reduced


def run_collective(case: Case, x: np.ndarray) -> np.ndarray:
    if case.collective == "all_reduce":
        return concord.all_reduce(x, op=case.op)
    if case.collective == "all_gather":
        return concord.all_gather(x, axis=0)
    return concord.reduce_scatter(x, op=case.op, axis=0)


def max_abs_error(got: np.ndarray, expected: np.ndarray) -> float:
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return float("inf")
    if expected.size == 0:
        return 0.0
    return float(np.abs(got.astype(np.float64) - expected.astype(np.float64)).max())


def check_case(case_index: int, case: Case, rank: int, world_size: int) -> tuple[float, bool]:
    """(max abs error, within tolerance) of one collective on this rank."""
    inputs = [rank_input(case_index, r, case, world_size) for r in range(world_size)]
    got = np.asarray(run_collective(case, inputs[rank]))
    expected = reference(case, inputs, rank)
    error = max_abs_error(got, expected)
    scale = max(1.0, float(np.abs(expected).max())) if expected.size else 1.0
    return error, error <= TOLERANCE[case.dtype] * scale


def describe(case: Case, world_size: int) -> str:
    shape = input_shape(case, world_size)
    mib = np.prod(shape) * np.dtype(case.dtype).itemsize / 2**20
    return (f"{case.collective:<15} {case.op or '-':<5} {case.dtype:<8} {str(shape):<17} "
            f"{mib:6.2f} MiB")


def main() -> int:
    concord.init()
    rank, world_size = concord.rank(), concord.world_size()
    checks = [check_case(i, case, rank, world_size) for i, case in enumerate(CASES)]
    # One collective tells rank 0 the worst error and any mismatch on any rank.
    local = np.array([[error for error, _ in checks], [float(not ok) for _, ok in checks]])
    errors, mismatches = np.asarray(concord.all_reduce(local, op="max"))
    if rank == 0:
        print(f"{world_size} ranks, {concord.world().backend} backend; input per rank, "
              "max abs error over all ranks:")
        for case, error, mismatch in zip(CASES, errors, mismatches):
            verdict = "MISMATCH" if mismatch else "ok"
            print(f"  {describe(case, world_size)}  {error:9.2e}  {verdict}")
        verified = int(len(CASES) - mismatches.sum())
        print(f"verified {verified}/{len(CASES)} collectives on {world_size} ranks")
    concord.shutdown()
    return 1 if mismatches.any() else 0


if __name__ == "__main__":
    sys.exit(main())
