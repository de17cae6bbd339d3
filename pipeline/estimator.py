"""scikit-learn estimators backed by the flat-parameter numpy MLP.

``BPNNClassifier`` and ``BPNNRegressor`` take ``MLPClassifier`` / ``MLPRegressor``'s
parameters where they make sense and keep their fitted attributes, so existing code,
``Pipeline`` and ``GridSearchCV`` work unchanged. The structure follows
``sklearn/neural_network/_multilayer_perceptron.py``: parameters stored verbatim in
``__init__``, validation in ``fit``, fitted attributes ending in ``_``.

Differences from scikit-learn, on purpose:

- only the stochastic solvers ``"sgd"`` and ``"adam"`` (the parallel algorithm is
  mini-batch based; L-BFGS is not);
- ``dtype`` (float32 by default): the network computes in that type whatever the input;
- all parameters live in one contiguous vector (see :mod:`hmdspt.core.nn`); ``coefs_`` and
  ``intercepts_`` are views into it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import multiprocessing
import numbers
import os
import sys
import time
import warnings
from numbers import Integral, Real

import numpy as np
from scipy import sparse
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, _fit_context, is_classifier
from sklearn.exceptions import ConvergenceWarning, DataConversionWarning
from sklearn.metrics import accuracy_score, r2_score
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import LabelBinarizer
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import (
    Interval,
    Options,
    StrOptions,
    validate_parameter_constraints,
)
from sklearn.utils.multiclass import (
    _check_partial_fit_first_call,
    check_classification_targets,
    type_of_target,
    unique_labels,
)
from sklearn.utils.validation import (
    _check_feature_names,
    _check_sample_weight,
    check_is_fitted,
    column_or_1d,
    validate_data,
)

from hmdspt.core.callers import user_stacklevel
from hmdspt.core.checkpoint import (
    check_fingerprint,
    held_for_one_fit,
    load_latest_checkpoint,
    model_fingerprint,
    save_checkpoint,
)
from hmdspt.core.config import COMPRESSION_MODES, TrainerConfig
from hmdspt.core.nn import (
    MLP,
    BatchBuffers,
    divergence_message,
    make_optimizer,
    minibatch_pass,
    split_weights,
    weighted_targets,
)
from hmdspt.core.shard import DataError, LabelColumns
from hmdspt.core.strategies import PARTITION_POLICIES, SYNC_STRATEGIES
from hmdspt.parallel import blocks

__all__ = ["TRAINER_OPTIONS", "BPNNClassifier", "BPNNRegressor"]

_HIDDEN_ACTIVATIONS = {"identity", "logistic", "tanh", "relu"}

#: TrainerConfig's defaults: the one source of the cluster parameters' defaults.
_TRAINER_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainerConfig)}

#: TrainerConfig fields that are estimator parameters of their own (same name, same default).
_TRAINER_PARAMETERS = (
    "sync",
    "partition",
    "rounds_per_epoch",
    "block_momentum",
    "compression",
    "run_log",
    "max_seconds",
    "checkpoint_dir",
    "checkpoint_every",
    "resume",
)

#: The rarely changed TrainerConfig fields, reached through ``trainer_options``, with their
#: constraints (``TrainerConfig.validate`` then checks them together with the rest). The
#: fields in neither list are the estimator's to fill: ``seed`` (from ``random_state``),
#: ``emulation`` (from the client's cluster) and ``record_row_ids`` (an audit of the
#: ``Trainer`` object, which the estimator does not expose).
_TRAINER_OPTION_CONSTRAINTS: dict = {
    "sync_budget": [Interval(Real, 0, 1, closed="neither")],
    "max_local_steps": [Interval(Integral, 1, None, closed="left")],
    "early_local_steps": [Interval(Integral, 1, None, closed="left")],
    "block_lr": [Interval(Real, 0, None, closed="neither")],
    "local_lr_scale": [Interval(Real, 0, None, closed="neither")],
    "normalize_steps": ["boolean"],
    "topk": [Interval(Real, 0, 1, closed="right")],
    "warm_start_rows": [Interval(Integral, 0, None, closed="left")],
    "warm_start_epochs": [Interval(Integral, 0, None, closed="left")],
    "first_wave_fraction": [Interval(Real, 0, 1, closed="right")],
    "ramp_rounds": [Interval(Integral, 0, None, closed="left")],
    "ramp_first_round_s": [Interval(Real, 0, None, closed="neither")],
    "max_ramp_rounds": [Interval(Integral, 0, None, closed="left")],
    "probe_seconds": [None, Interval(Real, 0, None, closed="neither")],
    "reuse_speeds_s": [Interval(Real, 0, None, closed="left")],
    "cost_window_s": [Interval(Real, 0, None, closed="left")],
    "rebalance_threshold": [Interval(Real, 0, 1, closed="left")],
    "min_rows": [Interval(Integral, 0, None, closed="left")],
    "quiet_workers": ["boolean"],
    "broadcast_timeout_s": [Interval(Real, 0, None, closed="neither")],
    "stall_warning_s": [Interval(Real, 0, None, closed="neither")],
    "eval_resolution": [Interval(Real, 0, None, closed="left")],
}

#: The keys ``trainer_options`` accepts, in TrainerConfig's order.
TRAINER_OPTIONS = tuple(n for n in _TRAINER_DEFAULTS if n in _TRAINER_OPTION_CONSTRAINTS)


def _is_dask_array(X) -> bool:
    return type(X).__module__.startswith("dask.array") and hasattr(X, "map_blocks")


def _is_dask_frame(X) -> bool:
    return type(X).__module__.startswith("dask") and hasattr(X, "map_partitions")


def _is_lazy(X) -> bool:
    """Dask input: predictions are lazy, computed block by block on the workers."""
    return _is_dask_array(X) or _is_dask_frame(X)


def _rows_of(X):
    """A Dask array of ``X``'s rows with known block lengths (counted on the workers of
    Dask's current scheduler)."""
    if _is_dask_frame(X):
        # Not to_dask_array(lengths=True): it counts the blocks of a column of a parquet
        # frame as Dask fuses them, then refuses them against the partitions (4 != 15).
        from hmdspt.parallel.sources import known_rows

        return known_rows(None, X)
    return X.compute_chunk_sizes() if any(np.isnan(c) for c in X.chunks[0]) else X


def _check_lazy_table(estimator, X) -> None:
    """Refuse Dask ``X`` that is not a table of rows (a 1-D array, a Series, an array of
    more dimensions, a frame that names two columns alike) in scikit-learn's words, as
    the same data in memory is refused: a fit took a 1-D array for one feature, and its
    early stopping, predictions and scores failed on the workers ("Axis 1 is out of
    bounds")."""
    if _is_dask_frame(X) and X.ndim == 1:  # a Dask Series (it has a .columns too)
        raise ValueError(
            f"Expected a 2-dimensional container but got {type(X)} instead. Pass a DataFrame "
            "containing a single row (i.e. single sample) or a single column (i.e. single "
            "feature) instead."
        )
    if _is_dask_array(X) and X.ndim == 1:
        raise ValueError(
            f"Expected 2D array, got 1D array instead: a Dask array of shape {X.shape}. "
            "Reshape your data either using array.reshape(-1, 1) if your data has a single "
            "feature or array.reshape(1, -1) if it contains a single sample."
        )
    if _is_dask_array(X) and X.ndim != 2:
        raise ValueError(
            f"Found array with dim {X.ndim}. {type(estimator).__name__} expected <= 2."
        )
    if _is_dask_frame(X) and not X.columns.is_unique:  # trained as columns of one name
        counts = X.columns.value_counts()
        repeated = ", ".join(f"{name!r} {n} times" for name, n in counts[counts > 1].items())
        raise ValueError(f"Expected unique column names, got: {repeated}")


def _warn_column_vector(y) -> None:
    """Labels of one column (Dask or in memory, beside Dask ``X``) warn as scikit-learn
    warns for the same in memory."""
    if y is None or isinstance(y, (str, os.PathLike)):
        return
    shape = y.shape if hasattr(y, "shape") else np.shape(y)  # a Dask frame's rows: lazy
    if len(shape) == 2 and shape[1] == 1:
        warnings.warn(
            "A column-vector y was passed when a 1d array was expected. Please change the "
            "shape of y to (n_samples, ), for example using ravel().",
            DataConversionWarning,
            stacklevel=user_stacklevel(),
        )


def _check_lazy_input(estimator, X) -> None:
    """Refuse Dask ``X`` of another width, or a Dask data frame of non-numeric or other
    columns, when predictions are asked for, as scikit-learn refuses an array or a frame
    in memory: each block's check would only fail on the workers at compute time."""
    _check_lazy_table(estimator, X)
    if _is_dask_frame(X):
        _check_numeric_columns(X)
        # Its empty pandas meta: scikit-learn reads no names from a Dask frame itself.
        _check_feature_names(estimator, X._meta, reset=False)
    width = len(X.columns) if _is_dask_frame(X) else X.shape[1]
    if not np.isnan(width):
        estimator._set_n_features(width, None, reset=False)


def _row_blocks(method, X, n_columns: int | None, dtype):
    """``(rows, method)``: Dask array or DataFrame ``X`` as a Dask array of whole rows in
    every block, and ``method`` wrapped to take such a block (a frame's as its frame, a
    block of no rows). ``n_columns`` is the width of the output, None for a 1-d output."""
    if _is_dask_frame(X):
        method = functools.partial(blocks.on_frame, method, dict(X.dtypes.items()))
    method = functools.partial(blocks.unless_empty, method, n_columns, dtype)
    return _rows_of(X).rechunk({1: -1}), method


def _blockwise(method, X, n_columns: int | None, dtype):
    """Apply ``method`` to every row block of Dask array or DataFrame ``X``; a Dask array.

    ``n_columns`` is the width of the output, None for a 1-d output.
    """
    X, method = _row_blocks(method, X, n_columns, dtype)
    # A NaN or infinite feature is refused, by its row, as scikit-learn refuses it in
    # memory: the network would predict the first class for it, and a score count it.
    X = _checked_by_block(X, blocks.refuse_non_finite_features)
    if n_columns is None:
        return X.map_blocks(method, dtype=dtype, drop_axis=1, meta=np.empty((0,), dtype))
    return X.map_blocks(
        method, dtype=dtype, chunks=(X.chunks[0], (n_columns,)), meta=np.empty((0, 0), dtype)
    )


def _aligned_rows(values, rows, what: str = "y"):
    """``values`` (``what``: ``"y"`` or ``"sample_weight"``, Dask or in memory) as a Dask
    array in the row blocks of the Dask array ``rows``; refused in scikit-learn's words
    where their lengths differ (Dask's rechunk said "Chunks do not add up to shape")."""
    import dask.array as da

    values = _rows_of(values) if _is_lazy(values) else da.from_array(np.asarray(values))
    n_rows, n_values = rows.shape[0], values.shape[0]
    if what == "sample_weight" and values.ndim != 1:
        raise ValueError(
            f"Sample weights must be 1D array or scalar, got {values.ndim}D array of shape "
            f"{values.shape} instead."
        )
    if n_values != n_rows:
        if what == "sample_weight":
            raise ValueError(f"sample_weight.shape == ({n_values},), expected ({n_rows},)!")
        raise ValueError(
            f"Found input variables with inconsistent numbers of samples: [{n_rows}, {n_values}]"
        )
    return values.rechunk({0: rows.chunks[0]})


def _checked_by_block(values, check):
    """Dask ``values`` whose blocks are passed, as they are computed, to ``check(block,
    rows)`` (``rows`` their row numbers), which raises on a bad one, naming its row."""
    return values.map_blocks(functools.partial(blocks.checked_block, check), dtype=values.dtype)


def _label_sample(y) -> np.ndarray:
    """Labels that tell what kind ``y``'s are (:func:`blocks.label_kind`) without computing
    Dask ``y``: none of its dtype, or none at all for a dtype numpy lacks (pandas' own)."""
    if not _is_lazy(y):
        return np.asarray(y)[:1]
    try:
        return np.empty(0, np.dtype(y.dtype))
    except TypeError:
        return np.empty(0, object)


