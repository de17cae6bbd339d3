"""What Dask runs on each row block of a user's Dask input: predictions and label checks.

The estimator builds its lazy ``predict``, ``predict_proba`` and ``score`` of Dask input
from these (``map_blocks``). They are pickled into every task by reference, so the
workers import this module, never the estimator's, which imports scikit-learn: seconds
that a fresh worker paid in a fit's first staging or score (docs/design.md). Nothing
here imports it; ``tests/test_worker_imports.py`` checks that workers never do.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hmdspt.core.nn import MLP
from hmdspt.core.shard import LabelColumns, as_rows, first_non_finite
from hmdspt.parallel.readers import check_labels_present, non_finite_error

__all__ = [
    "BlockPredictor",
    "checked_block",
    "on_frame",
    "refuse_missing_labels",
    "refuse_non_finite_features",
    "refuse_non_finite_targets",
    "unless_empty",
]


class BlockPredictor:
    """Predict one block with a model's parameters (and the classes' decoding).

    What a task needs and no more: the network's shape and a copy of the parameters
    scored (never the estimator, nor the live parameters). Each call builds its own
    network, so tasks in one worker's threads share nothing they write.

    Parameters
    ----------
    model : MLP
        The network whose parameters are copied.
    labels : LabelColumns, optional
        A classifier's classes: the outputs are decoded into them (``predict``).
    probabilities : bool, default=False
        The outputs as ``predict_proba`` gives them: a single logistic output becomes the
        two columns ``1 - p, p``.
    """

    def __init__(
        self, model: MLP, labels: LabelColumns | None = None, probabilities: bool = False
    ) -> None:
        self.shape = (model.layer_sizes, model.hidden_activation, model.out_activation)
        self.alpha, self.dtype = model.alpha, model.dtype
        self.params = model.params.copy()
        self.labels = labels
        self.probabilities = probabilities

    def __call__(self, block) -> np.ndarray:
        model = MLP(*self.shape, self.alpha, self.dtype)
        model.set_params(self.params)
        out = model.forward(np.ascontiguousarray(block, dtype=self.dtype))
        if self.probabilities:
            return np.column_stack([1 - out[:, 0], out[:, 0]]) if out.shape[1] == 1 else out
        if out.shape[1] == 1:
            out = out.ravel()
        return out if self.labels is None else self.labels.inverse(out)


def on_frame(method: Callable, dtypes: dict, block: np.ndarray):
    """``method`` on a block as the data frame it came from: its feature names and column
    types (a frame with a bool or Int64 column comes as an object array)."""
    import pandas as pd

    return method(pd.DataFrame(block, columns=list(dtypes)).astype(dtypes))


def unless_empty(method: Callable, n_columns: int | None, dtype, block) -> np.ndarray:
    """``method(block)``, or an empty output for a block of no rows (a filter's): the
    estimator's checks refuse 0 samples, which failed the whole prediction."""
    if len(block) == 0:
        return np.empty((0,) if n_columns is None else (0, n_columns), dtype)
    return method(block)


def checked_block(
    check: Callable[[np.ndarray, np.ndarray], None],
    block: np.ndarray,
    block_info: dict | None = None,
) -> np.ndarray:
    """``block``, once ``check(block, rows)`` (``rows`` its row numbers) has passed it."""
    start = block_info[0]["array-location"][0][0] if block_info else 0
    check(block, np.arange(start, start + len(block)))
    return block


def refuse_missing_labels(labels: np.ndarray, rows: np.ndarray) -> None:
    """Raise, naming the row, if a block of labels has a missing one."""
    check_labels_present(labels, rows, None, whole=False, numeric=True)


def refuse_non_finite_targets(targets: np.ndarray, rows: np.ndarray) -> None:
    """Raise, naming the row, if a block of targets has a NaN or infinity."""
    _refuse_non_finite(as_rows(targets), rows, "y")


def refuse_non_finite_features(features: np.ndarray, rows: np.ndarray) -> None:
    """Raise, naming the row and column, if a block of features has a NaN or infinity (as
    scikit-learn refuses them in memory). A data frame's block of bool or nullable
    integer columns comes as an object array; its missing values count as NaN."""
    try:
        values = np.asarray(features, dtype=np.float64)
    except (TypeError, ValueError):
        import pandas as pd

        values = pd.DataFrame(features).astype("Float64").to_numpy(np.float64, na_value=np.nan)
    _refuse_non_finite(as_rows(values), rows, "X")


def _refuse_non_finite(values: np.ndarray, rows: np.ndarray, part: str) -> None:
    found = first_non_finite(values, rows)
    if found is not None:  # found block by block: "e.g.", not "first"
        raise non_finite_error(None, found, False, part=part)
