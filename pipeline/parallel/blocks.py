"""What Dask runs on each row block of a user's Dask input: predictions, checks, scores.

The estimator builds its lazy ``predict`` and ``predict_proba`` of Dask input from these
(``map_blocks``), and its ``score`` from one :func:`score_parts` task a block.
They are pickled into every task by reference, so the workers import this module, never
the estimator's, which imports scikit-learn: seconds that a fresh worker paid in a fit's
first staging or score (docs/design.md). Nothing here imports it;
``tests/test_worker_imports.py`` checks that workers never do.
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
    "combined_score",
    "label_kind",
    "on_frame",
    "refuse_missing_labels",
    "refuse_mixed_label_kinds",
    "refuse_non_finite_features",
    "refuse_non_finite_targets",
    "score_parts",
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


def label_kind(labels: np.ndarray) -> str | None:
    """``"string"``, ``"number"`` or None (undecided: no labels, or objects of neither),
    as scikit-learn tells labels apart when it refuses to compare them."""
    kind = np.asarray(labels).dtype.kind
    if kind in "US":
        return "string"
    if kind in "biuf":
        return "number"
    if kind == "O" and len(labels):
        first = np.asarray(labels).ravel()[0]
        if isinstance(first, str):
            return "string"
        if isinstance(first, (int, float, np.number, bool, np.bool_)):
            return "number"
    return None


def refuse_mixed_label_kinds(labels: np.ndarray, classes: np.ndarray) -> None:
    """Raise as scikit-learn's accuracy does for labels of one kind (strings, numbers)
    against classes of the other: no label could equal a prediction, and the score of a
    block of them was 0.0 without a word."""
    kinds = {label_kind(labels), label_kind(classes)}
    if kinds == {"string", "number"}:
        raise ValueError(
            "Mix of label input types (string and number): the labels are "
            f"{label_kind(labels)}s, the classes the model was fitted on "
            f"{label_kind(classes)}s"
        )


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


def score_parts(
    predict: Callable,
    regression: bool,
    start: int,
    features: np.ndarray,
    labels: np.ndarray,
    weights: np.ndarray | None,
) -> np.ndarray:
    """One row block's part of a score, in one task: its features and labels checked
    (``start`` its first row's number, for the messages), predicted and compared.

    A classifier's part is ``[[sum of weights of right rows, sum of weights]]`` (a row of
    several labels is right when all are); a regressor's, per output (columns), the sum of
    weights, the weighted mean of the targets, the weighted sum of squares about that mean
    and of the residuals. :func:`combined_score` adds the blocks' parts up.
    """
    rows = np.arange(start, start + len(features))
    refuse_non_finite_features(features, rows)
    w = np.ones(len(features)) if weights is None else np.asarray(weights, np.float64)
    predictions = predict(features)
    if not regression:
        refuse_missing_labels(labels, rows)
        refuse_mixed_label_kinds(labels, predictions)
        right = predictions == labels
        if right.ndim == 2:
            right = right.all(axis=1)
        return np.array([[np.sum(w * right), np.sum(w)]])
    refuse_non_finite_targets(labels, rows)
    targets = as_rows(np.asarray(labels, np.float64))
    predictions = np.asarray(predictions, np.float64).reshape(targets.shape)
    total = np.sum(w)
    mean = w @ targets / total if total > 0 else np.zeros(targets.shape[1])
    spread = w @ (targets - mean) ** 2
    residual = w @ (targets - predictions) ** 2
    return np.vstack([np.full_like(mean, total), mean, spread, residual])


def combined_score(parts: list[np.ndarray], regression: bool) -> float:
    """The score of the rows whose blocks gave ``parts`` (:func:`score_parts`): accuracy,
    or R^2 per output averaged over the outputs. The blocks' spreads are pooled about the
    overall mean (Chan et al.'s update), as one pass over all rows would find them."""
    if not regression:
        right, total = np.sum(np.vstack(parts), axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return float(right / total)
    total = mean = spread = residual = 0.0
    for part in parts:
        n, block_mean, block_spread, block_residual = part
        if not n.any():
            continue
        new_total = total + n
        delta = block_mean - mean
        mean = mean + delta * n / new_total
        spread = spread + block_spread + delta**2 * total * n / new_total
        residual = residual + block_residual
        total = new_total
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.mean(1 - np.asarray(residual) / spread))
