"""Bad settings of the estimators get one clear line (issue 14, defects 13a and 13d)."""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster
from sklearn.datasets import load_digits, make_classification
from sklearn.exceptions import NotFittedError

from hmdspt.core.checkpoint import CheckpointError, save_checkpoint
from hmdspt.estimator import BPNNClassifier, BPNNRegressor
from hmdspt.parallel.cluster import connect
from tests.clusters import FREE_PORTS


@pytest.fixture(scope="module")
def data():
    return make_classification(n_samples=300, n_features=6, n_informative=4, random_state=0)


@pytest.fixture(scope="module")
def closed_client():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, **FREE_PORTS) as cluster:
        client = Client(cluster)
        client.close()
        yield client


def _one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_a_closed_client_gets_one_clear_line(closed_client, data):
    X, y = data
    with pytest.raises(ValueError, match="client is closed") as excinfo:
        connect(closed_client)
    assert "pass an open distributed.Client" in _one_line(excinfo)
    with pytest.raises(ValueError, match="client is closed") as excinfo:
        BPNNClassifier((4,), max_iter=1, client=closed_client).fit(X, y)
    _one_line(excinfo)


def test_resume_without_a_checkpoint_dir_is_refused_in_process(data):
    X, y = data
    with pytest.raises(ValueError, match="resume=True needs a checkpoint_dir") as excinfo:
        BPNNClassifier((4,), max_iter=1, resume=True).fit(X, y)
    _one_line(excinfo)


def test_partial_fit_refuses_checkpoints(data, tmp_path):
    X, y = data
    clf = BPNNClassifier((4,), checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match="partial_fit keeps no checkpoints") as excinfo:
        clf.partial_fit(X, y, classes=np.unique(y))
    _one_line(excinfo)
    assert not list(tmp_path.iterdir())


def test_an_in_process_resume_refuses_another_models_checkpoint(data, tmp_path):
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        BPNNClassifier((4,), max_iter=1, checkpoint_dir=tmp_path).fit(X, y)
    with pytest.raises(CheckpointError, match="layer_sizes") as excinfo:
        BPNNClassifier((5,), max_iter=2, checkpoint_dir=tmp_path, resume=True).fit(X, y)
    _one_line(excinfo)


def test_an_in_process_resume_refuses_a_cluster_checkpoint(data, tmp_path):
    X, y = data
    # What a cluster fit of this very model writes: same shape, but its epochs are rounds
    # of per-worker optimizers, not the in-process optimizer's state.
    fingerprint = {
        "layer_sizes": [6, 4, 1],
        "n_params": 6 * 4 + 4 + 4 + 1,
        "dtype": "float32",
        "hidden_activation": "relu",
        "out_activation": "logistic",
        "solver": "adam",
    }
    save_checkpoint(
        tmp_path,
        {"params": np.zeros(fingerprint["n_params"], np.float32)},
        {"round_index": 4, "epoch": 1, "epoch_complete": True, "fingerprint": fingerprint},
    )
    with pytest.raises(
        CheckpointError, match="the checkpoint's fit ran on a cluster, this one runs in-process"
    ) as excinfo:
        BPNNClassifier((4,), max_iter=2, checkpoint_dir=tmp_path, resume=True).fit(X, y)
    _one_line(excinfo)


def test_a_cluster_resume_refuses_an_in_process_checkpoint(data, tmp_path):
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        BPNNClassifier((4,), max_iter=1, checkpoint_dir=tmp_path).fit(X, y)
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, **FREE_PORTS) as cluster,
        Client(cluster) as client,
    ):
        clf = BPNNClassifier((4,), max_iter=2, client=client, checkpoint_dir=tmp_path, resume=True)
        with pytest.raises(
            CheckpointError, match="the checkpoint's fit ran in-process, this one runs on a cluster"
        ) as excinfo:
            clf.fit(X, y)
    _one_line(excinfo)


