"""The run log: JSON lines written by the trainer and read by the monitor (pure Python).

A run log is an append-only file of UTF-8 JSON objects, one per line, each with
``event``, ``run_id`` and ``time`` (unix seconds). It is the only contract between the
trainer and the monitoring app: the monitor never talks to the cluster and never
unpickles anything, it parses this text. The schema is documented in ``docs/runlog.md``
and versioned by :data:`SCHEMA_VERSION` (written in every ``run_start``).

- :class:`RunLogWriter` appends events, flushing after each one, so a reader sees every
  finished event and at worst one torn last line.
- :func:`read_events` reads a whole log, ignores a torn last line and skips malformed
  lines (:func:`parse_event`, :func:`event_problem`).
- :class:`RunLogTail` follows a growing log, reading only the bytes appended since its
  previous call.
- :func:`summarize` turns the ``round`` events into idle fractions, utilisation and
  parallel efficiency (docs/design.md, "Definitions"); :func:`fit_wall_time` and
  :func:`utilisation` are its definitions of the fit's wall time and of utilisation.

This module must not import Dask: it is in the core layer.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hmdspt.core.callers import user_stacklevel
from hmdspt.core.paths import check_file_path

__all__ = [
    "EVENT_TYPES",
    "HEAD_BYTES",
    "MAX_DEPTH",
    "MAX_LINE_BYTES",
    "SCHEMA_VERSION",
    "SCORE_SOURCES",
    "RunLogTail",
    "RunTotals",
    "RunLogWriter",
    "event_problem",
    "finite",
    "fit_wall_time",
    "new_run_id",
    "parse_event",
    "read_events",
    "summarize",
    "to_json_native",
    "utilisation",
]

SCHEMA_VERSION = 1
"""Version of the event schema; bumped on any change a reader could trip over."""

EVENT_TYPES = (
    "run_start",
    "score",
    "partition",
    "warm_start",
    "round_size",
    "prediction",
    "round",
    "worker_lost",
    "worker_joined",
    "checkpoint",
    "run_end",
)
SCORE_SOURCES = ("probe", "online", "remembered")

_RESERVED = ("event", "run_id", "time")
_ROUND_WORKER_REQUIRED = ("rows", "steps", "busy_s", "comm_s")


def new_run_id(now: float | None = None) -> str:
    """A new run id: UTC time to the millisecond plus a random suffix.

    Ids sort by creation time as strings, e.g. ``"20240601T123456.789Z-3f9a1c"``, and are
    safe in file names.

    Parameters
    ----------
    now : float, optional
        Unix time to use instead of the current time.

    Returns
    -------
    run_id : str
    """
    t = time.time() if now is None else float(now)
    seconds, millis = divmod(round(t * 1000), 1000)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(seconds))
    return f"{stamp}.{millis:03d}Z-{secrets.token_hex(3)}"


def to_json_native(obj: Any) -> Any:
    """Convert ``obj`` to plain JSON types (dict, list, str, int, float, bool, None).

    Numpy scalars and arrays become Python numbers and lists, tuples and sets become
    lists, dataclasses become dicts, paths become strings, and NaN and infinities become
    None (JSON has no NaN, and ``null`` is what every JSON reader understands).

    Raises
    ------
    TypeError
        For anything else, so a bad value fails where it is logged, not in the reader.
    """
    # bool before int: bool is a subclass of int.
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.generic):
        return to_json_native(obj.item())
    if isinstance(obj, np.ndarray):
        return to_json_native(obj.tolist())
    if isinstance(obj, Mapping):
        return {_json_key(k): to_json_native(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_json_native(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_json_native(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, np.dtype):
        return str(obj)
    raise TypeError(
        f"cannot write a {type(obj).__name__} to the run log; convert it to numbers, "
        "strings, lists or dicts first"
    )


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return str(int(key))
    raise TypeError(f"run log object keys must be strings, got {type(key).__name__}")


# --------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------


class RunLogWriter:
    """Append events to a JSON-lines run log.

    Each event is encoded completely, then written with its newline straight to the file
    (unbuffered), so a reader polling the file sees whole events plus at most one torn
    last line.

    Training is not the run log's hostage: when writing fails (a full disk, a quota, an
    I/O error), the writer cuts the file back to the end of its last whole event, closes
    it, warns once and turns every later write into a no-op (:attr:`stopped`).

    Parameters
    ----------
    path : str or path-like
        The log file; parent directories are created and an existing file is appended to.
    run_id : str, optional
        Written in every event; :func:`new_run_id` when not given.
    fsync : bool, default=False
        Also ``os.fsync`` after every event, so events survive a machine crash, at the
        cost of a disk round trip per event (rounds last ~1 s, so it is affordable).

    Attributes
    ----------
    path : pathlib.Path
    run_id : str
    events_written : int
        Whole events written by this writer.

    Raises
    ------
    ValueError
        When ``path`` cannot be a file: one of its parents is a file, or it is a folder.

    Examples
    --------
    >>> with RunLogWriter(tmp_path / "run.jsonl") as log:  # doctest: +SKIP
    ...     log.run_start(config={}, workers=[], dataset={}, model={})
    ...     log.run_end("completed", wall_s=1.5, summary={})
    """

    def __init__(
        self, path: str | os.PathLike, run_id: str | None = None, *, fsync: bool = False
    ) -> None:
        self.path = Path(path)
        self.run_id = new_run_id() if run_id is None else str(run_id)
        self.fsync = bool(fsync)
        self.events_written = 0
        self._stopped: OSError | None = None
        self._check_file_path(self.path)
        # Dask callbacks (worker_lost, ...) may log from another thread than the round loop.
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Unbuffered: a failed write leaves no bytes in a buffer that close() would
            # flush after the cut (see _write_bytes).
            self._file = open(self.path, "ab", buffering=0)  # closed by close() / __exit__
        except OSError as exc:  # named as the parameter, the errno's type kept
            named = type(exc)(f"run_log {self.path}: cannot write it ({exc.strerror or exc})")
            named.errno = exc.errno
            raise named from None
        # A writer that died mid-event left a fragment without a newline. End it, so our
        # first event starts on a line of its own; readers skip the fragment as invalid.
        size = os.fstat(self._file.fileno()).st_size
        if size > 0:
            with open(self.path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    self._write_bytes(b"\n")

    # -- plumbing -------------------------------------------------------------------

    @staticmethod
    def _check_file_path(path: Path) -> None:
        check_file_path(path, "run_log")

    def _write_bytes(self, data: bytes) -> bool:
        """Append ``data``; False when the log has stopped (now or before)."""
        with self._lock:
            if self._stopped is not None:
                return False
            if self._file.closed:
                raise ValueError(f"run log {self.path} is closed")
            written = 0
            try:
                while written < len(data):  # a raw write may be partial (a disk filling up)
                    written += self._file.write(data[written:])
                if self.fsync:
                    os.fsync(self._file.fileno())
            except OSError as exc:
                self._stop(exc, torn=written if written < len(data) else 0)
                return False
            return True

    def _stop(self, exc: OSError, torn: int) -> None:
        """Cut the ``torn`` bytes of a partial event, close the file, warn once."""
        try:
            if torn:
                fd = self._file.fileno()
                os.ftruncate(fd, os.fstat(fd).st_size - torn)
        except OSError:
            pass  # the reader skips a torn last line anyway
        finally:
            self._file.close()
            self._stopped = exc
        reason = f"[Errno {exc.errno}] {exc.strerror}" if exc.strerror else str(exc)
        warnings.warn(
            f"run log {self.path} stopped after {self.events_written} events: {reason}; "
            "training goes on",
            RuntimeWarning,
            stacklevel=user_stacklevel(),
        )

    def write(self, event: str, *, timestamp: float | None = None, **fields: Any) -> dict:
        """Append one event (a no-op once the log has :attr:`stopped`).

        Parameters
        ----------
        event : str
            Event type; :data:`EVENT_TYPES` are the schema's, others may be added by
            later schema versions (readers ignore types they do not know).
        timestamp : float, optional
            Unix time of the event; now when not given.
        **fields
            The event's fields, converted by :func:`to_json_native`.

        Returns
        -------
        record : dict
            The JSON-native record (as written, or as it would have been).
        """
        if not isinstance(event, str) or not event:
            raise ValueError(f"event must be a non-empty string, got {event!r}")
        clash = [k for k in fields if k in _RESERVED]
        if clash:
            raise ValueError(f"fields {clash} are reserved for every event")
        record = {
            "event": event,
            "run_id": self.run_id,
            "time": time.time() if timestamp is None else float(timestamp),
        }
        record.update(fields)
        record = to_json_native(record)
        line = json.dumps(record, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        # JSON escapes newlines inside strings and UTF-8 never uses byte 0x0A inside a
        # multi-byte character, so b"\n" only ever ends a record.
        if self._write_bytes(line.encode("utf-8") + b"\n"):
            self.events_written += 1
        return record

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed

    @property
    def stopped(self) -> bool:
        """Whether writing failed, which closed the log (later writes are no-ops)."""
        return self._stopped is not None

    def __enter__(self) -> RunLogWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- typed events ---------------------------------------------------------------

    def run_start(
        self,
        config: Mapping[str, Any],
        workers: Sequence[Mapping[str, Any]],
        dataset: Mapping[str, Any],
        model: Mapping[str, Any],
        **extra: Any,
    ) -> dict:
        """Log the start of a run (writes :data:`SCHEMA_VERSION`).

        Parameters
        ----------
        config : mapping
            The run's configuration (trainer and strategy parameters).
        workers : sequence of mapping
            One ``{"name", "address", "nthreads", "memory"}`` per worker (memory in bytes).
        dataset : mapping
            At least ``{"n_rows", "n_features"}``; ``name`` and ``n_outputs`` if known.
        model : mapping
            At least ``{"layers", "n_params"}``.
        **extra
            Further fields, e.g. ``called_at``: unix time of the user's call that started
            the fit (its wall time counts from there, :func:`fit_wall_time`).
        """
        return self.write(
            "run_start",
            schema_version=SCHEMA_VERSION,
            config=config,
            workers=workers,
            dataset=dataset,
            model=model,
            **extra,
        )

    def score(
        self,
        round: int,
        worker: str,
        score: float,
        source: str,
        uncertainty: float | None = None,
        **extra: Any,
    ) -> dict:
        """Log a worker's score (rows per second) after a probe or an online update.

        Parameters
        ----------
        round : int
            Round after which the score holds (-1 for a probe before the first round).
        worker : str
            Worker name.
        score : float
            Rows per second.
        source : {"probe", "online", "remembered"}
            A dedicated probe task, the timings of a training round, or the speed a
            worker remembered from an earlier fit of the same model shape.
        uncertainty : float, optional
            Standard error of the score, in rows per second.
        """
        if source not in SCORE_SOURCES:
            raise ValueError(f"source must be one of {SCORE_SOURCES}, got {source!r}")
        return self.write(
            "score",
            round=round,
            worker=worker,
            score=score,
            source=source,
            uncertainty=uncertainty,
            **extra,
        )

    def partition(
        self,
        round: int,
        rows: Mapping[str, int],
        moves: Sequence[Any],
        rows_moved: int,
        seconds: float,
        **extra: Any,
    ) -> dict:
        """Log a (re)partition of the rows.

        Parameters
        ----------
        round : int
            Round after which it took effect (-1 for the initial partition).
        rows : mapping of str to int
            Rows per worker after the partition.
        moves : sequence
            Transfers, each a ``(src, dst, rows)`` sequence or a mapping; written as
            ``{"src", "dst", "rows"}`` objects.
        rows_moved : int
            Total rows transferred.
        seconds : float
            Wall time the re-partition took.
        """
        return self.write(
            "partition",
            round=round,
            rows=rows,
            moves=[_move_record(m) for m in moves],
            rows_moved=rows_moved,
            seconds=seconds,
            **extra,
        )

    def round(
        self,
        round: int,
        epoch: float,
        wall_s: float,
        merge_s: float,
        loss: float | None,
        val_score: float | None,
        workers: Mapping[str, Mapping[str, Any]],
        **extra: Any,
    ) -> dict:
        """Log one synchronous round.

        Parameters
        ----------
        round : int
            Round number, from 0.
        epoch : int or float
            Epoch the round belongs to.
        wall_s : float
            Driver time from broadcast to merged update.
        merge_s : float
            Driver time spent merging and applying the deltas.
        loss : float or None
            Training loss (mean of the workers' losses weighted by rows).
        val_score : float or None
            Validation score, if evaluated this round.
        workers : mapping of str to mapping
            Per worker ``rows``, ``steps``, ``busy_s``, ``comm_s`` (required) and
            ``idle_s``, ``bytes_in``, ``bytes_out``. A missing ``idle_s`` is computed as
            ``max(0, wall_s - busy_s - comm_s)``; missing byte counts are written as null.
        """
        per_worker = {}
        for name, w in workers.items():
            missing = [k for k in _ROUND_WORKER_REQUIRED if k not in w]
            if missing:
                raise ValueError(f"round {round}: worker {name!r} lacks {missing}")
            entry = dict(w)
            if entry.get("idle_s") is None:
                entry["idle_s"] = _idle(wall_s, entry["busy_s"], entry["comm_s"])
            entry.setdefault("bytes_in", None)
            entry.setdefault("bytes_out", None)
            per_worker[name] = entry
        return self.write(
            "round",
            round=round,
            epoch=epoch,
            wall_s=wall_s,
            merge_s=merge_s,
            loss=loss,
            val_score=val_score,
            workers=per_worker,
            **extra,
        )

    def worker_lost(
        self, worker: str, round: int | None = None, reason: str | None = None, **extra: Any
    ) -> dict:
        """Log that a worker left (or failed); ``round`` is the round it was lost in."""
        return self.write("worker_lost", worker=worker, round=round, reason=reason, **extra)

    def worker_joined(
        self,
        worker: str,
        round: int | None = None,
        address: str | None = None,
        nthreads: int | None = None,
        memory: int | None = None,
        **extra: Any,
    ) -> dict:
        """Log that a worker joined; it takes part from the round after ``round``."""
        return self.write(
            "worker_joined",
            worker=worker,
            round=round,
            address=address,
            nthreads=nthreads,
            memory=memory,
            **extra,
        )

    def warm_start(
        self, rows: int, epochs: int, seconds: float, val_score: float | None, **extra: Any
    ) -> dict:
        """Log the warm start: the pilot fit before round one and the model it gave.

        Parameters
        ----------
        rows : int
            Rows of the pilot's sample.
        epochs : int
            Epochs the pilot trained over them.
        seconds : float
            Wall time of the pilot fit.
        val_score : float or None
            Validation score of the warm-started model, if the fit has a validation set.
        """
        return self.write(
            "warm_start",
            round=0,
            rows=rows,
            epochs=epochs,
            seconds=seconds,
            val_score=val_score,
            **extra,
        )

    def round_size(
        self,
        epoch: int,
        rounds_per_epoch: int,
        compute_s: float,
        sync_s: float,
        fixed_s: float,
        overhead_fraction: float,
        bound: str,
        step_bound: int,
        **extra: Any,
    ) -> dict:
        """Log the rounds an epoch is split into and the costs that chose them.

        Parameters
        ----------
        epoch : int
            The epoch about to start.
        rounds_per_epoch : int
            Its regular rounds.
        compute_s : float
            Predicted compute of the epoch on its slowest share.
        sync_s : float
            Measured synchronisation per round (wall time beyond the longest busy time).
        fixed_s : float
            Largest fixed per-round cost measured on a worker.
        overhead_fraction : float
            Predicted share of a round spent on ``sync_s + fixed_s``.
        bound : {"budget", "steps", "epoch"}
            What decided (:class:`hmdspt.core.rounds.RoundSize`).
        step_bound : int
            Most steps a round of the epoch may hold
            (:func:`hmdspt.core.rounds.local_step_bound`).
        """
        return self.write(
            "round_size",
            epoch=epoch,
            rounds_per_epoch=rounds_per_epoch,
            compute_s=compute_s,
            sync_s=sync_s,
            fixed_s=fixed_s,
            overhead_fraction=overhead_fraction,
            bound=bound,
            step_bound=step_bound,
            **extra,
        )

    def prediction(
        self,
        epoch: int,
        rounds_per_epoch: int,
        sync_s: float,
        epoch_s: float,
        balanced_epoch_s: float,
        equal_shares_epoch_s: float,
        fastest_alone_epoch_s: float,
        fastest: str,
        speedup: float,
        efficiency: float,
        **extra: Any,
    ) -> dict:
        """Log what an epoch is predicted to cost (:func:`hmdspt.core.prediction.predict_epoch`).

        Parameters
        ----------
        epoch : int
            The epoch about to start (the fit's second).
        rounds_per_epoch : int
            Its regular rounds.
        sync_s : float
            Measured synchronisation per round.
        epoch_s : float
            Predicted epoch with the fit's shares.
        balanced_epoch_s : float
            Predicted epoch with balanced shares.
        equal_shares_epoch_s : float
            Predicted epoch with equal shares on the same workers.
        fastest_alone_epoch_s : float
            Predicted epoch of one process on the fastest worker alone.
        fastest : str
            That worker's name.
        speedup : float
            ``fastest_alone_epoch_s / epoch_s``.
        efficiency : float
            Predicted parallel efficiency.
        """
        return self.write(
            "prediction",
            epoch=epoch,
            rounds_per_epoch=rounds_per_epoch,
            sync_s=sync_s,
            epoch_s=epoch_s,
            balanced_epoch_s=balanced_epoch_s,
            equal_shares_epoch_s=equal_shares_epoch_s,
            fastest_alone_epoch_s=fastest_alone_epoch_s,
            fastest=fastest,
            speedup=speedup,
            efficiency=efficiency,
            **extra,
        )

    def checkpoint(self, round: int, path: str | os.PathLike, **extra: Any) -> dict:
        """Log that the state after ``round`` was saved to ``path``."""
        return self.write("checkpoint", round=round, path=path, **extra)

    def run_end(
        self,
        status: str,
        wall_s: float,
        summary: Mapping[str, Any] | None = None,
        reason: str | None = None,
        **extra: Any,
    ) -> dict:
        """Log the end of the run.

        Parameters
        ----------
        status : str
            ``"completed"``, ``"stopped"`` (early stopping or user request) or ``"failed"``.
        wall_s : float
            Wall time of the fit on the user's clock: from the call that started it
            (``run_start.called_at``) to now.
        summary : mapping, optional
            Typically :func:`summarize` of the run's events.
        reason : str, optional
            Why it stopped or failed.
        """
        return self.write(
            "run_end", status=status, wall_s=wall_s, summary=summary, reason=reason, **extra
        )


def _move_record(move: Any) -> Any:
    if isinstance(move, Mapping):
        return dict(move)
    if isinstance(move, Sequence) and not isinstance(move, str) and len(move) == 3:
        src, dst, rows = move
        return {"src": src, "dst": dst, "rows": rows}
    return move  # e.g. a dataclass; to_json_native turns it into an object


def _idle(wall: Any, busy: Any, comm: Any) -> float | None:
    wall, busy, comm = _num(wall), _num(busy), _num(comm)
    if wall is None or busy is None:
        return None
    return max(0.0, wall - busy - (comm or 0.0))


# --------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------


MAX_LINE_BYTES = 8 << 20
"""Longest line a reader parses (8 MiB); longer ones are skipped as malformed.

The writer's longest events (``run_end`` with a summary of a thousand workers) are a few
hundred kB; the limit bounds what one corrupt or hostile line costs a reader."""

MAX_DEPTH = 64
"""Deepest nesting of objects and lists in an event; deeper lines are skipped as malformed."""


def _is_text(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))


def _is_object_of_objects(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, dict) for v in value.values())


def _is_worker_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(w, dict) and isinstance(w.get("name", ""), str) for w in value
    )


def _is_model(value: Any) -> bool:
    layers = value.get("layers") if isinstance(value, dict) else None
    return isinstance(value, dict) and (
        layers is None
        or (
            isinstance(layers, list)
            and all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in layers)
        )
    )


# Per event type: (field, check, what it must be). Only what readers iterate, index or
# show as a name or text; a null or absent field is "unknown" and passes, and a number
# that is not one reads as unknown (docs/runlog.md, "Reading robustly").
_SHAPES: dict[str, tuple[tuple[str, Any, str], ...]] = {
    "run_start": (
        ("config", lambda v: isinstance(v, dict), "an object"),
        ("dataset", lambda v: isinstance(v, dict), "an object"),
        ("model", _is_model, "an object whose layers are a list of numbers"),
        ("workers", _is_worker_list, "a list of objects with string names"),
    ),
    "round": (("workers", _is_object_of_objects, "an object of per-worker objects"),),
    "partition": (
        ("rows", lambda v: isinstance(v, dict), "an object"),
        ("moves", lambda v: isinstance(v, list), "a list"),
    ),
    "score": (("worker", lambda v: isinstance(v, str), "a string"),),
    "worker_lost": (
        ("worker", lambda v: isinstance(v, str), "a string"),
        ("reason", _is_text, "text"),
    ),
    "worker_joined": (("worker", lambda v: isinstance(v, str), "a string"),),
    "checkpoint": (("path", _is_text, "text"),),
    "run_end": (("status", _is_text, "text"), ("reason", _is_text, "text")),
}


def event_problem(record: Any) -> str | None:
    """Why ``record`` is not an event readers can use, or None if it is one.

    The one place where event shapes are checked (:func:`read_events`,
    :class:`RunLogTail` and the monitor rely on it): an event is a JSON object with an
    ``event`` string, a ``run_id`` string (or none), and, for the types of
    :data:`EVENT_TYPES`, the fields that readers iterate or show as names and text of the
    documented container types (docs/runlog.md). Null or absent fields are unknown and
    pass, as do numbers of the wrong type (readers treat them as unknown).

    Parameters
    ----------
    record : object
        A decoded JSON value.

    Returns
    -------
    problem : str or None
        A short phrase naming the offending field, e.g. ``"round.workers is not an object
        of per-worker objects"``.
    """
    if not isinstance(record, dict):
        return "not a JSON object"
    kind = record.get("event")
    if not isinstance(kind, str):
        return "no event string"
    if record.get("run_id") is not None and not isinstance(record["run_id"], str):
        return "run_id is not a string"
    for field, check, what in _SHAPES.get(kind, ()):
        value = record.get(field)
        if value is not None and not check(value):
            return f"{kind}.{field} is not {what}"
    return None


def _deeper_than(obj: Any, limit: int) -> bool:
    """Whether lists and objects nest more than ``limit`` levels (level by level: no
    recursion, whatever the depth)."""
    level = [obj]
    for _ in range(limit):
        below = []
        for node in level:
            for child in node.values() if type(node) is dict else node:
                if type(child) is dict or type(child) is list:
                    below.append(child)
        if not below:
            return False
        level = below
    return True


def _side_by_side(record: Any) -> int:
    """Brackets that cannot lie on one path: all but one of the per-worker objects."""
    workers = record.get("workers") if isinstance(record, dict) else None
    if isinstance(workers, dict):
        workers = workers.values()
    elif not isinstance(workers, list):
        return 0
    return max(0, sum(isinstance(w, (dict, list)) for w in workers) - 1)


def parse_event(line: bytes | str) -> dict:
    """Decode one line of a run log into an event.

    Parameters
    ----------
    line : bytes or str
        One complete line, without its newline (UTF-8 if bytes).

    Returns
    -------
    event : dict

    Raises
    ------
    ValueError
        Saying why the line is not an event: longer than :data:`MAX_LINE_BYTES`, not
        JSON (or not UTF-8), nested deeper than :data:`MAX_DEPTH`, or of the wrong shape
        (:func:`event_problem`).
    """
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"a line of {len(line):,} bytes (the limit is {MAX_LINE_BYTES:,})")
    try:
        # Decoding first (in C) spares json.loads its per-call guess of the encoding.
        text = line if isinstance(line, str) else line.decode("utf-8")
        record = json.loads(text)
    except RecursionError:  # json's C parser gives up near 1,000 levels
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"not JSON: {exc}") from None
    # The depth is at most the number of opening brackets (counted in C), less the
    # per-worker objects side by side: that rules out deep nesting for nearly every
    # line without walking it.
    if isinstance(record, (dict, list)):
        openers = text.count("[") + text.count("{")
        if (
            openers > MAX_DEPTH
            and openers - _side_by_side(record) > MAX_DEPTH
            and _deeper_than(record, MAX_DEPTH)
        ):
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    problem = event_problem(record)
    if problem is not None:
        raise ValueError(problem)
    return record


def _parse_lines(data: bytes, strict: bool) -> tuple[list[dict], int]:
    """Parse complete lines; return the events and the number of malformed lines skipped."""
    events: list[dict] = []
    skipped = 0
    for line in data.split(b"\n"):
        line = line.strip()
        if not line:
            continue
        try:
            events.append(parse_event(line))
        except ValueError as exc:
            if strict:
                raise ValueError(f"invalid run log line ({exc}): {line[:200]!r}") from None
            skipped += 1
    return events, skipped


def read_events(path: str | os.PathLike, *, strict: bool = False) -> list[dict]:
    """Read every event of a run log.

    Parameters
    ----------
    path : str or path-like
        The log file.
    strict : bool, default=False
        Raise on a malformed complete line instead of skipping it.

    Returns
    -------
    events : list of dict
        In file order.

    Notes
    -----
    The bytes after the last newline are a torn (still being written, or cut by a crash)
    event and are ignored, whatever ``strict``. Without ``strict``, malformed complete
    lines are skipped too (:func:`parse_event` says what that is: not JSON, too long,
    too deeply nested, or an event of the wrong shape); they come from a crash (a new
    writer ends the fragment with a newline), corruption, or a writer that does not
    follow docs/runlog.md. :class:`RunLogTail` counts them.
    """
    data = Path(path).read_bytes()
    end = data.rfind(b"\n") + 1
    return _parse_lines(data[:end], strict)[0]


#: How many of a run log's first bytes :class:`RunLogTail` compares on every call: its
#: first event names the run and its start, so a rewritten file differs there.
HEAD_BYTES = 256


class RunLogTail:
    """Follow a growing run log, parsing only what was appended since the last call.

    It keeps the byte offset it has read up to and the bytes of an incomplete last line,
    which it completes with the next call's bytes. Past the file's first
    :data:`HEAD_BYTES`, which every call compares, it never reads a byte twice, so polling
    a long run costs what was appended, not the size of the log.

    Parameters
    ----------
    path : str or path-like
        The log file; it need not exist yet.
    strict : bool, default=False
        Raise on a malformed complete line instead of skipping it.
    chunk_size : int, default=1 MiB
        Most bytes read at once (bounds memory when catching up on a big log).

    Attributes
    ----------
    offset : int
        Bytes of the file consumed so far (including :attr:`pending_bytes`).
    skipped : int
        Malformed complete lines skipped so far (:func:`parse_event`).
    restarts : int
        Times the tail started again from the file's beginning (:meth:`reset`, or the file
        replaced or truncated). A reader that aggregates the events must start over when
        it changes: the events after a restart are the file's from its first line.

    Notes
    -----
    If the file is replaced or rewritten (its inode changes, it shrinks below ``offset``,
    or its first bytes are no longer those read), the tail starts again from its beginning
    and counts a restart. A file replaced by a larger one (written elsewhere, then renamed
    over the log, as rsync and scp do; or truncated and rewritten past ``offset`` between
    two calls, as a new run on the same path is) leaves ``offset`` where it was or higher:
    only :attr:`restarts` tells. An
    unfinished line that grows beyond :data:`MAX_LINE_BYTES` is dropped rather than held,
    and counted as skipped once its newline arrives.
    """

    def __init__(
        self, path: str | os.PathLike, *, strict: bool = False, chunk_size: int = 1 << 20
    ) -> None:
        if chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        self.path = Path(path)
        self.strict = strict
        self.chunk_size = int(chunk_size)
        self.offset = 0
        self.skipped = 0
        self.restarts = 0
        self._pending = b""
        self._dropping = False  # inside a line longer than MAX_LINE_BYTES
        self._inode: int | None = None
        self._head = b""  # the file's first bytes as read: a rewrite changes them

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete last line held until its newline arrives."""
        return len(self._pending)

    def reset(self) -> None:
        """Start again from the beginning of the file (counted in :attr:`restarts`)."""
        self.restarts += 1
        self.offset = 0
        self.skipped = 0
        self._pending = b""
        self._dropping = False
        self._inode = None
        self._head = b""

    def _hold(self, data: bytes) -> None:
        """Keep the bytes of the unfinished last line, unless it is already too long."""
        if self._dropping:
            return
        self._pending += data
        if len(self._pending) > MAX_LINE_BYTES:
            self._pending = b""
            self._dropping = True

    def read_new(self) -> list[dict]:
        """Events completed since the previous call (an empty list if none or no file)."""
        try:
            f = open(self.path, "rb")  # closed by the with below
        except FileNotFoundError:
            return []
        events: list[dict] = []
        with f:
            st = os.fstat(f.fileno())
            if self._inode is not None and (
                st.st_ino != self._inode
                or st.st_size < self.offset
                or os.pread(f.fileno(), len(self._head), 0) != self._head
            ):
                self.reset()
            self._inode = st.st_ino
            # Read up to the size seen now; what is appended meanwhile waits for next call.
            remaining = st.st_size - self.offset
            f.seek(self.offset)
            while remaining > 0:
                chunk = f.read(min(self.chunk_size, remaining))
                if not chunk:
                    break
                if len(self._head) < HEAD_BYTES:
                    self._head += chunk[: HEAD_BYTES - len(self._head)]
                self.offset += len(chunk)
                remaining -= len(chunk)
                # Search only the new chunk for the last newline: the pending bytes have
                # none by construction.
                cut = chunk.rfind(b"\n") + 1
                if cut == 0:
                    self._hold(chunk)
                    continue
                complete = self._pending + chunk[:cut]
                if self._dropping:  # the first line ends the over-long one: skip it
                    if self.strict:
                        raise ValueError(
                            f"invalid run log line (longer than {MAX_LINE_BYTES:,} bytes)"
                        )
                    complete = complete[complete.index(b"\n") + 1 :]
                    self._dropping = False
                    self.skipped += 1
                self._pending = b""
                self._hold(chunk[cut:])
                parsed, skipped = _parse_lines(complete, self.strict)
                events.extend(parsed)
                self.skipped += skipped
        return events


# --------------------------------------------------------------------------------------
# Summary
# --------------------------------------------------------------------------------------


def finite(x: Any) -> float | None:
    """A run log's number: a finite float, or None for null, NaN, infinities, booleans and
    non-numbers. Every reader of run logs (the summary, the monitor) counts by this rule."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


_num = finite


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _integral(x: float | None) -> float | int | None:
    """Counts were summed as floats (they may be null); give whole ones back as int."""
    return int(x) if x is not None and x.is_integer() else x


def fit_wall_time(
    run_start: Mapping[str, Any] | None,
    run_end: Mapping[str, Any] | None = None,
    latest: float | None = None,
) -> float | None:
    """The fit's wall time on the user's clock, the denominator of :func:`utilisation`.

    Parameters
    ----------
    run_start : mapping or None
        The run's ``run_start``: the fit counts from its ``called_at`` (the user's call),
        or from its ``time`` in a log written before ``called_at`` was recorded.
    run_end : mapping, optional
        The run's ``run_end``: once the run ended, its ``wall_s`` is the fit's wall time.
    latest : float, optional
        Unix time of the run's latest event: a run still going counts up to it.

    Returns
    -------
    seconds : float or None
        None when there is nothing to count from or to.
    """
    if run_end is not None:
        wall = _num(run_end.get("wall_s"))
        if wall is not None:
            return wall
    if run_start is None or _num(latest) is None:
        return None
    origin = _num(run_start.get("called_at"))
    if origin is None:
        origin = _num(run_start.get("time"))
    return None if origin is None else max(0.0, float(latest) - origin)


def utilisation(busy_s: float | None, fit_wall_s: float | None) -> float | None:
    """A worker's utilisation: its compute seconds over the fit's wall time.

    Parameters
    ----------
    busy_s : float or None
        Σ ``busy_s`` of the worker's rounds (its local training inside each round).
    fit_wall_s : float or None
        The fit's wall time from the user's call (:func:`fit_wall_time`).

    Returns
    -------
    utilisation : float or None
        In [0, 1]; None when either is unknown or the wall time is not positive.
    """
    busy, wall = _num(busy_s), _num(fit_wall_s)
    if busy is None or wall is None:
        return None
    return _ratio(busy, wall)


class RunTotals:
    """The additive sums behind :func:`summarize`, fed one ``round`` event at a time.

    :func:`summarize` and the monitor (which adds each poll's new rounds) both compute a
    run's summary through this class, so the definitions live in one place.
    """

    def __init__(self) -> None:
        self.rounds = 0
        self.wall_s = self.ideal_s = self.wall_with_ideal = self.merge_s = 0.0
        self.final_loss: float | None = None
        self.final_val_score: float | None = None
        self.workers: dict[str, dict[str, Any]] = {}

    def add(self, e: Mapping[str, Any]) -> bool:
        """Add a ``round`` event; any other event, or a round without a wall time, is
        ignored. Returns whether it was added."""
        if e.get("event") != "round":
            return False
        wall = _num(e.get("wall_s"))
        if wall is None:
            return False
        self.rounds += 1
        self.wall_s += wall
        self.merge_s += _num(e.get("merge_s")) or 0.0
        self.final_loss = _num(e.get("loss"))
        self.final_val_score = _num(e.get("val_score"))
        round_rows = round_speed = 0.0
        workers = e.get("workers")
        for name, w in (workers if isinstance(workers, Mapping) else {}).items():
            if not isinstance(w, Mapping):
                continue
            acc = self.workers.setdefault(
                name,
                {
                    "rounds": 0,
                    "rows": 0.0,
                    "steps": 0.0,
                    "busy_s": 0.0,
                    "comm_s": 0.0,
                    "idle_s": 0.0,
                    "wall_s": 0.0,
                    "bytes_in": None,
                    "bytes_out": None,
                    "_rows_timed": 0.0,
                    "_busy_timed": 0.0,
                },
            )
            rows = _num(w.get("rows")) or 0.0
            busy = _num(w.get("busy_s"))
            comm = _num(w.get("comm_s"))
            idle = _num(w.get("idle_s"))
            if idle is None:
                idle = _idle(wall, busy, comm) or 0.0
            acc["rounds"] += 1
            acc["rows"] += rows
            acc["steps"] += _num(w.get("steps")) or 0.0
            acc["busy_s"] += busy or 0.0
            acc["comm_s"] += comm or 0.0
            acc["idle_s"] += idle
            acc["wall_s"] += wall
            for key in ("bytes_in", "bytes_out"):
                b = _num(w.get(key))
                if b is not None:
                    acc[key] = (acc[key] or 0.0) + b
            if rows > 0 and busy is not None and busy > 0:
                acc["_rows_timed"] += rows
                acc["_busy_timed"] += busy
                round_rows += rows
                round_speed += rows / busy
        if round_speed > 0:
            self.ideal_s += round_rows / round_speed
            self.wall_with_ideal += wall
        return True

    def summary(self, fit_wall_s: float | None) -> dict:
        """The round-derived part of :func:`summarize`'s result (same keys and meaning)."""
        per_worker = {}
        for name, acc in self.workers.items():
            per_worker[name] = {
                "rounds": acc["rounds"],
                "rows": _integral(acc["rows"]),
                "steps": _integral(acc["steps"]),
                "busy_s": acc["busy_s"],
                "comm_s": acc["comm_s"],
                "idle_s": acc["idle_s"],
                "wall_s": acc["wall_s"],
                "idle_fraction": _ratio(acc["idle_s"], acc["wall_s"]),
                "utilisation": utilisation(acc["busy_s"], fit_wall_s),
                "mean_speed": _ratio(acc["_rows_timed"], acc["_busy_timed"]),
                "bytes_in": _integral(acc["bytes_in"]),
                "bytes_out": _integral(acc["bytes_out"]),
            }
        speeds = [(w["mean_speed"], name) for name, w in per_worker.items() if w["mean_speed"]]
        fastest = max(speeds, key=lambda s: s[0])[1] if speeds else None
        return {
            "rounds": self.rounds,
            "wall_s": self.wall_s,
            "fit_wall_s": fit_wall_s,
            "ideal_s": self.ideal_s,
            "merge_s": self.merge_s,
            "efficiency": _ratio(self.ideal_s, self.wall_with_ideal),
            "fastest_worker": fastest,
            "fastest_idle_fraction": per_worker[fastest]["idle_fraction"] if fastest else None,
            "fastest_utilisation": per_worker[fastest]["utilisation"] if fastest else None,
            "final_loss": self.final_loss,
            "final_val_score": self.final_val_score,
            "workers": per_worker,
        }


def summarize(
    events: Sequence[Mapping[str, Any]],
    run_id: str | None = None,
    *,
    fit_wall_s: float | None = None,
) -> dict:
    """Idle, utilisation, speed and parallel efficiency of a run, from its events.

    Per docs/design.md, "Definitions": ``idle_i = max(0, wall − busy_i − comm_i)`` (the logged
    ``idle_s`` is used when present); a worker's idle fraction is ``Σ idle_i / Σ wall``
    over the rounds it took part in; its utilisation is ``Σ busy_i`` over the fit's wall
    time from the user's call (:func:`fit_wall_time`, :func:`utilisation`);
    ``speed_i = rows_i / busy_i``; a round's ideal time is ``Σ rows_i / Σ speed_i``;
    parallel efficiency is ``Σ ideal / Σ wall``.

    Parameters
    ----------
    events : sequence of dict
        Events as :func:`read_events` returns them.
    run_id : str, optional
        Run to summarise; by default the run of the last event that has a run id.
    fit_wall_s : float, optional
        The fit's wall time, for a writer about to log it in ``run_end``; by default
        :func:`fit_wall_time` of the run's ``run_start``, ``run_end`` and latest event.

    Returns
    -------
    summary : dict
        JSON-native. Keys: ``run_id``, ``rounds``, ``wall_s`` (Σ round wall),
        ``fit_wall_s`` (the fit's wall time from the user's call), ``ideal_s``,
        ``merge_s``, ``efficiency``, ``fastest_worker`` (highest mean speed, i.e.
        ``Σ rows / Σ busy``), ``fastest_idle_fraction``, ``fastest_utilisation``,
        ``final_loss``, ``final_val_score``, ``workers_lost``, ``workers_joined``,
        ``status`` (from ``run_end``, else None) and ``workers``: per worker ``rounds``,
        ``rows``, ``steps``, ``busy_s``, ``comm_s``, ``idle_s``, ``wall_s``,
        ``idle_fraction``, ``utilisation``, ``mean_speed``, ``bytes_in``, ``bytes_out``.
        Ratios are None when undefined.

    Notes
    -----
    A round in which no worker has both rows and a positive busy time has no ideal time
    and is left out of the efficiency (both sums). Scaling every worker's ``rows`` by the
    same factor leaves the ideal time unchanged, so whether the trainer logs rows per
    round or shard sizes does not change the efficiency as long as it is consistent.
    """
    if run_id is None:
        for e in reversed(events):
            if isinstance(e.get("run_id"), str):
                run_id = e["run_id"]
                break
    mine = [e for e in events if e.get("run_id") == run_id]
    if fit_wall_s is None:
        start = next((e for e in mine if e.get("event") == "run_start"), None)
        end = next((e for e in reversed(mine) if e.get("event") == "run_end"), None)
        times = [t for t in (_num(e.get("time")) for e in mine) if t is not None]
        fit_wall_s = fit_wall_time(start, end, max(times) if times else None)

    totals = RunTotals()
    for e in mine:
        totals.add(e)
    summary = totals.summary(fit_wall_s)
    status = None
    for e in mine:
        if e.get("event") == "run_end":
            status = e.get("status")
    return to_json_native(
        {
            "run_id": run_id,
            **summary,
            "workers_lost": sum(e.get("event") == "worker_lost" for e in mine),
            "workers_joined": sum(e.get("event") == "worker_joined" for e in mine),
            "status": status,
        }
    )
