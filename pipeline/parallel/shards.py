"""Putting rows on Dask workers: one shard per worker, staged from memory, Dask or files.

:func:`stage` gives every worker its share of the training rows as ONE object in its
memory (a :class:`hmdspt.core.shard.Shard`), held by the driver as a Dask future pinned to
that worker. The shard stays there between rounds: a round's task receives the future and
finds the rows already in the worker's memory, nothing is re-read or re-sent.

:mod:`hmdspt.parallel.rebalance` moves rows between workers once they are staged;
the files are read by :mod:`hmdspt.parallel.readers`.

Which rows go where
-------------------
Rows are dealt out by a seeded random permutation ``perm`` of ``range(n_rows)``:
the ``i``-th worker of ``counts`` (in the mapping's order) gets ``perm[o_i : o_i + n_i]``
with ``o_i`` the sum of the counts before it. Each shard is therefore a simple random
sample of the data set (class proportions within sampling noise), and the same data,
seed and counts give the same shards whatever the source (array, data frame or file).
A shard keeps its rows in that shuffled order, so any contiguous slice of it -- the
rows that :func:`hmdspt.parallel.rebalance.rebalance` moves -- is itself a random sample.
Every row carries its global row id (its position in the source), so shards can be audited.

Who reads what
--------------
- In-memory sources (numpy, pandas): the driver already holds the data; it cuts each
  worker's rows and sends them straight to that worker (``scatter(direct=True)``).
- Dask collections: the blocks are computed on the workers; per (block, worker) a task
  next to the block takes the rows the worker needs, and one task on the worker
  assembles its shard. The driver handles block lengths only.
- Paths (``.npz``, parquet file or directory, CSV): the driver reads metadata only (row
  count, column names and types, array headers); each worker opens the file itself and
  keeps only its own rows, streaming through it so a worker never holds more than its
  shard plus one chunk (parquet: one row group; CSV: ``csv_chunksize`` rows; npz: about
  16 MB of the member). The workers must see the same path as the driver.

Because the permutation spreads every worker's rows over the whole file, every worker
reads the whole file once; what it keeps is its share. Reading only one's own byte
range would be cheaper on I/O but would give each worker a contiguous, biased block.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor
from concurrent.futures import wait as wait_jobs
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import dask.base
import numpy as np
import pandas as pd
from distributed import Client, Future

from hmdspt.core.shard import (
    Shard,
    _as_features,
    _permutation,
    _shard_non_finite,
    _unique_labels,
    as_rows,
    take_rows,
)
from hmdspt.parallel.client import (
    WorkerLostError,
    _cluster_workers,
    _gone_workers,
    _wait_ok,
    scatter_to,
)
from hmdspt.parallel.readers import (
    _check_numeric,
    _csv_meta,
    _csv_shard,
    _is_numeric_dtype,
    _npz_meta,
    _npz_shard,
    _parquet_meta,
    _parquet_shard,
    _read_csv_shard,
    _read_npz_shard,
    _read_parquet_shard,
    _unique_target,
    empty_frame,
    file_meta,
    frame_parts,
    missing_label_error,
    missing_labels,
    npz_member,
    npz_part,
    read_frame_part,
    source_kind,
)

__all__ = [
    "DaskReader",
    "PathReader",
    "SecondWave",
    "SourceReader",
    "StagedData",
    "equal_counts",
    "stage",
    "stage_from",
]

#: The one line for an empty source, whichever path stages it.
NO_ROWS = "X has no rows (0 samples): nothing to train on"


# --------------------------------------------------------------------------------------
# Worker-side tasks (module level so tasks pickle by reference)
# --------------------------------------------------------------------------------------


def _take_block_rows(
    block: Any,
    block_start: int,
    perm: np.ndarray,
    start: int,
    stop: int,
    dtype: np.dtype | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # perm: or any ids, start 0, stop len
    """Rows of one block of a Dask collection that belong to shard ``perm[start:stop]``.

    Runs next to the block. Returns ``(positions in the shard, row ids, values)``;
    features are cast to ``dtype`` here so the smaller array is what travels.
    """
    ids = perm[start:stop]
    pos, local = _block_positions(ids, block_start, len(block))
    return pos, ids[pos], _block_values(block, local, dtype)


def _take_rows_of_blocks(
    x_block: Any,
    y_block: Any,
    w_block: Any,
    block_start: int,
    perm: np.ndarray,
    start: int,
    stop: int,
    dtype: np.dtype,
) -> tuple[tuple, tuple, tuple | None]:
    """:func:`_take_block_rows` of a block of X and of the blocks of y and the weights
    (None: none) that hold the same rows, in one task: their three pieces."""
    ids = perm[start:stop]
    pos, local = _block_positions(ids, block_start, len(x_block))
    gids = ids[pos]
    return (
        (pos, gids, _block_values(x_block, local, dtype)),
        (pos, gids, _block_values(y_block, local, None)),
        None if w_block is None else (pos, gids, _block_values(w_block, local, None)),
    )


def _block_starts(lengths: Sequence[int]) -> list[int]:
    """The first row of each block, from the blocks' lengths."""
    return [int(o) for o in np.concatenate([[0], np.cumsum(lengths)[:-1]])]


def _block_positions(ids: np.ndarray, block_start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions in ``ids`` of the rows of the block ``[block_start, block_start + n)``,
    and those rows' positions in the block."""
    pos = np.flatnonzero((ids >= block_start) & (ids < block_start + n))
    return pos, ids[pos] - block_start


def _block_values(block: Any, local: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    """Rows ``local`` of a block (array or frame), features cast to ``dtype``."""
    if hasattr(block, "iloc"):
        rows = block.iloc[local]
        # Features straight to ``dtype``, a nullable column's NA as NaN (refused after
        # staging, naming its row): bool and Int64 columns made an object array, whose
        # pd.NA float() refused in a traceback.
        values = rows.to_numpy() if dtype is None else rows.to_numpy(dtype, na_value=np.nan)
    else:
        values = np.asarray(block)[local]
    if dtype is not None:
        values = _as_features(values, dtype)
    return values


def _assemble_shard(
    x_parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    y_parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]] | None,
    n: int,
    n_features: int,
    dtype: np.dtype,
    w_parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None,
) -> Shard:
    """Worker side of :func:`stage` for Dask collections: put the block pieces together."""
    X = np.empty((n, n_features), dtype=dtype)
    row_ids = np.empty(n, dtype=np.int64)
    for pos, gids, values in x_parts:
        X[pos] = as_rows(values)
        row_ids[pos] = gids
    y = None
    if y_parts is not None:
        first = next(p[2] for p in y_parts if len(p[2])) if n else np.empty(0)
        y = np.empty((n, *first.shape[1:]), dtype=np.result_type(*(p[2] for p in y_parts)))
        for pos, _, values in y_parts:
            y[pos] = values
    weights = None
    if w_parts is not None:
        weights = np.empty(n, dtype=np.float64)
        for pos, _, values in w_parts:
            weights[pos] = np.asarray(values, dtype=np.float64).reshape(len(values))
    return Shard(X=X, y=y, row_ids=row_ids, weights=weights)