def _client_for(where: str, stack: contextlib.ExitStack):
    """``client=`` for a fit ``where``: False in-process, else a one-worker cluster's client
    that ``stack`` closes."""
    if where == "in-process":
        return False
    cluster = stack.enter_context(
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, **FREE_PORTS)
    )
    return stack.enter_context(Client(cluster))


@pytest.mark.parametrize("where", ["in-process", "cluster"])
def test_a_resume_refuses_a_checkpoint_of_other_classes(data, tmp_path, where):
    # The same number of classes gave the same shape: the fit resumed into outputs that
    # meant other labels.
    X, y = data
    named = np.array(["no", "yes"])[y]
    with contextlib.ExitStack() as stack:
        client = _client_for(where, stack)
        params = {"client": client, "checkpoint_dir": tmp_path}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            BPNNClassifier((4,), max_iter=1, **params).fit(X, y)
            other = r"classes: checkpoint has \[0, 1\], this fit has \['no', 'yes'\]"
            with pytest.raises(CheckpointError, match=other) as excinfo:
                BPNNClassifier((4,), max_iter=2, resume=True, **params).fit(X, named)
            _one_line(excinfo)
            resumed = BPNNClassifier((4,), max_iter=2, resume=True, **params).fit(X, y)
    assert resumed.n_iter_ == 2


@pytest.mark.parametrize("where", ["in-process", "cluster"])
def test_resume_does_not_take_a_finished_fits_model_for_a_fit_on_other_rows(data, tmp_path, where):
    # resume=True in a cross-validation: every fold after the first resumed the first
    # fold's last checkpoint, trained no epoch and kept that model (trained on the rows
    # it was then scored on). A finished fit leaves nothing to continue: start afresh.
    X, y = data
    half = len(y) // 2
    with contextlib.ExitStack() as stack:
        client = _client_for(where, stack)
        params = dict(max_iter=3, random_state=0, client=client, tol=0.0)
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        first = BPNNClassifier((4,), checkpoint_dir=tmp_path, resume=True, **params)
        first.fit(X[:half], y[:half])
        with pytest.warns(UserWarning, match="ran 3 epochs .* this fit starts afresh"):
            other = BPNNClassifier((4,), checkpoint_dir=tmp_path, resume=True, **params)
            other.fit(X[half:], y[half:])
        plain = BPNNClassifier((4,), **params).fit(X[half:], y[half:])
        # Raising max_iter still continues a finished fit, from where it ended.
        longer = BPNNClassifier((4,), checkpoint_dir=tmp_path, resume=True, **params)
        longer.set_params(max_iter=5).fit(X[half:], y[half:])
    assert other.n_iter_ == 3 and other.loss_curve_ != first.loss_curve_
    if where == "in-process":  # the same fit as one without checkpoints
        np.testing.assert_array_equal(other._model.params, plain._model.params)
    assert longer.n_iter_ == 5 and longer.loss_curve_[:3] == other.loss_curve_


def _damage_newest_checkpoint(folder) -> str:
    """Flip bytes inside the newest checkpoint's payload; return its file name."""
    newest = sorted(Path(folder).glob("ckpt-*.npz"))[-1]
    data = bytearray(newest.read_bytes())
    for i in range(200, 260):
        data[i] ^= 0xFF
    newest.write_bytes(bytes(data))
    return newest.name


