"""The ``hmdspt`` command line.

Sub-commands:

- ``hmdspt train``: fit a ``BPNNClassifier`` on the embedded default data set (or
  ``--data PATH``) and print the test accuracy.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Sequence

import numpy as np

EXIT_USAGE = 2


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


def _positive_int_tuple(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}") from None
    return values


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    return value


def load_default_dataset(random_state: int = 0):
    """The embedded default: scikit-learn's bundled digits, scaled to [0, 1], split 75/25.

    Needs no download and nothing outside the installed packages.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    return train_test_split(X, y, test_size=0.25, random_state=random_state, stratify=y)


def cmd_train(args: argparse.Namespace) -> int:
    from sklearn.exceptions import ConvergenceWarning

    from .estimator import BPNNClassifier

    X_train, X_test, y_train, y_test = load_default_dataset(args.seed)
    clf = BPNNClassifier(
        hidden_layer_sizes=args.hidden, max_iter=args.epochs, random_state=args.seed
    )
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        clf.fit(X_train, y_train)
    wall = time.perf_counter() - start
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    print(
        f"data: digits (embedded default), {len(X_train)} train / {len(X_test)} test rows, "
        f"{X_train.shape[1]} features"
    )
    print(f"model: BPNNClassifier hidden={args.hidden}, in-process, {clf.n_iter_} epochs")
    note = "" if converged else " (stopped at --epochs before converging)"
    print(f"fit: {wall:.2f} s, final loss {clf.loss_:.4f}{note}")
    print(f"test accuracy: {clf.score(X_test, y_test):.4f}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hmdspt",
        description="Heterogeneous micro-difference synchronous parallel training of MLPs.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="fit a BPNNClassifier and print its test accuracy")
    train.add_argument(
        "--hidden",
        type=_positive_int_tuple,
        default=(64,),
        help="hidden layer sizes, e.g. 128,64 (default: 64)",
    )
    train.add_argument("--epochs", type=_positive_int, default=60, help="epochs (default: 60)")
    train.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    train.set_defaults(func=cmd_train)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (CliError, FileNotFoundError, ValueError) as exc:
        if args.debug:
            raise
        print(f"hmdspt: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
