"""The estimator's ``client`` as Dask users expect it (in-process clusters, real clients).

A fit inside an active Client uses it, ``client=False`` forces in-process, ``client=``
takes a Client, a cluster, an address or a scheduler file, a fit closes what it opened,
model selection clones onto the same cluster, and connection problems fail in one line.
"""

from __future__ import annotations

import json
import os
import pickle
import threading
import warnings

import dask
import joblib
import numpy as np
import pytest
from distributed import Client, LocalCluster
from sklearn.datasets import make_classification
from sklearn.model_selection import GridSearchCV, cross_val_score
from threadpoolctl import threadpool_info, threadpool_limits

from hmdspt import BPNNClassifier
from hmdspt.cli import main
from tests.clusters import FREE_PORTS

pytestmark = pytest.mark.heavy(9)  # fits on a cluster, joblib processes


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, **FREE_PORTS) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(
        n_samples=600, n_features=10, n_informative=6, n_classes=3, random_state=0
    )
    return X.astype(np.float32), y


def _model(**params) -> BPNNClassifier:
    return BPNNClassifier((8,), max_iter=2, rounds_per_epoch=1, random_state=0, **params)


def _fit(model: BPNNClassifier, X, y, **fit_params) -> BPNNClassifier:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence, "slower than one process alone"
        return model.fit(X, y, **fit_params)


def _on_cluster(model: BPNNClassifier) -> bool:
    return hasattr(model, "training_report_")


def _clients(cluster) -> set[str]:
    """The scheduler's connected clients, less its own fire-and-forget entry."""
    return {c for c in cluster.scheduler.clients if c != "fire-and-forget"}


def test_a_fit_inside_an_active_client_uses_it_and_false_fits_in_process(cluster, data):
    X, y = data
    assert not _on_cluster(_fit(_model(), X, y))  # no Client anywhere: in-process
    with Client(cluster) as client:
        before = _clients(cluster)
        model = _fit(_model(), X, y)
        assert _on_cluster(model)
        assert set(model.training_report_) == {
            str(w["name"]) for w in client.scheduler_info(n_workers=-1)["workers"].values()
        }
        assert not _on_cluster(_fit(_model(client=False), X, y))
        # partial_fit trains in-process even inside an active Client
        _model().partial_fit(X, y, classes=np.unique(y))
        assert _clients(cluster) == before  # the active client was used, not a new one
        assert client.status == "running"  # and is not closed by the fit


def test_partial_fit_after_a_cluster_fit_trains_in_process_whatever_client_is(cluster, data):
    X, y = data
    with Client(cluster) as client:
        model = _fit(_model(client=client), X, y)
        assert _on_cluster(model)
        before, coefs, steps = _clients(cluster), model.coefs_[0].copy(), model.t_
        model.partial_fit(X, y)  # used to refuse: "partial_fit runs in-process; set client=..."
        assert model.t_ > steps and not np.allclose(model.coefs_[0], coefs)
        assert _clients(cluster) == before and client.status == "running"
        # An address is not even connected to.
        _model(client="tcp://127.0.0.1:1").partial_fit(X, y, classes=np.unique(y))


@pytest.mark.parametrize("given", ["address", "cluster", "scheduler file"])
def test_a_fit_closes_the_client_it_opened(cluster, data, given, tmp_path):
    X, y = data
    if given == "address":
        target = cluster.scheduler_address
    elif given == "cluster":
        target = cluster
    else:
        target = tmp_path / "scheduler.json"
        target.write_text(json.dumps({"address": cluster.scheduler_address}))
    before = _clients(cluster)
    for _ in range(4):
        model = _fit(_model(client=target), X, y)
        assert _on_cluster(model)
    assert _clients(cluster) == before


