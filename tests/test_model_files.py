"""Saving and copying a model (issue 14, defects 1 and 4, and issue 18): a saved or copied
model carries no client, and saving never changes the live model."""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest
from distributed import Client, LocalCluster
from sklearn.base import clone
from sklearn.datasets import make_classification
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from hmdspt.estimator import BPNNClassifier, BPNNRegressor
from tests.clusters import FREE_PORTS

#: The types a fitted BPNNClassifier may ask skops to trust (docs/security.md).
SKOPS_TRUSTED = {
    "numpy.dtype",
    "hmdspt.estimator.BPNNClassifier",
    "hmdspt.estimator.BPNNRegressor",
    "hmdspt.core.nn.AdamOptimizer",
    "hmdspt.core.nn.MLP",
    "hmdspt.core.nn.SGDOptimizer",
}

#: An address nothing listens on: a model that kept it would try to connect there.
ATTACKER_ADDRESS = "tcp://127.0.0.1:1"


@pytest.fixture(scope="module")
def data():
    return make_classification(n_samples=600, n_features=8, n_informative=5, random_state=0)


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, **FREE_PORTS) as cluster,
        Client(cluster) as client,
    ):
        yield client


def _fit_in_process(X, y, **params) -> BPNNClassifier:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        params.setdefault("client", False)  # in-process beside the module's live client
        return BPNNClassifier((8,), max_iter=3, random_state=0, **params).fit(X, y)


def _pickle_round_trip(model):
    return pickle.loads(pickle.dumps(model))


def _skops_io():
    """skops, imported by the tests that use it: every test process collects this module,
    and the import costs about a second."""
    import skops.io

    return skops.io


def _skops_round_trip(model):
    sio = _skops_io()
    data = sio.dumps(model)
    untrusted = set(sio.get_untrusted_types(data=data))
    # Checking the file is enough: nothing beyond the documented types needs trusting.
    assert untrusted <= SKOPS_TRUSTED, untrusted - SKOPS_TRUSTED
    return sio.loads(data, trusted=sorted(untrusted))


ROUND_TRIPS = {"pickle": _pickle_round_trip, "skops": _skops_round_trip}


@pytest.mark.parametrize("save", sorted(ROUND_TRIPS))
@pytest.mark.parametrize("fitted", [False, True], ids=["constructed", "fitted"])
def test_a_saved_model_carries_no_client_address_and_loading_never_connects(save, fitted, data):
    X, y = data
    if fitted:
        model = _fit_in_process(X, y).set_params(client=ATTACKER_ADDRESS)
    else:
        model = BPNNRegressor(client=ATTACKER_ADDRESS)
    loaded = ROUND_TRIPS[save](model)
    assert loaded.client is None
    assert model.client == ATTACKER_ADDRESS  # the live model keeps what it was given
    if fitted:
        np.testing.assert_array_equal(loaded.predict_proba(X), model.predict_proba(X))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded.fit(X, y)  # in-process: nothing to connect to
        assert not hasattr(loaded, "training_report_")


@pytest.mark.parametrize("save", sorted(ROUND_TRIPS))
def test_a_saved_model_fitted_on_a_cluster_carries_no_client(save, client, data):
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = BPNNClassifier(
            (8,), max_iter=2, rounds_per_epoch=2, client=client, random_state=0
        ).fit(X, y)
    assert hasattr(model, "training_report_")  # it did train on the cluster
    loaded = ROUND_TRIPS[save](model)
    assert loaded.client is None
    assert model.client is client
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))


SAVES = {
    "pickle.dumps": _pickle_round_trip,
    "copy.deepcopy": copy.deepcopy,
    "skops.io.dumps": _skops_round_trip,
}


@pytest.mark.parametrize("save", sorted(SAVES))
def test_saving_a_model_leaves_the_live_model_unchanged(save, client, data):
    X, y = data
    model = _fit_in_process(X, y).set_params(client=client)
    before = model.predict_proba(X)
    saved = SAVES[save](model)

    assert len(model.coefs_) == len(model.intercepts_) == 2
    for array in (*model.coefs_, *model.intercepts_):
        assert np.shares_memory(array, model._model.params)
    assert model.client is client
    np.testing.assert_array_equal(model.predict_proba(X), before)

    # The copy's views are views of its own vector, not of the original's.
    assert saved.client is None
    for array in (*saved.coefs_, *saved.intercepts_):
        assert np.shares_memory(array, saved._model.params)
        assert not np.shares_memory(array, model._model.params)
    np.testing.assert_array_equal(saved.predict_proba(X), before)


def test_clone_shares_a_live_client_and_deepcopy_drops_it(client):
    model = BPNNClassifier((8,), client=client, max_iter=3)
    cloned = clone(model)
    assert cloned.client is client  # the clone fits on the same cluster
    assert cloned.get_params()["max_iter"] == 3
    assert copy.deepcopy(model).client is None  # a copy, like a saved model, has no client
    pipe = clone(make_pipeline(StandardScaler(), model))
    assert pipe[-1].client is client and pipe[-1] is not model


@pytest.mark.parametrize("save", sorted(ROUND_TRIPS))
def test_a_model_file_that_names_a_client_loads_without_it(save, data, monkeypatch):
    """An attacker writes the file, not our __getstate__: loading itself drops the client."""
    X, y = data
    model = _fit_in_process(X, y).set_params(client=ATTACKER_ADDRESS)
    # A file written by the old code, or by hand: the state keeps the address.
    monkeypatch.setattr(BPNNClassifier, "__getstate__", lambda self: dict(self.__dict__))
    if save == "pickle":
        payload = pickle.dumps(model)
        monkeypatch.undo()
        loaded = pickle.loads(payload)
    else:
        sio = _skops_io()
        payload = sio.dumps(model)
        monkeypatch.undo()
        untrusted = set(sio.get_untrusted_types(data=payload))
        assert untrusted <= SKOPS_TRUSTED, untrusted - SKOPS_TRUSTED
        loaded = sio.loads(payload, trusted=sorted(untrusted))
    assert loaded.client is None
    np.testing.assert_array_equal(loaded.predict_proba(X), model.predict_proba(X))