def _assemble_taken_together(
    parts: Sequence[tuple[tuple, tuple, tuple | None]], n: int, n_features: int, dtype: np.dtype
) -> Shard:
    """:func:`_assemble_shard` of the pieces :func:`_take_rows_of_blocks` took."""
    w_parts = [p[2] for p in parts] if parts and parts[0][2] is not None else None
    return _assemble_shard(
        [p[0] for p in parts], [p[1] for p in parts], n, n_features, dtype, w_parts
    )


# --------------------------------------------------------------------------------------
# Driver side
# --------------------------------------------------------------------------------------


@dataclass(eq=False)
class SecondWave:
    """The rest of each worker's rows, sent after the first wave while rounds train.

    Attributes
    ----------
    jobs : dict of str to concurrent.futures.Future
        Worker address -> the send of its rows, whose result is the Dask future of a
        :class:`~hmdspt.core.shard.Shard` on that worker.
    counts : dict of str to int
        Worker address -> rows on their way to it.
    ended : dict of str to float
        Worker address -> ``time.perf_counter()`` when its send ended (each send writes
        its own).
    """

    jobs: dict[str, Any]
    counts: dict[str, int]
    ended: dict[str, float] = field(default_factory=dict)

    @property
    def ended_at(self) -> float | None:
        """``time.perf_counter()`` when the last send that has ended ended."""
        return max(self.ended.values(), default=None)

    def landed(self) -> bool:
        """Whether every send has ended (landed, or failed with its worker)."""
        return all(job.done() for job in self.jobs.values())

    def take(self) -> tuple[dict[str, Future], set[str]]:
        """Wait for every send: the rows that landed, by worker, and the workers that left
        before theirs did (:class:`~hmdspt.parallel.client.WorkerLostError`). Another
        failure is raised, after releasing what landed."""
        landed: dict[str, Future] = {}
        lost: set[str] = set()
        try:
            for w, job in self.jobs.items():
                try:
                    landed[w] = job.result()
                except WorkerLostError:
                    lost.add(w)
        except BaseException:
            for fut in landed.values():
                fut.release()
            self.release()
            raise
        self.jobs = {}
        return landed, lost

    def release(self) -> None:
        """Nothing of the wave stays on the workers: sends not started are cancelled, the
        others waited for and their rows dropped."""
        for job in self.jobs.values():
            if job.cancel():
                continue
            try:
                job.result().release()
            except BaseException:  # a send that failed left nothing
                pass
        self.jobs = {}


@dataclass(eq=False)
class StagedData:
    """Rows staged on workers: one pinned future per worker, and what describes them.

    Attributes
    ----------
    client : Client
        The client the futures belong to.
    futures : dict of str to Future
        Worker address -> future of that worker's :class:`~hmdspt.core.shard.Shard`.
        Only workers holding rows appear.
    counts : dict of str to int
        Worker address -> rows it holds (same keys as ``futures``, all positive).
    n_features : int
        Columns of ``X``.
    feature_names : list of str or None
        Column names when the source had them.
    has_labels : bool
        Whether the shards carry ``y``.
    seed : int
        Seed of the staging permutation.
    source : str
        Short description of the source (for logs).
    second_wave : SecondWave or None
        The rows still on their way (``counts`` counts them), when staging sent a first
        wave only; the caller takes it over.
    """

    client: Client = field(repr=False)
    futures: dict[str, Future] = field(repr=False)
    counts: dict[str, int]
    n_features: int
    feature_names: list[str] | None = None
    has_labels: bool = True
    seed: int = 0
    source: str = ""
    second_wave: SecondWave | None = field(default=None, repr=False)

    @property
    def n_rows(self) -> int:
        """Total rows over all workers."""
        return sum(self.counts.values())

    @property
    def workers(self) -> list[str]:
        """Addresses of the workers holding rows."""
        return list(self.futures)

    def map_shards(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Future]:
        """Run ``func(shard, *args, **kwargs)`` on every worker, on its own shard.

        Each task is pinned to the shard's worker, so the shard never moves. ``func``
        should live in an importable module (pickled by reference, not by value).
        ``kwargs`` go to ``func``; names that ``Client.submit`` reserves (``key``,
        ``workers``, ``priority``, ...) cannot be passed this way.

        Returns
        -------
        futures : dict of str to Future
            Worker address -> future of the result.
        """
        return {
            addr: self.client.submit(
                func, fut, *args, workers=[addr], allow_other_workers=False, pure=False, **kwargs
            )
            for addr, fut in self.futures.items()
        }

    def unique_labels(self) -> np.ndarray:
        """Sorted distinct labels over all shards (computed on the workers).

        Only each shard's distinct labels travel to the driver.
        """
        if not self.has_labels:
            raise ValueError("the staged data has no labels")
        futures = self.map_shards(_unique_labels)
        _wait_ok(futures.values(), futures)  # a pinned task whose worker left: raise, not hang
        parts = self.client.gather(list(futures.values()))
        return np.unique(np.concatenate([p for p in parts if p is not None]))

    def first_non_finite(self, part: str = "X") -> tuple[int, int, float] | None:
        """``(row id, column, value)`` of the NaN or infinite feature (``part="X"``) or
        target (``"y"``) of the lowest row id over all shards (each worker looks at its
        own; only what it found travels)."""
        futures = self.map_shards(_shard_non_finite, part)
        _wait_ok(futures.values(), futures)
        found = [f for f in self.client.gather(list(futures.values())) if f is not None]
        return min(found) if found else None

    def release(self) -> None:
        """Drop the shards from the workers' memory."""
        for fut in self.futures.values():
            fut.release()
        self.futures = {}
        self.counts = {}


