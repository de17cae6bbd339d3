"""BPNNClassifier / BPNNRegressor behaviour against scikit-learn's MLP."""

import pickle
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import sparse
from sklearn.datasets import load_diabetes, load_digits, make_multilabel_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from hmdspt.estimator import BPNNClassifier, BPNNRegressor


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return X / 16.0, y


def _quiet():
    warnings.simplefilter("ignore", ConvergenceWarning)


@pytest.mark.parametrize("solver", ["sgd", "adam"])
@pytest.mark.parametrize("activation", ["identity", "logistic", "tanh", "relu"])
def test_float64_training_is_identical_to_sklearn(digits, solver, activation):
    """Same init, same batches, same updates: the same weights to rounding."""
    _quiet()
    X, y = digits
    kw = dict(
        hidden_layer_sizes=(20, 10),
        activation=activation,
        solver=solver,
        max_iter=3,
        shuffle=False,
        random_state=0,
        alpha=1e-3,
        batch_size=100,
    )
    ours = BPNNClassifier(dtype="float64", **kw).fit(X, y)
    theirs = MLPClassifier(**kw).fit(X, y)
    for a, b in zip(ours.coefs_ + ours.intercepts_, theirs.coefs_ + theirs.intercepts_):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ours.loss_curve_, theirs.loss_curve_, rtol=1e-12)


def test_regressor_and_binary_identical_to_sklearn(digits):
    _quiet()
    Xr, yr = load_diabetes(return_X_y=True)
    kw = dict(hidden_layer_sizes=(5,), max_iter=3, shuffle=False, random_state=0)
    ours = BPNNRegressor(dtype="float64", **kw).fit(Xr, yr)
    theirs = MLPRegressor(**kw).fit(Xr, yr)
    np.testing.assert_allclose(ours.predict(Xr), theirs.predict(Xr), rtol=1e-10)
    X, y = digits
    Xb, yb = X[y < 2], y[y < 2]
    ours = BPNNClassifier(dtype="float64", **kw).fit(Xb, yb)
    theirs = MLPClassifier(**kw).fit(Xb, yb)
    np.testing.assert_allclose(ours.predict_proba(Xb), theirs.predict_proba(Xb), atol=1e-12)
    assert ours.out_activation_ == theirs.out_activation_ == "logistic"


def test_float32_learns_digits_and_has_mlp_attributes(digits):
    X, y = digits
    clf = BPNNClassifier(hidden_layer_sizes=(64,), max_iter=40, random_state=0).fit(X, y)
    assert clf.score(X, y) > 0.97
    assert clf.coefs_[0].dtype == np.float32
    for name in [
        "classes_",
        "coefs_",
        "intercepts_",
        "n_iter_",
        "t_",
        "loss_",
        "loss_curve_",
        "best_loss_",
        "validation_scores_",
        "best_validation_score_",
        "n_features_in_",
        "n_outputs_",
        "out_activation_",
        "n_layers_",
    ]:
        assert hasattr(clf, name), name
    assert clf.n_iter_ == len(clf.loss_curve_) and clf.t_ == clf.n_iter_ * len(X)
    assert clf.out_activation_ == "softmax" and clf.n_outputs_ == 10
    proba = clf.predict_proba(X[:5])
    np.testing.assert_allclose(proba.sum(axis=1), 1, rtol=1e-5)
    np.testing.assert_allclose(clf.predict_log_proba(X[:5]), np.log(proba), rtol=1e-5)


def test_same_random_state_gives_same_model(digits):
    X, y = digits
    a = BPNNClassifier((16,), max_iter=5, random_state=7).fit(X, y)
    b = BPNNClassifier((16,), max_iter=5, random_state=7).fit(X, y)
    c = BPNNClassifier((16,), max_iter=5, random_state=8).fit(X, y)
    np.testing.assert_array_equal(a._model.params, b._model.params)
    assert not np.array_equal(a._model.params, c._model.params)


def test_pickled_model_predicts_identically(digits):
    X, y = digits
    clf = BPNNClassifier((16,), max_iter=5, random_state=0).fit(X, y)
    clone = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(clone.predict_proba(X), clf.predict_proba(X))
    # The views still share the flat vector after loading.
    assert np.shares_memory(clone.coefs_[0], clone._model.params)
    clone.partial_fit(X, y)  # and training continues from the loaded state
    assert clone.n_iter_ == 1


def test_pandas_input_keeps_feature_names(digits):
    X, y = digits
    df = pd.DataFrame(X, columns=[f"px{i}" for i in range(64)])
    clf = BPNNClassifier((16,), max_iter=5, random_state=0).fit(df, pd.Series(y))
    assert list(clf.feature_names_in_) == list(df.columns)
    np.testing.assert_array_equal(clf.predict(df), clf.predict(X))


