"""One in-process peer, run by ``bench_peers`` inside a testbed slot.

``--system sklearn``: scikit-learn's ``MLPClassifier``, one ``partial_fit`` per epoch and
the held-out curve rows scored after each (``hmdspt.compare``'s run, scoring left out
of the curve's times). ``--system bpnn``: ``BPNNClassifier(client=None)`` with
``eval_set``, its ``eval_curve_`` shifted to start at the ``fit()`` call. Reads the
benchmark's ``.npz`` and writes one JSON (wall seconds, curve, final test accuracy).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from hmdspt.compare import _sklearn_run
from hmdspt.estimator import BPNNClassifier


def run(system: str, data, params: dict) -> dict:
    """Train ``system`` on ``data`` (the benchmark's arrays); wall, curve, final accuracy."""
    X, y = data["X_train"], data["y_train"]
    X_curve, y_curve = data["X_curve"], data["y_curve"]
    if system == "sklearn":
        result = _sklearn_run(params, X, y, X_curve, y_curve, None)
        wall, curve, model = result.wall_s, result.curve, result.final_model
    else:
        model = BPNNClassifier(**params)
        called = time.perf_counter()
        model.fit(X, y, eval_set=(X_curve, y_curve))
        wall = time.perf_counter() - called
        # eval_curve_ counts from the start of training inside fit(), after its input
        # checks: shift it to the user's call.
        before = getattr(model, "_fit_start", called) - called
        curve = [(t + before, score) for t, score in model.eval_curve_]
    return {
        "wall_s": wall,
        "curve": curve,
        "final_accuracy": float(model.score(data["X_test"], data["y_test"])),
        "epochs": int(model.n_iter_),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=("sklearn", "bpnn"), required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--params", required=True, help="JSON of estimator parameters")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    params = json.loads(args.params)
    params["hidden_layer_sizes"] = tuple(params["hidden_layer_sizes"])
    with np.load(args.data) as npz:
        data = {k: npz[k] for k in npz.files}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # a fixed epoch budget on purpose
        result = run(args.system, data, params)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
