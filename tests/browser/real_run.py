"""Real run logs for the monitor's tests: a small fit on an emulated local cluster.

:func:`real_fit` trains a ``BPNNClassifier`` with HMDSPT on ``local_cluster(speeds=...)``
and returns the run log the trainer wrote; :func:`real_runs` makes HMDSPT's run and the
equal-shares baseline on the same data and cluster. :func:`session_real_logs` does that
once per pytest session (a few seconds), whatever test module asks first, so the fast
tests and the browser test share the same real logs.

The emulated workers are threads of the calling process: what the monitor reads is the run
log, which is the same whatever the workers run in.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

__all__ = ["real_fit", "real_runs", "session_real_logs"]


def real_fit(
    path: str | os.PathLike,
    *,
    speeds: tuple[float, ...] = (2, 1),
    n_samples: int = 4000,
    n_features: int = 20,
    hidden: tuple[int, ...] = (32,),
    epochs: int = 3,
    rounds_per_epoch: int = 2,
    partition: str = "proportional",
    client: Any = None,
    seed: int = 0,
) -> Path:
    """Fit a small MLP on a generated data set with a real cluster; return the run log.

    Parameters
    ----------
    path : path
        Where the trainer writes the run log (JSON lines).
    speeds : tuple of float, default=(2, 1)
        Speeds of a new emulated local cluster (ignored when ``client`` is given).
    n_samples, n_features : int
        Size of the ``make_classification`` data set (seeded by ``seed``).
    hidden : tuple of int
        Hidden layer sizes.
    epochs, rounds_per_epoch : int
        Training length.
    partition : {"proportional", "equal"}
        HMDSPT's shares or the equal-shares baseline.
    client : distributed.Client, optional
        Train on this client's cluster instead of starting one.
    seed : int
        Seeds the data and the model.
    """
    from distributed import Client
    from sklearn.datasets import make_classification
    from sklearn.exceptions import ConvergenceWarning

    from hmdspt.estimator import BPNNClassifier
    from hmdspt.parallel.cluster import local_cluster

    path = Path(path)
    X, y = make_classification(
        n_samples=n_samples,
        n_features=n_features,
        n_informative=max(2, n_features // 2),
        n_classes=3,
        random_state=seed,
    )

    def fit(c: Any) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # max_iter is short on purpose
            BPNNClassifier(
                hidden,
                client=c,
                max_iter=epochs,
                rounds_per_epoch=rounds_per_epoch,
                partition=partition,
                # A fit this small would skip the adaptive probe (it cannot pay:
                # hmdspt.core.speed.probe_pays); the monitor's tests read every event type.
                trainer_options={"probe_seconds": 0.1} if partition == "proportional" else None,
                early_stopping=True,  # holds out a validation split (scores per round)
                n_iter_no_change=epochs + 1,  # ... without stopping this short fit early
                run_log=str(path),
                random_state=seed,
            ).fit(X, y)

    if client is not None:
        fit(client)
    else:
        with local_cluster(speeds=speeds, processes=False) as cluster, Client(cluster) as c:
            fit(c)
    return path


def real_runs(
    folder: str | os.PathLike, speeds: tuple[float, ...] = (2, 1), **kwargs: Any
) -> dict[str, Path]:
    """HMDSPT's proportional shares and the equal-shares baseline, same data, one cluster.

    Returns ``{"proportional": path, "equal": path}`` (``hmdspt.jsonl``, ``equal.jsonl``
    in ``folder``); ``kwargs`` go to :func:`real_fit`.
    """
    from distributed import Client

    from hmdspt.parallel.cluster import local_cluster

    folder = Path(folder)
    out = {}
    with local_cluster(speeds=speeds, processes=False) as cluster, Client(cluster) as client:
        for partition, name in (("proportional", "hmdspt"), ("equal", "equal")):
            out[partition] = real_fit(
                folder / f"{name}.jsonl", partition=partition, client=client, **kwargs
            )
    return out


_SESSION: dict[str, dict[str, Path]] = {}


def session_real_logs(tmp_path_factory: Any) -> dict[str, Path]:
    """:func:`real_runs` once per pytest session (made by the first test module that asks).

    A session-scoped fixture is per module unless it lives in a conftest; this cache makes
    every module's fixture share one pair of fits (~6 s on 2 cores). Do not write to the
    returned files: copy them.
    """
    if "logs" not in _SESSION:
        _SESSION["logs"] = real_runs(tmp_path_factory.mktemp("real-runs"))
    return _SESSION["logs"]
