"""concord.metrics: distributed metrics for any array library.

Two APIs:

- functional reductions of metric pytrees across ranks (datarax):
  reduce_mean / reduce_sum / reduce_max / reduce_min, reduce_custom,
  reduce_mean_collective / reduce_sum_collective (datarax's names, bound
  from concord._aliases), all_gather, collect_from_devices (see
  concord.metrics.functional);
- stateful metrics with local updates and an asynchronous fused sync
  (d9d, torchmetrics): Metric and its implementations, MetricCollection
  (see concord.metrics.base for the lifecycle and how the synced totals
  and the local window are kept apart).

Both work where the data lives: metric states live in the array library
and on the device of a metric's first inputs (NumPy on the host, torch or
CuPy on their device; see concord.metrics.base), updates never wait for
the device, and functional reductions return each leaf's own type on its
own device.
"""

from .. import _aliases
from ..mesh import BATCH_AXIS
from .aggregation import Cat, Max, Mean, Min, Sum, WeightedMean
from .base import Metric
from .classification import (
    Accuracy,
    BinaryAUROC,
    ConfusionMatrix,
    F1Score,
    FBetaScore,
    Precision,
    Recall,
)
from .collection import MetricCollection
from .functional import (
    all_gather,
    collect_from_devices,
    reduce_custom,
    reduce_max,
    reduce_mean,
    reduce_min,
    reduce_sum,
)

__all__ = [
    "Accuracy",
    "BinaryAUROC",
    "Cat",
    "ConfusionMatrix",
    "F1Score",
    "FBetaScore",
    "Max",
    "Mean",
    "Metric",
    "MetricCollection",
    "Min",
    "Precision",
    "Recall",
    "Sum",
    "WeightedMean",
    "all_gather",
    "collect_from_devices",
    "reduce_custom",
    "reduce_max",
    "reduce_mean",
    "reduce_min",
    "reduce_sum",
]

_aliases.bind_collectives(globals(), BATCH_AXIS)
__all__ += _aliases.COLLECTIVES