def equal_counts(n_rows: int, workers: Sequence[str]) -> dict[str, int]:
    """Equal shares of ``n_rows`` over ``workers`` (the first ones get the remainder).

    Parameters
    ----------
    n_rows : int
        Rows to share.
    workers : sequence of str
        Worker addresses, in the order the remainder is handed out.

    Returns
    -------
    counts : dict of str to int
    """
    if not workers:
        raise ValueError("no workers to share rows between")
    base, rem = divmod(int(n_rows), len(workers))
    return {w: base + (1 if i < rem else 0) for i, w in enumerate(workers)}


def _resolve_counts(
    client: Client, counts: Mapping[str, int] | None, n_rows: int, skip_lost: bool = False
) -> dict[str, int]:
    workers = _cluster_workers(client)
    if counts is None:
        return {w: c for w, c in equal_counts(n_rows, workers).items() if c > 0}
    unknown = [w for w in counts if w not in workers]
    if unknown and not skip_lost:  # with skip_lost they count as lost: left since planned
        raise ValueError(f"counts name unknown workers {unknown}; the cluster has {workers}")
    out: dict[str, int] = {}
    for w, c in counts.items():
        if int(c) != c or c < 0:
            raise ValueError(f"counts[{w!r}] = {c!r}: row counts must be non-negative integers")
        if c > 0:
            out[w] = int(c)
    total = sum(out.values())
    if total != n_rows:
        raise ValueError(f"counts sum to {total} but the data has {n_rows} rows")
    return out