@pytest.mark.parametrize("where", ["in-process", "cluster"])
@pytest.mark.parametrize("then", ["resumes", "starts afresh"])
def test_a_damaged_checkpoint_is_named_once_whether_the_fit_resumes_or_not(
    data, tmp_path, where, then
):
    # The folder was read twice, once to decide whether to resume and once to resume,
    # and each read warned about the same damaged file.
    X, y = data
    with contextlib.ExitStack() as stack:
        client = _client_for(where, stack)
        params = dict(random_state=0, client=client, tol=0.0, checkpoint_dir=tmp_path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            BPNNClassifier((4,), max_iter=3, **params).fit(X, y)
        damaged = _damage_newest_checkpoint(tmp_path)
        max_iter = 5 if then == "resumes" else 2  # the good one holds 2 epochs
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fitted = BPNNClassifier((4,), max_iter=max_iter, resume=True, **params).fit(X, y)
    said = [str(w.message) for w in caught]
    assert sum(damaged in m and m.startswith("skipping") for m in said) == 1, said
    assert any("starts afresh" in m for m in said) == (then == "starts afresh"), said
    assert fitted.n_iter_ == max_iter


@pytest.mark.parametrize(
    ("where", "interrupted"),  # a Ctrl-C sent from on_round, which cluster fits call
    [(w, False) for w in ("in-process", "cluster", "cluster, Dask rows")]
    + [(w, True) for w in ("cluster", "cluster, Dask rows")],
)
def test_a_fits_warnings_name_the_users_line(data, where, interrupted, sigint_raises):
    # A fixed stacklevel counted the frames of one path: on a cluster "Training interrupted
    # by user." and the predicted slow-down named lines of estimator.py.
    import signal

    import dask.array as da

    X, y = data
    with contextlib.ExitStack() as stack:
        client = _client_for(where.split(",")[0], stack)
        if "Dask" in where:
            X, y = da.from_array(X, chunks=100), da.from_array(y, chunks=100)
        on_round = (lambda record: signal.raise_signal(signal.SIGINT)) if interrupted else None
        model = BPNNClassifier((4,), max_iter=2, batch_size=1000, random_state=0, client=client)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(X, y, on_round=on_round)
    said = {(w.category.__name__, str(w.message)[:30], Path(w.filename).name) for w in caught}
    assert caught and all(w.filename == __file__ for w in caught), said
    assert any("Training interrupted by user." in m for _, m, _ in said) == interrupted, said


def test_a_diverging_in_process_fit_warns_once_with_the_numbers():
    """Issue 14, defect 11: Adam with learning_rate_init=1e6 ran on without a word."""
    X, y = load_digits(return_X_y=True)
    clf = BPNNClassifier(
        hidden_layer_sizes=(32,), learning_rate_init=1e6, max_iter=6, random_state=0
    )
    with warnings.catch_warnings(record=True) as caught:
        clf.fit(X, y)
    diverging = [w for w in caught if "diverg" in str(w.message)]
    assert len(diverging) == 1, [str(w.message) for w in caught]
    assert "learning_rate_init" in str(diverging[0].message)
    assert "\n" not in str(diverging[0].message)


def test_a_converging_in_process_fit_gets_no_divergence_warning():
    X, y = load_digits(return_X_y=True)
    clf = BPNNClassifier(hidden_layer_sizes=(32,), max_iter=8, random_state=0)
    with warnings.catch_warnings(record=True) as caught:
        clf.fit(X, y)
    assert not [w for w in caught if "diverg" in str(w.message)]


def test_non_numeric_columns_are_named_at_fit_and_predict():
    X = pd.DataFrame(
        {
            "a": np.arange(12.0),
            "color": ["red", "blue"] * 6,
            "size": pd.Categorical(["s", "m", "l"] * 4),
            "flag": [True, False] * 6,  # booleans are numbers
        }
    )
    y = np.arange(12) % 2
    message = r"non-numeric feature column\(s\) in X: \['color', 'size'\]; encode or drop these"
    with pytest.raises(ValueError, match=message):
        BPNNClassifier((4,), max_iter=1).fit(X, y)
    numeric = X[["a", "flag"]].astype(float)
    model = BPNNRegressor(hidden_layer_sizes=(4,), max_iter=1).fit(numeric, y)
    with pytest.raises(ValueError, match=r"non-numeric feature column\(s\) in X: \['flag'\]"):
        model.predict(numeric.assign(flag=["x"] * 12))


def test_a_missing_label_is_named_by_its_row_in_memory_and_in_dask_labels():
    """scikit-learn's checks fail on a None label with "'<' not supported between instances
    of 'NoneType' and 'str'", Dask's label collection with "boolean value of NA is
    ambiguous"; both now name the row."""
    import dask.dataframe as dd

    from hmdspt.core.shard import DataError

    X, y = make_classification(n_samples=300, n_features=5, random_state=0)
    labels = pd.Series(np.array(["no", "yes"], dtype=object)[y])
    labels[7] = None
    message = r"y has a missing label \(None, NaN or NA\), first at row 7; drop those rows"
    with pytest.raises(ValueError, match=message):
        BPNNClassifier(max_iter=1).fit(X, labels)
    with pytest.raises(ValueError, match=message):
        BPNNClassifier(max_iter=1).partial_fit(X, labels, classes=["no", "yes"])
    frame = pd.DataFrame(X, columns=list("abcde")).assign(label=labels)
    parts = dd.from_pandas(frame, npartitions=3)
    with LocalCluster(n_workers=1, processes=False, **FREE_PORTS) as cluster:
        with Client(cluster) as client, pytest.raises(DataError, match=message):
            BPNNClassifier(max_iter=1, client=client).fit(
                parts.drop(columns="label"), parts["label"]
            )


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("kind", ["array", "frame", "nullable frame"])
def test_a_non_finite_feature_of_dask_input_is_refused_by_its_row_when_predicting(bad, kind):
    """As scikit-learn refuses it in memory. Predicted on the workers from the network's
    parameters alone, the row came out as the first class (and counted in a score)."""
    import dask.array as da
    import dask.dataframe as dd

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4))
    y = (X[:, 0] > 0).astype(int)
    classifier = BPNNClassifier((8,), max_iter=2, random_state=0).fit(X, y)
    regressor = BPNNRegressor(hidden_layer_sizes=(8,), max_iter=2, random_state=0).fit(X, y)
    X = X.copy()
    if kind == "nullable frame":  # a missing value of an Int64 column: its NaN
        frame = pd.DataFrame(X, columns=list("abcd")).assign(d=pd.array([1] * 300, "Int64"))
        classifier.fit(frame.astype(float), y)  # the frame's names and types
        regressor.fit(frame.astype(float), y)
        frame.loc[205, "d"], (row, column, what) = pd.NA, (205, 3, "a NaN")
        data = dd.from_pandas(frame, npartitions=3)
    else:
        X[205, 2], (row, column) = bad, (205, 2)
        what = "a NaN" if np.isnan(bad) else "an infinite value"
        data = (
            da.from_array(X, chunks=100)
            if kind == "array"
            else dd.from_pandas(pd.DataFrame(X, columns=list("abcd")), npartitions=3)
        )
    message = f"X has NaN/infinite value.*{what} at row {row}, column {column}"
    for predicted in (
        lambda: classifier.predict(data).compute(),
        lambda: classifier.predict_proba(data).compute(),
        lambda: classifier.score(data, y),
        lambda: regressor.predict(data).compute(),
        lambda: regressor.score(data, y.astype(float)),
    ):
        with pytest.raises(ValueError, match=message):
            predicted()