def _score_of_dask(estimator, X, y, model: MLP, sample_weight=None, client=None) -> float:
    """``model``'s score (accuracy or R^2) of Dask ``X`` against ``y``, one task per row
    block: each checks its rows, predicts and compares them, and returns the sums the
    score is added up from (:func:`blocks.score_parts`). As a lazy graph of predictions,
    checks, comparisons and means, a score took six tasks a block."""
    import dask

    if isinstance(y, str) and _is_dask_frame(X):  # the label column, as fit takes it
        X, y = X.drop(columns=[y]), X[y]
    _check_lazy_input(estimator, X)
    regression = not is_classifier(estimator)
    labels = None if regression else estimator._label_columns()
    dtype = model.dtype if regression else estimator.classes_.dtype
    if not regression:  # known from the dtype alone but for objects (then per block)
        blocks.refuse_mixed_label_kinds(_label_sample(y), estimator.classes_)
    predictor = blocks.BlockPredictor(model, labels)
    rows, predict = _row_blocks(predictor, X, _prediction_width(estimator), dtype)
    targets = _aligned_rows(y, rows)
    if targets.ndim == 2:
        targets = targets.rechunk({1: -1})
    if sample_weight is not None and np.ndim(sample_weight) == 0:
        sample_weight = np.full(rows.shape[0], float(sample_weight))
    weights = (
        [None] * rows.numblocks[0]
        if sample_weight is None
        else _aligned_rows(sample_weight, rows, "sample_weight")
        .to_delayed(optimize_graph=False)
        .ravel()
    )
    starts = np.cumsum((0, *rows.chunks[0][:-1]))
    parts = [
        dask.delayed(blocks.score_parts, pure=True)(predict, regression, int(start), x, t, w)
        for start, x, t, w in zip(
            starts,
            rows.to_delayed(optimize_graph=False).ravel(),
            targets.to_delayed(optimize_graph=False).ravel(),
            weights,
        )
    ]
    if client is None:
        computed = dask.compute(*parts, optimize_graph=False)
    else:
        futures = client.compute(parts, optimize_graph=False)
        try:
            computed = client.gather(futures)
        except BaseException:
            # The error's traceback keeps this frame, and the futures in it their results
            # on the workers, for as long as the caller keeps the error.
            client.cancel(futures)
            raise
    return blocks.combined_score(list(computed), regression)


#: Fitted attributes only a fit on a cluster sets; they describe the latest fit, so any
#: other fit drops them.
_CLUSTER_FIT_ATTRIBUTES = ("training_report_", "prediction_", "run_id_", "run_log_path_")


def _emulation_of(client) -> dict | None:
    """The emulated heterogeneity of the cluster, if any (recorded in the run log).

    From ``local_cluster``'s record when the client holds the cluster object, else from
    the workers' own slowdowns (a client connected by address to an emulated cluster:
    its workers run throttled all the same). None where every worker runs at full speed
    (``local_cluster(n_workers=...)``, any real cluster): nothing about it is emulated.
    """
    from hmdspt.parallel.cluster import Emulation

    emulation = getattr(getattr(client, "cluster", None), "emulation", None)
    if emulation is not None:
        slowdowns, speeds = emulation.slowdowns, list(emulation.speeds.values())
        method = emulation.method
    else:
        from hmdspt.parallel.client import scheduler_workers
        from hmdspt.parallel.worker import get_slowdowns

        try:
            by_address = get_slowdowns(client)
            names = {a: str(w.get("name", a)) for a, w in scheduler_workers(client).items()}
        except (OSError, TimeoutError):  # a worker leaving: the fit's own checks say so
            return None
        # In the workers' order by name, as local_cluster lists its speeds.
        slowdowns = {a: by_address[a] for a in sorted(by_address, key=lambda a: names.get(a, a))}
        slowest = max(slowdowns.values(), default=1.0)
        speeds = [round(slowest / k, 6) for k in slowdowns.values()]
        method = Emulation.method
    if all(k == 1 for k in slowdowns.values()):
        return None
    return {"speeds": speeds, "method": str(method)}


def _active_client():
    """The Dask client a ``with Client(...)`` block (or the latest Client) made current."""
    if "distributed" not in sys.modules:  # no Client can exist: spare the import
        return None
    from distributed import default_client

    try:
        return default_client()
    except ValueError:
        return None


def _in_dask_task() -> bool:
    """Whether this code runs as a task on a Dask worker."""
    if "distributed" not in sys.modules:  # no worker can exist: spare the import
        return False
    from distributed import get_worker

    try:
        get_worker()
    except ValueError:
        return False
    return True


def _check_client_param(client, must_be_open: bool = True) -> None:
    """One line naming what is wrong with ``client``, before any data is read
    (``must_be_open=False``: a fit that does not use it, ``partial_fit``)."""
    if client is None or client is False or isinstance(client, (str, os.PathLike)):
        return
    if "distributed" in sys.modules:  # else no Client can exist
        from distributed import Client

        if isinstance(client, Client):
            from hmdspt.parallel.cluster import check_open

            if must_be_open:
                check_open(client)
            return
    if hasattr(client, "scheduler_address"):  # a cluster object
        return
    raise TypeError(
        "client must be a distributed.Client, a cluster, a scheduler address or file, None "
        f"(the active Client if any) or False (in-process), got {type(client).__name__}"
    )


def _is_worker_readable(X) -> bool:
    """A Dask collection or a path: data a cluster's workers read themselves."""
    return isinstance(X, (str, os.PathLike)) or _is_lazy(X)


def _check_label_column_named(X, y) -> None:
    """Refuse several column names as ``y`` of a Dask DataFrame or a file: ``y`` names
    one label column. (A list of names was taken for labels: "X has 2000 rows but y has
    2".)"""
    if not isinstance(y, (list, tuple)) or not y or not all(isinstance(v, str) for v in y):
        return
    columns = set(X.columns) if _is_dask_frame(X) else None
    if columns is not None and not set(y) <= columns:
        return  # labels that happen to be strings
    names = ", ".join(map(repr, y))
    if columns is None:
        raise ValueError(
            f"y names {len(y)} columns of {os.fspath(X)} ({names}); name one label column (a str)"
        )
    raise ValueError(
        f"y names {len(y)} columns of the Dask DataFrame ({names}); name one label column "
        "(a str), or pass several targets as their own collection: "
        "fit(X.drop(columns=[...]), X[[...]])"
    )


def _read_in_process(estimator, X, y):
    """A Dask collection or a file (``y``: its label column or key), read here for
    ``estimator``: Dask ``X`` that is not a table of rows refused before it is computed
    (scikit-learn's message then printed its values), a classifier's missing label in a
    file (a NaN too) named with the file and its row, as on a cluster (a NaN among a
    regressor's targets is refused as such where it is trained)."""
    if isinstance(X, (str, os.PathLike)):
        import pandas as pd

        from hmdspt.parallel.readers import check_labels_present, read_file

        data = read_file(X, y)
        if data.y is None:
            raise ValueError(f"{os.fspath(X)}: no labels; name the label column as y")
        if is_classifier(estimator):
            rows = np.arange(len(data.y))
            check_labels_present(data.y, rows, os.fspath(X), numeric=True)
        features = data.X if data.features is None else pd.DataFrame(data.X, columns=data.features)
        return features, data.y
    _check_lazy_table(estimator, X)
    if isinstance(y, str):  # the label column of a Dask DataFrame
        X, y = X.drop(columns=[y]), X[y]
    return X.compute(), (y.compute() if hasattr(y, "compute") else y)


def _prediction_width(estimator) -> int | None:
    """Columns of ``predict``'s output (None: 1-D)."""
    if estimator.n_outputs_ == 1:
        return None
    if is_classifier(estimator) and estimator.out_activation_ == "softmax":
        return None
    return estimator.n_outputs_


def _check_labels_of_path(path, y) -> None:
    """Refuse a fit's ``y`` beside a data file in the estimator's words: staging's own
    told the user to pass ``target=``, which ``fit`` does not take."""
    from hmdspt.parallel.readers import reader_kind

    if y is not None and not isinstance(y, str):
        raise ValueError(
            f"{os.fspath(path)}: the labels come from the file; name its label column (an "
            ".npz file's label array) as y, not the labels themselves"
        )
    if y is None and reader_kind(path) != "npz":  # an .npz file has a default label array
        raise ValueError(f"{os.fspath(path)}: no labels; name the label column as y")


def _lazy_path(path, y):
    """A data file as Dask ``(features, labels)`` whose blocks the workers read, by
    staging's reader: parquet and CSV as a DataFrame and the Series of its label column
    ``y``; an ``.npz`` as arrays (``y`` the label key, or its default)."""
    from hmdspt.parallel.readers import reader_kind
    from hmdspt.parallel.shards import frame_of, npz_arrays

    if reader_kind(path) == "npz":
        X, labels = npz_arrays(path, y)
        if labels is None:
            raise ValueError(f"{os.fspath(path)}: no labels; name the label array as y")
        return X, labels
    if not isinstance(y, str):
        raise ValueError(f"{os.fspath(path)}: name its label column as y")
    frame = frame_of(path, y)
    return frame.drop(columns=[y]), frame[y]


def _score_of_path(estimator, path, y, sample_weight=None) -> float:
    """``estimator.score`` of the rows of a data file (a float)."""
    return estimator.score(*_lazy_path(path, y), sample_weight=sample_weight)


def _lazy_weights(sample_weight, client, X):
    """A fit's ``sample_weight`` beside rows the workers read, as a Dask array, checked as
    scikit-learn checks weights in memory, before any row is read: 1-D, none negative, not
    all zero (two bools reach the driver). A scalar weighs every row alike."""
    if sample_weight is None:
        return None
    import dask.array as da

    if np.ndim(sample_weight) == 0:
        negative, nonzero = sample_weight < 0, sample_weight != 0
        # One weight for every row, block by block (X's row count may be unknown yet): not
        # the same as none, as the weights' sum divides the L2 penalty.
        weights = _weights_alike(X, float(sample_weight))
    else:
        weights = sample_weight
        if not _is_lazy(weights):
            # Weights the driver holds already: cut into blocks the workers take rows of.
            weights = da.from_array(np.asarray(weights, dtype=np.float64))
        if weights.ndim != 1:
            raise ValueError(
                f"Sample weights must be 1D array or scalar, got {weights.ndim}D array of "
                f"shape {weights.shape} instead."
            )
        # Checked on the workers: two bools reach the driver.
        negative, nonzero = client.gather(
            client.compute([(weights < 0).any(), (weights != 0).any()], optimize_graph=False)
        )
    if negative:
        raise ValueError("Negative values in data passed to `sample_weight`.")
    if not nonzero:
        raise ValueError("Sample weights must contain at least one non-zero number.")
    return weights


def _weights_alike(X, weight: float):
    """The weight ``weight`` for every row of Dask ``X``, in its row blocks."""
    import dask.array as da

    if _is_dask_frame(X):
        X = X.to_dask_array()  # its blocks' lengths stay as they are, known or not
    return da.map_blocks(
        lambda block: np.full(len(block), weight), X, drop_axis=1, dtype=np.float64
    )


def _persisted(client, parts: list, kept_for_fit: list) -> list:
    """Dask ``parts`` persisted on ``client``'s workers, then as arrays of known row
    blocks (None stays None): held-out data read once, then scored there every epoch.
    The persisted collections are appended to ``kept_for_fit``, which the fit releases."""
    from hmdspt.parallel.sources import known_rows_of

    lazy = [p for p in parts if p is not None]
    persisted = client.persist(lazy, optimize_graph=False) if lazy else []
    kept_for_fit.extend(persisted)
    kept = iter(known_rows_of(client, persisted))
    return [None if p is None else next(kept) for p in parts]


def _release_persisted(collections: list) -> None:
    """Drop this process's hold on the futures of persisted Dask ``collections``."""
    if collections:
        from distributed import futures_of

        for fut in futures_of(collections):
            fut.release()


def _n_rows(X) -> int:
    return X.n_rows if hasattr(X, "n_rows") else X.shape[0]


def _refuse_missing_labels(y) -> None:
    """One line naming the first missing label (None, NaN, pd.NA), as the workers name one
    in Dask labels: scikit-learn's checks fail on one with "'<' not supported between
    instances of 'NoneType' and 'str'" or "Input contains NaN"."""
    from hmdspt.parallel.readers import check_labels_present

    values = np.asarray(y)
    if values.ndim:
        check_labels_present(values, np.arange(len(values)), None, numeric=True)


def _check_numeric_columns(X) -> None:
    """One line naming a data frame's non-numeric columns (scikit-learn names a value)."""
    dtypes = getattr(X, "dtypes", None)
    if dtypes is None or not hasattr(dtypes, "items"):  # not a data frame
        return
    from hmdspt.parallel.readers import _check_numeric, non_numeric_columns

    bad = non_numeric_columns(dtypes)
    # The readers' message: a file or Dask frame of the same columns is refused in its words.
    _check_numeric({str(c): str(c) not in bad for c in dtypes.keys()}, "X", labels_known=True)


def _json_float(value: float | None) -> float | str | None:
    """A float JSON can carry: infinities (initial best scores) as strings."""
    if value is None:
        return None
    value = float(value)
    return value if np.isfinite(value) else str(value)


def _from_json_float(value: float | str | None) -> float | None:
    return None if value is None else float(value)


def _classes_of(y: np.ndarray) -> np.ndarray | None:
    """The sorted distinct labels of a 1-D ``y``; None for a 2-D ``y`` or labels of types
    that do not sort together (scikit-learn's checks then name the problem)."""
    if y.ndim != 1:
        return None
    try:
        return np.unique(y)
    except TypeError:
        return None


def _as_dtype(dtype) -> np.dtype:
    """The computing dtype named by the ``dtype`` parameter (float32 or float64)."""
    resolved = np.dtype(dtype)
    if resolved not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    return resolved