def _bounds(counts: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    out, start = {}, 0
    for w, c in counts.items():
        out[w] = (start, start + c)
        start += c
    return out


def _wait_shards(futures: Mapping[str, Future], skip_lost: bool) -> dict[str, Future]:
    """Wait for the shards being built, each pinned to its worker (see :func:`stage`).

    With ``skip_lost`` the shards of workers that left are dropped and the others waited
    for; without it a worker that left raises
    :class:`~hmdspt.parallel.client.WorkerLostError`. On any failure every shard is
    released, so nothing stays on the workers.
    """
    live = dict(futures)
    try:
        while live:
            try:
                _wait_ok(live.values(), live)
                break
            except WorkerLostError:
                if not skip_lost:
                    raise
                gone = _gone_workers(next(iter(live.values())).client, live)
                if not gone:
                    raise
                for w in gone:
                    live.pop(w).release()
    except BaseException:
        for fut in live.values():
            fut.release()
        raise
    return live


@contextmanager
def _released(*futures: Sequence[Future]) -> Iterator[None]:
    """Release ``futures`` when the block ends, also when it raises: a block of data a
    failed read left would otherwise stay on the workers for as long as the error's
    traceback, which holds the list, is kept (a notebook keeps the last one)."""
    try:
        yield
    finally:
        for group in futures:
            for fut in group:
                fut.release()


def _is_dask(obj: Any) -> bool:
    return hasattr(obj, "__dask_graph__") and hasattr(obj, "to_delayed")


def _split_target(frame: Any, target: str | None, y: Any, where: str) -> tuple[Any, Any]:
    """Split a (pandas or Dask) data frame into features and the ``target`` column."""
    if target is None:
        return frame, y
    if y is not None:
        raise ValueError("pass the labels either as y or as target=, not both")
    if target not in frame.columns:
        raise ValueError(
            f"{where}: target column {target!r} not found; columns are {list(frame.columns)}"
        )
    return frame.drop(columns=[target]), frame[target]


def stage(
    client: Client,
    X: Any,
    y: Any = None,
    counts: Mapping[str, int] | None = None,
    *,
    seed: int | None = 0,
    target: str | None = None,
    x_key: str | None = None,
    dtype: Any = np.float32,
    csv_chunksize: int = 65_536,
    skip_lost: bool = False,
    key_name: Callable[[str], str] | None = None,
    first_wave: float = 1.0,
) -> StagedData:
    """Put the rows of a data set on the workers, ``counts[address]`` rows each.

    Parameters
    ----------
    client : Client
        A synchronous ``distributed.Client``.
    X : array-like, DataFrame, Dask array or DataFrame, or path
        The features (and, for data frames and files, possibly the labels; see
        ``target``). A path (str or ``os.PathLike``) names an ``.npz`` file, a parquet
        file (``.parquet``, ``.pq``) or a directory of parquet files (row order as
        ``pyarrow.parquet.read_table`` gives it), or a CSV file with a header (``.csv``,
        optionally ``.gz``/``.bz2``/``.xz``/``.zst``). For paths each worker reads its own
        rows; the driver reads metadata only.
    y : array-like, Series, Dask array or Series, optional
        Labels, when not part of ``X``. Not accepted with a path.
    counts : mapping of str to int, optional
        Worker address -> rows it gets; the counts must sum to the number of rows, and
        workers given 0 get nothing. Default: equal shares over all workers of the cluster.
    seed : int or None, default=0
        Seed of the permutation that deals out the rows. None draws one (recorded in
        the result's ``seed``).
    target : str, optional
        Name of the label column of a data frame, parquet or CSV source, or of the
        label array of an ``.npz`` file. For ``.npz`` the default is the partner of the
        X key among :data:`hmdspt.parallel.readers.NPZ_KEY_PAIRS` (``y`` for ``X``,
        ``y_train`` for ``X_train``; generally ``"y" + x_key[1:]``), or none when absent.
    x_key : str, optional
        Name of the feature array in an ``.npz`` file. Default: the first of ``X``,
        ``X_train``, ``x``, ``data`` present.
    dtype : dtype, default=np.float32
        dtype of the shards' ``X``.
    csv_chunksize : int, default=65536
        Rows a worker parses at a time from a CSV file.
    skip_lost : bool, default=False
        A worker of ``counts`` that leaves the cluster while the rows are staged (or has
        left since ``counts`` was planned): False releases every shard staged so far and
        raises :class:`~hmdspt.parallel.client.WorkerLostError`; True leaves that worker
        out and stages the others' shards as planned. Its rows are then staged nowhere: the result's
        ``n_rows`` is short of the data's, and the caller re-stages them (see
        :func:`hmdspt.parallel.rebalance.add_rows`). The result may hold no worker at all.
    key_name : callable, optional
        ``key_name(worker) -> key`` names the key of each shard scattered from memory
        (default: one Dask makes up). The trainer names them after its run
        (:func:`hmdspt.parallel.worker.run_key`), so that a worker frees what an
        interrupted scatter of an ended run left behind.
    first_wave : float, default=1.0
        Arrays in memory: the fraction of each worker's rows sent before this returns;
        the rest is sent in the background, one worker at a time, and returned as the
        result's ``second_wave`` (:class:`SecondWave`), which the caller joins or
        releases. 1: every row before this returns (other sources always).

    Returns
    -------
    staged : StagedData
        The shard futures (pinned to their workers) and their counts.

    Raises
    ------
    FileNotFoundError
        A path that does not exist.
    ValueError
        Unknown file type, missing target column or key, X and y of different lengths,
        counts that name unknown workers (without ``skip_lost``) or do not sum to the
        number of rows.
    TypeError
        Non-numeric feature columns.
    WorkerLostError
        Without ``skip_lost``: a worker left the cluster while its rows were staged.

    Notes
    -----
    A compressed ``.npz`` member cannot be memory-mapped: each worker decompresses the
    members as a stream (about 16 MB at a time) and keeps only its rows, so every worker
    reads the whole file but never holds more than its share plus one chunk. Members
    stored without compression are read the same way (the random assignment touches
    every page anyway).

    In-memory arrays are cut on the driver, one shard gathered while the previous one is
    sent, so the driver holds up to two shards beside ``X``. Rows gather fastest from a
    C-contiguous ``X`` (from a Fortran-ordered one each row is strided over the array).
    """
    dtype = np.dtype(dtype)
    if seed is None:
        seed = int(np.random.SeedSequence().generate_state(1)[0])
    seed = int(seed)
    if isinstance(X, (str, os.PathLike)):
        if y is not None:
            raise ValueError("with a path, the labels come from the file: use target=, not y")
        return _stage_path(
            client, os.fspath(X), counts, seed, target, x_key, dtype, csv_chunksize, skip_lost
        )
    if x_key is not None:
        raise ValueError("x_key= applies to .npz paths only")
    if _is_dask(X) or _is_dask(y):
        return _stage_dask(client, X, y, counts, seed, target, dtype, skip_lost)
    return _stage_memory(client, X, y, counts, seed, target, dtype, skip_lost, key_name, first_wave)


def _stage_memory(
    client: Client,
    X: Any,
    y: Any,
    counts: Mapping[str, int] | None,
    seed: int,
    target: str | None,
    dtype: np.dtype,
    skip_lost: bool = False,
    key_name: Callable[[str], str] | None = None,
    first_wave: float = 1.0,
) -> StagedData:
    feature_names = None
    if isinstance(X, pd.DataFrame):
        X, y = _split_target(X, target, y, "DataFrame")
        _check_numeric(
            {str(c): _is_numeric_dtype(t) for c, t in X.dtypes.items()}, "DataFrame", y is not None
        )
        feature_names = [str(c) for c in X.columns]
    elif target is not None:
        raise ValueError("target= names a column: pass a DataFrame, a path, or the labels as y")
    if isinstance(X, pd.Series):
        X = X.to_frame()
    if not hasattr(X, "iloc"):
        X = np.asarray(X)
        if X.ndim not in (1, 2):
            raise ValueError(f"X must be 1- or 2-dimensional, got shape {X.shape}")
    if y is not None:
        y = y.to_numpy() if hasattr(y, "to_numpy") else np.asarray(y)
        if len(y) != len(X):
            raise ValueError(f"X has {len(X)} rows but y has {len(y)}")
    n_rows = len(X)
    if n_rows == 0:
        raise ValueError(NO_ROWS)
    n_features = 1 if X.ndim == 1 else X.shape[1]
    counts = _resolve_counts(client, counts, n_rows, skip_lost)
    perm = _permutation(seed, n_rows)
    futures: dict[str, Future] = {}
    lost = _gone_workers(client, counts) if skip_lost else set()
    # Two shards go out at once, each on its worker's own link, the largest first; the
    # next is gathered when one has landed. The driver holds at most two shards.
    sending: dict[str, Any] = {}  # worker -> its scatter job

    def land(worker: str) -> None:
        """Take a finished scatter's future; a worker that left is skipped or raised."""
        job = sending.pop(worker)
        try:
            futures[worker] = job.result()
        except WorkerLostError:
            if not skip_lost:
                raise
            lost.add(worker)

    bounds = _bounds(counts)
    rest: dict[str, tuple[int, int]] = {}  # the second wave's rows, by worker
    if first_wave < 1:
        for w, (start, stop) in list(bounds.items()):
            cut = min(start + max(1, math.ceil(first_wave * (stop - start))), stop)
            bounds[w] = (start, cut)
            if cut < stop:
                rest[w] = (cut, stop)

    def shard_of(start: int, stop: int) -> Shard:
        ids = perm[start:stop].copy()
        rows = X.iloc[ids].to_numpy(dtype=dtype) if hasattr(X, "iloc") else take_rows(X, ids, dtype)
        return Shard(
            X=_as_features(rows, dtype),
            y=None if y is None else np.ascontiguousarray(take_rows(y, ids)),
            row_ids=ids,
        )

    order = sorted((w for w in bounds if w not in lost), key=lambda w: -counts[w])
    try:
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="hmdspt-stage") as sender:
            for w in order:
                if len(sending) == 2:
                    done, _ = wait_jobs(sending.values(), return_when=FIRST_COMPLETED)
                    first = next(iter(done))
                    land(next(a for a, job in sending.items() if job is first))
                shard = shard_of(*bounds[w])
                # Driver -> worker, not through the scheduler, and without tokenising
                # (hashing) the whole shard.
                key = None if key_name is None else key_name(w)
                sending[w] = sender.submit(scatter_to, client, shard, w, key=key)
                del shard
            for w in list(sending):
                land(w)
    except BaseException:
        # Nothing stays on the workers: the shards sent, and those still in flight.
        for job in sending.values():
            if job.done() and job.exception() is None:
                job.result().release()
            else:  # still sending: released when it lands
                job.add_done_callback(lambda j: j.exception() is None and j.result().release())
        for fut in futures.values():
            fut.release()
        raise
    futures = {w: futures[w] for w in counts if w in futures}  # in the workers' order
    staged_counts = {w: counts[w] for w in futures}
    staged = StagedData(
        client, futures, staged_counts, n_features, feature_names, y is not None, seed, "memory"
    )
    rest = {w: rest[w] for w in sorted(rest, key=lambda w: -counts[w]) if w in futures}
    if rest:
        # One send at a time, largest first, in a thread of its own: the driver holds one
        # more shard while the first rounds train.
        later = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hmdspt-second-wave")

        ended: dict[str, float] = {}

        def send(w: str) -> Future:
            key = None if key_name is None else key_name(w)
            try:
                return scatter_to(client, shard_of(*rest[w]), w, key=key)
            finally:
                ended[w] = time.perf_counter()

        staged.second_wave = SecondWave(
            {w: later.submit(send, w) for w in rest},
            {w: stop - start for w, (start, stop) in rest.items()},
            ended,
        )
        later.shutdown(wait=False)
    return staged