@pytest.mark.parametrize("kind", ["1-D array", "Series", "3-D array", "a column named twice"])
def test_dask_x_that_is_not_a_table_of_rows_is_refused_as_in_memory(kind):
    """As scikit-learn refuses it in memory, on every path. A cluster fit took a 1-D Dask
    array for one feature, and its early stopping, an eval_set, predictions and scores
    failed on the workers ("Axis 1 is out of bounds"); a Dask Series failed the fit with
    an AttributeError; a frame naming two columns alike trained on both."""
    import dask.array as da
    import dask.dataframe as dd

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 1))
    y = (X[:, 0] > 0).astype(int)
    bad, message = {
        "1-D array": (da.from_array(X[:, 0], chunks=100), r"Expected 2D array, got 1D array"),
        "Series": (dd.from_pandas(pd.Series(X[:, 0]), npartitions=3), r"Expected a 2-dim"),
        "3-D array": (da.from_array(X.reshape(300, 1, 1), chunks=100), r"Found array with dim 3"),
        "a column named twice": (
            dd.from_pandas(pd.DataFrame(np.hstack([X, X]), columns=["a", "a"]), npartitions=3),
            r"Expected unique column names, got: ?\n?(- )?'a' 2 times",
        ),
    }[kind]
    labels = da.from_array(y, chunks=100)
    fitted = BPNNClassifier((4,), max_iter=1, random_state=0).fit(X, y)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, **FREE_PORTS) as cluster,
        Client(cluster) as client,
    ):
        for params, call in (
            ({}, lambda m: m.fit(bad, labels)),
            (dict(early_stopping=True), lambda m: m.fit(bad, labels)),
            ({}, lambda m: m.fit(X, y, eval_set=(bad, labels))),
            # In-process too, before computing it (scikit-learn's words printed its rows).
            ({"client": False}, lambda m: m.fit(bad, labels)),
            ({"client": False}, lambda m: m.partial_fit(bad, labels, classes=[0, 1])),
        ):
            model = BPNNClassifier((4,), max_iter=1, **{"client": client, **params})
            with pytest.raises(ValueError, match=message) as excinfo:
                call(model)
            _one_line(excinfo)
        for predicted in (fitted.predict, fitted.predict_proba, lambda d: fitted.score(d, y)):
            with pytest.raises(ValueError, match=message) as excinfo:
                predicted(bad)
            _one_line(excinfo)


