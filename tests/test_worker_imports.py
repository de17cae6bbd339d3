"""Workers that train, predict and score never import scikit-learn.

The labels' encoding and the lazy predictions and scores of Dask input had pickled
scikit-learn objects and the estimator's functions into the workers' tasks, so every fresh
worker imported scikit-learn inside a fit's first staging (docs/design.md). ``LabelColumns``
is the binarizer in numpy alone; it is held here to the binarizer itself.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.preprocessing import LabelBinarizer

from hmdspt import BPNNClassifier, BPNNRegressor
from hmdspt.core.shard import LabelColumns
from tests.clusters import FREE_PORTS

LABEL_KINDS = {
    "ints": st.integers(-3, 3),
    "strings": st.sampled_from(["cat", "dog", "eel", "fox"]),
    "floats": st.sampled_from([-1.0, 2.0, 3.0]),  # class labels: whole numbers
    "bools": st.booleans(),
}


def _binarizer_and_columns(labels):
    binarizer = LabelBinarizer().fit(labels)
    return binarizer, LabelColumns(binarizer.classes_, binarizer.y_type_)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(LABEL_KINDS)).flatmap(lambda k: st.lists(LABEL_KINDS[k], min_size=2)))
def test_label_columns_encode_as_the_fitted_binarizer_transforms(labels):
    labels = np.array(labels, dtype=object if isinstance(labels[0], str) else None)
    if len(np.unique(labels)) < 2:
        return
    binarizer, columns = _binarizer_and_columns(labels)
    expected = binarizer.transform(labels)
    assert np.array_equal(columns(labels), expected)
    assert np.array_equal(columns(labels.reshape(-1, 1)), expected)  # a column of labels


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 5).flatmap(
        lambda k: st.tuples(
            st.just(k),
            st.lists(st.lists(st.floats(0, 1, width=32), min_size=k, max_size=k), min_size=1),
        )
    )
)
def test_label_columns_decode_as_the_fitted_binarizer_inverts(case):
    k, outputs = case
    outputs = np.array(outputs, dtype=np.float32)
    for labels in (np.arange(k) * 10, np.array(list("abcde")[:k], dtype=object)):
        binarizer, columns = _binarizer_and_columns(labels)
        if k == 2:  # binary: one logistic output
            assert np.array_equal(
                columns.inverse(outputs[:, :1]), binarizer.inverse_transform(outputs[:, :1])
            )
        else:
            assert np.array_equal(columns.inverse(outputs), binarizer.inverse_transform(outputs))
    indicator = np.array([[0] * k, [1] * k])
    binarizer, columns = _binarizer_and_columns(indicator)
    assert np.array_equal(columns(indicator), binarizer.transform(indicator))
    assert np.array_equal(columns.inverse(outputs), binarizer.inverse_transform(outputs))


def test_label_columns_name_a_label_the_fit_did_not_find():
    columns = LabelColumns(np.array(["cat", "dog", "eel"]), "multiclass")
    with pytest.raises(ValueError, match=r"labels the fit did not find: \['fox'\]"):
        columns(np.array(["cat", "fox"]))


def _sklearn_imported(client) -> dict:
    import sys

    return client.run(lambda: "sklearn" in sys.modules)


@pytest.mark.heavy(12)
def test_workers_that_train_predict_and_score_never_import_scikit_learn(tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(1200, 5)).astype(np.float32), columns=list("abcde"))
    frame["label"] = np.where(frame.a + frame.b > 0, "yes", "no")
    path = tmp_path / "rows.csv"
    frame.to_csv(path, index=False)
    # Process workers: in-process ones share the test's modules, scikit-learn included.
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, **FREE_PORTS) as cluster,
        Client(cluster) as client,
    ):
        # Nothing in a fresh worker imports it (else the check below could not fail).
        assert not any(_sklearn_imported(client).values())
        import dask.dataframe as dd

        features = dd.from_pandas(frame[list("abcde")], npartitions=3)
        labels = dd.from_pandas(frame["label"], npartitions=3)
        model = BPNNClassifier((8,), max_iter=2, early_stopping=True, client=client)
        model.fit(path, "label")  # read, encoded and held-out-scored on the workers
        predictions = model.predict(features).compute()
        assert set(predictions) <= {"yes", "no"}
        assert model.predict_proba(features).compute().shape == (1200, 2)
        assert 0 <= model.score(features, labels) <= 1
        targets = dd.from_pandas(frame["a"], npartitions=3)
        regressor = BPNNRegressor(hidden_layer_sizes=(8,), max_iter=2, client=client).fit(
            features, targets
        )
        assert np.isfinite(regressor.score(features, targets))
        assert regressor.predict(features).compute().shape == (1200,)
        assert not any(_sklearn_imported(client).values())