def _dask_blocks(client: Client, obj: Any) -> tuple[list[Future], list[int]]:
    """Compute the row blocks of a Dask collection on the workers (or scatter a local one)."""
    if not _is_dask(obj):
        obj = obj.to_numpy() if hasattr(obj, "to_numpy") else np.asarray(obj)
        return [client.scatter(obj, direct=True, hash=False)], [len(obj)]
    delayed = _delayed_blocks(obj)
    lengths = list(obj.chunks[0]) if hasattr(obj, "chunks") else [np.nan] * len(delayed)
    blocks = client.compute(delayed)
    if any(np.isnan(v) for v in lengths):
        lengths = client.gather(client.map(len, blocks, pure=False))
    return blocks, [int(v) for v in lengths]


def _submit_pieces(
    client: Client,
    blocks: list[Future],
    lengths: list[int],
    perm: Future,
    start: int,
    stop: int,
    cast: np.dtype | None,
) -> list[Future]:
    """One :func:`_take_block_rows` task per block for the shard ``perm[start:stop]``."""
    # No worker restriction: Dask runs each piece next to its block. One map, one message
    # to the scheduler for all the blocks (a submit each cost the driver over a millisecond).
    return client.map(
        _take_block_rows,
        blocks,
        _block_starts(lengths),
        perm=perm,
        start=start,
        stop=stop,
        dtype=cast,
        pure=False,
    )


def _stage_dask(
    client: Client,
    X: Any,
    y: Any,
    counts: Mapping[str, int] | None,
    seed: int,
    target: str | None,
    dtype: np.dtype,
    skip_lost: bool = False,
) -> StagedData:
    feature_names = None
    if hasattr(X, "columns"):
        X, y = _split_target(X, target, y, "Dask DataFrame")
        _check_numeric(
            {str(c): _is_numeric_dtype(t) for c, t in X.dtypes.items()},
            "Dask DataFrame",
            y is not None,
        )
        feature_names = [str(c) for c in X.columns]
        n_features = len(feature_names)
    else:
        if target is not None:
            raise ValueError("target= names a column: pass a DataFrame or the labels as y")
        if X.ndim not in (1, 2):
            raise ValueError(f"X must be 1- or 2-dimensional, got {X.ndim} dimensions")
        n_features = 1 if X.ndim == 1 else int(X.shape[1])
    x_blocks, x_lengths = _dask_blocks(client, X)
    n_rows = sum(x_lengths)
    y_blocks, y_lengths = _dask_blocks(client, y) if y is not None else (None, None)
    if y_lengths is not None and sum(y_lengths) != n_rows:
        raise ValueError(f"X has {n_rows} rows but y has {sum(y_lengths)}")
    if n_rows == 0:
        raise ValueError(NO_ROWS)
    counts = _resolve_counts(client, counts, n_rows, skip_lost)
    perm = client.submit(_permutation, seed, n_rows, pure=False)
    futures: dict[str, Future] = {}
    lost = _gone_workers(client, counts) if skip_lost else set()
    for w, (start, stop) in _bounds(counts).items():
        if w in lost:
            continue
        y_pieces = None
        if y_blocks is not None:
            y_pieces = _submit_pieces(client, y_blocks, y_lengths, perm, start, stop, None)
        futures[w] = client.submit(
            _assemble_shard,
            _submit_pieces(client, x_blocks, x_lengths, perm, start, stop, dtype),
            y_pieces,
            stop - start,
            n_features,
            dtype,
            workers=[w],
            allow_other_workers=False,
            pure=False,
        )
    futures = _wait_shards(futures, skip_lost)
    # The blocks and pieces are released when their futures go out of scope here.
    counts = {w: counts[w] for w in futures}
    return StagedData(
        client, futures, counts, n_features, feature_names, y is not None, seed, "dask"
    )


def _stage_path(
    client: Client,
    path: str,
    counts: Mapping[str, int] | None,
    seed: int,
    target: str | None,
    x_key: str | None,
    dtype: np.dtype,
    csv_chunksize: int,
    skip_lost: bool = False,
) -> StagedData:
    reader = PathReader(path, target, x_key)
    return stage_from(client, reader, counts, seed, dtype, skip_lost, csv_chunksize=csv_chunksize)


def stage_from(
    client: Client,
    reader: SourceReader,
    counts: Mapping[str, int] | None,
    seed: int,
    dtype: Any,
    skip_lost: bool = False,
    then: Callable[[dict[str, Future]], dict[str, Future]] | None = None,
    **read_kw: Any,
) -> StagedData:
    """Stage what ``reader`` names: every worker reads its slice of the permutation.

    ``then(futures) -> futures`` runs on the shards before they are waited for (e.g.
    encoding their labels on the workers). ``skip_lost`` as in :func:`stage`.
    """
    counts = _resolve_counts(client, counts, reader.n_rows, skip_lost)
    lost = frozenset(_gone_workers(client, counts) if skip_lost else ())
    read = reader.read_dealt(client, seed, counts, dtype=dtype, skip=lost, **read_kw)
    try:
        futures = _wait_shards(read if then is None else then(read), skip_lost)
    except BaseException:
        # The rows read before a failure (a worker found a NaN in its slice) go now, not
        # once the driver's garbage collector breaks the traceback's cycle with this frame.
        for fut in read.values():
            fut.release()
        raise
    return StagedData(
        client,
        futures,
        {w: counts[w] for w in futures},
        reader.n_features,
        reader.feature_names,
        reader.labelled,
        seed,
        reader.describe(),
    )


# --------------------------------------------------------------------------------------
# Readers: data the workers read, for a fit that stages it and re-stages lost rows
# --------------------------------------------------------------------------------------