@pytest.mark.parametrize("estimator", [BPNNClassifier, BPNNRegressor])
def test_dask_labels_of_one_column_warn_as_in_memory(estimator):
    """scikit-learn warns of a column-vector y; on a cluster Dask labels of one column
    trained without a word. Warned now, at the user's line."""
    import dask.array as da
    import dask.dataframe as dd

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    y = (X[:, :1] > 0).astype(float)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, **FREE_PORTS) as cluster,
        Client(cluster) as client,
    ):
        for labels in (
            da.from_array(y, chunks=100),
            dd.from_pandas(pd.DataFrame(y, columns=["label"]), npartitions=3),
            y,  # in memory
        ):
            for where in (client, False):
                model = estimator(hidden_layer_sizes=(4,), max_iter=1, client=where)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    model.fit(da.from_array(X, chunks=100), labels)
                said = [w for w in caught if "column-vector y" in str(w.message)]
                assert len(said) == 1, (type(labels), where, [str(w.message) for w in caught])
                if where is client:  # scikit-learn's own, in-process, names its caller
                    assert said[0].filename == __file__


# --------------------------------------------- a refused fit leaves the estimator as it was
def _fitted(cls, X, y, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning of max_iter=2
        return cls(hidden_layer_sizes=(4,), max_iter=2, random_state=0, **params).fit(X, y)


def test_a_refit_refused_for_its_labels_keeps_the_model_fitted_before(data):
    X, y = data
    model = _fitted(BPNNClassifier, X, y)
    predicted, proba = model.predict(X), model.predict_proba(X)
    for X_new in (X, X[:, :4]):  # the same features, and fewer
        with pytest.raises(ValueError, match="number of classes has to be greater than one"):
            model.fit(X_new, np.zeros(len(X_new), dtype=int))
        assert model.n_features_in_ == 6 and list(model.classes_) == [0, 1]
        np.testing.assert_array_equal(model.predict(X), predicted)
        np.testing.assert_array_equal(model.predict_proba(X), proba)


def test_a_first_fit_refused_leaves_the_estimator_unfitted(data):
    X, y = data
    for fit in (
        lambda m: m.fit(X, np.zeros(len(X), dtype=int)),
        lambda m: m.partial_fit(np.where(X > 2, np.nan, X), y, classes=[0, 1]),
    ):
        model = BPNNClassifier((4,), max_iter=1)
        with pytest.raises(ValueError):
            fit(model)
        with pytest.raises(NotFittedError):
            model.predict(X)
        assert not hasattr(model, "classes_") and not hasattr(model, "n_features_in_")


@pytest.mark.parametrize("continued", ["warm_start", "partial_fit"])
def test_a_continued_regression_with_another_number_of_outputs_is_refused(data, continued):
    X, y = data
    model = _fitted(BPNNRegressor, X, y.astype(float), warm_start=continued == "warm_start")
    predicted = model.predict(X)
    two_outputs = np.column_stack([y, -y]).astype(float)
    refused = r"y has 2 output\(s\) where the model fitted before has 1"
    with pytest.raises(ValueError, match=refused):
        if continued == "partial_fit":
            model.partial_fit(X, two_outputs)
        else:
            model.fit(X, two_outputs)
    np.testing.assert_array_equal(model.predict(X), predicted)


@pytest.mark.parametrize("sizes", [(4.5,), ("8",), (True,), (0.5,)])
def test_hidden_layer_sizes_that_are_not_whole_numbers_are_refused(data, sizes):
    X, y = data
    with pytest.raises(ValueError, match="hidden_layer_sizes must hold whole numbers of units"):
        BPNNClassifier(sizes, max_iter=1).fit(X, y)


@pytest.mark.parametrize("refit", ["fit in-process", "partial_fit"])
def test_a_fit_in_process_drops_what_describes_an_earlier_fit_on_a_cluster(data, refit):
    X, y = data
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, **FREE_PORTS) as c:
        with Client(c) as client:
            model = _fitted(BPNNClassifier, X, y, client=client)
    assert model.run_id_ and model.training_report_ and model.run_log_path_ is None
    if refit == "partial_fit":  # always in-process
        model.partial_fit(X, y)
    else:
        model.set_params(client=False).fit(X, y)
    for name in ("training_report_", "prediction_", "run_id_", "run_log_path_"):
        assert not hasattr(model, name)