def test_model_selection_fits_every_candidate_on_the_cluster(cluster, data):
    X, y = data
    with Client(cluster) as client:
        learner = _model(client=client).set_params(max_iter=20, learning_rate_init=0.01)
        scores = cross_val_score(learner, X, y, cv=3, error_score="raise")
        assert len(scores) == 3 and np.all(scores > 0.5), scores  # 3 classes: chance 1/3
        search = GridSearchCV(
            _model(client=cluster), {"hidden_layer_sizes": [(4,), (8,)]}, cv=2, error_score="raise"
        )
        before = _clients(cluster)
        _fit(search, X, y)
        assert _clients(cluster) == before
    assert _on_cluster(search.best_estimator_)
    assert search.best_estimator_.client is cluster


def test_a_copy_sent_to_a_joblib_process_refuses_to_fit_in_process(cluster, data):
    X, y = data
    with Client(cluster) as client:
        with pytest.raises(RuntimeError, match="joblib n_jobs > 1.*n_jobs=1"):
            cross_val_score(_model(client=client), X, y, cv=2, n_jobs=2, error_score="raise")
    # In this process a copy fits in-process, as a saved model does.
    copy = pickle.loads(pickle.dumps(_model(client=cluster)))
    assert copy.client is None and not _on_cluster(_fit(copy, X, y))


@pytest.mark.timeout(120)  # the old way waited for ever
def test_under_joblibs_dask_backend_candidates_fit_in_their_tasks(cluster, data):
    """Each candidate's fit is then a task on the workers: without a client it trains in
    its task (a fit on the cluster from there waited for ever for the workers the tasks
    held); given one, it is refused in one line. The refit runs here, on the cluster."""
    X, y = data
    grid = {"alpha": [1e-4, 1e-2]}
    with Client(cluster) as client, joblib.parallel_backend("dask"):
        search = GridSearchCV(_model(), grid, cv=2, error_score="raise")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            search.fit(X, y)
        assert np.isfinite(search.best_score_) and _on_cluster(search.best_estimator_)
        given = GridSearchCV(_model(client=client), grid, cv=2, error_score="raise")
        with pytest.raises(RuntimeError, match=r"fits inside a Dask task \(joblib's 'dask'"):
            given.fit(X, y)


def _blas_threads() -> int:
    return max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")