def dealt_slices(
    counts: Mapping[str, int], skip: frozenset[str] = frozenset()
) -> dict[str, tuple[int, int]]:
    """Each worker's slice ``[start, stop)`` of the staging permutation (``counts`` order).

    Workers in ``skip`` keep their place in the order but get no slice.
    """
    bounds = _bounds({w: c for w, c in counts.items() if c > 0})
    return {w: b for w, b in bounds.items() if w not in skip}


class SourceReader:
    """Data that the workers read (a Dask collection or a path), by the rows they keep.

    A worker's rows are named either by its slice of the staging permutation
    (:meth:`read_dealt`, a fresh staging) or by their row ids (:meth:`read_ids`, rows of
    a lost worker read again from the source). The driver holds metadata only.

    Attributes
    ----------
    n_rows, n_features : int
    feature_names : list of str or None
    """

    n_rows: int
    n_features: int
    feature_names: list[str] | None = None
    labelled: bool = True  # whether the rows come with labels

    @staticmethod
    def of(
        client: Client,
        X: Any,
        y: Any = None,
        *,
        target: str | None = None,
        x_key: str | None = None,
        sample_weight: Any = None,
    ) -> SourceReader:
        """The reader of ``X`` (a path or a Dask collection) on ``client``'s cluster.

        ``sample_weight`` (a Dask array or Series, or an array) is read beside the rows
        of a Dask collection; a path takes none.
        """
        if isinstance(X, (str, os.PathLike)):
            if y is not None:
                raise ValueError("with a path, the labels come from the file: use target=, not y")
            if sample_weight is not None:
                raise ValueError(
                    "a path's reader takes no sample_weight: read the path as a Dask DataFrame "
                    "with frame_of (as fit does) and weigh its rows"
                )
            return PathReader(os.fspath(X), target, x_key)
        if x_key is not None:
            raise ValueError("x_key= applies to .npz paths only")
        return DaskReader(client, X, y, target, sample_weight)

    def unique_labels(self, client: Client) -> np.ndarray:
        """Sorted distinct labels, found on the workers (only they reach the driver)."""
        raise NotImplementedError

    @property
    def n_targets(self) -> int:
        """Columns of the labels (1 for a label column or a 1-D array)."""
        return 1

    def describe(self) -> str:
        """Short description of the source (for logs)."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        """The source as an error message names it (a path, or "Dask input")."""
        raise NotImplementedError

    def read_dealt(
        self,
        client: Client,
        seed: int,
        counts: Mapping[str, int],
        *,
        dtype: Any,
        skip: frozenset[str] = frozenset(),
        **kw: Any,
    ) -> dict[str, Future]:
        """Worker -> future of its :class:`Shard` of its slice of the permutation.

        Workers in ``skip`` (left since ``counts`` was planned) read nothing; the others'
        slices stay where ``counts`` puts them.
        """
        raise NotImplementedError

    def read_ids(
        self, client: Client, ids: Mapping[str, np.ndarray], *, dtype: Any, **kw: Any
    ) -> dict[str, Future]:
        """Worker -> future of a :class:`Shard` of rows ``ids[worker]``, read on it."""
        raise NotImplementedError


class DaskReader(SourceReader):
    """A Dask array or DataFrame (with labels as ``y`` or the column ``target``)."""

    def __init__(
        self, client: Client, X: Any, y: Any, target: str | None, weights: Any = None
    ) -> None:
        if hasattr(X, "columns"):
            X, y = _split_target(X, target, y, "Dask DataFrame")
            _check_numeric(
                {str(c): _is_numeric_dtype(t) for c, t in X.dtypes.items()},
                "Dask DataFrame",
                y is not None,
            )
            self.feature_names = [str(c) for c in X.columns]
            self.n_features = len(self.feature_names)
        else:
            if target is not None:
                raise ValueError("target= names a column: pass a DataFrame or the labels as y")
            if X.ndim not in (1, 2):
                raise ValueError(f"X must be 1- or 2-dimensional, got {X.ndim} dimensions")
            self.n_features = 1 if X.ndim == 1 else int(X.shape[1])
        if y is None:
            raise ValueError("no labels: pass y, or name the label column with target=")
        # Each collection's blocks, built once for the counts, the labels and every read.
        parts = []
        if not _is_dask(y) or (weights is not None and not _is_dask(weights)):
            # In-memory labels or weights go in the feature blocks' rows: counted first.
            parts = blocks_and_lengths(client, [X])
            y = _in_blocks_of(y, parts[0][1])
            weights = None if weights is None else _in_blocks_of(weights, parts[0][1])
        self.X, self.y, self.weights = X, y, weights
        rest = [X, y, weights][len(parts) :]
        parts += blocks_and_lengths(client, [p for p in rest if p is not None])
        (self._x_blocks, self.x_lengths), (self._y_blocks, self.y_lengths) = parts[:2]
        self._w_blocks, self.w_lengths = parts[2] if weights is not None else (None, None)
        self.n_rows = sum(self.x_lengths)
        if sum(self.y_lengths) != self.n_rows:
            raise ValueError(f"X has {self.n_rows} rows but y has {sum(self.y_lengths)}")
        if self.w_lengths is not None and sum(self.w_lengths) != self.n_rows:
            raise ValueError(
                f"sample_weight.shape == ({sum(self.w_lengths)},), expected ({self.n_rows},)"
            )
        if self.n_rows == 0:
            raise ValueError(NO_ROWS)

    def describe(self) -> str:
        return "dask"

    @property
    def name(self) -> str:
        return "Dask input"

    def unique_labels(self, client: Client) -> np.ndarray:
        # Per block on the workers: only each block's distinct labels travel (no shuffle).
        blocks = client.compute(self._y_blocks)
        distinct = client.map(_distinct, blocks, pure=False)
        with _released(blocks, distinct):  # now, also when a missing label is refused below
            found = client.gather(distinct)
        starts = np.cumsum([0, *self.y_lengths[:-1]])
        missing = [start + first for (_, first), start in zip(found, starts) if first >= 0]
        if missing:  # np.unique of them failed with "boolean value of NA is ambiguous"
            raise missing_label_error(self.name, min(missing))
        return np.unique(np.concatenate([labels for labels, _ in found]))

    @property
    def n_targets(self) -> int:
        return 1 if getattr(self.y, "ndim", 1) == 1 else int(self.y.shape[1])

    def _read(self, client: Client, plans: Mapping[str, tuple], dtype: Any) -> dict[str, Future]:
        dtype = np.dtype(dtype)
        # In one call: X and y cut from one frame share its partitions' keys, read once.
        blocks = client.compute([*self._x_blocks, *self._y_blocks, *(self._w_blocks or [])])
        n_x, n_xy = len(self._x_blocks), len(self._x_blocks) + len(self._y_blocks)
        x_blocks, y_blocks = blocks[:n_x], blocks[n_x:n_xy]
        w_blocks = None if self._w_blocks is None else blocks[n_xy:]
        # Blocks of X, y and the weights that hold the same rows (a frame's columns, arrays
        # of one chunking) give their pieces in one task a block, not one a collection.
        together = self.y_lengths == self.x_lengths and self.w_lengths in (None, self.x_lengths)
        futures = {}
        for w, (rows, start, stop) in plans.items():
            if together:
                pieces = client.map(
                    _take_rows_of_blocks,
                    x_blocks,
                    y_blocks,
                    [None] * len(x_blocks) if w_blocks is None else w_blocks,
                    _block_starts(self.x_lengths),
                    perm=rows,
                    start=start,
                    stop=stop,
                    dtype=dtype,
                    pure=False,
                )
                futures[w] = client.submit(
                    _assemble_taken_together,
                    pieces,
                    stop - start,
                    self.n_features,
                    dtype,
                    workers=[w],
                    allow_other_workers=False,
                    pure=False,
                )
                continue
            w_pieces = None
            if w_blocks is not None:
                w_pieces = _submit_pieces(client, w_blocks, self.w_lengths, rows, start, stop, None)
            futures[w] = client.submit(
                _assemble_shard,
                _submit_pieces(client, x_blocks, self.x_lengths, rows, start, stop, dtype),
                _submit_pieces(client, y_blocks, self.y_lengths, rows, start, stop, None),
                stop - start,
                self.n_features,
                dtype,
                w_pieces,
                workers=[w],
                allow_other_workers=False,
                pure=False,
            )
        return futures  # the blocks are released once the shards no longer need them

    def read_dealt(self, client, seed, counts, *, dtype, skip=frozenset(), **kw):
        perm = client.submit(_permutation, seed, self.n_rows, pure=False)
        slices = dealt_slices(counts, skip)
        return self._read(client, {w: (perm, lo, hi) for w, (lo, hi) in slices.items()}, dtype)

    def read_ids(self, client, ids, *, dtype, **kw):
        plans = {}
        for w, rows in ids.items():
            # Sent once to the worker that keeps them, not with every block's task.
            plans[w] = (client.scatter(np.asarray(rows, np.int64), workers=[w]), 0, len(rows))
        return self._read(client, plans, dtype)


def _distinct(block: Any) -> tuple[np.ndarray, int]:
    """A block's distinct labels and the position of its first missing one (-1: none)."""
    values = np.asarray(block)
    missing = np.flatnonzero(missing_labels(values))
    if len(missing):
        return values[:0], int(missing[0])
    return np.unique(values), -1


