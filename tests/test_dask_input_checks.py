"""Dask input is checked as scikit-learn checks the same data in memory, before any work,
and a refused score or fit leaves nothing on the workers (an audit of 2026-12-08 found
each case below wrong: a silent 0.0, Dask's own messages, a fit after the run began)."""

from __future__ import annotations

import time
import warnings

import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import make_classification

from hmdspt import BPNNClassifier
from hmdspt.core.shard import DataError

N_ROWS, CHUNK = 600, 150


@pytest.fixture(scope="module")
def rows():
    X, y = make_classification(
        n_samples=N_ROWS, n_features=6, n_informative=4, n_classes=3, random_state=0
    )
    return X.astype(np.float32), y


@pytest.fixture(scope="module")
def fitted(rows, client):
    X, y = rows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BPNNClassifier((8,), max_iter=2, random_state=0, client=client).fit(
            da.from_array(X, chunks=CHUNK), da.from_array(y, chunks=CHUNK)
        )


def _fit(client, X, y, **fit_params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = BPNNClassifier((8,), max_iter=2, random_state=0, client=client)
        return model.fit(X, y, **fit_params)


def _nothing_on_the_workers(client, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(client.run(lambda dask_worker: len(dask_worker.data)).values()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("as_frame", [False, True], ids=["dask array", "dask Series"])
def test_labels_of_another_kind_than_the_classes_are_refused_not_scored_zero(
    rows, fitted, as_frame
):
    # Fitted on integers, scored against the same labels as strings: in memory scikit-learn
    # refuses the mix; on Dask every comparison failed and the score was 0.0.
    X, y = rows
    labels = y.astype(str)
    y_dask = (
        dd.from_pandas(pd.Series(labels, dtype=object), npartitions=4)  # objects: per block
        if as_frame
        else da.from_array(labels, chunks=CHUNK)
    )
    with pytest.raises(ValueError, match=r"^Mix of label input types \(string and number\)"):
        fitted.score(da.from_array(X, chunks=CHUNK), y_dask)
    on_dask = fitted.score(da.from_array(X, chunks=CHUNK), da.from_array(y, chunks=CHUNK))
    assert on_dask == pytest.approx(fitted.score(X, y))  # the labels it was fitted on


@pytest.mark.parametrize(
    ("cut", "match"),
    [
        ("y", r"^Found input variables with inconsistent numbers of samples: \[600, 500\]$"),
        ("sample_weight", r"^sample_weight.shape == \(500,\), expected \(600,\)!$"),
    ],
)
def test_a_score_of_another_length_is_refused_in_scikit_learns_words(rows, fitted, cut, match):
    X, y = rows
    weights = np.ones(N_ROWS)
    args = {"y": da.from_array(y, chunks=CHUNK), "sample_weight": weights}
    args[cut] = args[cut][:500]
    with pytest.raises(ValueError, match=match):
        fitted.score(da.from_array(X, chunks=CHUNK), **args)


def test_a_data_frame_scores_with_its_label_column_named_as_fit_takes_it(rows, fitted):
    X, y = rows
    frame = dd.from_pandas(pd.DataFrame(X).assign(label=y), npartitions=4)
    frame.columns = frame.columns.astype(str)
    by_name = BPNNClassifier((8,), max_iter=2, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        by_name.fit(frame, "label")
    assert by_name.score(frame, "label") == by_name.score(frame.drop(columns="label"), frame.label)


def test_an_eval_set_of_another_length_is_refused_before_the_first_round(rows, client):
    X, y = rows
    with pytest.raises(ValueError, match=r"^eval_set has 600 rows in X but 500 in y$"):
        _fit(
            client,
            da.from_array(X, chunks=CHUNK),
            da.from_array(y, chunks=CHUNK),
            eval_set=(da.from_array(X, chunks=CHUNK), da.from_array(y[:500], chunks=CHUNK)),
        )
    assert _nothing_on_the_workers(client)


def test_a_bad_eval_set_is_named_and_its_scores_leave_nothing_on_the_workers(rows, client):
    # Its score's futures stayed on the workers for as long as the error was kept.
    X, y = rows
    bad = X.copy()
    bad[550, 1] = np.nan
    with pytest.raises(DataError, match=r"^eval_set: X has NaN/infinite value\(s\).*row 550"):
        _fit(
            client,
            da.from_array(X, chunks=CHUNK),
            da.from_array(y, chunks=CHUNK),
            eval_set=(da.from_array(bad, chunks=CHUNK), da.from_array(y, chunks=CHUNK)),
        )
    assert _nothing_on_the_workers(client)


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        (lambda n: np.ones((n, 3)), r"^Sample weights must be 1D array or scalar, got 2D"),
        (lambda n: np.ones((n, 1)), r"^Sample weights must be 1D array or scalar, got 2D"),
        (lambda n: np.zeros(n), r"^Sample weights must contain at least one non-zero number"),
        (lambda n: -1.0, r"^Negative values in data passed to `sample_weight`"),
        (lambda n: 0.0, r"^Sample weights must contain at least one non-zero number"),
    ],
    ids=["(n, 3)", "(n, 1)", "all zero", "negative scalar", "zero scalar"],
)
def test_dask_weights_are_refused_as_in_memory_before_any_row_is_read(rows, client, weights, match):
    X, y = rows
    w = weights(N_ROWS)
    w = w if np.ndim(w) == 0 else da.from_array(w, chunks=CHUNK)
    with pytest.raises(ValueError, match=match):
        _fit(
            client, da.from_array(X, chunks=CHUNK), da.from_array(y, chunks=CHUNK), sample_weight=w
        )
    assert _nothing_on_the_workers(client)


def test_a_scalar_weight_with_dask_rows_weighs_every_row_alike(rows, client):
    # It failed with "IndexError: tuple index out of range"; in memory it is accepted, and
    # it is not the same as no weight (the weights' sum divides the L2 penalty).
    X, y = rows
    X_dask, y_dask = da.from_array(X, chunks=CHUNK), da.from_array(y, chunks=CHUNK)
    scalar = _fit(client, X_dask, y_dask, sample_weight=2.0)
    full = _fit(client, X_dask, y_dask, sample_weight=da.full(N_ROWS, 2.0, chunks=CHUNK))
    np.testing.assert_array_equal(scalar._model.params, full._model.params)


def test_a_file_fit_refuses_labels_given_other_than_by_their_column_in_its_own_words(
    rows, client, tmp_path
):
    # Staging's messages told the user to pass target=, which fit does not take.
    X, y = rows
    path = tmp_path / "rows.parquet"
    pd.DataFrame(X, columns=[f"f{i}" for i in range(6)]).assign(label=y).to_parquet(path)
    with pytest.raises(ValueError, match=r"rows.parquet: no labels; name the label column as y$"):
        _fit(client, str(path), None)
    with pytest.raises(ValueError, match=r"the labels come from the file; name its label column"):
        _fit(client, str(path), y)


@pytest.mark.parametrize("where", ["cluster", "in-process"])
def test_a_missing_numeric_label_in_a_file_is_named_by_its_file_and_row(
    rows, client, tmp_path, where
):
    # A float label column with a NaN: on a cluster np.unique kept the NaN as a class, and
    # the fit failed in scikit-learn's words ("Input y contains NaN."), naming neither row
    # nor file; in-process the row was named but not the file.
    X, y = rows
    labels = y.astype(float)
    labels[420] = np.nan
    path = tmp_path / "rows.parquet"
    pd.DataFrame(X, columns=[f"f{i}" for i in range(6)]).assign(label=labels).to_parquet(path)
    with pytest.raises(DataError, match=r"rows.parquet: y has a missing label .* first at row 420"):
        _fit(client if where == "cluster" else False, str(path), "label")


def test_bad_rows_a_worker_finds_are_one_line_without_its_compute_failed_log(rows, client):
    # Each worker logged "Compute Failed" with a traceback (on the user's terminal, for
    # in-process workers) before the fit raised its one line; a user's own failing task
    # is still logged.
    import logging

    X, y = rows
    weights = np.ones(N_ROWS)
    weights[420] = np.nan
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("distributed.worker")
    logger.addHandler(handler)
    try:
        with pytest.raises(DataError, match=r"^sample_weight has NaN/infinite value\(s\)"):
            _fit(
                client,
                da.from_array(X, chunks=CHUNK),
                da.from_array(y, chunks=CHUNK),
                sample_weight=da.from_array(weights, chunks=CHUNK),
            )
        assert not [m for m in records if m.startswith("Compute Failed")], records
        with pytest.raises(ZeroDivisionError):
            client.submit(lambda: 1 / 0).result()
        assert any(m.startswith("Compute Failed") for m in records), records
    finally:
        logger.removeHandler(handler)
    assert _nothing_on_the_workers(client)


def test_text_late_in_a_csvs_numeric_column_is_one_data_error(rows, client, tmp_path):
    # pandas infers the column's type from the first rows; the text failed a worker's read
    # after the run had begun, as a TrainingError wrapping it, each worker's "Compute
    # Failed" record first.
    import logging

    X, y = np.tile(rows[0], (5, 1)), np.tile(rows[1], 5)  # past the rows the types are read from
    frame = pd.DataFrame(X, columns=[f"f{i}" for i in range(6)]).astype(object).assign(label=y)
    frame.loc[2900, "f3"] = "abc"
    path = tmp_path / "late.csv"
    frame.to_csv(path, index=False)
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("distributed.worker").addHandler(handler)
    try:
        with pytest.raises(DataError, match=r"late.csv: could not convert string to float: 'abc'$"):
            _fit(client, str(path), "label")
    finally:
        logging.getLogger("distributed.worker").removeHandler(handler)
    assert not [m for m in records if m.startswith("Compute Failed")], records
    assert _nothing_on_the_workers(client)