def test_a_fit_on_worker_threads_of_this_process_limits_blas_while_it_runs(cluster, data):
    """The cluster's two workers are threads here: in the fit BLAS runs cores // 2 threads a
    call (each worker thread's BLAS would start one a core), after it as many as before."""
    X, y = data
    cores = len(os.sched_getaffinity(0))
    with threadpool_limits(limits=cores, user_api="blas"):  # as a fresh process has it
        before = _blas_threads()
        during = []
        with Client(cluster) as client:
            model = _model(client=client)
            _fit(model, X, y, on_round=lambda record: during.append(_blas_threads()))
        after = _blas_threads()
    assert _on_cluster(model) and during
    assert set(during) == {max(1, cores // 2)}
    assert before == after == cores


def test_one_worker_of_two_threads_keeps_the_blas_of_this_process(data):
    """A worker trains one model replica at a time whatever its threads: alone in this
    process (``Client(processes=False)``'s default shape), its BLAS is left as it is."""
    X, y = data
    cores = len(os.sched_getaffinity(0))
    with (
        threadpool_limits(limits=cores, user_api="blas"),
        LocalCluster(n_workers=1, threads_per_worker=2, processes=False, **FREE_PORTS) as single,
        Client(single) as client,
    ):
        during = []
        model = _fit(_model(client=client), X, y, on_round=lambda r: during.append(_blas_threads()))
    assert _on_cluster(model) and set(during) == {cores}


def test_score_workers_probes_worker_threads_of_this_process_with_the_fits_blas_limit(cluster):
    """The standalone probe measures the speeds a fit trains at: BLAS limited as in a fit
    while it runs (watched from another thread of this process), as before after it."""
    from hmdspt import score_workers

    cores = len(os.sched_getaffinity(0))
    seen, probing = [], threading.Event()

    def watch() -> None:
        while not probing.is_set():
            seen.append(_blas_threads())

    with threadpool_limits(limits=cores, user_api="blas"), Client(cluster) as client:
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            speeds = score_workers(client, (10, 8, 3), seconds=0.2)
        finally:
            probing.set()
            watcher.join()
        after = _blas_threads()
    assert len(speeds) == 2 and all(v > 0 for v in speeds.values())
    assert min(seen) == max(1, cores // 2)
    assert after == cores


def test_a_fit_runs_its_tasks_in_one_span(cluster, data, tmp_path):
    X, y = data
    with Client(cluster) as client:
        # A fixed probe runs whatever the data's size: its tasks, one per worker, are the
        # fit's tasks (rounds and staging are calls on the workers, not tasks).
        options = {"probe_seconds": 0.05}
        model = _fit(_model(client=client, run_log=tmp_path, trainer_options=options), X, y)
        n_workers = len(client.scheduler_info()["workers"])
    spans = cluster.scheduler.extensions["spans"].spans.values()
    (fit_span,) = [s for s in spans if s.name == ("hmdspt-fit", model.run_id_)]
    assert sum(fit_span.states.values()) >= n_workers


def _run_events(model: BPNNClassifier) -> list[dict]:
    from hmdspt.core.runlog import read_events

    return read_events(model.run_log_path_)


@pytest.mark.parametrize(
    "client, error, words",
    [
        (42, TypeError, "client must be a distributed.Client"),
        ("nonsense", ValueError, "neither a scheduler address nor an existing file"),
        ("tcp://127.0.0.1:1", ConnectionError, "within 0.5 s"),
    ],
    ids=["wrong type", "not an address", "unreachable"],
)
def test_a_bad_client_fails_in_one_line(data, client, error, words):
    X, y = data
    with dask.config.set({"distributed.comm.timeouts.connect": "0.5s"}):
        with pytest.raises(error) as caught:
            _fit(_model(client=client), X, y)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_closed_client_fails_in_one_line(cluster, data):
    X, y = data
    client = Client(cluster)
    client.close()
    with pytest.raises(ValueError, match="client is closed"):
        _fit(_model(client=client), X, y)


def test_the_cli_says_it_connects_first_and_reports_a_silent_scheduler_at_once(capsys):
    with dask.config.set({"distributed.comm.timeouts.connect": "0.5s"}):
        code = main(["train", "--scheduler", "tcp://127.0.0.1:1", "--epochs", "1"])
    captured = capsys.readouterr()
    assert code == 1
    assert "data:" not in captured.out  # nothing waits on the data built meanwhile
    lines = captured.err.strip().splitlines()
    assert lines[0].startswith("connecting to the Dask scheduler at tcp://127.0.0.1:1")
    assert "waiting at most 0.5 s" in lines[0]
    assert lines[1:] == [
        "hmdspt: error: could not connect to the Dask scheduler at tcp://127.0.0.1:1 within "
        "0.5 s (Dask setting distributed.comm.timeouts.connect): Timed out trying to connect "
        "to tcp://127.0.0.1:1 after 0.5 s"
    ]


def test_compares_one_process_baseline_stays_in_process_inside_its_client(
    cluster, data, tmp_path, monkeypatch
):
    from hmdspt.compare import WARM_UP_FITS, run_comparison

    X, y = data
    on_cluster: list[object] = []
    fit_on_cluster = BPNNClassifier._fit_on_cluster

    def recorded(self, target, *args, **kwargs):
        on_cluster.append(target)
        return fit_on_cluster(self, target, *args, **kwargs)

    monkeypatch.setattr(BPNNClassifier, "_fit_on_cluster", recorded)
    with Client(cluster) as client, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, _ = run_comparison(
            client,
            X[:400],
            y[:400],
            X[400:],
            y[400:],
            strategies=["bpnn-in-process"],
            params=dict(hidden_layer_sizes=(8,), max_iter=2),
            run_dir=tmp_path,
            echo=lambda line: None,
        )
    assert [r.name for r in results] == ["bpnn-in-process"]
    # The untimed warm-up only: fits too short to leave the workers' speeds in their memory
    # are repeated, at most WARM_UP_FITS times.
    assert 1 <= len(on_cluster) <= WARM_UP_FITS
    assert all(target is client for target in on_cluster)