def _delayed_blocks(obj: Any) -> list[Any]:
    """A Dask collection's row blocks as delayed objects (a dask array's columns in one)."""
    if hasattr(obj, "chunks"):  # dask array: one block per row chunk
        if obj.ndim == 2 and len(obj.chunks[1]) > 1:
            obj = obj.rechunk({1: -1})
        # Unoptimised, so that each key keeps one task in every call: X and y masked by
        # one mask share its keys, which each call's fusion made into other tasks (the
        # scheduler's "Detected different `run_spec` for key", dask/dask#9888).
        return list(obj.to_delayed(optimize_graph=False).ravel())
    # A data frame's to_delayed makes a new collection, which warns (once a process) that
    # annotations, here the fit's span, are ignored with query planning: taken outside them.
    with _no_annotations():
        return list(obj.to_delayed())


@contextmanager
def _no_annotations() -> Iterator[None]:
    """No Dask annotations in this context (the variable ``dask.annotate`` sets; this
    thread or task only). The tasks computed from what it makes still join the span: the
    client adds the annotations in force when it submits them."""
    annotations = getattr(dask.base, "_annotations", None)
    if annotations is None:  # another Dask: at worst its warning is shown
        yield
        return
    token = annotations.set(None)
    try:
        yield
    finally:
        annotations.reset(token)


def _in_blocks_of(values: Any, lengths: Sequence[int]) -> Any:
    """In-memory labels or weights (numpy, pandas, a list) as a Dask array in the row
    blocks of the Dask features they go with; Dask ones as they are."""
    if _is_dask(values):
        return values
    import dask.array as da

    values = np.asarray(values)
    if len(values) != sum(lengths):  # the caller names the mismatch
        return da.from_array(values)
    return da.from_array(values, chunks=(tuple(lengths), *values.shape[1:]))


def _block_lengths(client: Client | None, obj: Any) -> list[int]:
    """Rows of each block; unknown ones are counted on the workers (only counts travel),
    ``client``'s or, with None, those of Dask's current scheduler."""
    return blocks_and_lengths(client, [obj])[0][1]


def blocks_and_lengths(
    client: Client | None, objs: Sequence[Any]
) -> list[tuple[list[Any], list[int]]]:
    """Each Dask collection's row blocks (:func:`_delayed_blocks`) and their lengths.

    Lengths a collection does not know are counted on the workers (only counts travel),
    ``client``'s or, with None, those of Dask's current scheduler, for all collections in
    one wait (X, y and the weights of a data frame had a round trip each), and each
    collection's graph is built once, for its blocks and their counts.
    """
    blocks = [_delayed_blocks(obj) for obj in objs]
    lengths: list[list[int] | None] = [
        [int(v) for v in obj.chunks[0]]
        if hasattr(obj, "chunks") and not any(np.isnan(v) for v in obj.chunks[0])
        else None
        for obj in objs
    ]
    unknown = [b for b, n in zip(blocks, lengths) if n is None]
    if unknown:
        flat = [block for part in unknown for block in part]
        if client is None:
            counts = dask.compute(*[dask.delayed(len)(block) for block in flat])
        else:
            computed = client.compute(flat)
            counted_on_workers = client.map(len, computed, pure=False)
            with _released(computed, counted_on_workers):  # the blocks go; the counts stay
                counts = client.gather(counted_on_workers)
        counted = iter(int(v) for v in counts)
        lengths = [
            [next(counted) for _ in part] if n is None else n for part, n in zip(blocks, lengths)
        ]
    return [(b, n) for b, n in zip(blocks, lengths)]


