"""Accuracy parity of BPNNClassifier with scikit-learn's MLPClassifier (same hyper-parameters).

- ``load_digits``, standardised, 5-fold stratified CV: mean accuracy of each.
- Smartphone activity windows (``../shared/datasets/hapt_smartphone_har/har6_windows128.npz``),
  128x6 windows flattened, standardised on the training split, the file's own subject split:
  test accuracy of each.

Run: ``python -m benchmarks.bench_accuracy``.
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import StratifiedKFold, cross_val_score
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from hmdspt.estimator import BPNNClassifier

from ._common import dataset_path, header, timed


def digits_cv(params: dict) -> dict[str, float]:
    X, y = load_digits(return_X_y=True)
    cv = StratifiedKFold(5, shuffle=True, random_state=0)
    out = {}
    for name, cls in (("BPNNClassifier", BPNNClassifier), ("MLPClassifier", MLPClassifier)):
        pipe = make_pipeline(StandardScaler(), cls(**params))
        out[name] = float(cross_val_score(pipe, X, y, cv=cv).mean())
    return out


def har_windows(params: dict) -> dict[str, float]:
    data = np.load(dataset_path("hapt_smartphone_har", "har6_windows128.npz"))
    X_train = data["X_train"].reshape(len(data["X_train"]), -1)
    X_test = data["X_test"].reshape(len(data["X_test"]), -1)
    scaler = StandardScaler().fit(X_train)
    X_train, X_test = scaler.transform(X_train), scaler.transform(X_test)
    out = {}
    for name, cls in (("BPNNClassifier", BPNNClassifier), ("MLPClassifier", MLPClassifier)):
        seconds, model = timed(cls(**params).fit, X_train, data["y_train"])
        out[name] = float(model.score(X_test, data["y_test"]))
        out[name + " fit s"] = seconds
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", ConvergenceWarning)
    results = {}
    with threadpool_limits(1):
        header("accuracy parity with MLPClassifier (same hyper-parameters)")
        digits_params = dict(hidden_layer_sizes=(100,), max_iter=200, random_state=args.seed)
        d = digits_cv(digits_params)
        print(f"digits 5-fold CV {digits_params}:")
        print(
            f"  BPNNClassifier {d['BPNNClassifier']:.4f}  MLPClassifier {d['MLPClassifier']:.4f}"
            f"  difference {100 * (d['BPNNClassifier'] - d['MLPClassifier']):+.2f} points"
            " (target >= -0.5)"
        )
        har_params = dict(
            hidden_layer_sizes=(256, 128), max_iter=60, early_stopping=True, random_state=args.seed
        )
        h = har_windows(har_params)
        print(f"HAR 128x6 windows, subject split {har_params}:")
        print(
            f"  BPNNClassifier {h['BPNNClassifier']:.4f} ({h['BPNNClassifier fit s']:.1f} s)"
            f"  MLPClassifier {h['MLPClassifier']:.4f} ({h['MLPClassifier fit s']:.1f} s)"
            f"  difference {100 * (h['BPNNClassifier'] - h['MLPClassifier']):+.2f} points"
            " (target >= -1)"
        )
        results = {"digits": d, "har": h}
    return results


if __name__ == "__main__":
    main()
