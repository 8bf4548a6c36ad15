"""The notebooks of examples/notebooks run top to bottom in a real Jupyter
kernel (nbclient, ipykernel): no cell may fail, and the values they print as
`name: value` lines are checked here against references computed from
their definitions."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "examples" / "notebooks"
# Each notebook takes a few seconds; a cell is stopped well before a minute.
CELL_TIMEOUT_S = 50
NPROCS = 4


def run(name: str) -> tuple[dict[str, object], list]:
    """Executes a notebook; returns its printed `name: value` lines (values
    parsed as Python literals where they are ones) and its cells."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells), f"{name} is stored with outputs"
    nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3").execute()
    printed = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            assert output.output_type != "error", f"{output.ename}: {output.evalue}"
            if output.output_type == "stream" and output.name == "stdout":
                for line in output.text.splitlines():
                    key, _, value = line.partition(": ")
                    try:
                        printed[key] = ast.literal_eval(value)
                    except (ValueError, SyntaxError):
                        printed[key] = value
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count for cell in code), "a code cell did not run"
    return printed, code


def images(cells) -> int:
    return sum("image/png" in output.get("data", {}) for cell in cells for output in cell.outputs)


def quickstart_samples(rank, n=200, classes=3):
    """The quickstart's per-rank samples (seeded the same way)."""
    rng = np.random.default_rng([2024, rank])
    target = rng.integers(0, classes, n)
    preds = np.where(rng.random(n) < 0.7, target, rng.integers(0, classes, n))
    return preds, target, rng.random(n)


def test_quickstart():
    printed, cells = run("quickstart.ipynb")
    n = 5
    assert printed["world sizes"] == [NPROCS] * NPROCS
    assert printed["all_reduce sum"] == (NPROCS * np.arange(n) + sum(range(NPROCS))).tolist()
    assert printed["all_gather ranks"] == list(range(NPROCS))
    assert printed["all_reduce max"] == (np.arange(n) + NPROCS - 1).tolist()
    assert printed["every rank agrees"] is True

    preds, target, loss = (np.concatenate(p) for p in zip(*map(quickstart_samples, range(NPROCS))))
    assert printed["accuracy"] == round(float(np.mean(preds == target)), 6)
    assert printed["mean loss"] == round(float(loss.mean()), 6)
    assert printed["metrics match the reference"] is True

    assert printed["steps"] == [60] * NPROCS
    assert printed["last global loss"] < printed["first global loss"] / 100
    assert printed["ranks agree on the global loss"] is True
    assert printed["matches one process"] is True
    assert images(cells) == 1, "the loss curves were not plotted"


def metrics_samples(rank, n=300, classes=4):
    """The metrics notebook's per-rank scores and targets."""
    rng = np.random.default_rng([7, rank])
    target = rng.integers(0, classes, n)
    scores = rng.random((n, classes))
    scores[np.arange(n), target] += 0.3 + 0.2 * rank
    return scores.astype(np.float32), target


def test_metrics():
    printed, cells = run("metrics.ipynb")
    samples = [metrics_samples(rank) for rank in range(NPROCS)]
    confusion = np.zeros((4, 4), np.int64)
    for scores, target in samples:
        for t, p in zip(target, scores.argmax(axis=1)):
            confusion[t, p] += 1
    assert printed["samples per rank"] == [300] * NPROCS
    assert printed["synced samples"] == 300 * NPROCS
    assert printed["confusion matrix"] == confusion.tolist()
    assert printed["every rank agrees"] is True
    assert printed["matches the reference"] is True
    assert printed["precision"] == np.round(np.diag(confusion) / confusion.sum(axis=0), 4).tolist()
    assert printed["recall"] == np.round(np.diag(confusion) / confusion.sum(axis=1), 4).tolist()
    assert printed["scores match the reference"] is True
    assert images(cells) == 1, "the confusion matrices were not plotted"