class PathReader(SourceReader):
    """An ``.npz`` file, a parquet file or folder, or a CSV file, read on the workers."""

    def __init__(self, path: str, target: str | None, x_key: str | None) -> None:
        path, kind = source_kind(path, x_key)  # the checks and messages read_file gives
        self.path, self.kind, self.target = path, kind, target
        meta = file_meta(path, kind, x_key, target)
        if kind == "npz":
            self.feature_names = None
            self.labelled = meta["y_key"] is not None
        else:
            self.feature_names = meta["features"]
            self.labelled = target is not None
            meta["n_features"] = len(self.feature_names)
        self.meta = meta
        self.n_rows, self.n_features = meta["n_rows"], meta["n_features"]
        if self.n_rows == 0:
            raise ValueError(f"{path} has no rows")

    def describe(self) -> str:
        return f"{self.kind}:{self.path}"

    @property
    def name(self) -> str:
        return self.path

    def unique_labels(self, client: Client) -> np.ndarray:
        if not self.labelled:
            raise ValueError(f"{self.path}: no labels; name the label column with target=")
        task = client.submit(
            _unique_target, self.kind, self.path, self.meta, self.target, self.n_rows, pure=False
        )
        return np.asarray(task.result())

    def read_dealt(
        self, client, seed, counts, *, dtype, skip=frozenset(), csv_chunksize=65_536, **kw
    ):
        meta, names = self.meta, self.feature_names
        futures = {}
        for w, (start, stop) in dealt_slices(counts, skip).items():
            if self.kind == "npz":
                args = (_read_npz_shard, self.path, meta["x_key"], meta["y_key"])
            elif self.kind == "parquet":
                args = (_read_parquet_shard, meta["files"], names, self.target)
            else:
                args = (_read_csv_shard, self.path, names, self.target)
            extra = (csv_chunksize,) if self.kind == "csv" else ()
            futures[w] = client.submit(
                *args,
                seed,
                self.n_rows,
                start,
                stop,
                np.dtype(dtype),
                *extra,
                workers=[w],
                allow_other_workers=False,
                pure=False,
            )
        return futures

    def read_ids(self, client, ids, *, dtype, csv_chunksize=65_536, **kw):
        meta, names, dtype = self.meta, self.feature_names, np.dtype(dtype)
        futures = {}
        for w, rows in ids.items():
            rows = np.asarray(rows, np.int64)
            if self.kind == "npz":
                call = (
                    _npz_shard,
                    self.path,
                    meta["x_key"],
                    meta["y_key"],
                    rows,
                    self.n_rows,
                    dtype,
                )
            elif self.kind == "parquet":
                call = (_parquet_shard, meta["files"], names, self.target, rows, self.n_rows, dtype)
            else:
                call = (
                    _csv_shard,
                    self.path,
                    names,
                    self.target,
                    rows,
                    self.n_rows,
                    dtype,
                    csv_chunksize,
                )
            futures[w] = client.submit(*call, workers=[w], allow_other_workers=False, pure=False)
        return futures


def frame_of(path: str | os.PathLike, target: str | None = None, *, classes: bool = False) -> Any:
    """A parquet or CSV source as a Dask DataFrame whose partitions the workers read.

    The reading rule is :mod:`hmdspt.parallel.readers`' (suffixes, globs, metadata checks
    and their messages), the one staging and ``read_file`` use; only metadata is read
    here. ``classes``: the ``target`` column holds class labels, so a NaN of a numeric one
    is refused as a missing label, by its file row, as the partition is read.

    Raises
    ------
    FileNotFoundError, ValueError, TypeError
        As :func:`hmdspt.parallel.readers.read_file` words them; ValueError for ``.npz``
        (arrays, not a table: pass its path to ``fit``).
    """
    import dask.dataframe as dd

    path, kind = source_kind(path)
    if kind == "npz":
        raise ValueError(f"{path}: an .npz file holds arrays, not a table; pass its path to fit")
    meta = _parquet_meta(path, target) if kind == "parquet" else _csv_meta(path, target)
    if meta["n_rows"] == 0:
        raise ValueError(f"{path} has no rows")
    columns = [*meta["features"], *([] if target is None else [target])]
    parts = frame_parts(kind, path, meta)
    empty = empty_frame(kind, parts[0], columns)  # no rows read on the driver
    return dd.from_map(
        read_frame_part,
        parts,
        kind=kind,
        columns=columns,
        features=meta["features"],
        target=target,
        numeric_labels=classes,
        meta=empty,
    )


#: Rows of an ``.npz`` file in one block of :func:`npz_arrays`.
NPZ_BLOCK_ROWS = 262_144


def npz_arrays(
    path: str | os.PathLike, y_key: str | None = None, *, x_key: str | None = None,
    dtype: Any = np.float32,
) -> tuple[Any, Any]:  # fmt: skip
    """An ``.npz`` file's features and labels as Dask arrays whose blocks the workers read.

    The file is read by :mod:`hmdspt.parallel.readers`' rule (keys, checks, messages);
    only the members' headers are read here. Returns ``(X, y)``; ``y`` is None when the
    file has no labels.
    """
    import dask
    import dask.array as da

    path, kind = source_kind(path, x_key)
    if kind != "npz":
        raise ValueError(f"{path}: not an .npz file")
    meta = _npz_meta(path, x_key, y_key)
    n, width, dtype = meta["n_rows"], meta["n_features"], np.dtype(dtype)
    if n == 0:
        raise ValueError(f"{path} has no rows")
    y_shape, y_dtype = (None, None) if meta["y_key"] is None else npz_member(path, meta["y_key"])
    xs, ys = [], []
    for start in range(0, n, NPZ_BLOCK_ROWS):
        stop = min(start + NPZ_BLOCK_ROWS, n)
        part = dask.delayed(npz_part, pure=True)(
            path, meta["x_key"], meta["y_key"], start, stop, n, dtype
        )
        xs.append(da.from_delayed(part.X, (stop - start, width), dtype))
        if y_dtype is not None:
            ys.append(da.from_delayed(part.y, (stop - start, *y_shape[1:]), y_dtype))
    return da.concatenate(xs), (da.concatenate(ys) if ys else None)