def test_an_empty_checkpoint_dir_is_refused_not_taken_for_the_current_folder(data, tmp_path):
    X, y = data
    with pytest.raises(ValueError, match="checkpoint_dir must name a folder, got ''"):
        BPNNClassifier((4,), max_iter=1, checkpoint_dir="").fit(X, y)


@pytest.mark.parametrize("saved_with", [False, True])
def test_a_resume_across_a_switch_of_early_stopping_is_refused_in_one_line(
    data, tmp_path, saved_with
):
    X, y = data
    params = dict(hidden_layer_sizes=(4,), random_state=0, checkpoint_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        BPNNClassifier(max_iter=2, early_stopping=saved_with, **params).fit(X, y)
        resumed = BPNNClassifier(max_iter=4, early_stopping=not saved_with, resume=True, **params)
        with pytest.raises(CheckpointError, match="early_stopping") as info:
            resumed.fit(X, y)
    assert "\n" not in str(info.value)


def test_a_resume_with_fewer_epochs_than_a_stopped_fit_ran_starts_afresh_warned(data, tmp_path):
    """A fit stopped by its time box (or Ctrl-C) after more epochs than the resuming fit
    asks for: resumed, it trained no epoch and returned that model with n_iter_ above
    max_iter, without a word."""
    X, y = data
    params = dict(hidden_layer_sizes=(4,), random_state=0, checkpoint_dir=tmp_path, tol=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        boxed = BPNNClassifier(max_iter=50, max_seconds=1e-9, **params).fit(X, y)
    assert boxed.n_iter_ == 1  # stopped by its time box after its first epoch
    with pytest.warns(UserWarning, match="ran 1 epoch .* this fit starts afresh"):
        resumed = BPNNClassifier(max_iter=1, resume=True, **params).fit(X, y)
    assert resumed.n_iter_ == 1