class _BaseBPNN(BaseEstimator):
    """Shared fitting machinery of :class:`BPNNClassifier` and :class:`BPNNRegressor`."""

    _parameter_constraints: dict = {
        "hidden_layer_sizes": ["array-like", Interval(Integral, 1, None, closed="left")],
        "activation": [StrOptions(_HIDDEN_ACTIVATIONS)],
        "solver": [StrOptions({"sgd", "adam"})],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "batch_size": [StrOptions({"auto"}), Interval(Integral, 1, None, closed="left")],
        "learning_rate": [StrOptions({"constant", "invscaling", "adaptive"})],
        "learning_rate_init": [Interval(Real, 0, None, closed="neither")],
        "power_t": [Interval(Real, 0, None, closed="left")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "shuffle": ["boolean"],
        "random_state": ["random_state"],
        "tol": [Interval(Real, 0, None, closed="left")],
        "verbose": ["verbose"],
        "warm_start": ["boolean"],
        "momentum": [Interval(Real, 0, 1, closed="both")],
        "nesterovs_momentum": ["boolean"],
        "early_stopping": ["boolean"],
        "validation_fraction": [Interval(Real, 0, 1, closed="left")],
        "beta_1": [Interval(Real, 0, 1, closed="left")],
        "beta_2": [Interval(Real, 0, 1, closed="left")],
        "epsilon": [Interval(Real, 0, None, closed="neither")],
        "n_iter_no_change": [
            Interval(Integral, 1, None, closed="left"),
            Options(Real, {np.inf}),
        ],
        "dtype": [StrOptions({"float32", "float64"}), type, np.dtype],
        "client": "no_validation",
        # The registries' live key views: a strategy registered later is accepted too.
        "partition": [StrOptions(PARTITION_POLICIES.keys())],
        "sync": [StrOptions(SYNC_STRATEGIES.keys())],
        "rounds_per_epoch": [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"})],
        "block_momentum": [Interval(Real, 0, 1, closed="left")],
        "compression": [StrOptions(set(COMPRESSION_MODES))],
        "run_log": [None, str, os.PathLike],
        "max_seconds": [None, Interval(Real, 0, None, closed="neither")],
        "checkpoint_dir": [None, str, os.PathLike],
        "checkpoint_every": [Interval(Integral, 1, None, closed="left")],
        "resume": ["boolean"],
        "trainer_options": [None, dict],
    }

    def __init__(
        self,
        hidden_layer_sizes=(100,),
        activation="relu",
        *,
        solver="adam",
        alpha=0.0001,
        batch_size="auto",
        learning_rate="constant",
        learning_rate_init=0.001,
        power_t=0.5,
        max_iter=200,
        shuffle=True,
        random_state=None,
        tol=1e-4,
        verbose=False,
        warm_start=False,
        momentum=0.9,
        nesterovs_momentum=True,
        early_stopping=False,
        validation_fraction=0.1,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-8,
        n_iter_no_change=10,
        dtype="float32",
        client=None,
        partition=_TRAINER_DEFAULTS["partition"],
        sync=_TRAINER_DEFAULTS["sync"],
        rounds_per_epoch=_TRAINER_DEFAULTS["rounds_per_epoch"],
        block_momentum=_TRAINER_DEFAULTS["block_momentum"],
        compression=_TRAINER_DEFAULTS["compression"],
        run_log=_TRAINER_DEFAULTS["run_log"],
        max_seconds=_TRAINER_DEFAULTS["max_seconds"],
        checkpoint_dir=_TRAINER_DEFAULTS["checkpoint_dir"],
        checkpoint_every=_TRAINER_DEFAULTS["checkpoint_every"],
        resume=_TRAINER_DEFAULTS["resume"],
        trainer_options=None,
    ):
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.solver = solver
        self.alpha = alpha
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.learning_rate_init = learning_rate_init
        self.power_t = power_t
        self.max_iter = max_iter
        self.shuffle = shuffle
        self.random_state = random_state
        self.tol = tol
        self.verbose = verbose
        self.warm_start = warm_start
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.n_iter_no_change = n_iter_no_change
        self.dtype = dtype
        self.client = client
        self.partition = partition
        self.sync = sync
        self.rounds_per_epoch = rounds_per_epoch
        self.block_momentum = block_momentum
        self.compression = compression
        self.run_log = run_log
        self.max_seconds = max_seconds
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.trainer_options = trainer_options

    # ------------------------------------------------------------------ pickling
    def __getstate__(self):
        # A copy: on Python 3.11+ the base class returns the live __dict__ itself.
        state = dict(super().__getstate__())
        # coefs_/intercepts_ are views into the model's flat vector: pickle the vector once
        # and rebind the views on load, so they keep sharing memory.
        state.pop("coefs_", None)
        state.pop("intercepts_", None)
        # A saved model carries no connection settings, an address no more than a live
        # Client: a file's address would make the next fit talk to whoever it names.
        if state.get("client") not in (None, False):
            state["client"] = None
            # Remembered so that a copy in another process (joblib's n_jobs > 1) does not
            # silently fit in-process instead of on the cluster: see _cluster_target.
            state["_client_not_pickled"] = True
        return state

    def __setstate__(self, state):
        # The file may not come from __getstate__ (an older version, or written by hand):
        # loading drops a client it names, so loading never leads to a connection.
        state = dict(state)
        if state.get("client") not in (None, False):
            state["client"] = None
            state["_client_not_pickled"] = True
        state.setdefault("trainer_options", None)  # saved before the parameter existed
        super().__setstate__(state)
        if "_model" in self.__dict__:
            self._bind_fitted_views()

    def __sklearn_clone__(self):
        """An unfitted copy with the same parameters, sharing ``client`` if it is live.

        A live Client or cluster is a connection, not a setting, and cannot be deep-copied
        (``clone`` deep-copies every other parameter): the clone fits on the same cluster.
        """
        client = self.client
        if client is None or client is False or isinstance(client, (str, os.PathLike)):
            return super().__sklearn_clone__()
        # Clone a shallow copy made through __getstate__ (so without the client), which
        # carries whatever else clone copies (metadata requests, output config, ...).
        cloned = super(_BaseBPNN, copy.copy(self)).__sklearn_clone__()
        cloned.client = client
        return cloned

    def _bind_fitted_views(self) -> None:
        self.coefs_ = self._model.coefs
        self.intercepts_ = self._model.intercepts

    # ------------------------------------------------------------------- fitting
    def _hidden_sizes(self) -> list[int]:
        sizes = self.hidden_layer_sizes
        if not hasattr(sizes, "__iter__"):
            sizes = [sizes]
        sizes = list(sizes)
        if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) for s in sizes):
            # int() would make 4.5 units 4 and "8" 8 without a word.
            raise ValueError(f"hidden_layer_sizes must hold whole numbers of units, got {sizes}.")
        if any(int(s) <= 0 for s in sizes):
            raise ValueError(f"hidden_layer_sizes must be > 0, got {sizes}.")
        return [int(s) for s in sizes]

    def _fit(
        self,
        X,
        y,
        incremental: bool = False,
        eval_set=None,
        called_at=None,
        on_round=None,
        sample_weight=None,
        prepare=None,
    ):
        # called_at: time.perf_counter() at the user's call; a cluster fit's wall time
        # (run_end.wall_s, utilisation) counts from there. prepare: a caller's set-up of
        # the estimator (partial_fit's first call), undone with the rest if refused.
        # Dask data persisted for this fit (its held-out rows) goes when the fit ends, also
        # when it fails: not once a kept error's traceback, which holds it, is collected.
        # A fit refused before it trains (its input, labels or outputs) leaves the
        # estimator as it was: still the model fitted before, or still unfitted.
        before = dict(self.__dict__)
        self._persisted_for_fit = []
        self._training = False
        try:
            if prepare is not None:
                prepare()
            return self._fit_body(X, y, incremental, eval_set, called_at, on_round, sample_weight)
        except BaseException:
            if not self._training:
                persisted = self._persisted_for_fit
                self.__dict__.clear()
                self.__dict__.update(before, _persisted_for_fit=persisted, _training=False)
            raise
        finally:
            _release_persisted(self._persisted_for_fit)
            del self._persisted_for_fit
            del self._training

    def _fit_body(self, X, y, incremental, eval_set, called_at, on_round, sample_weight):
        """:meth:`_fit` but for releasing what it persisted."""
        self._check_checkpoint_settings(incremental)
        # Decided once for both paths, here, so that its warning names the caller's line.
        self._resume_this_fit = bool(self.resume) and self._left_to_continue(self.checkpoint_dir)
        _check_client_param(self.client, must_be_open=not incremental)
        # Also in-process: a mistyped option fails whether or not this fit would use it.
        self._trainer_config(seed=0, emulation=None).validate()
        target = self._cluster_target(incremental)
        if _is_worker_readable(X):
            _check_label_column_named(X, y)
            if target is None:  # in-process: computed or read here
                X, y = _read_in_process(self, X, y)
            else:
                from hmdspt.parallel.cluster import connected

                with connected(target) as client:
                    return self._fit_read_by_workers(
                        client, X, y, incremental, eval_set, called_at, on_round, sample_weight
                    )
        hidden = self._hidden_sizes()
        dtype = _as_dtype(self.dtype)
        first_pass = not hasattr(self, "_model") or (not self.warm_start and not incremental)
        _check_numeric_columns(X)
        X, Y = self._validate_input(X, y, incremental, reset=first_pass)
        if target is None or sparse.issparse(X) or not X.flags.c_contiguous:
            X = self._to_model_dtype(X, dtype)
        # Else a cluster fit converts the rows as it sends them, shard by shard, and the
        # driver holds no second X in the model's dtype. A Fortran-ordered X is still
        # copied: gathering from it cost a fit more than the copy (docs/design.md).
        Y = np.ascontiguousarray(Y, dtype=dtype)
        if sample_weight is not None:
            sample_weight = _check_sample_weight(
                sample_weight, X, dtype=dtype, ensure_non_negative=True
            )
        n_samples, n_features = X.shape

        self._prepare_model(first_pass, Y.shape[1], [n_features, *hidden, Y.shape[1]], dtype)
        if sample_weight is not None:
            # The weights travel with their rows as one more target column.
            Y = weighted_targets(Y, sample_weight)
        return self._train(X, Y, incremental, called_at, target, eval_set, on_round)

    def _prepare_model(self, first_pass: bool, n_outputs: int, layers: list, dtype) -> None:
        """A new model on a first pass; else check that the dtype has not changed."""
        self._random_state = check_random_state(self.random_state)
        if first_pass:
            self._initialize(n_outputs, layers, dtype)
        elif self._model.dtype != dtype:
            raise ValueError(
                f"dtype changed from {self._model.dtype} to {dtype} since the last fit; "
                "fit again without warm_start."
            )
        elif n_outputs != self.n_outputs_:
            # Else one more column of y would pass for the sample weights' column.
            raise ValueError(
                f"y has {n_outputs} output(s) where the model fitted before has "
                f"{self.n_outputs_}; fit again without warm_start."
            )

    def _train(self, X, Y, incremental: bool, called_at, target, eval_set, on_round, held_out=None):
        """The epochs with the fit's held-out data and callback set for their length.

        ``held_out``: the early-stopping validation rows ``(X, y, weights)`` when the fit
        split them already (Dask data on a cluster), else split from ``X`` here.
        """
        self._training = True  # from here a failure keeps what training did (_fit)
        for name in _CLUSTER_FIT_ATTRIBUTES:  # a cluster fit sets them again
            self.__dict__.pop(name, None)
        self._score_client = None  # the cluster that scores Dask held-out data
        self._eval_set = self._validate_eval_set(eval_set, on_cluster=target is not None)
        self._on_round = on_round
        self._val_weight = None  # the early-stopping split's sample weights
        try:
            self._fit_stochastic(X, Y, incremental, called_at, target, held_out)
        finally:
            # Held-out data is not part of the fitted model; Dask data persisted for this
            # fit is released on the workers with the last reference to it.
            del self._eval_set
            del self._on_round
            del self._val_weight
            del self._score_client
        if not np.isfinite(self._model.params).all():
            raise ValueError(
                "Solver produced non-finite parameter weights. The input data may"
                " contain large values and need to be preprocessed."
            )
        return self

    def _fit_read_by_workers(
        self, client, X, y, incremental, eval_set, called_at, on_round, sample_weight
    ):
        """Fit on data the workers read (a Dask collection or a path); nothing gathered.

        The driver handles metadata: the row count, the feature names, the distinct
        labels (found on the workers). The rows are read on the workers, encoded there,
        and read again from the source when a lost worker's rows are re-staged.
        """
        from hmdspt.parallel.sources import WorkerRead

        if isinstance(X, (str, os.PathLike)):
            _check_labels_of_path(X, y)
        _check_lazy_table(self, X)
        _warn_column_vector(y)
        label_column = y if isinstance(y, str) else None
        if isinstance(X, (str, os.PathLike)) and (self.early_stopping or sample_weight is not None):
            # Its rows split or weighted as a Dask collection's, read by the same reader.
            X, y = _lazy_path(X, y)
            label_column = None
        sample_weight = _lazy_weights(sample_weight, client, X)
        hidden = self._hidden_sizes()
        dtype = _as_dtype(self.dtype)
        first_pass = not hasattr(self, "_model") or (not self.warm_start and not incremental)
        held_out, names = None, None
        if self.early_stopping and not incremental:
            if label_column is not None:
                from hmdspt.parallel.shards import _split_target

                X, y = _split_target(X, label_column, None, "Dask DataFrame")
                label_column = None
            if _is_dask_frame(X):  # split as an array: its names and column check first
                _check_numeric_columns(X)
                names = [str(c) for c in X.columns]
            (X, y, sample_weight), held_out = self._held_out_split(client, X, y, sample_weight)
        try:
            source = WorkerRead(
                client,
                X,
                None if label_column else y,
                target=label_column,
                sample_weight=sample_weight,
                feature_names=names,
            )
        except ValueError as exc:
            from hmdspt.parallel.shards import NO_ROWS

            if held_out is None or str(exc) != NO_ROWS:
                raise
            # X had rows: the validation part took them all ("X has no rows" misled).
            raise ValueError(
                f"validation_fraction={self.validation_fraction} held out every row of X for "
                "early stopping: none is left to train on; lower validation_fraction or "
                "give more rows"
            ) from None
        self._set_n_features(source.n_features, source.feature_names, reset=first_pass)
        n_outputs, source.encode = self._targets_from(source, client, incremental)
        layers = [source.n_features, *hidden, n_outputs]
        self._prepare_model(first_pass, n_outputs, layers, dtype)
        return self._train(
            source, None, incremental, called_at, client, eval_set, on_round, held_out
        )

    def _held_out_split(self, client, X, y, sample_weight):
        """The training part and the early-stopping validation rows of Dask data.

        Both stay lazy and on the workers; the validation rows (``validation_fraction``
        of them, by position: random, not stratified) are persisted on the cluster for
        the fit and scored there each epoch. Returns ``(X, y, weights), (X_val, y_val,
        weights_val)``.
        """
        from hmdspt.parallel.shards import _block_lengths
        from hmdspt.parallel.sources import split_held_out

        seed = int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))
        train, (X_val, y_val, w_val) = split_held_out(
            client, [X, y, sample_weight], self.validation_fraction, seed
        )
        X_val, y_val, w_val = _persisted(client, [X_val, y_val, w_val], self._persisted_for_fit)
        if sum(_block_lengths(client, X_val)) < 2:
            raise ValueError(
                "The validation set is too small. Increase 'validation_fraction' "
                "or the size of your dataset."
            )
        return train, (X_val, y_val, w_val)

    def _set_n_features(self, n_features: int, names: list[str] | None, reset: bool) -> None:
        """``n_features_in_`` and ``feature_names_in_`` as ``validate_data`` sets them."""
        if not reset:
            if n_features != self.n_features_in_:
                raise ValueError(
                    f"X has {n_features} features, but {type(self).__name__} is expecting "
                    f"{self.n_features_in_} features as input."
                )
            if names is not None:  # a Dask frame's or a file's: checked as a frame's are
                import pandas as pd

                _check_feature_names(self, pd.DataFrame(columns=names), reset=False)
            return
        self.n_features_in_ = n_features
        if names is not None:
            self.feature_names_in_ = np.asarray(names, dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_

    def _validate_eval_set(self, eval_set, on_cluster: bool = False):
        """Held-out ``(X, y)`` scored during the fit (``eval_curve_``, run log), or None.

        Dask collections and paths stay lazy on a cluster (persisted there once the fit
        connects, :meth:`_held_out_on`); in-process they are computed or read here.
        """
        if eval_set is None:
            return None
        try:
            X_eval, y_eval = eval_set
        except (TypeError, ValueError):
            raise ValueError("eval_set must be a pair (X, y)") from None
        if _is_worker_readable(X_eval):
            if on_cluster:
                return X_eval, y_eval
            X_eval, y_eval = _read_in_process(self, X_eval, y_eval)
        X_eval = validate_data(self, X_eval, accept_sparse=["csr", "csc"], reset=False)
        y_eval = np.asarray(y_eval)
        if len(y_eval) != X_eval.shape[0]:
            raise ValueError(f"eval_set has {X_eval.shape[0]} rows in X but {len(y_eval)} in y")
        return self._to_model_dtype(X_eval, self._model.dtype), y_eval

    def _held_out_on(self, client, X, y, weights=None):
        """Dask or file held-out data persisted on ``client``'s workers, checked."""
        if isinstance(X, (str, os.PathLike)):
            X, y = _lazy_path(X, y)
        elif isinstance(y, str):  # the label column of a Dask DataFrame
            X, y = X.drop(columns=[y]), X[y]
        _check_lazy_table(self, X)
        n_features = len(X.columns) if _is_dask_frame(X) else X.shape[1]
        if n_features != self.n_features_in_:
            raise ValueError(
                f"eval_set has {n_features} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input."
            )
        if _is_dask_frame(X):  # its columns checked as an eval_set in memory is
            _check_lazy_input(self, X)
        if not _is_lazy(y):
            import dask.array as da

            y = da.from_array(np.asarray(y))
        self._score_client = client
        X, y, weights = _persisted(client, [X, y, weights], self._persisted_for_fit)
        # Their lengths known now, before the first round (the first score refused them).
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"eval_set has {X.shape[0]} rows in X but {y.shape[0]} in y")
        if weights is not None and weights.shape[0] != X.shape[0]:
            raise ValueError(f"eval_set has {X.shape[0]} rows in X but {weights.shape[0]} weights")
        return X, y, weights

    def _eval_score(self) -> float | None:
        if self._eval_set is None:
            return None
        start = time.perf_counter()
        try:
            return self._score_unchecked(*self._eval_set)
        finally:
            # Scoring eval_set is the caller's measurement, not training: not counted in
            # eval_curve_'s times nor in max_seconds.
            self._eval_seconds += time.perf_counter() - start

    def _training_seconds(self) -> float:
        return time.perf_counter() - self._fit_start - self._eval_seconds

    @staticmethod
    def _to_model_dtype(X, dtype: np.dtype):
        if sparse.issparse(X):
            return X.astype(dtype, copy=False).tocsr()
        return np.ascontiguousarray(X, dtype=dtype)

    def _initialize(self, n_outputs: int, layer_units: list[int], dtype: np.dtype) -> None:
        self.n_iter_ = 0
        self.t_ = 0
        self.n_outputs_ = n_outputs
        self.n_layers_ = len(layer_units)
        self.out_activation_ = self._output_activation()
        self._model = MLP(
            layer_units,
            hidden_activation=self.activation,
            out_activation=self.out_activation_,
            alpha=self.alpha,
            dtype=dtype,
        )
        self._model.initialize(self._random_state)
        self._bind_fitted_views()
        self._best_params = self._model.params.copy()
        self.loss_curve_ = []
        self._no_improvement_count = 0
        if self.early_stopping:
            self.validation_scores_ = []
            self.best_validation_score_ = -np.inf
            self.best_loss_ = None
        else:
            self.best_loss_ = np.inf
            self.validation_scores_ = None
            self.best_validation_score_ = None

    def _optimizer_kwargs(self) -> dict:
        return dict(
            solver=self.solver,
            learning_rate_init=self.learning_rate_init,
            learning_rate=self.learning_rate,
            momentum=self.momentum,
            nesterovs_momentum=self.nesterovs_momentum,
            power_t=self.power_t,
            beta_1=self.beta_1,
            beta_2=self.beta_2,
            epsilon=self.epsilon,
        )

    def _make_optimizer(self):
        return make_optimizer(
            n_params=self._model.n_params, dtype=self._model.dtype, **self._optimizer_kwargs()
        )

    def _batch_size(self, n_samples: int) -> int:
        if self.batch_size == "auto":
            return min(200, n_samples)
        if self.batch_size > n_samples:
            warnings.warn(
                "Got `batch_size` less than 1 or larger than sample size. It is going to be "
                "clipped",
                stacklevel=user_stacklevel(),
            )
        return int(np.clip(self.batch_size, 1, n_samples))

    def _split_validation(self, X, Y: np.ndarray):
        """Train and validation parts; sets the validation part's sample weights."""
        should_stratify = is_classifier(self) and self.n_outputs_ == 1
        labels, _ = split_weights(Y, self.n_outputs_)
        X_train, X_val, Y_train, Y_val = train_test_split(
            X,
            Y,
            random_state=self._random_state,
            test_size=self.validation_fraction,
            stratify=labels if should_stratify else None,
        )
        if X_val.shape[0] < 2:
            raise ValueError(
                "The validation set is too small. Increase 'validation_fraction' "
                "or the size of your dataset."
            )
        Y_val, self._val_weight = split_weights(Y_val, self.n_outputs_)
        return X_train, X_val, np.ascontiguousarray(Y_train), self._decode_targets(Y_val)

    def _fit_stochastic(
        self,
        X,
        Y: np.ndarray | None,
        incremental: bool,
        called_at: float | None,
        target,
        held_out=None,
    ) -> None:
        """The epochs: in-process, or on ``target``'s cluster (None: in-process).

        ``X`` may be a :class:`hmdspt.parallel.sources.WorkerRead` (``Y`` None) on a cluster.
        """
        if not incremental or not hasattr(self, "_optimizer"):
            self._optimizer = self._make_optimizer()
        if self.early_stopping and incremental:
            raise ValueError("partial_fit does not support early_stopping=True")
        early_stopping = self.early_stopping
        if early_stopping and held_out is not None:  # split on the workers already
            X_train, Y_train = X, Y
            X_val, y_val, self._val_weight = held_out
        elif early_stopping:
            X_train, X_val, Y_train, y_val = self._split_validation(X, Y)
            # Scored every round: converted once (a cluster fit's X may be the user's).
            X_val = self._to_model_dtype(X_val, self._model.dtype)
        else:
            X_train, Y_train, X_val, y_val = X, Y, None, None

        n_samples = _n_rows(X_train)
        batch_size = self._batch_size(n_samples)
        self.n_iter_ = 0
        self._divergence_warned = False
        self._finished_by = None  # "converged" or "max_iter" once the fit ends by itself
        self.eval_curve_ = []
        # The user's clock: eval_curve_ and max_seconds count from the fit() call.
        self._fit_start = time.perf_counter() if called_at is None else called_at
        self._eval_seconds = 0.0
        self._interrupted = False  # Ctrl-C stopped this fit (it keeps its model, as sklearn's)
        folder = contextlib.nullcontext()
        if self.checkpoint_dir is not None and not incremental:
            folder = held_for_one_fit(self.checkpoint_dir)
        with folder:
            self._fit_epochs(
                target, X_train, Y_train, X_val, y_val, batch_size, called_at, incremental
            )
        if early_stopping:
            self._model.set_params(self._best_params)

    def _fit_epochs(
        self, target, X_train, Y_train, X_val, y_val, batch_size, called_at, incremental
    ) -> None:
        """The epochs of :meth:`_fit_stochastic`, in-process or on ``target``'s cluster."""
        n_samples = _n_rows(X_train)
        try:
            if target is not None:
                self._fit_on_cluster(target, X_train, Y_train, X_val, y_val, batch_size, called_at)
            else:
                buffers = BatchBuffers(
                    batch_size, X_train.shape[1], Y_train.shape[1], self._model.dtype
                )
                checkpoint_dir = None if incremental else self.checkpoint_dir
                if self._resume_this_fit:
                    self._resume_in_process(checkpoint_dir)
                while self.n_iter_ < self.max_iter:
                    order = self._random_state.permutation(n_samples) if self.shuffle else None
                    loss_sum, _steps = minibatch_pass(
                        self._model,
                        self._optimizer,
                        X_train,
                        Y_train,
                        order,
                        batch_size,
                        buffers,
                    )
                    self._record_eval(self._eval_score())
                    last = (
                        self._end_epoch(loss_sum / n_samples, n_samples, X_val, y_val)
                        or self.n_iter_ >= self.max_iter
                        or incremental
                        or (
                            self.max_seconds is not None
                            and self._training_seconds() >= self.max_seconds
                        )
                    )
                    if checkpoint_dir is not None and (
                        last or self.n_iter_ % self.checkpoint_every == 0
                    ):
                        self._save_in_process_checkpoint(checkpoint_dir)
                    if last:
                        break
        except KeyboardInterrupt:
            self._interrupted = True
            warnings.warn("Training interrupted by user.", stacklevel=user_stacklevel())

    def _record_eval(self, score: float | None) -> float | None:
        if score is not None:
            self.eval_curve_.append((self._training_seconds(), score))
        return score

    def _end_epoch(
        self, loss: float, n_samples: int, X_val, y_val, val_score: float | None = None
    ) -> bool:
        """Book-keeping after an epoch, as scikit-learn's MLP does it; True stops.

        ``val_score``: the current parameters' score on ``X_val`` when already computed.
        """
        self.n_iter_ += 1
        self.loss_ = loss
        self.t_ += n_samples
        self.loss_curve_.append(self.loss_)
        message = divergence_message(self.loss_curve_)
        if message is not None and not self._divergence_warned:
            self._divergence_warned = True  # once per fit: the loss goes on rising
            warnings.warn(message, RuntimeWarning, stacklevel=user_stacklevel())
        if self.verbose:
            print(f"Iteration {self.n_iter_}, loss = {self.loss_:.8f}")
        self._update_no_improvement_count(self.early_stopping, X_val, y_val, val_score)
        self._optimizer.iteration_ends(self.t_)
        if self._no_improvement_count > self.n_iter_no_change:
            what = "Validation score" if self.early_stopping else "Training loss"
            msg = (
                f"{what} did not improve more than tol={self.tol:f} for "
                f"{self.n_iter_no_change} consecutive epochs."
            )
            if self._optimizer.trigger_stopping(msg, self.verbose):
                self._finished_by = "converged"
                return True
            self._no_improvement_count = 0
        if self.n_iter_ >= self.max_iter:
            self._finished_by = "max_iter"
        if self.n_iter_ == self.max_iter:
            warnings.warn(
                f"Stochastic Optimizer: Maximum iterations ({self.max_iter}) reached "
                "and the optimization hasn't converged yet.",
                ConvergenceWarning,
                stacklevel=user_stacklevel(),
            )
        return False

    def _cluster_target(self, incremental: bool):
        """What this fit trains on: None for in-process, else what ``connect`` takes."""
        client = self.client
        if client is False or incremental:  # partial_fit: one pass here, whatever `client` is
            return None
        if _in_dask_task():
            # joblib's 'dask' backend: the fit is itself a task, and a fit on the cluster
            # would wait for the workers such tasks hold (with single-thread workers, for
            # ever). Without a client of its own it trains here, as any task does.
            if client is None and not self.__dict__.get("_client_not_pickled"):
                return None
            raise RuntimeError(
                f"this {type(self).__name__} was given a client but fits inside a Dask task "
                "(joblib's 'dask' backend?), where a fit on the cluster would wait for the "
                "workers the tasks hold: give it no client there (it then fits in the task), "
                "or search with n_jobs=1 outside that backend to fit each candidate on the "
                "cluster"
            )
        if client is None:
            active = _active_client()
            if active is None and self.__dict__.get("_client_not_pickled"):
                self._refuse_fit_without_the_pickled_client()
            return active
        return client

    def _refuse_fit_without_the_pickled_client(self) -> None:
        # In the process that pickled it, a copy without its client fitting in-process is
        # what a saved model does; in a joblib worker it would silently not use the cluster.
        if multiprocessing.parent_process() is None:
            return
        raise RuntimeError(
            f"this {type(self).__name__} was given a client, which is not pickled, and was "
            "then sent to another process (joblib n_jobs > 1?), where it would fit "
            "in-process: use n_jobs=1 (the cluster already trains in parallel), joblib's "
            "'threading' backend, or set client=False to fit in-process"
        )

    def _fit_on_cluster(
        self,
        target,
        X_train,
        Y_train,
        X_val,
        y_val,
        batch_size: int,
        called_at: float | None = None,
    ) -> None:
        """Train through the HMDSPT round loop on ``target``'s cluster."""
        from hmdspt.parallel.cluster import connected

        with connected(target) as client:
            self._train_on(client, X_train, Y_train, X_val, y_val, batch_size, called_at)

    def _train_on(
        self, client, X_train, Y_train, X_val, y_val, batch_size: int, called_at: float | None
    ) -> None:
        from hmdspt.parallel.trainer import Trainer

        seed = int(self._random_state.randint(np.iinfo(np.int32).max))
        config = self._trainer_config(seed=seed, emulation=_emulation_of(client))
        if config.resume and not self._resume_this_fit:
            config = dataclasses.replace(config, resume=False)
        trainer = Trainer(client, self._model, self._optimizer_kwargs(), batch_size, config)
        trainer.fingerprint_extra = self._resume_fingerprint()
        # The trainer's driver optimizer carries the schedule (and bsp's state).
        self._optimizer = trainer.driver_optimizer
        if sparse.issparse(X_train):
            X_train = X_train.toarray()

        n_samples = _n_rows(X_train)

        # Without an eval_set the trainer scores the early-stopping split, an epoch's last
        # round in the loop with the workers waiting: early stopping reads that score
        # rather than scoring the same parameters on the same rows again.
        last_score = {"round": None, "score": None}

        def on_round(record) -> None:
            if record.val_score is not None:
                last_score.update(round=record.round, score=record.val_score)
            if self._on_round is not None:
                self._on_round(record)

        def on_epoch_end(epoch: int, loss: float) -> bool:
            current = self._eval_set is None and last_score["round"] == trainer.round_index
            val_score = last_score["score"] if current else None
            stop = self._end_epoch(loss, n_samples, X_val, y_val, val_score)
            return stop or self.n_iter_ >= self.max_iter

        # The trainer scores most rounds in a background thread while the next trains:
        # a model of the same shape holds the parameters scored, never the live one.
        m = self._model
        scored = MLP(m.layer_sizes, m.hidden_activation, m.out_activation, m.alpha, m.dtype)
        self._score_client = client  # Dask held-out data is scored on this cluster
        if self._eval_set is not None and _is_worker_readable(self._eval_set[0]):
            held_out = self._held_out_on(client, *self._eval_set)
        elif self._eval_set is not None:
            held_out = (*self._eval_set, None)
        else:
            held_out = (X_val, y_val, self._val_weight)

        def evaluate(params: np.ndarray) -> float:
            # eval_set if given, else the early-stopping split: logged per round.
            X_held, y_held, weights = held_out
            scored.set_params(params)
            try:
                return self._score_unchecked(X_held, y_held, model=scored, sample_weight=weights)
            except DataError as exc:  # its rows are eval_set's, not the training rows
                if self._eval_set is None:
                    raise
                raise DataError(f"eval_set: {exc}") from None

        def on_score(training_s: float, score: float) -> None:
            if self._eval_set is not None:  # eval_curve_ is eval_set's
                self.eval_curve_.append((training_s, score))

        has_eval = self._eval_set is not None or X_val is not None
        try:
            trainer.fit(
                X_train,
                Y_train,
                self.max_iter,
                on_epoch_end=on_epoch_end,
                evaluate=evaluate if has_eval else None,
                checkpoint_extra=self._checkpoint_state,
                on_resume=self._restore_checkpoint_state,
                called_at=called_at,
                on_round=on_round,
                on_score=on_score,
            )
        finally:
            # Also after Ctrl-C, which keeps the model: these describe this fit, not the last.
            self.training_report_ = trainer.report()
            self.prediction_ = trainer.prediction
            self.run_id_ = trainer.run_id
            self.run_log_path_ = trainer.run_log_path

    def _checked_trainer_options(self) -> dict:
        """``trainer_options`` checked against :data:`TRAINER_OPTIONS`, as a new dict."""
        options = {} if self.trainer_options is None else self.trainer_options
        for key in options:
            if key in _TRAINER_PARAMETERS:
                raise ValueError(f"trainer_options: {key!r} is a parameter of its own: {key}=...")
            if key not in _TRAINER_OPTION_CONSTRAINTS:
                raise ValueError(
                    f"trainer_options: unknown key {key!r}; accepted: {', '.join(TRAINER_OPTIONS)}"
                )
        validate_parameter_constraints(
            {key: _TRAINER_OPTION_CONSTRAINTS[key] for key in options},
            dict(options),
            caller_name=f"{type(self).__name__}.trainer_options",
        )
        return dict(options)

    def _trainer_config(self, seed: int, emulation: dict | None) -> TrainerConfig:
        """The round loop's settings: the cluster parameters, then ``trainer_options``."""
        named = {name: getattr(self, name) for name in _TRAINER_PARAMETERS}
        for name in ("run_log", "checkpoint_dir"):
            named[name] = None if named[name] is None else os.fspath(named[name])
        return TrainerConfig(
            **named, **self._checked_trainer_options(), seed=seed, emulation=emulation
        )

    def _check_checkpoint_settings(self, incremental: bool) -> None:
        if isinstance(self.checkpoint_dir, (str, os.PathLike)) and not os.fspath(
            self.checkpoint_dir
        ):
            # Path("") is the current folder, and the trainer read "" as no folder at all.
            raise ValueError("checkpoint_dir must name a folder, got ''; None keeps none")
        if incremental and (self.checkpoint_dir is not None or self.resume):
            raise ValueError(
                "partial_fit keeps no checkpoints (checkpoint_dir and resume are for fit); "
                "set checkpoint_dir=None and resume=False"
            )
        if self.resume and self.checkpoint_dir is None:
            raise ValueError("resume=True needs a checkpoint_dir to resume from")

    def _labels_fingerprint(self) -> dict:
        """A classifier's classes, which a checkpoint must match as its shape does: the
        same number of other labels would resume into outputs that meant other classes."""
        if not is_classifier(self):
            return {}
        return {"classes": [c.item() if hasattr(c, "item") else c for c in self.classes_]}

    def _resume_fingerprint(self) -> dict:
        """What a checkpoint must match beyond the model's shape, in-process and on a
        cluster: the classes, and whether the fit stops early (its stopping state, the best
        score or the best loss, means nothing to a fit that stops the other way; resumed
        across the switch, the fit failed on a None in it)."""
        return {**self._labels_fingerprint(), "early_stopping": bool(self.early_stopping)}

    def _in_process_fingerprint(self) -> dict:
        """What an in-process checkpoint must match to be resumed into this model."""
        return {
            **model_fingerprint(self._model, self.solver),
            **self._resume_fingerprint(),
            # Not in a cluster fit's fingerprint, so neither kind resumes from the other:
            # a cluster's epochs are rounds of per-worker optimizers, not this optimizer.
            "fit": "in-process",
        }

    def _save_in_process_checkpoint(self, directory) -> None:
        """Save the state after an epoch, laid out as the trainer lays out its own."""
        arrays: dict[str, np.ndarray] = {"params": self._model.params}
        for name, vector in self._optimizer.state_vectors().items():
            arrays[f"optimizer.{name}"] = vector
        extra: dict = {}
        for key, value in self._checkpoint_state().items():
            if isinstance(value, np.ndarray):
                arrays[f"extra.{key}"] = value
            else:
                extra[key] = value
        algorithm, keys, pos, has_gauss, cached_gaussian = self._random_state.get_state()
        arrays["random_state.keys"] = keys
        meta = {
            "epoch": int(self.n_iter_),
            "epoch_complete": True,
            "fingerprint": self._in_process_fingerprint(),
            "optimizer": {
                "learning_rate": float(self._optimizer.learning_rate),
                "t": getattr(self._optimizer, "t", None),
            },
            "random_state": {
                "algorithm": str(algorithm),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached_gaussian),
            },
            "extra": extra,
        }
        save_checkpoint(directory, arrays, meta)

    def _resume_in_process(self, directory) -> None:
        """Restore the newest good in-process checkpoint of ``directory``, if any."""
        ckpt = load_latest_checkpoint(directory)
        if ckpt is None:
            return
        meta, arrays = ckpt.meta, ckpt.arrays
        check_fingerprint(meta.get("fingerprint", {}), self._in_process_fingerprint())
        self._model.params[...] = arrays["params"]  # in place: coefs_ are views of it
        for name, vector in self._optimizer.state_vectors().items():
            if f"optimizer.{name}" in arrays:
                vector[...] = arrays[f"optimizer.{name}"]
        optimizer = meta["optimizer"]
        self._optimizer.learning_rate = float(optimizer["learning_rate"])
        if optimizer.get("t") is not None and hasattr(self._optimizer, "t"):
            self._optimizer.t = int(optimizer["t"])
        rng = meta.get("random_state")
        # random_state=None draws from numpy's global generator: leave that alone.
        if self.random_state is not None and rng and "random_state.keys" in arrays:
            self._random_state.set_state(
                (
                    rng["algorithm"],
                    arrays["random_state.keys"],
                    rng["pos"],
                    rng["has_gauss"],
                    rng["cached_gaussian"],
                )
            )
        extra_arrays = {
            key[len("extra.") :]: value for key, value in arrays.items() if key.startswith("extra.")
        }
        self._restore_checkpoint_state(dict(meta.get("extra", {})), extra_arrays)
        if self.verbose:
            print(f"Resumed from {ckpt.path} after epoch {self.n_iter_}")

    def _left_to_continue(self, directory) -> bool:
        """Whether ``resume=True`` has a fit to continue in ``directory``: not when its
        newest checkpoint ends a fit that converged, or holds as many epochs as this one
        asks for or more, however that fit ended (``max_iter``, ``max_seconds``, Ctrl-C)
        (warned: this fit starts afresh).

        Resuming such a checkpoint trains no epoch: the fit would return the model it
        holds, trained on the rows of that fit. Under a cross-validation every fold after
        the first was the first fold's model, scored on rows it had trained on; a fit on
        other rows kept a model that had never seen them.
        """
        # A fit that resumes reads the folder again and warns then about the files it
        # skips (damaged, older format); these are said here only if it starts afresh.
        with warnings.catch_warnings(record=True) as skipped:
            warnings.simplefilter("always", RuntimeWarning)
            ckpt = load_latest_checkpoint(directory)
        extra = {} if ckpt is None else dict(ckpt.meta.get("extra") or {})
        finished_by, epochs = extra.get("finished_by"), int(extra.get("n_iter_", 0))
        if finished_by == "converged":
            ended = f"converged after {epochs} epochs"
        elif ckpt is not None and epochs >= self.max_iter:
            # Resumed, it would train no epoch and return n_iter_ above max_iter.
            plural = "" if epochs == 1 else "s"
            ended = f"ran {epochs} epoch{plural} (max_iter={self.max_iter} here)"
        else:
            return True
        for warning in skipped:
            warnings.warn(warning.message, warning.category, stacklevel=user_stacklevel())
        warnings.warn(
            f"resume=True: the newest checkpoint in {directory} ({ckpt.path.name}) ends a "
            f"fit that {ended}, which leaves nothing to continue; this fit starts afresh "
            "(raise max_iter to train that fit on)",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
        return False

    def _checkpoint_state(self) -> dict:
        """The epoch book-keeping saved with a checkpoint (JSON-native but arrays)."""
        state = {
            # A fit that ended by itself has nothing left to resume (_left_to_continue).
            "finished_by": self._finished_by,
            "n_iter_": int(self.n_iter_),
            "t_": int(self.t_),
            "loss_curve_": [float(v) for v in self.loss_curve_],
            "best_loss_": _json_float(self.best_loss_),
            "no_improvement_count": int(self._no_improvement_count),
            "validation_scores_": None
            if self.validation_scores_ is None
            else [float(v) for v in self.validation_scores_],
            "best_validation_score_": _json_float(self.best_validation_score_),
        }
        if self.early_stopping:
            state["best_params"] = self._best_params
        return state

    def _restore_checkpoint_state(self, state: dict, arrays: dict) -> None:
        """Undo :meth:`_checkpoint_state` after a resume: ``max_iter`` counts on."""
        self.n_iter_ = int(state.get("n_iter_", 0))
        self.t_ = int(state.get("t_", 0))
        self.loss_curve_ = [float(v) for v in state.get("loss_curve_", [])]
        if self.loss_curve_:
            self.loss_ = self.loss_curve_[-1]
        if "best_loss_" in state:
            self.best_loss_ = _from_json_float(state["best_loss_"])
        self._no_improvement_count = int(state.get("no_improvement_count", 0))
        if state.get("validation_scores_") is not None:
            self.validation_scores_ = [float(v) for v in state["validation_scores_"]]
        if "best_validation_score_" in state:
            self.best_validation_score_ = _from_json_float(state["best_validation_score_"])
        if "best_params" in arrays and arrays["best_params"].shape == self._best_params.shape:
            self._best_params[...] = arrays["best_params"]

    def _update_no_improvement_count(
        self, early_stopping: bool, X_val, y_val, val_score: float | None = None
    ) -> None:
        if early_stopping:
            if val_score is None:
                val_score = self._score_unchecked(X_val, y_val, sample_weight=self._val_weight)
            self.validation_scores_.append(val_score)
            if self.verbose:
                print(f"Validation score: {val_score:f}")
            if val_score < self.best_validation_score_ + self.tol:
                self._no_improvement_count += 1
            else:
                self._no_improvement_count = 0
            if val_score > self.best_validation_score_:
                self.best_validation_score_ = val_score
                self._best_params[...] = self._model.params
        else:
            if self.loss_curve_[-1] > self.best_loss_ - self.tol:
                self._no_improvement_count += 1
            else:
                self._no_improvement_count = 0
            if self.loss_curve_[-1] < self.best_loss_:
                self.best_loss_ = self.loss_curve_[-1]

    # ---------------------------------------------------------------- predicting
    def _forward(self, X, check_input: bool = True, model: MLP | None = None) -> np.ndarray:
        """Network output for ``X`` (``coefs_``/``intercepts_`` are views of the model);
        ``model``: another model of the same shape instead of the fitted one."""
        model = self._model if model is None else model
        if check_input:
            if isinstance(X, (str, os.PathLike)):  # scikit-learn: "got scalar array instead"
                raise TypeError(
                    f"predictions take the rows, not a path ({os.fspath(X)}): read the file "
                    "first, e.g. dask.dataframe.read_parquet(path)[model.feature_names_in_]; "
                    "fit and score read a path themselves"
                )
            _check_numeric_columns(X)
            X = validate_data(self, X, accept_sparse=["csr", "csc"], reset=False)
        X = self._to_model_dtype(X, model.dtype)
        return model.forward(X)

    def _lazy_predictions(self, X, model: MLP):
        """``model``'s predictions for Dask ``X``, a lazy Dask array (no estimator pickled)."""
        _check_lazy_input(self, X)
        labels = self._label_columns() if is_classifier(self) else None
        width = _prediction_width(self)
        dtype = self.classes_.dtype if is_classifier(self) else model.dtype
        return _blockwise(blocks.BlockPredictor(model, labels), X, width, dtype)

    def _score_unchecked(self, X, y, model: MLP | None = None, sample_weight=None) -> float:
        if _is_lazy(X):  # held-out Dask data: scored block by block on the workers
            model = self._model if model is None else model
            client = getattr(self, "_score_client", None)
            return _score_of_dask(self, X, y, model, sample_weight, client)
        y_pred = self._predict(X, check_input=False, model=model)
        if np.issubdtype(y_pred.dtype, np.floating) and not np.isfinite(y_pred).all():
            return np.nan
        return float(self._score_function(y, y_pred, sample_weight=sample_weight))

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None, eval_set=None, on_round=None):
        """Fit the model to data matrix X and target(s) y.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            The input data.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            The target values (class labels in classification, real numbers in
            regression).
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights of the rows, as scikit-learn's MLP takes them: each
            mini-batch's loss and gradient are their weighted means, and the early-stopping
            split is scored with its weights. On a cluster the weights travel with their
            rows (staged, re-balanced and re-staged with them) and the workers' updates are
            merged in proportion to the sample weight each processed.
        eval_set : tuple (X_eval, y_eval), optional
            Held-out data scored during the fit (after every epoch in-process, after
            rounds on a cluster, where the scores also go to the run log as
            ``val_score``); the scores are in ``eval_curve_``. Not used for stopping.
        on_round : callable, optional
            ``on_round(record)``: called after every round of a cluster fit with its
            :class:`hmdspt.parallel.trainer.RoundRecord` (round, epoch, loss, rows, the
            workers' times), e.g. to draw progress. An in-process fit has no rounds and
            does not call it.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        called_at = time.perf_counter()  # the fit's wall time is the user's, from here
        return self._fit(
            X,
            y,
            incremental=False,
            eval_set=eval_set,
            called_at=called_at,
            on_round=on_round,
            sample_weight=sample_weight,
        )

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


class BPNNClassifier(ClassifierMixin, _BaseBPNN):
    """Back-propagation neural network (multi-layer perceptron) classifier.

    A drop-in for :class:`sklearn.neural_network.MLPClassifier` with the stochastic
    solvers, computing in float32 by default on one flat parameter vector.

    Parameters
    ----------
    hidden_layer_sizes : array-like of shape (n_layers - 2,), default=(100,)
        The ith element is the number of neurons in the ith hidden layer.
    activation : {"identity", "logistic", "tanh", "relu"}, default="relu"
        Activation of the hidden layers.
    solver : {"sgd", "adam"}, default="adam"
        The weight optimizer.
    alpha : float, default=0.0001
        Strength of the L2 penalty.
    batch_size : int or "auto", default="auto"
        Mini-batch size; "auto" is ``min(200, n_samples)``.
    learning_rate : {"constant", "invscaling", "adaptive"}, default="constant"
        Step-size schedule of ``solver="sgd"``.
    learning_rate_init : float, default=0.001
        Initial step size.
    power_t : float, default=0.5
        Exponent of the "invscaling" schedule.
    max_iter : int, default=200
        Maximum number of epochs.
    shuffle : bool, default=True
        Shuffle the rows every epoch.
    random_state : int, RandomState instance or None, default=None
        Seeds initialisation, shuffling and the early-stopping split.
    tol : float, default=1e-4
        Tolerance of the stopping rule.
    verbose : bool, default=False
        Print progress.
    warm_start : bool, default=False
        Reuse the previous solution as initialisation.
    momentum : float, default=0.9
        Momentum of "sgd".
    nesterovs_momentum : bool, default=True
        Nesterov's momentum for "sgd".
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the rows and stop when its score stalls.
    validation_fraction : float, default=0.1
        Fraction of rows held out for early stopping.
    beta_1, beta_2 : float, default=0.9, 0.999
        Decay rates of Adam's moment estimates.
    epsilon : float, default=1e-8
        Numerical stability term of Adam.
    n_iter_no_change : int, default=10
        Epochs without ``tol`` improvement before stopping.
    dtype : {"float32", "float64"} or numpy type, default="float32"
        Type the network computes in.
    client : distributed.Client, cluster, str, path, None or False, default=None
        Where ``fit`` trains: HMDSPT rounds on a cluster given as a ``Client``, a cluster
        object (``LocalCluster``, ``SLURMCluster``, ...), a scheduler address or a
        scheduler file; None uses the active Client (``with Client(...)``, or the latest
        one made) if there is one and fits in-process otherwise; False always fits
        in-process. A client the fit opens (of a cluster, an address, a file) is closed
        when the fit ends; one passed in or active stays open. Connecting waits at most
        Dask's ``distributed.comm.timeouts.connect``, then fails with a
        ``ConnectionError``. ``partial_fit`` trains in-process (with None it ignores the
        active Client). Not saved: a pickled, skops-saved or deep-copied model has
        ``client=None`` whatever was given (an address too), so loading never connects;
        in another process (joblib's ``n_jobs > 1``) such a copy refuses to fit rather
        than silently fitting in-process. ``clone`` shares a live client, so
        ``cross_val_score`` and ``GridSearchCV`` fit on the same cluster.
    partition : {"proportional", "equal"}, default="proportional"
        Cluster fits: rows per worker by measured speed (re-balanced), or equal.
    sync : {"hmdspt", "local", "bsp"}, default="hmdspt"
        Cluster fits: step-normalised delta merge with block momentum and warm start;
        plain model averaging; or a gradient average after every mini-batch. A strategy
        registered in :data:`hmdspt.core.strategies.SYNC_STRATEGIES` is accepted too
        (likewise ``partition``).
    rounds_per_epoch : int or "auto", default="auto"
        Cluster fits: synchronous rounds an epoch is split into (not used by "bsp"); more
        than the training rows are clipped to them, with a warning. ``"auto"``: 4 in
        the first epoch, then in each epoch as many as keep a round's measured overhead
        (synchronisation and fixed per-round costs) within
        ``trainer_options["sync_budget"]`` (5 %) of the round, with at most
        ``trainer_options["max_local_steps"]`` (128) steps per round in the last epoch
        (``max_iter``'s) and ``trainer_options["early_local_steps"]`` (2048) before it
        (docs/design.md, "Rounds sized from measured costs").
    block_momentum : float, default=0.5
        Cluster fits with ``sync="hmdspt"``: momentum of the merged delta.
    compression : {"none", "float16", "topk"}, default="none"
        Cluster fits: what a worker sends (top-k: the ``trainer_options["topk"]``
        fraction of the entries, 10 % by default, with error feedback).
    run_log : str or path, default=None
        Cluster fits: the JSON-lines run log (docs/runlog.md): a ``.jsonl`` file to
        append to, or a folder in which ``<run_id>.jsonl`` is written.
    max_seconds : float, default=None
        Stop after the epoch (in-process) or round (cluster) during which the fit
        passed this many seconds of training (scoring ``eval_set`` not counted); the
        last epoch of a cluster fit may then be partial.
    checkpoint_dir : str or path, default=None
        Folder of atomic, checksummed checkpoints (the last two files are kept); None
        writes none. They hold the parameters, the optimizer's state, the epoch
        counters and scores, and: in-process, the random state; on a cluster, the
        block-momentum state, worker scores and the round counter. Not for
        ``partial_fit``. A folder serves one fit at a time: a fit started on a folder
        another running fit writes to is refused (``CheckpointError``).
    checkpoint_every : int, default=1
        In-process: epochs between two checkpoints (the fit's last epoch is saved
        too). Cluster fits: rounds between two checkpoints (every epoch's end is saved
        too).
    resume : bool, default=False
        Continue from the newest good checkpoint in ``checkpoint_dir`` (a fresh fit
        when there is none, or when it ends a fit that converged or ran ``max_iter``
        epochs, as many as this one asks for: there is nothing left to continue, and
        its model was trained on that fit's rows; warned with a ``UserWarning``).
        ``n_iter_``, ``loss_curve_`` and ``t_`` are restored, so ``max_iter`` counts
        the epochs of the interrupted and the resumed fit together.
        A checkpoint of a differently shaped model is refused, and so is one of a
        cluster fit in-process or the other way round. In-process, with an int
        ``random_state``, the resumed fit ends where an uninterrupted one would.
    trainer_options : dict, default=None
        Cluster fits: the round loop's rarely changed settings, by name
        (:data:`hmdspt.estimator.TRAINER_OPTIONS`; each one's meaning and default are those
        of :class:`hmdspt.core.config.TrainerConfig`): ``sync_budget``,
        ``max_local_steps``, ``early_local_steps``, ``block_lr``, ``local_lr_scale``,
        ``normalize_steps``, ``topk``, ``warm_start_rows``, ``warm_start_epochs``,
        ``first_wave_fraction``, ``ramp_rounds``, ``ramp_first_round_s``,
        ``max_ramp_rounds``, ``probe_seconds``, ``reuse_speeds_s``, ``cost_window_s``,
        ``rebalance_threshold``, ``min_rows``,
        ``quiet_workers``, ``broadcast_timeout_s``, ``stall_warning_s`` and
        ``eval_resolution``. An unknown
        key fails the fit, in-process too.

    Attributes
    ----------
    classes_ : ndarray or list of ndarray
        Class labels.
    loss_ : float
        Loss of the last epoch.
    best_loss_ : float or None
        Best training loss (None with early stopping).
    loss_curve_ : list of float
        Loss per epoch.
    validation_scores_ : list of float or None
        Validation accuracy per epoch with early stopping.
    best_validation_score_ : float or None
        Best validation accuracy with early stopping.
    t_ : int
        Training samples seen.
    coefs_ : list of ndarray
        Weight matrices (views into one flat vector).
    intercepts_ : list of ndarray
        Bias vectors (views into the same vector).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of str
        Feature names, when X had them.
    n_iter_ : int
        Epochs run.
    n_layers_ : int
        Number of layers.
    n_outputs_ : int
        Number of outputs.
    out_activation_ : str
        Output activation ("softmax" or "logistic").
    eval_curve_ : list of (float, float)
        ``(seconds of training since the fit began, score)`` on ``eval_set`` when one
        was given; the time the fit waited on scoring ``eval_set`` is not counted (on
        a cluster most rounds are scored while the next one trains).
    training_report_ : dict
        After a fit on a cluster: per worker rows held, busy s, comm s, idle s, idle
        fraction, final score (samples/s) and ``fixed_s``: the round cost model's speed
        and fixed seconds per round at the fit's end, which the shares follow (a round of
        ``n`` rows keeps the worker busy ``fixed_s + n / score`` seconds; docs/design.md,
        "Round cost model").
    prediction_ : dict or None
        After a fit on a cluster of more than one epoch: what its second epoch was
        predicted to cost from the first's measured speeds and synchronisation
        (the run log's ``prediction`` event): ``epoch_s`` (with the fit's shares),
        ``balanced_epoch_s``, ``equal_shares_epoch_s``, ``fastest_alone_epoch_s`` (one
        process on the ``fastest`` worker alone),
        ``speedup`` (that over ``epoch_s``) and ``efficiency``: ``model_efficiency``
        (the cost model's) and ``measured_efficiency`` (the first epoch's) weighed by
        ``hmdspt.core.prediction.MEASURED_WEIGHT`` (docs/design.md, "An honest answer").
        A speed-up under 1 is also warned about (``RuntimeWarning``).
    run_id_ : str
        After a fit on a cluster: the run's id in its run log.
    run_log_path_ : pathlib.Path or None
        After a fit on a cluster: where its run log was written.

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from hmdspt.estimator import BPNNClassifier
    >>> X, y = load_digits(return_X_y=True)
    >>> clf = BPNNClassifier(hidden_layer_sizes=(64,), max_iter=30, random_state=0)
    >>> clf.fit(X / 16, y).score(X / 16, y) > 0.95
    True
    """

    _score_function = staticmethod(accuracy_score)

    def _output_activation(self) -> str:
        return "softmax" if self._label_binarizer.y_type_ == "multiclass" else "logistic"

    def _validate_input(self, X, y, incremental: bool, reset: bool):
        _refuse_missing_labels(y)  # scikit-learn's "Input contains NaN" names no row
        X, y = validate_data(
            self,
            X,
            y,
            accept_sparse=["csr", "csc"],
            multi_output=True,
            dtype=(np.float64, np.float32),
            reset=reset,
        )
        if y.ndim == 2 and y.shape[1] == 1:
            y = column_or_1d(y, warn=True)
        classes = _classes_of(y)
        if classes is None:  # a label indicator, or labels numpy cannot sort
            self._fit_labels(y, incremental)
            return X, self._label_binarizer.transform(y)
        # The binarizer fitted on the classes, the rows encoded in numpy: one pass over
        # the labels, where the binarizer's checks, fit and transform made six.
        self._fit_labels(classes, incremental)
        return X, self._label_columns()(y, dtype=_as_dtype(self.dtype))

    def _targets_from(self, source, client, incremental: bool):
        """``(n_outputs, encode)`` of data the workers read: labels found there."""
        classes = source.unique_labels(client)
        if source.n_targets > 1:  # a label indicator matrix: one 0/1 column per label
            if not np.isin(classes, (0, 1)).all():
                raise ValueError(
                    "Multioutput target data is not supported with label binarization: "
                    f"a 2-D y must hold 0 and 1 only (a label indicator), found {classes[:5]}"
                )
            # The binarizer fitted as on the indicator matrix, from its two kinds of rows.
            classes = np.repeat([[0], [1]], source.n_targets, axis=1)
        self._fit_labels(classes, incremental)
        # The fitted binarizer's transform, run on the workers on each shard's labels, in
        # numpy alone: with the binarizer itself each worker first imported scikit-learn.
        encode = self._label_columns()
        return encode(classes[:1]).shape[1], encode

    def _fit_labels(self, y, incremental: bool) -> None:
        """Fit (or check against) the label binarizer: ``y`` the labels or their classes."""
        # Names a regression target as such ("continuous"), where the binarizer would print
        # the labels' array into its message.
        check_classification_targets(y)
        if not hasattr(self, "classes_") or (not self.warm_start and not incremental):
            self._label_binarizer = LabelBinarizer()
            self._label_binarizer.fit(y)
            self.classes_ = self._label_binarizer.classes_
        else:
            classes = unique_labels(y)
            if self.warm_start:
                if set(classes) != set(self.classes_):
                    raise ValueError(
                        "warm_start can only be used where `y` has the same classes as in "
                        f"the previous call to fit. Previously got {self.classes_}, `y` has "
                        f"{classes}"
                    )
            elif len(np.setdiff1d(classes, self.classes_, assume_unique=True)):
                raise ValueError(
                    f"`y` has classes not in `self.classes_`. `self.classes_` has "
                    f"{self.classes_}. 'y' has {classes}."
                )
        if len(self._label_binarizer.classes_) < 2 and self._label_binarizer.y_type_ != (
            "multilabel-indicator"
        ):
            raise ValueError(
                "The number of classes has to be greater than one; got "
                f"{len(self._label_binarizer.classes_)} class"
            )

    def _label_columns(self) -> LabelColumns:
        """The fitted binarizer as the workers apply it (no scikit-learn to import)."""
        return LabelColumns(self._label_binarizer.classes_, self._label_binarizer.y_type_)

    def _decode_targets(self, Y: np.ndarray):
        return self._label_binarizer.inverse_transform(Y)

    def _predict(self, X, check_input: bool = True, model: MLP | None = None):
        y_pred = self._forward(X, check_input=check_input, model=model)
        if self.n_outputs_ == 1:
            y_pred = y_pred.ravel()
        return self._label_binarizer.inverse_transform(y_pred)

    def predict(self, X):
        """Predict class labels for X.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            The input data.

        Returns
        -------
        y : ndarray of shape (n_samples,) or (n_samples, n_classes)
            The predicted classes.
        """
        check_is_fitted(self)
        if _is_lazy(X):
            return self._lazy_predictions(X, self._model)
        return self._predict(X)

    def score(self, X, y, sample_weight=None):
        """Mean accuracy of ``predict(X)`` against ``y``, as scikit-learn's ``score``.

        On Dask input (a Dask array or DataFrame ``X``, labels as a Dask array or
        Series) it is computed block by block by Dask's current scheduler (the active
        Client's workers, if any); only the float travels. A path (``y`` its label column
        or key) likewise: a parquet or CSV file is read block by block there, an ``.npz``
        file here.
        """
        if isinstance(X, (str, os.PathLike)):
            return _score_of_path(self, X, y, sample_weight)
        if _is_lazy(X):
            # A float, as scikit-learn's scorers require (cross_val_score, GridSearchCV).
            check_is_fitted(self)
            return _score_of_dask(self, X, y, self._model, sample_weight)
        _refuse_missing_labels(y)  # scikit-learn's accuracy fails on one unnamed
        return super().score(X, y, sample_weight=sample_weight)

    def predict_proba(self, X):
        """Probability estimates.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            The input data.

        Returns
        -------
        y_prob : ndarray of shape (n_samples, n_classes)
            Probability of each class, ordered as in ``classes_``.
        """
        check_is_fitted(self)
        if _is_lazy(X):
            _check_lazy_input(self, X)
            width = 2 if self.n_outputs_ == 1 else self.n_outputs_
            proba = blocks.BlockPredictor(self._model, probabilities=True)
            return _blockwise(proba, X, width, self._model.dtype)
        y_pred = self._forward(X)
        if self.n_outputs_ == 1:
            p = y_pred.ravel()
            return np.vstack([1 - p, p]).T
        return y_pred

    def predict_log_proba(self, X):
        """Log of the probability estimates.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            The input data.

        Returns
        -------
        log_y_prob : ndarray of shape (n_samples, n_classes)
            ``log(predict_proba(X))``.
        """
        y_prob = self.predict_proba(X)
        with np.errstate(divide="ignore"):
            return np.log(y_prob, out=y_prob)

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y, sample_weight=None, classes=None):
        """Update the model with one epoch over the given data, in this process.

        Always in-process, whatever ``client`` is (also after a fit on a cluster): the
        cluster's round loop is :meth:`fit`'s. Dask input is computed here first.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            The input data.
        y : array-like of shape (n_samples,)
            The target values.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights of the rows (see :meth:`fit`).
        classes : array of shape (n_classes,), default=None
            All classes across calls; required on the first call.

        Returns
        -------
        self : object
            The updated estimator.
        """
        called_at = time.perf_counter()
        if _is_worker_readable(X):  # partial_fit trains in-process: read or computed here
            X, y = _read_in_process(self, X, y)
        _refuse_missing_labels(y)  # before type_of_target, which fails on one unnamed

        def first_call() -> None:
            if _check_partial_fit_first_call(self, classes):
                self._label_binarizer = LabelBinarizer()
                if type_of_target(y).startswith("multilabel"):
                    self._label_binarizer.fit(y)
                else:
                    self._label_binarizer.fit(classes)

        return self._fit(
            X,
            y,
            incremental=True,
            called_at=called_at,
            sample_weight=sample_weight,
            prepare=first_call,
        )

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_label = True
        return tags


class BPNNRegressor(RegressorMixin, _BaseBPNN):
    """Back-propagation neural network (multi-layer perceptron) regressor.

    A drop-in for :class:`sklearn.neural_network.MLPRegressor` (squared error) with the
    stochastic solvers, computing in float32 by default on one flat parameter vector.

    Parameters
    ----------
    loss : {"squared_error"}, default="squared_error"
        The loss (half squared error), first as in ``MLPRegressor``.
    hidden_layer_sizes : array-like of shape (n_layers - 2,), default=(100,)
        The ith element is the number of neurons in the ith hidden layer.
    activation : {"identity", "logistic", "tanh", "relu"}, default="relu"
        Activation of the hidden layers.
    solver : {"sgd", "adam"}, default="adam"
        The weight optimizer.
    alpha : float, default=0.0001
        Strength of the L2 penalty.
    batch_size : int or "auto", default="auto"
        Mini-batch size; "auto" is ``min(200, n_samples)``.
    learning_rate : {"constant", "invscaling", "adaptive"}, default="constant"
        Step-size schedule of ``solver="sgd"``.
    learning_rate_init : float, default=0.001
        Initial step size.
    power_t : float, default=0.5
        Exponent of the "invscaling" schedule.
    max_iter : int, default=200
        Maximum number of epochs.
    shuffle : bool, default=True
        Shuffle the rows every epoch.
    random_state : int, RandomState instance or None, default=None
        Seeds initialisation, shuffling and the early-stopping split.
    tol : float, default=1e-4
        Tolerance of the stopping rule.
    verbose : bool, default=False
        Print progress.
    warm_start : bool, default=False
        Reuse the previous solution as initialisation.
    momentum : float, default=0.9
        Momentum of "sgd".
    nesterovs_momentum : bool, default=True
        Nesterov's momentum for "sgd".
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the rows and stop when its R^2 stalls.
    validation_fraction : float, default=0.1
        Fraction of rows held out for early stopping.
    beta_1, beta_2 : float, default=0.9, 0.999
        Decay rates of Adam's moment estimates.
    epsilon : float, default=1e-8
        Numerical stability term of Adam.
    n_iter_no_change : int, default=10
        Epochs without ``tol`` improvement before stopping.
    dtype : {"float32", "float64"} or numpy type, default="float32"
        Type the network computes in.
    client : distributed.Client, cluster, str, path, None or False, default=None
        Where ``fit`` trains: HMDSPT rounds on a cluster given as a ``Client``, a cluster
        object (``LocalCluster``, ``SLURMCluster``, ...), a scheduler address or a
        scheduler file; None uses the active Client (``with Client(...)``, or the latest
        one made) if there is one and fits in-process otherwise; False always fits
        in-process. A client the fit opens (of a cluster, an address, a file) is closed
        when the fit ends; one passed in or active stays open. Connecting waits at most
        Dask's ``distributed.comm.timeouts.connect``, then fails with a
        ``ConnectionError``. ``partial_fit`` trains in-process (with None it ignores the
        active Client). Not saved: a pickled, skops-saved or deep-copied model has
        ``client=None`` whatever was given (an address too), so loading never connects;
        in another process (joblib's ``n_jobs > 1``) such a copy refuses to fit rather
        than silently fitting in-process. ``clone`` shares a live client, so
        ``cross_val_score`` and ``GridSearchCV`` fit on the same cluster.
    partition : {"proportional", "equal"}, default="proportional"
        Cluster fits: rows per worker by measured speed (re-balanced), or equal.
    sync : {"hmdspt", "local", "bsp"}, default="hmdspt"
        Cluster fits: step-normalised delta merge with block momentum and warm start;
        plain model averaging; or a gradient average after every mini-batch. A strategy
        registered in :data:`hmdspt.core.strategies.SYNC_STRATEGIES` is accepted too
        (likewise ``partition``).
    rounds_per_epoch : int or "auto", default="auto"
        Cluster fits: synchronous rounds an epoch is split into (not used by "bsp"); more
        than the training rows are clipped to them, with a warning. ``"auto"``: 4 in
        the first epoch, then in each epoch as many as keep a round's measured overhead
        (synchronisation and fixed per-round costs) within
        ``trainer_options["sync_budget"]`` (5 %) of the round, with at most
        ``trainer_options["max_local_steps"]`` (128) steps per round in the last epoch
        (``max_iter``'s) and ``trainer_options["early_local_steps"]`` (2048) before it
        (docs/design.md, "Rounds sized from measured costs").
    block_momentum : float, default=0.5
        Cluster fits with ``sync="hmdspt"``: momentum of the merged delta.
    compression : {"none", "float16", "topk"}, default="none"
        Cluster fits: what a worker sends (top-k: the ``trainer_options["topk"]``
        fraction of the entries, 10 % by default, with error feedback).
    run_log : str or path, default=None
        Cluster fits: the JSON-lines run log (docs/runlog.md): a ``.jsonl`` file to
        append to, or a folder in which ``<run_id>.jsonl`` is written.
    max_seconds : float, default=None
        Stop after the epoch (in-process) or round (cluster) during which the fit
        passed this many seconds of training (scoring ``eval_set`` not counted); the
        last epoch of a cluster fit may then be partial.
    checkpoint_dir : str or path, default=None
        Folder of atomic, checksummed checkpoints (the last two files are kept); None
        writes none. They hold the parameters, the optimizer's state, the epoch
        counters and scores, and: in-process, the random state; on a cluster, the
        block-momentum state, worker scores and the round counter. Not for
        ``partial_fit``. A folder serves one fit at a time: a fit started on a folder
        another running fit writes to is refused (``CheckpointError``).
    checkpoint_every : int, default=1
        In-process: epochs between two checkpoints (the fit's last epoch is saved
        too). Cluster fits: rounds between two checkpoints (every epoch's end is saved
        too).
    resume : bool, default=False
        Continue from the newest good checkpoint in ``checkpoint_dir`` (a fresh fit
        when there is none, or when it ends a fit that converged or ran ``max_iter``
        epochs, as many as this one asks for: there is nothing left to continue, and
        its model was trained on that fit's rows; warned with a ``UserWarning``).
        ``n_iter_``, ``loss_curve_`` and ``t_`` are restored, so ``max_iter`` counts
        the epochs of the interrupted and the resumed fit together.
        A checkpoint of a differently shaped model is refused, and so is one of a
        cluster fit in-process or the other way round. In-process, with an int
        ``random_state``, the resumed fit ends where an uninterrupted one would.
    trainer_options : dict, default=None
        Cluster fits: the round loop's rarely changed settings, by name
        (:data:`hmdspt.estimator.TRAINER_OPTIONS`; each one's meaning and default are those
        of :class:`hmdspt.core.config.TrainerConfig`): ``sync_budget``,
        ``max_local_steps``, ``early_local_steps``, ``block_lr``, ``local_lr_scale``,
        ``normalize_steps``, ``topk``, ``warm_start_rows``, ``warm_start_epochs``,
        ``first_wave_fraction``, ``ramp_rounds``, ``ramp_first_round_s``,
        ``max_ramp_rounds``, ``probe_seconds``, ``reuse_speeds_s``, ``cost_window_s``,
        ``rebalance_threshold``, ``min_rows``,
        ``quiet_workers``, ``broadcast_timeout_s``, ``stall_warning_s`` and
        ``eval_resolution``. An unknown
        key fails the fit, in-process too.

    Attributes
    ----------
    loss_ : float
        Loss of the last epoch.
    best_loss_ : float or None
        Best training loss (None with early stopping).
    loss_curve_ : list of float
        Loss per epoch.
    validation_scores_ : list of float or None
        Validation R^2 per epoch with early stopping.
    best_validation_score_ : float or None
        Best validation R^2 with early stopping.
    t_ : int
        Training samples seen.
    coefs_ : list of ndarray
        Weight matrices (views into one flat vector).
    intercepts_ : list of ndarray
        Bias vectors (views into the same vector).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of str
        Feature names, when X had them.
    n_iter_ : int
        Epochs run.
    n_layers_ : int
        Number of layers.
    n_outputs_ : int
        Number of outputs.
    out_activation_ : str
        Output activation ("identity").
    eval_curve_ : list of (float, float)
        ``(seconds of training since the fit began, score)`` on ``eval_set`` when one
        was given; the time the fit waited on scoring ``eval_set`` is not counted (on
        a cluster most rounds are scored while the next one trains).
    training_report_ : dict
        After a fit on a cluster: per worker rows held, busy s, comm s, idle s, idle
        fraction, final score (samples/s) and ``fixed_s``: the round cost model's speed
        and fixed seconds per round at the fit's end, which the shares follow (a round of
        ``n`` rows keeps the worker busy ``fixed_s + n / score`` seconds; docs/design.md,
        "Round cost model").
    prediction_ : dict or None
        After a fit on a cluster of more than one epoch: what its second epoch was
        predicted to cost from the first's measured speeds and synchronisation
        (the run log's ``prediction`` event): ``epoch_s`` (with the fit's shares),
        ``balanced_epoch_s``, ``equal_shares_epoch_s``, ``fastest_alone_epoch_s`` (one
        process on the ``fastest`` worker alone),
        ``speedup`` (that over ``epoch_s``) and ``efficiency``: ``model_efficiency``
        (the cost model's) and ``measured_efficiency`` (the first epoch's) weighed by
        ``hmdspt.core.prediction.MEASURED_WEIGHT`` (docs/design.md, "An honest answer").
        A speed-up under 1 is also warned about (``RuntimeWarning``).
    run_id_ : str
        After a fit on a cluster: the run's id in its run log.
    run_log_path_ : pathlib.Path or None
        After a fit on a cluster: where its run log was written.
    """

    _parameter_constraints: dict = {
        **_BaseBPNN._parameter_constraints,
        "loss": [StrOptions({"squared_error"})],
    }
    _score_function = staticmethod(r2_score)

    def __init__(
        self,
        loss="squared_error",
        hidden_layer_sizes=(100,),
        activation="relu",
        *,
        solver="adam",
        alpha=0.0001,
        batch_size="auto",
        learning_rate="constant",
        learning_rate_init=0.001,
        power_t=0.5,
        max_iter=200,
        shuffle=True,
        random_state=None,
        tol=1e-4,
        verbose=False,
        warm_start=False,
        momentum=0.9,
        nesterovs_momentum=True,
        early_stopping=False,
        validation_fraction=0.1,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-8,
        n_iter_no_change=10,
        dtype="float32",
        client=None,
        partition=_TRAINER_DEFAULTS["partition"],
        sync=_TRAINER_DEFAULTS["sync"],
        rounds_per_epoch=_TRAINER_DEFAULTS["rounds_per_epoch"],
        block_momentum=_TRAINER_DEFAULTS["block_momentum"],
        compression=_TRAINER_DEFAULTS["compression"],
        run_log=_TRAINER_DEFAULTS["run_log"],
        max_seconds=_TRAINER_DEFAULTS["max_seconds"],
        checkpoint_dir=_TRAINER_DEFAULTS["checkpoint_dir"],
        checkpoint_every=_TRAINER_DEFAULTS["checkpoint_every"],
        resume=_TRAINER_DEFAULTS["resume"],
        trainer_options=None,
    ):
        super().__init__(
            hidden_layer_sizes=hidden_layer_sizes,
            activation=activation,
            solver=solver,
            alpha=alpha,
            batch_size=batch_size,
            learning_rate=learning_rate,
            learning_rate_init=learning_rate_init,
            power_t=power_t,
            max_iter=max_iter,
            shuffle=shuffle,
            random_state=random_state,
            tol=tol,
            verbose=verbose,
            warm_start=warm_start,
            momentum=momentum,
            nesterovs_momentum=nesterovs_momentum,
            early_stopping=early_stopping,
            validation_fraction=validation_fraction,
            beta_1=beta_1,
            beta_2=beta_2,
            epsilon=epsilon,
            n_iter_no_change=n_iter_no_change,
            dtype=dtype,
            client=client,
            partition=partition,
            sync=sync,
            rounds_per_epoch=rounds_per_epoch,
            block_momentum=block_momentum,
            compression=compression,
            run_log=run_log,
            max_seconds=max_seconds,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            resume=resume,
            trainer_options=trainer_options,
        )
        self.loss = loss

    def _output_activation(self) -> str:
        return "identity"

    def _validate_input(self, X, y, incremental: bool, reset: bool):
        X, y = validate_data(
            self,
            X,
            y,
            accept_sparse=["csr", "csc"],
            multi_output=True,
            y_numeric=True,
            dtype=(np.float64, np.float32),
            reset=reset,
        )
        if y.ndim == 2 and y.shape[1] == 1:
            y = column_or_1d(y, warn=True)
        return X, y.reshape(len(y), -1)

    def _targets_from(self, source, client, incremental: bool):
        """``(n_outputs, encode)`` of data the workers read: the values, as columns."""
        return source.n_targets, np.asarray

    def _label_columns(self) -> LabelColumns:
        """The fitted binarizer as the workers apply it (no scikit-learn to import)."""
        return LabelColumns(self._label_binarizer.classes_, self._label_binarizer.y_type_)

    def _decode_targets(self, Y: np.ndarray):
        return Y.ravel() if Y.shape[1] == 1 else Y

    def _predict(self, X, check_input: bool = True, model: MLP | None = None):
        y_pred = self._forward(X, check_input=check_input, model=model)
        return y_pred.ravel() if y_pred.shape[1] == 1 else y_pred

    def score(self, X, y, sample_weight=None):
        """R^2 of ``predict(X)`` against ``y``, as scikit-learn's ``score``.

        On Dask input (a Dask array or DataFrame ``X``, targets as a Dask array or
        Series) it is computed block by block by Dask's current scheduler (the active
        Client's workers, if any); only the float travels. A path (``y`` its label column
        or key) likewise: a parquet or CSV file is read block by block there, an ``.npz``
        file here.
        """
        if isinstance(X, (str, os.PathLike)):
            return _score_of_path(self, X, y, sample_weight)
        if _is_lazy(X):
            # A float, as scikit-learn's scorers require (cross_val_score, GridSearchCV).
            check_is_fitted(self)
            return _score_of_dask(self, X, y, self._model, sample_weight)
        return super().score(X, y, sample_weight=sample_weight)

    def predict(self, X):
        """Predict using the multi-layer perceptron model.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            The input data.

        Returns
        -------
        y : ndarray of shape (n_samples,) or (n_samples, n_outputs)
            The predicted values.
        """
        check_is_fitted(self)
        if _is_lazy(X):
            return self._lazy_predictions(X, self._model)
        return self._predict(X)

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X, y, sample_weight=None):
        """Update the model with one epoch over the given data, in this process.

        Always in-process, whatever ``client`` is (also after a fit on a cluster): the
        cluster's round loop is :meth:`fit`'s. Dask input is computed here first.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            The input data.
        y : ndarray of shape (n_samples,) or (n_samples, n_outputs)
            The target values.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights of the rows (see :meth:`fit`).

        Returns
        -------
        self : object
            The updated estimator.
        """
        return self._fit(
            X, y, incremental=True, called_at=time.perf_counter(), sample_weight=sample_weight
        )
