"""The ``hmdspt`` command line (also ``python -m hmdspt``; ``hmdspt --version``).

Sub-commands:

- ``hmdspt train``: train a ``BPNNClassifier`` with HMDSPT on an emulated heterogeneous
  local cluster (``--speeds``) or an existing scheduler (``--scheduler``), on the embedded
  default data set or ``--data PATH``; prints a table per worker and the test accuracy and
  writes the run log to ``--run-dir``.
- ``hmdspt score``: probe every worker and print its speed and the share it would get.

Exit codes: 0 success; 2 a usage error (a malformed option value, a missing or conflicting
option: argparse's own errors and :class:`UsageError`); 1 a runtime error (a missing or
unusable file, a cluster or training failure). Either prints one line on stderr, as a
warning does (``--debug`` shows the traceback instead, and warnings in Python's form).
A reader that closes stdout early (``| head``) ends the command with 1 and no line; Ctrl-C
with 130 and ``hmdspt: interrupted``, except in ``train``'s fit, which it stops (the fit keeps
its model, and the command goes on to report it).
Progress goes to stderr, results to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import logging
import os
import signal
import sys
import time
import uuid
import warnings
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hmdspt.core.process import importing_the_main_script_in_a_child  # stdlib only

# A worker process of the command's own cluster imports the command's script first (Python's
# spawn runs the main module again in each child): from here on it leaves SIGINT to the
# command, which closes the cluster. Else a Ctrl-C at the terminal while the cluster started
# (it goes to the whole process group) printed each worker process's traceback. Before the
# imports that take the child's time.
if importing_the_main_script_in_a_child():
    signal.signal(signal.SIGINT, signal.SIG_IGN)

import numpy as np  # noqa: E402  (after the check above)

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended
MAX_SEED = 2**32 - 1  # numpy's RandomState takes seeds in [0, 2**32)


class CliError(Exception):
    """A runtime error the user can act on (a missing or unusable file): one line, exit 1."""


class UsageError(CliError):
    """The command line itself is wrong (as argparse's errors): one line, exit 2."""


def _comma_items(text: str) -> list[str]:
    """The items of a comma-separated list; one trailing comma is allowed ('128,', as a
    one-item tuple is written), an empty item elsewhere ('10,,5', a typo) is a ValueError."""
    items = text.split(",")
    if len(items) > 1 and not items[-1].strip():
        items.pop()
    if len(items) > 1 and not all(item.strip() for item in items):
        raise ValueError(f"an empty item in {text!r}")
    return [item for item in items if item.strip()]


def _positive_int_tuple(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in _comma_items(text))
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


class _StoreCluster(argparse.Action):
    """Store a flag that only a fit on a cluster reads, and remember that it was given
    (its default cannot tell): ``--in-process`` refuses it rather than ignore it."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.cluster_flags = [*getattr(namespace, "cluster_flags", []), option_string]


def _rounds_per_epoch(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected 'auto' or a positive integer, got {text!r}"
        ) from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (np.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(
            f"expected an integer from 0 to {MAX_SEED}, got {text!r}"
        ) from None
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {text!r}")
    return value


def _strategy_names(text: str) -> list[str]:
    """``--strategies``: comma-separated names of :data:`hmdspt.compare.STRATEGIES`."""
    from hmdspt.compare import STRATEGIES, check_strategies  # only when given: loads sklearn

    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names:
        raise argparse.ArgumentTypeError(
            f"no strategy in {text!r}; choose from {', '.join(STRATEGIES)}"
        )
    try:
        return check_strategies(names)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in _comma_items(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None
    if not values or not all(np.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"speeds must be positive numbers, got {text!r}")
    from hmdspt.parallel.cluster import check_speeds

    try:  # the emulation's own bounds
        return check_speeds(values)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: Rows the embedded default draws (80 % to train, 20 % to test).
DEFAULT_SAMPLES = 200_000
#: The test part of a data file without its own test split. A parquet or CSV table is split
#: row by row (:func:`~hmdspt.core.shard.held_out_rows` of its file position and the seed),
#: so the workers reading it on a cluster and ``--in-process`` hold out the same rows.
TEST_FRACTION = 0.2


def load_default_dataset(random_state: int = 0, n_samples: int = DEFAULT_SAMPLES):
    """The embedded default: a generated 10-class problem (200,000 x 40), split 80/20.

    Generated by scikit-learn from a fixed seed, so it needs no download and nothing
    outside the installed packages, and it is large enough that a round's compute
    dwarfs the cluster's synchronisation cost. ``n_samples`` draws the same problem at
    another size (the benchmarks' larger jobs).
    """
    from sklearn.datasets import make_classification
    from sklearn.model_selection import train_test_split

    X, y = make_classification(
        n_samples=n_samples,
        n_features=40,
        n_informative=30,
        n_redundant=5,
        n_classes=10,
        n_clusters_per_class=2,
        class_sep=1.5,
        random_state=random_state,
    )
    return train_test_split(X.astype(np.float32), y, test_size=0.2, random_state=random_state)


def _check_data_args(path: str, target: str | None) -> None:
    """Refuse a data file by its name and ``--target`` alone, before any work starts."""
    from hmdspt.parallel.readers import reader_kind

    try:
        kind = reader_kind(path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if glob.has_magic(path):
        if not glob.glob(path):
            raise CliError(f"no data files match {path}")
    elif not os.path.exists(path):
        raise CliError(f"data file not found: {path}")
    if kind != "npz" and target is None:  # after the above: a missing file is the first fix
        raise UsageError(f"--target COLUMN is required for {kind} data")
    from hmdspt.parallel.readers import check_file_source

    try:  # its arrays or --target column, from its metadata: not after a cluster started
        check_file_source(path, target)
    except (OSError, ValueError, TypeError) as exc:  # as the readers word them
        raise CliError(str(exc)) from None


def load_dataset(path: str, target: str | None, random_state: int = 0):
    """Train/test arrays from a data file, read by :func:`hmdspt.parallel.readers.read_file`.

    The file is read by the rule staging reads it with (its suffixes, column rules and
    messages): an ``.npz`` file (the arrays of :data:`~hmdspt.parallel.readers.NPZ_KEY_PAIRS`;
    with ``X_train``/``y_train`` and ``X_test``/``y_test`` its own test split), a parquet
    file or folder, or a CSV file (optionally compressed, e.g. ``.csv.gz``).

    Parameters
    ----------
    path : str
        The data file.
    target : str or None
        Label column of parquet/CSV data (required for them).
    random_state : int, default=0
        Seed of the 80/20 train/test split (when the file holds no test split). A parquet
        or CSV table is split row by row, each row by its file position and the seed
        (:func:`~hmdspt.core.shard.held_out_rows`), as its workers split it on a cluster;
        an ``.npz`` file by scikit-learn's ``train_test_split``.

    Returns
    -------
    X_train, X_test, y_train, y_test : ndarray

    Raises
    ------
    UsageError
        An unsupported file suffix, or no ``target`` for parquet/CSV data (checked before
        the file is opened: the command line is wrong whatever the file holds).
    CliError
        With the reader's one line naming the problem: a missing, unreadable or corrupted
        file, a ``target`` column the file does not have, non-numeric features, NaN/inf,
        no rows, X and y of different lengths; or no labels, or too few rows to split.
    """
    from sklearn.model_selection import train_test_split

    from hmdspt.core.shard import held_out_rows
    from hmdspt.parallel.readers import check_labels_present, read_file

    _check_data_args(path, target)
    try:
        data = read_file(path, target)
        test = None
        if data.x_key == "X_train" and {"X_test", "y_test"} <= set(data.keys):
            test = read_file(path, "y_test", x_key="X_test")
    except (OSError, ValueError, TypeError) as exc:
        lines = str(exc).strip().splitlines()
        raise CliError(lines[0] if lines else type(exc).__name__) from None
    if data.y is None:
        raise CliError(f"{path} has no labels for {data.x_key} (arrays: {data.keys})")
    where = os.path.abspath(path)  # as the reader names the file
    try:  # the CLI classifies: a NaN label is a missing one, named by its file row
        for part in (data, test) if test is not None else (data,):
            check_labels_present(part.y, np.arange(len(part.y)), where, numeric=True)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if test is not None:
        if test.X.shape[1] != data.X.shape[1]:
            raise CliError(
                f"{path}: X_test has {test.X.shape[1]} features but X_train has {data.X.shape[1]}"
            )
        return data.X, test.X, data.y, test.y
    if data.features is None:  # .npz arrays: the driver reads them on every path
        if len(data.X) < 2:
            raise CliError(f"{path} has {len(data.X)} row(s): too few to split into train and test")
        return train_test_split(data.X, data.y, test_size=0.2, random_state=random_state)
    test_rows = held_out_rows(random_state, 0, len(data.X), TEST_FRACTION)
    _check_split(path, len(data.X), int(test_rows.sum()))
    return data.X[~test_rows], data.X[test_rows], data.y[~test_rows], data.y[test_rows]


def _check_split(path: str, n_train: int, n_test: int) -> None:
    """Refuse a table whose row-by-row split leaves either part empty."""
    if not (n_train and n_test):
        raise CliError(
            f"{path} has {n_train + n_test} row(s): too few to split into train and test "
            f"({n_train} train / {n_test} test)"
        )


def _cluster_and_client(args: argparse.Namespace):
    """A client of ``--scheduler``, ``--cluster``/``--cluster-config`` pools, or a new
    emulated local cluster with ``--speeds``; returns (ExitStack, client, label).

    Nothing waits on the data before it: a scheduler that does not answer is reported as
    soon as the wait ends (the driver's data may be read meanwhile, in a thread:
    :func:`_read_while_the_cluster_starts`).
    """
    from hmdspt.parallel.cluster import connect_timeout_s
    from hmdspt.parallel.pools import client_from_args

    if getattr(args, "scheduler", None):
        print(
            f"connecting to the Dask scheduler at {args.scheduler} (waiting at most "
            f"{connect_timeout_s():g} s, "
            "Dask setting distributed.comm.timeouts.connect) ...",
            file=sys.stderr,
            flush=True,
        )
        return client_from_args(args)  # the user's workers: their logs are theirs
    stack, client, label = client_from_args(args)
    if not getattr(args, "debug", False):  # --debug: the workers' logs in full
        from hmdspt.parallel.cluster import QuietWorkerLogsPlugin

        client.register_plugin(QuietWorkerLogsPlugin())
    return stack, client, label


class _RoundBar:
    """A tqdm bar on stderr counting a fit's rounds, drawn by the fit's ``on_round`` callback.

    The bar counts rounds, not a fraction of the fit: how many rounds a fit takes is not
    known beforehand (ramp rounds, catch-up rounds after a lost worker, ``max_seconds``,
    early stopping). Its postfix shows the epoch, the round's loss and validation score,
    and the fastest worker's idle share and the parallel efficiency of the rounds so far,
    summed as the run log's summary sums them (:class:`hmdspt.core.runlog.RunTotals`): one
    round's idle share jumps with the round's jitter (0-30 % from round to round on the
    emulated 4:2:1 cluster), and the running figures end on the run log's summary.

    Where stderr is not a terminal (a log file, a CI log), the bar is not drawn: its
    redraws would pile up on one line. The same figures are written instead as one line
    at each epoch's end (as the fit's last round of the epoch left them) and the fit's.
    """

    def __init__(self, epochs: int, file=None, live: bool | None = None) -> None:
        from tqdm import tqdm

        from hmdspt.core.runlog import RunTotals

        self.epochs = epochs
        self.totals = RunTotals()
        self.file = file
        stream = sys.stderr if file is None else file
        self.live = stream.isatty() if live is None else live
        self.rounds = 0
        self.line: str | None = None  # not live: the latest round's line, not yet written
        self.epoch: int | None = None
        self.bar = tqdm(
            desc="training",
            unit="round",
            file=file,  # None: sys.stderr
            bar_format="{desc}: {n_fmt} rounds, {elapsed}{postfix}",
            disable=not self.live,
        )
        self.started = time.monotonic()

    def __enter__(self) -> _RoundBar:
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()
        self._write_line()

    def _write_line(self) -> None:
        if self.line is not None:
            print(self.line, file=sys.stderr if self.file is None else self.file, flush=True)
            self.line = None

    @contextlib.contextmanager
    def lines_above(self):
        """A context in which what the fit prints (``--verbose``'s loss lines, warnings)
        goes above the bar, whole lines at a time, not glued to the bar's line."""
        out = _LinesAboveBar(self.bar, sys.stdout)
        err = _LinesAboveBar(self.bar, sys.stderr)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                yield
        finally:
            out.finish()
            err.finish()

    def __call__(self, record) -> None:
        """The ``on_round`` callback: one :class:`hmdspt.parallel.trainer.RoundRecord`."""
        from tqdm import tqdm

        self.totals.add(
            {"event": "round", "wall_s": record.wall_s, "merge_s": record.merge_s,
             "workers": record.workers}
        )  # fmt: skip
        so_far = self.totals.summary(None)
        idle, eff = so_far["fastest_idle_fraction"], so_far["efficiency"]
        val = "-" if record.val_score is None else f"{record.val_score:.4f}"
        postfix = (
            f"epoch {record.epoch}/{self.epochs}, round's loss "
            f"{record.loss_sum / max(record.rows, 1):.4f}, val {val}; so far: fastest idle "
            + ("-" if idle is None else f"{100 * idle:.1f}%")
            + ", efficiency "
            + ("-" if eff is None else f"{eff:.2f}")
        )
        self.rounds += 1
        if self.live:
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(1)
            return
        if record.epoch != self.epoch:  # the previous round ended an epoch
            self._write_line()
            self.epoch = record.epoch
        elapsed = tqdm.format_interval(time.monotonic() - self.started)
        self.line = f"training: {self.rounds} rounds, {elapsed}, {postfix}"


class _LinesAboveBar(io.TextIOBase):
    """stdout or stderr while a bar is drawn: each complete line clears the bar, is written
    to ``out`` and the bar is drawn again below it.

    Not tqdm's ``DummyTqdmFile``: once ``sys.stdout`` is redirected to it, ``tqdm.write``
    no longer sees the bar as sharing the terminal and leaves it uncleared (tried: the loss
    lines stayed glued to the bar)."""

    def __init__(self, bar, out) -> None:
        self.bar, self.out, self.pending = bar, out, ""

    def write(self, text: str) -> int:
        lines, _, self.pending = (self.pending + text).rpartition("\n")
        if lines:
            self.bar.clear()
            self.out.write(lines + "\n")
            self.out.flush()
            self.bar.refresh()
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def finish(self) -> None:
        """Write what is left of a last line that had no newline."""
        if self.pending:
            self.out.write(self.pending)
            self.pending = ""
        self.out.flush()


def _print_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """Print ``rows`` in columns ``(title, key, format)``; None prints "-".

    The first column (names) is left-aligned and as wide as its longest cell (the worker
    names of an existing cluster are addresses); the others are right-aligned, at least 12
    characters wide.
    """
    cells = [
        ["-" if row[key] is None else format(row[key], fmt) for _, key, fmt in columns]
        for row in rows
    ]
    widths = [
        max([len(title) if i == 0 else 12] + [len(line[i]) for line in cells])
        for i, (title, _, _) in enumerate(columns)
    ]
    for line in [[title for title, _, _ in columns], *cells]:
        rest = (f"{cell:>{width}}" for cell, width in zip(line[1:], widths[1:]))
        print("  ".join([f"{line[0]:<{widths[0]}}", *rest]))


def _logged_summary(path) -> dict:
    """The ``run_end`` summary of the run log at ``path`` ({} if there is none)."""
    from hmdspt.core.runlog import read_events

    if path is None:
        return {}
    try:
        events = read_events(path)
    except OSError:
        return {}
    ends = [e for e in events if e.get("event") == "run_end"]
    summary = ends[-1].get("summary") if ends else None
    return summary if isinstance(summary, dict) else {}


def cmd_train(args: argparse.Namespace) -> int:
    from sklearn.exceptions import ConvergenceWarning

    from hmdspt.core.prediction import counted
    from hmdspt.estimator import BPNNClassifier

    run_log = Path(args.run_dir)  # a folder: the trainer writes <run_id>.jsonl into it
    params = dict(
        hidden_layer_sizes=args.hidden,
        max_iter=args.epochs,
        random_state=args.seed,
        batch_size=256,
        verbose=args.verbose,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        if args.in_process:
            X_train, X_test, y_train, y_test = _scaled_data(args)
            clf = BPNNClassifier(client=False, **params)  # --in-process, whatever is active
            start = time.perf_counter()
            clf.fit(X_train, y_train)
            wall = time.perf_counter() - start
            accuracy = clf.score(X_test, y_test)
            epochs = counted(clf.n_iter_, "epoch")
            print(f"fit: in-process, {epochs}, {wall:.2f} s, {_loss_text(clf)}")
        else:
            pending = _read_while_the_cluster_starts(args)
            stack, client, label = _cluster_and_client(args)
            with stack:
                print(f"cluster: {label}")
                X_train, X_test, y_train, y_test = _cluster_data(args, client, pending)
                # Held-out data the workers read is scored at the end, not every round.
                eval_set = None if _read_by_workers(X_test) else (X_test, y_test)
                clf = BPNNClassifier(
                    client=client,
                    sync=args.sync,
                    partition=args.partition,
                    rounds_per_epoch=args.rounds_per_epoch,
                    run_log=run_log,
                    **params,
                )
                start = time.perf_counter()
                with _RoundBar(args.epochs) as progress, progress.lines_above():
                    clf.fit(X_train, y_train, eval_set=eval_set, on_round=progress)
                wall = time.perf_counter() - start
                # While the cluster is up: Dask test data is scored by its workers.
                accuracy = float(clf.score(X_test, y_test))
            print(
                f"fit: sync={args.sync}, partition={args.partition}, "
                f"{counted(clf.n_iter_, 'epoch')}, "
                f"{wall:.2f} s, {_loss_text(clf)}"
            )
            # Utilisation from the run log's summary, the one place it is computed.
            summary = _logged_summary(clf.run_log_path_)
            logged = summary.get("workers") or {}
            rows = []
            for n, r in sorted(clf.training_report_.items()):
                util = (logged.get(n) or {}).get("utilisation")
                rows.append(
                    {
                        "worker": n,
                        **r,
                        "fixed_ms": 1e3 * r["fixed_s"],
                        "idle_pct": 100 * r["idle_fraction"],
                        "util_pct": None if util is None else 100 * util,
                    }
                )
            _print_table(
                rows,
                [
                    ("worker", "worker", "s"),
                    ("samples/s", "score", ",.0f"),
                    ("fixed ms", "fixed_ms", ".1f"),
                    ("rows", "rows", ",d"),
                    ("busy s", "busy_s", ".2f"),
                    ("idle s", "idle_s", ".2f"),
                    ("idle %", "idle_pct", ".1f"),
                    ("util %", "util_pct", ".1f"),
                ],
            )
            fit_wall = summary.get("fit_wall_s")
            print(
                "samples/s, fixed ms: each worker's speed and fixed cost per round at the "
                "fit's end, as the round cost model measured them and the shares follow "
                "(a round of n rows keeps a worker busy for fixed + n / speed); rows: the "
                "rows each worker holds at the end, its share of an epoch; busy s and idle s: "
                "over the whole fit"
            )
            if fit_wall is None:  # a stopped run's log has no summary
                print("util %: - (the run log has no summary of a fit that did not complete)")
            else:
                print(
                    f"util %: busy s over the {fit_wall:.2f} s from the fit() call to the run "
                    "log's run_end, the fit line's time less the estimator's last steps "
                    "(staging, probe, warm start, re-balancing, communication and waiting "
                    "count as not computing); idle % is over the rounds' wall time"
                )
            for line in _prediction_lines(clf.prediction_):
                print(line)
            print(f"run log: {clf.run_log_path_}")
    print(f"test accuracy: {accuracy:.4f}")
    return 0


def _loss_text(clf: Any) -> str:
    """The fit line's loss: none yet when a Ctrl-C stopped the fit in its first epoch."""
    loss = getattr(clf, "loss_", None)
    return "loss - (stopped in its first epoch)" if loss is None else f"loss {loss:.4f}"


def _prediction_lines(prediction: dict | None) -> list[str]:
    """What the fit's second epoch was predicted to cost, labelled as predicted."""
    if not prediction:
        return ["predicted: - (the fit ended before a second epoch)"]
    from hmdspt.core.prediction import MEASURED_WEIGHT, sync_per_round

    p = prediction
    emulated = " (heterogeneity emulated on one machine)" if p.get("emulated") else ""
    measured = p.get("measured_efficiency")
    weighed = (
        ""
        if measured is None
        else f" (the cost model's {p['model_efficiency']:.2f}, the first epoch's "
        f"measured {measured:.2f} weighed {MEASURED_WEIGHT:g})"
    )
    return [
        f"predicted{emulated} from the first epoch's measured speeds and synchronisation "
        f"({sync_per_round(p['sync_s'], p['rounds_per_epoch'])}): "
        f"an epoch {p['epoch_s']:.3g} s, efficiency {p['efficiency']:.2f}{weighed}",
        f"predicted{emulated}: equal shares on the same workers "
        f"{p['equal_shares_epoch_s']:.3g} s an epoch "
        f"({p['equal_shares_epoch_s'] / p['epoch_s']:.2f}x this fit's), balanced shares "
        f"{p['balanced_epoch_s']:.3g} s; one process on the fastest worker {p['fastest']} "
        f"alone {p['fastest_alone_epoch_s']:.3g} s an epoch (speed-up of this fit "
        f"{p['speedup']:.2f}x)",
    ]


def cmd_score(args: argparse.Namespace) -> int:
    from hmdspt.core.partition import apportion
    from hmdspt.parallel.client import scheduler_workers
    from hmdspt.parallel.scoring import score_workers

    n_features = 40 if args.features is None else args.features
    layers = (n_features, *args.hidden, args.classes)
    stack, client, label = _cluster_and_client(args)
    with stack:
        print(f"cluster: {label}")
        how = "adaptive" if args.seconds is None else f"{args.seconds:g} s"
        print(f"probe: model {layers}, real training steps per worker ({how})")
        start = time.perf_counter()
        scores = score_workers(client, layers, seconds=args.seconds)
        took = time.perf_counter() - start
        info = scheduler_workers(client)
    shares = apportion(args.rows, scores)
    rows = [
        {
            "name": str(info[a].get("name", a)),
            "address": a,
            "nthreads": info[a]["nthreads"],
            "memory": info[a]["memory_limit"] / 2**30,
            "score": scores[a],
            "rows": shares[a],
        }
        for a in sorted(scores, key=lambda a: str(info[a].get("name", a)))
    ]
    _print_table(
        rows,
        [
            ("name", "name", "s"),
            ("address", "address", "s"),
            ("nthreads", "nthreads", "d"),
            ("memory GiB", "memory", ".1f"),
            ("samples/s", "score", ",.0f"),
            (f"rows of {args.rows:,}", "rows", ",d"),
        ],
    )
    print(f"probe took {took:.2f} s")
    return 0


def _read_by_workers(data) -> bool:
    return hasattr(data, "__dask_graph__")


def _cluster_data(args: argparse.Namespace, client, pending: Future | None = None):
    """Train/test data of a cluster fit: parquet and CSV files stay with the workers.

    They become Dask arrays, split 80/20 row by row as :func:`load_dataset` splits them
    in-process and standardised lazily (the means and standard deviations are computed
    on the workers), which the fit reads on the workers; ``.npz`` files and the embedded
    default are read here (:func:`_scaled_data`).
    """
    from hmdspt.parallel.readers import reader_kind

    if not args.data or reader_kind(args.data) == "npz":
        return _scaled_data(args, pending)
    import dask

    from hmdspt.parallel.shards import frame_of
    from hmdspt.parallel.sources import split_held_out

    try:  # staging's reading rule and messages: the CLI's --data reads as fit(path) does
        frame = frame_of(args.data, args.target, classes=True)  # the CLI classifies
    except (OSError, ValueError, TypeError) as exc:
        raise CliError(str(exc).strip().splitlines()[0]) from None
    features = [c for c in frame.columns if c != args.target]
    # Each row by its file position, as load_dataset splits it --in-process.
    (X_train, y_train), (X_test, y_test) = split_held_out(
        client, [frame[features], frame[args.target]], TEST_FRACTION, args.seed
    )
    mean, std, n_train, n_test = dask.compute(
        X_train.mean(axis=0), X_train.std(axis=0), _rows_of(y_train), _rows_of(y_test)
    )
    _check_split(args.data, n_train, n_test)
    std = np.where(std > 0, std, 1.0)  # a constant column, as StandardScaler leaves it

    def scaled(part):
        return ((part - mean) / std).astype(np.float32)

    X_train = X_train.map_blocks(scaled, dtype=np.float32)
    X_test = X_test.map_blocks(scaled, dtype=np.float32)
    print(
        f"data: {args.data} (read by the workers), {n_train} train / {n_test} test rows, "
        f"{len(features)} features"
    )
    return X_train, X_test, y_train, y_test


def _rows_of(part):
    """The rows of a Dask array whose blocks' lengths are unknown, counted lazily."""
    counts = part.map_blocks(
        lambda block: np.array([len(block)]), chunks=((1,) * part.numblocks[0],), dtype=np.int64
    )
    return counts.sum()


def _read_scaled(args: argparse.Namespace):
    """The driver's data (``--data`` ``.npz`` or the embedded default), split and
    standardised: ``(X_train, X_test, y_train, y_test, name)``."""
    from sklearn.preprocessing import StandardScaler

    if args.data:
        X_train, X_test, y_train, y_test = load_dataset(args.data, args.target, args.seed)
        name = args.data
    else:
        X_train, X_test, y_train, y_test = load_default_dataset(args.seed)
        name = "generated 10-class set (embedded default)"
    scaler = StandardScaler().fit(X_train)
    X_train = scaler.transform(X_train).astype(np.float32)
    X_test = scaler.transform(X_test).astype(np.float32)
    return X_train, X_test, y_train, y_test, name


def _read_while_the_cluster_starts(args: argparse.Namespace) -> Future | None:
    """Start :func:`_read_scaled` in a thread when the driver reads the data, so that it
    overlaps the cluster's start (the embedded default takes most of a second to generate);
    None when the workers read it (parquet, CSV)."""
    from hmdspt.parallel.readers import reader_kind

    if args.data and reader_kind(args.data) != "npz":
        return None
    reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hmdspt-data")
    try:
        return reader.submit(_read_scaled, args)
    finally:
        reader.shutdown(wait=False)


def _scaled_data(args: argparse.Namespace, pending: Future | None = None):
    """:func:`_read_scaled`'s arrays (``pending``'s, when it was started), announced."""
    X_train, X_test, y_train, y_test, name = (
        pending.result() if pending is not None else _read_scaled(args)
    )
    print(
        f"data: {name}, {len(X_train)} train / {len(X_test)} test rows, {X_train.shape[1]} features"
    )
    return X_train, X_test, y_train, y_test


def cmd_compare(args: argparse.Namespace) -> int:
    from hmdspt.compare import (
        format_table,
        new_comparison_dir,
        plot,
        run_comparison,
        why_one_process_won,
    )
    from hmdspt.parallel.client import scheduler_workers
    from hmdspt.parallel.cluster_options import BATCH_SYSTEMS

    params = dict(
        hidden_layer_sizes=args.hidden, max_iter=args.epochs, batch_size=256, random_state=args.seed
    )
    pending = _read_while_the_cluster_starts(args)
    stack, client, label = _cluster_and_client(args)
    with stack:
        print(f"cluster: {label}")
        X_train, X_test, y_train, y_test = _scaled_data(args, pending)
        run_dir = new_comparison_dir(args.run_dir)
        results, target = run_comparison(
            client,
            X_train,
            y_train,
            X_test,
            y_test,
            strategies=args.strategies,
            params=params,
            run_dir=run_dir,
            max_seconds=args.max_seconds,
            rounds_per_epoch=args.rounds_per_epoch,
        )
        n_workers = len(scheduler_workers(client))
    print(format_table(results, target))
    # Without --scheduler or a batch system the workers are local processes: one machine.
    shared = args.scheduler is None and getattr(args, "cluster", None) not in BATCH_SYSTEMS
    for line in why_one_process_won(results, n_workers, os.cpu_count() if shared else None):
        print(line)
    chart = Path(args.chart or run_dir / "compare.png")
    plot(results, target, chart, f"HMDSPT vs baselines — {label}")
    print(f"chart: {chart}")
    print(f"run logs: {run_dir}/<run>.jsonl")
    return 0


def _cluster_dry_run(args: argparse.Namespace) -> int:
    """``hmdspt cluster``: :func:`hmdspt.parallel.pools.cmd_cluster_dry_run` (imported when
    run, so that building the parser imports no Dask)."""
    from hmdspt.parallel.pools import cmd_cluster_dry_run

    return cmd_cluster_dry_run(args)


def cmd_monitor(args: argparse.Namespace) -> int:
    from hmdspt.app.cli import monitor_main

    return monitor_main(
        args.runs_path,
        port=args.port,
        address=args.address,
        show=args.show,
        basic_auth=args.basic_auth,
        cookie_secret=args.cookie_secret,
    )


class _OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr, as the command's
    own are (argparse printed its usage block, nine lines for ``train``, above it)."""

    #: The commands' parsers by name (set on the top parser by :func:`build_parser`).
    commands: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from dataclasses import fields

    from hmdspt import __version__
    from hmdspt.core.config import TrainerConfig
    from hmdspt.core.strategies import PARTITION_POLICIES, SYNC_STRATEGIES
    from hmdspt.parallel.cluster_options import add_cluster_arguments
    from hmdspt.parallel.readers import SUFFIX_READERS

    # The round loop's options: TrainerConfig's defaults, the registries' choices, as the
    # estimator's (tests/test_options.py compares them).
    trainer_default = {f.name: f.default for f in fields(TrainerConfig)}
    # --data: the file types staging reads (hmdspt.parallel.readers.SUFFIX_READERS).
    data_help = (
        f"data file: {', '.join(SUFFIX_READERS)}, or a folder or glob of parquet files "
        "(default: the embedded data set)"
    )

    parser = _OneLineParser(
        prog="hmdspt",
        description="Heterogeneous micro-difference synchronous parallel training of MLPs.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    parser.commands = sub.choices  # name -> the command's parser

    def cluster_options(p: argparse.ArgumentParser) -> None:
        add_cluster_arguments(p)
        p.add_argument(
            "--speeds",
            type=_positive_floats,
            default=None,  # 4,2,1 where used: None says it was not given
            help="relative speeds of an emulated local cluster (default: 4,2,1)",
        )
        p.add_argument(
            "--scheduler",
            default=None,
            help="address of an existing Dask scheduler (instead of --speeds)",
        )

    train = sub.add_parser("train", help="train a BPNNClassifier with HMDSPT and report it")
    cluster_options(train)
    train.add_argument("--data", default=None, help=data_help)
    train.add_argument("--target", default=None, help="label column of parquet/CSV data")
    train.add_argument(
        "--hidden",
        type=_positive_int_tuple,
        default=(128, 64),
        help="hidden layer sizes (default: 128,64)",
    )
    train.add_argument("--epochs", type=_positive_int, default=8, help="epochs (default: 8)")
    train.add_argument(
        "--sync",
        choices=tuple(SYNC_STRATEGIES),
        action=_StoreCluster,
        default=trainer_default["sync"],
        help="synchronisation: hmdspt (step-normalised delta merge with block momentum), "
        "local (plain delta averaging) or bsp (one merged gradient step per global "
        "mini-batch) (default: %(default)s)",
    )
    train.add_argument(
        "--partition",
        choices=tuple(PARTITION_POLICIES),
        action=_StoreCluster,
        default=trainer_default["partition"],
        help="rows per worker: proportional to its measured speed, or equal (default: %(default)s)",
    )
    train.add_argument(
        "--rounds-per-epoch",
        type=_rounds_per_epoch,
        action=_StoreCluster,
        default=trainer_default["rounds_per_epoch"],
        help="synchronisation rounds an epoch is split into, or auto: as many as keep each "
        "round's measured overhead within 5 %% of it; ignored by --sync bsp "
        "(default: %(default)s)",
    )
    train.add_argument(
        "--run-dir",
        action=_StoreCluster,
        default="runs",
        help="folder of run logs, which fits on a cluster write (default: runs)",
    )
    train.add_argument("--in-process", action="store_true", help="train without a cluster")
    train.add_argument("--seed", type=_seed, default=0, help="random seed (default: 0)")
    train.add_argument("--verbose", action="store_true", help="print the loss every epoch")
    train.set_defaults(func=cmd_train)

    score = sub.add_parser("score", help="probe every worker and print its speed and share")
    cluster_options(score)
    score.add_argument(
        "--hidden",
        type=_positive_int_tuple,
        default=(128, 64),
        help="hidden layer sizes of the probed model (default: 128,64)",
    )
    score.add_argument(
        "--features",
        type=_positive_int,
        default=None,
        help="input features of the probed model (default: 40, the embedded data set's)",
    )
    score.add_argument(
        "--classes", type=_positive_int, default=10, help="output classes (default: 10)"
    )
    score.add_argument(
        "--rows",
        type=_positive_int,
        default=160_000,
        help="rows to apportion in the share column (default: 160,000)",
    )
    score.add_argument(
        "--seconds",
        type=_positive_float,
        default=None,
        help="fixed probe seconds (default: adaptive, until 5 %% precise)",
    )
    score.set_defaults(func=cmd_score)

    compare = sub.add_parser("compare", help="HMDSPT against its baselines: table and chart")
    cluster_options(compare)
    compare.add_argument("--data", default=None, help=data_help)
    compare.add_argument("--target", default=None, help="label column of parquet/CSV data")
    compare.add_argument(
        "--hidden",
        type=_positive_int_tuple,
        default=(128, 64),
        help="hidden layer sizes (default: 128,64)",
    )
    compare.add_argument("--epochs", type=_positive_int, default=8, help="epochs (default: 8)")
    compare.add_argument(
        "--rounds-per-epoch",
        type=_rounds_per_epoch,
        default=trainer_default["rounds_per_epoch"],
        help="synchronisation rounds an epoch is split into, or auto (see train), for the "
        "strategies that merge deltas (hmdspt, local) (default: %(default)s)",
    )
    compare.add_argument(
        "--max-seconds",
        type=_positive_float,
        default=60.0,
        help="time box of each run (default: 60)",
    )
    compare.add_argument(
        "--strategies",
        type=_strategy_names,
        default=None,
        help="comma-separated subset of the runs, e.g. hmdspt,hmdspt-equal,bsp-equal "
        "(default: all; a wrong name lists them; bpnn-in-process always runs: it sets the "
        "target accuracy)",
    )
    compare.add_argument(
        "--run-dir",
        default="runs/compare",
        help="folder of run logs (default: runs/compare); each comparison writes its logs "
        "and chart into a new subfolder of it, named by the time it started",
    )
    compare.add_argument(
        "--chart",
        default=None,
        help="chart path, .png, .pdf or .svg (default: the comparison's subfolder of "
        "RUN_DIR/compare.png)",
    )
    compare.add_argument("--seed", type=_seed, default=0, help="random seed (default: 0)")
    compare.set_defaults(func=cmd_compare)

    cluster = sub.add_parser(
        "cluster", help="print each pool's job script without submitting it (--dry-run, required)"
    )
    cluster_options(cluster)
    cluster.add_argument(
        "--dry-run",
        action="store_true",
        required=True,
        help="print the job scripts without submitting anything",
    )
    cluster.set_defaults(func=_cluster_dry_run)

    monitor = sub.add_parser("monitor", help="serve the Panel monitoring app for run logs")
    monitor.add_argument(
        "runs_path", help="a folder of run logs (*.jsonl, its subfolders' too) or one log"
    )
    monitor.add_argument("--port", type=_port, default=0, help="port (default: a free one)")
    monitor.add_argument(
        "--address",
        default="127.0.0.1",
        help="address to bind (default: 127.0.0.1, this machine only)",
    )
    monitor.add_argument("--show", action="store_true", help="open a browser")
    monitor.add_argument(
        "--basic-auth",
        default=None,
        help="ask for a login: a file of user:password lines (only those users get "
        "in), or a password any user name gets in with; use it whenever --address is not "
        "127.0.0.1 (docs/security.md)",
    )
    monitor.add_argument(
        "--cookie-secret",
        default=None,
        help="cookie secret for the auth (default: a random one per start)",
    )
    monitor.set_defaults(func=cmd_monitor)
    return parser


def _check_options(args: argparse.Namespace) -> None:
    """Refuse option combinations argparse cannot express, before any work starts."""
    from hmdspt.core.paths import check_file_path, check_folder_writable

    scheduler = getattr(args, "scheduler", None)
    kind = getattr(args, "cluster", None)
    pools = getattr(args, "cluster_config", None) or kind not in (None, "local")
    if scheduler and pools:
        raise UsageError("give either --scheduler or --cluster/--cluster-config")
    given_speeds = getattr(args, "speeds", None) is not None
    cluster_flags = getattr(args, "cluster_flags", [])  # --sync, --partition, --rounds-...
    if getattr(args, "in_process", False) and (
        given_speeds or scheduler or kind or pools or cluster_flags
    ):
        raise UsageError(
            "--in-process trains without a cluster: give no --speeds, --scheduler, --cluster, "
            "--cluster-config, --sync, --partition, --rounds-per-epoch or --run-dir (only a "
            "fit on a cluster writes a run log)"
        )
    if given_speeds and (scheduler or pools):
        raise UsageError(
            "--speeds sets an emulated local cluster: give it without --scheduler, "
            "--cluster-config or a batch --cluster"
        )
    if getattr(args, "data", None):  # before a cluster starts or a scheduler is reached
        _check_data_args(args.data, getattr(args, "target", None))
    if getattr(args, "run_dir", None):  # the run logs go into it: fail now, not after the fit
        check_folder_writable(args.run_dir, "--run-dir")
    if getattr(args, "chart", None):  # not after every comparison has run
        check_file_path(args.chart, "--chart")
        from hmdspt.compare import chart_format  # only when given: loads sklearn

        try:
            chart_format(args.chart)
        except ValueError as exc:
            raise UsageError(f"--chart {exc}") from None
        check_folder_writable(Path(args.chart).parent, "--chart's folder")


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line on stderr, as errors are: not the file and source line of the
    library code that raised it, which mean nothing to the command's user."""
    text = " ".join(str(message).split())  # some libraries write paragraphs
    print(f"hmdspt: warning: {text}", file=sys.stderr if file is None else file)


class _UnstartedSyncCancel(logging.Filter):
    """Drops the traceback distributed's ``sync()`` logs when Ctrl-C lands before the call it
    waits on has started: its ``cancel`` callback then reads a future it has not made yet
    (``NameError``, distributed 2026.8). The interrupt itself is handled; the traceback,
    printed after ``hmdspt: interrupted``, is noise to the command's user."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, NameError) and "sync.<locals>.cancel" in record.getMessage())


def _quiet_unstarted_sync_cancel() -> None:
    """Install :class:`_UnstartedSyncCancel` on tornado's callback logger, once. It stays:
    the record comes from the event loop's thread, possibly after :func:`main` returned."""
    logger = logging.getLogger("tornado.application")
    if not any(isinstance(f, _UnstartedSyncCancel) for f in logger.filters):
        logger.addFilter(_UnstartedSyncCancel())


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hmdspt ARGV``; the exit code (module docstring: 0, 1 or 2)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command they were given to, whose --help lists its options
        command = parser.commands.get(getattr(args, "command", None), parser)
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    _quiet_unstarted_sync_cancel()
    # The machine's node id, now: distributed's Client asks for it (uuid1) while it connects,
    # and the standard library's first lookup swallows a Ctrl-C in a bare ``except:``, which
    # left a connect that was interrupted waiting out its timeout.
    uuid.getnode()
    # Line by line into a file or a pipe too: the results on stdout then keep their place
    # among the progress lines and warnings on stderr in a combined log.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    with warnings.catch_warnings():  # puts the caller's warning display back on return
        if not args.debug:  # --debug keeps Python's form, with where each was raised
            warnings.showwarning = _warning_line
        try:
            return _run(args)
        except KeyboardInterrupt:  # Ctrl-C outside a fit (a fit stops at its round's end)
            if args.debug:
                raise
            print("hmdspt: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command; a runtime or usage error becomes one line and an exit code."""
    expected: tuple[type[BaseException], ...] = (CliError, OSError, ValueError, TimeoutError)
    try:
        _check_options(args)
        return args.func(args)
    except BrokenPipeError:
        # stdout's reader went away (`hmdspt train | head`): stop quietly, as other tools
        # do. stdout is pointed at devnull so that the flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except Exception as exc:
        # A fit that failed on the cluster (e.g. every worker lost) is a runtime error;
        # the trainer module is loaded whenever one of its errors can occur.
        trainer = sys.modules.get("hmdspt.parallel.trainer")
        if trainer is not None:
            expected += (trainer.TrainingError,)
        pools = sys.modules.get("hmdspt.parallel.pools")  # a batch system that refused a job
        if pools is not None:
            expected += (pools.JobSubmissionError,)
        if args.debug or not isinstance(exc, expected):
            raise
        lines = str(exc).strip().splitlines()  # some libraries write paragraphs
        print(f"hmdspt: error: {lines[0] if lines else type(exc).__name__}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
