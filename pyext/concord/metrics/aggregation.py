"""Aggregation metrics: Sum, Mean, WeightedMean, Max, Min, Cat."""

from __future__ import annotations

import math

import numpy as np

from .base import Metric, run_kernel, to_numpy

__all__ = ["Cat", "Max", "Mean", "Min", "Sum", "WeightedMean"]


class _Totals(Metric):
    """State: float64 [sum(values * weights), sum(weights)], summed across
    ranks; weights default to 1, so the second entry counts values."""

    def __init__(self):
        super().__init__()
        self._add_state("totals", "sum", (2,))

    def _add(self, values, weights=None):
        values, weights = self._begin_update(values, weights)
        run_kernel("weighted_sum", self._window["totals"], values, weights)

    def _mean(self):
        total, weight = self._host("totals")
        return self._ratio(total, weight)


class WeightedMean(_Totals):
    """sum(values * weights) / sum(weights) over every value seen; NaN with
    a RuntimeWarning while the weights sum to zero."""

    def update(self, values, weights=None):
        """values: an array (any shape) or scalar; weights: the same shape,
        or None for 1 per value."""
        self._add(values, weights)

    def _compute(self):
        return self._mean()


class Mean(_Totals):
    """The mean of every value seen; NaN with a RuntimeWarning before any."""

    def update(self, values):
        self._add(values)

    def _compute(self):
        return self._mean()


class Sum(_Totals):
    """The sum of every value seen, as a float (0.0 before any)."""

    def update(self, values):
        self._add(values)

    def _compute(self):
        return float(self._host("totals")[0])


class Max(Metric):
    """The largest value seen, NaN values skipped; -inf before any (the
    identity of max, as torchmetrics' MaxMetric)."""

    _op = "max"

    def __init__(self):
        super().__init__()
        self._add_state("value", self._op, (1,))

    def update(self, values):
        (values,) = self._begin_update(values)
        run_kernel(self._op, self._window["value"], values)

    def _compute(self):
        return float(self._host("value")[0])


class Min(Max):
    """The smallest value seen, NaN values skipped; inf before any."""

    _op = "min"


class Cat(Metric):
    """Every value seen, concatenated: rank by rank for data synced together
    (sync order first), then this rank's unsynced window.

    Values are cast to `dtype` and split into rows of `item_shape` (scalars
    by default, so any input is flattened). Ranks may add different numbers
    of rows; a sync gathers them (it does not reduce). compute() returns an
    array of the metric's home (NumPy for NumPy inputs, torch for torch
    inputs, on their device) of shape (rows, *item_shape)."""

    def __init__(self, dtype=np.float64, item_shape=()):
        super().__init__()
        self._item_shape = tuple(int(d) for d in item_shape)
        if any(d < 1 for d in self._item_shape):
            raise ValueError(f"Cat: item_shape {self._item_shape} must have positive dimensions")
        self._row_size = math.prod(self._item_shape)
        self._add_state("values", "cat", self._item_shape, dtype)

    def update(self, values):
        (values,) = self._begin_update(values)
        xp = self._where.xp
        array = to_numpy(values) if xp is np else values
        shape = tuple(array.shape)
        if math.prod(shape) % self._row_size:
            raise ValueError(f"Cat.update: values of shape {shape} do not split into rows "
                             f"of shape {self._item_shape}; expected (N, *{self._item_shape})")
        spec = self._specs["values"]
        if xp is np:
            rows = array.astype(spec.dtype, copy=True).reshape(-1, *self._item_shape)
        else:  # a copy in the home: the caller may reuse its array
            rows = xp.reshape(xp.astype(array, spec.dtype_in(xp), copy=True),
                              (-1, *self._item_shape))
        self._window["values"].append(rows)

    def _compute(self):
        return self._value("values")