def test_sparse_input_matches_dense(digits):
    X, y = digits
    dense = BPNNClassifier((16,), max_iter=3, random_state=0, dtype="float64").fit(X, y)
    for fmt in (sparse.csr_matrix, sparse.csc_matrix):
        sp = BPNNClassifier((16,), max_iter=3, random_state=0, dtype="float64").fit(fmt(X), y)
        np.testing.assert_allclose(sp._model.params, dense._model.params, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(sp.predict_proba(fmt(X)), dense.predict_proba(X), atol=1e-12)


def test_multilabel():
    X, Y = make_multilabel_classification(n_samples=300, n_classes=4, random_state=0)
    clf = BPNNClassifier((32,), max_iter=100, random_state=0).fit(X, Y)
    assert clf.predict(X).shape == Y.shape
    assert clf.out_activation_ == "logistic"
    assert clf.score(X, Y) > 0.5


def test_string_labels(digits):
    X, y = digits
    names = np.array(
        ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    )[y]
    clf = BPNNClassifier((16,), max_iter=10, random_state=0).fit(X, names)
    assert set(clf.classes_) == set(names)
    assert clf.predict(X[:3]).dtype.kind == "U"


@pytest.mark.parametrize(
    "labels",
    [
        np.arange(10),
        np.array([3, 7]),
        np.array(["eel", "cat", "dog"]),
        np.array(["eel", "cat", "dog"], dtype=object),
        np.array([True, False]),
        np.array([2.0, -1.0, 5.0]),
    ],
    ids=["ints", "binary", "strings", "objects", "bools", "integral-floats"],
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_labels_are_encoded_as_the_binarizer_encodes_them(labels, dtype):
    """The fit encodes labels in numpy from the classes it found in one pass: the same
    classes, kind and target columns as scikit-learn's LabelBinarizer, in the model's dtype."""
    from sklearn.preprocessing import LabelBinarizer

    rng = np.random.default_rng(0)
    y = labels[rng.integers(len(labels), size=500)]
    X = rng.normal(size=(500, 4))
    clf = BPNNClassifier(dtype=dtype)
    _, Y = clf._validate_input(X, y, incremental=False, reset=True)
    binarizer = LabelBinarizer().fit(y)
    np.testing.assert_array_equal(clf.classes_, binarizer.classes_)
    assert clf._label_binarizer.y_type_ == binarizer.y_type_
    assert Y.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(Y, binarizer.transform(y))


def test_labels_of_types_that_do_not_sort_together_get_scikit_learns_message():
    X = np.zeros((4, 2))
    y = np.array([1, "a", 2, "b"], dtype=object)
    with pytest.raises(ValueError, match="Unknown label type"):
        BPNNClassifier(max_iter=1).fit(X, y)


def test_partial_fit_and_unseen_labels(digits):
    X, y = digits
    clf = BPNNClassifier((16,), random_state=0)
    clf.partial_fit(X[:500], y[:500], classes=np.arange(10))
    clf.partial_fit(X[500:], y[500:])
    assert clf.n_iter_ == 1 and clf.t_ == len(X)
    with pytest.raises(ValueError, match="classes not in"):
        clf.partial_fit(X[:10], np.full(10, 42))
    with pytest.raises(ValueError, match="classes must be passed on the first call"):
        BPNNClassifier().partial_fit(X, y)


def test_early_stopping_restores_best(digits):
    X, y = digits
    clf = BPNNClassifier(
        (32,), early_stopping=True, max_iter=60, n_iter_no_change=3, random_state=0
    ).fit(X, y)
    assert clf.best_loss_ is None
    assert clf.best_validation_score_ == max(clf.validation_scores_)
    assert len(clf.validation_scores_) == clf.n_iter_ < 60


def test_warm_start_continues(digits):
    X, y = digits
    clf = BPNNClassifier((16,), max_iter=2, warm_start=True, random_state=0)
    _quiet()
    clf.fit(X, y)
    first = clf.loss_curve_[-1]
    clf.fit(X, y)
    assert len(clf.loss_curve_) == 4 and clf.loss_curve_[-1] < first


def test_pipeline_and_grid_search(digits):
    X, y = digits
    _quiet()
    pipe = make_pipeline(StandardScaler(), BPNNClassifier(max_iter=15, random_state=0))
    grid = GridSearchCV(pipe, {"bpnnclassifier__hidden_layer_sizes": [(8,), (32,)]}, cv=3)
    grid.fit(X, y)
    assert grid.best_params_["bpnnclassifier__hidden_layer_sizes"] == (32,)
    assert grid.score(X, y) > 0.9


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_nan_and_inf_rejected(digits, value):
    X, y = digits
    X = X.copy()
    X[3, 4] = value
    with pytest.raises(ValueError, match="Input X contains (NaN|infinity)"):
        BPNNClassifier().fit(X, y)


def test_wrong_feature_count_at_predict(digits):
    X, y = digits
    clf = BPNNClassifier((8,), max_iter=2, random_state=0)
    _quiet()
    clf.fit(X, y)
    with pytest.raises(ValueError, match="X has 10 features, but BPNNClassifier is expecting 64"):
        clf.predict(X[:, :10])
    # Dask input of the wrong width is refused as predictions are asked for, not when they
    # are computed (in a task on the workers, which log its traceback).
    import dask.array as da
    import dask.dataframe as dd
    import pandas as pd

    narrow = da.from_array(X[:, :10], chunks=500)
    for lazy in (narrow, dd.from_pandas(pd.DataFrame(X[:, :10]), npartitions=2)):
        for method in (clf.predict, clf.predict_proba):
            with pytest.raises(ValueError, match="X has 10 features, but BPNNClassifier is"):
                method(lazy)
    with pytest.raises(ValueError, match="X has 10 features, but BPNNClassifier is"):
        clf.score(narrow, da.from_array(y, chunks=500))


def test_a_dask_frame_of_other_or_non_numeric_columns_is_refused_at_predict(digits):
    # As the wrong width: the blocks' own checks failed only when computed, on the workers.
    import dask.dataframe as dd
    import pandas as pd

    X, y = digits
    frame = pd.DataFrame(X[:, :4], columns=["a", "b", "c", "d"])
    _quiet()
    clf = BPNNClassifier((8,), max_iter=2, random_state=0).fit(frame, y)
    renamed = dd.from_pandas(frame.rename(columns={"d": "e"}), npartitions=2)
    text = dd.from_pandas(frame.assign(d="x"), npartitions=2)
    for method in (clf.predict, clf.predict_proba):
        with pytest.raises(ValueError, match="feature names should match"):
            method(renamed)
        with pytest.raises(ValueError, match=r"non-numeric feature column\(s\) in X: \['d'\]"):
            method(text)


def test_empty_input():
    with pytest.raises(ValueError, match="0 sample"):
        BPNNClassifier().fit(np.empty((0, 3)), np.empty(0))


def test_one_class(digits):
    X, _ = digits
    with pytest.raises(ValueError, match="number of classes has to be greater than one"):
        BPNNClassifier().fit(X[:20], np.zeros(20))


def test_mismatched_lengths(digits):
    X, y = digits
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        BPNNClassifier().fit(X, y[:-1])


def test_predict_before_fit():
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        BPNNClassifier().predict(np.ones((2, 3)))


@pytest.mark.parametrize(
    "params, match",
    [
        ({"solver": "lbfgs"}, "'solver' parameter"),
        ({"hidden_layer_sizes": (10, 0)}, "hidden_layer_sizes must be > 0"),
        ({"learning_rate_init": 0}, "'learning_rate_init' parameter"),
        ({"dtype": "float16"}, "'dtype' parameter"),
        ({"dtype": np.int32}, "dtype must be float32 or float64"),
    ],
)
def test_bad_parameters(digits, params, match):
    X, y = digits
    with pytest.raises(ValueError, match=match):
        BPNNClassifier(**params).fit(X[:50], y[:50])


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("solver", ["sgd", "adam"])
def test_checkpoint_dir_on_an_in_process_fit_writes_checkpoints_and_resumes(
    digits, tmp_path, solver, shuffle
):
    from hmdspt.core.checkpoint import load_latest_checkpoint

    X, y = digits
    params = dict(
        hidden_layer_sizes=(16,),
        solver=solver,
        learning_rate="invscaling" if solver == "sgd" else "constant",
        learning_rate_init=0.05 if solver == "sgd" else 0.001,
        shuffle=shuffle,
        dtype="float64",
        random_state=0,
        tol=0.0,
    )
    with warnings.catch_warnings():
        _quiet()
        whole = BPNNClassifier(max_iter=6, **params).fit(X, y)
        first = BPNNClassifier(max_iter=4, checkpoint_dir=tmp_path, checkpoint_every=3, **params)
        first.fit(X, y)
        # Every third epoch, and the fit's last: epochs 3 and 4, the last two kept.
        saved = sorted(p.name for p in tmp_path.glob("ckpt-*.npz"))
        assert saved == ["ckpt-00000001.npz", "ckpt-00000002.npz"]
        assert load_latest_checkpoint(tmp_path).meta["epoch"] == 4
        resumed = BPNNClassifier(max_iter=6, checkpoint_dir=tmp_path, resume=True, **params)
        resumed.fit(X, y)

    assert first.n_iter_ == 4 and resumed.n_iter_ == 6
    assert resumed.loss_curve_[:4] == first.loss_curve_
    np.testing.assert_allclose(resumed.loss_curve_, whole.loss_curve_, rtol=1e-12)
    assert resumed.t_ == whole.t_
    np.testing.assert_allclose(resumed._model.params, whole._model.params, rtol=1e-10, atol=1e-12)
    assert load_latest_checkpoint(tmp_path).meta["epoch"] == 6
