"""Putting rows on Dask workers and moving them between workers.

:func:`stage` gives every worker its share of the training rows as ONE object in its
memory (a :class:`Shard`), held by the driver as a Dask future pinned to that worker.
The shard stays there between rounds: a round's task receives the future and finds the
rows already in the worker's memory, nothing is re-read or re-sent.

:func:`rebalance` carries out a move plan (see :mod:`hmdspt.core.partition`) worker to
worker: the sender cuts the moving rows off its shard, the receiver concatenates them
onto its own, and Dask ships the slice between the two workers; the rows never reach
the driver.

Which rows go where
-------------------
Rows are dealt out by a seeded random permutation ``perm`` of ``range(n_rows)``:
the ``i``-th worker of ``counts`` (in the mapping's order) gets ``perm[o_i : o_i + n_i]``
with ``o_i`` the sum of the counts before it. Each shard is therefore a simple random
sample of the data set (class proportions within sampling noise), and the same data,
seed and counts give the same shards whatever the source (array, data frame or file).
A shard keeps its rows in that shuffled order, so any contiguous slice of it -- the
rows that :func:`rebalance` moves -- is itself a random sample. Every row carries its
global row id (its position in the source), so shards can be audited.

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

import os
import time
import zipfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
from distributed import Client, Future, wait

__all__ = [
    "Shard",
    "StagedData",
    "WorkerLostError",
    "equal_counts",
    "rebalance",
    "scatter_to",
    "scheduler_workers",
    "stage",
    "wait_some",
]

#: (X key, y key) pairs tried in order when an ``.npz`` file's keys are not given.
NPZ_KEY_PAIRS = (("X", "y"), ("X_train", "y_train"), ("x", "y"), ("data", "target"))

_CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.bz2", ".csv.xz", ".csv.zst")
_PARQUET_SUFFIXES = (".parquet", ".pq")
_ACCEPTED = (".npz", *_PARQUET_SUFFIXES, *_CSV_SUFFIXES, "a directory of parquet files")

# Bytes of an .npz member decompressed at a time by a worker (bounds its extra memory).
_NPZ_CHUNK_BYTES = 16 * 2**20


# --------------------------------------------------------------------------------------
# The shard (lives on a worker)
# --------------------------------------------------------------------------------------


@dataclass(eq=False)
class Shard:
    """The rows one worker holds.

    Parameters
    ----------
    X : ndarray of shape (n_rows, n_features)
        Features, C-contiguous, in the staging ``dtype`` (float32 by default).
    y : ndarray of shape (n_rows, ...) or None
        Labels or targets in their source dtype; None for unlabelled data.
    row_ids : ndarray of shape (n_rows,), dtype int64
        Position of each row in the source data set.
    done : ndarray of shape (n_rows,), dtype bool, optional
        Rows already processed in the current epoch (training marks them). It travels
        with the rows when they move, so every row is processed exactly once per epoch
        even when shards change between rounds. All False when not given.
    """

    X: np.ndarray
    y: np.ndarray | None
    row_ids: np.ndarray
    done: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.row_ids)
        if len(self.X) != n or (self.y is not None and len(self.y) != n):
            raise ValueError(
                f"shard arrays disagree in length: X {len(self.X)}, "
                f"y {None if self.y is None else len(self.y)}, row_ids {n}"
            )
        if self.done is None:
            self.done = np.zeros(n, dtype=bool)

    def __setstate__(self, state: dict) -> None:
        # Arrays unpickled from Dask's out-of-band frames can start at any byte address;
        # numpy's gather (``np.take``) on a misaligned float32 array was measured ~260x
        # slower than on an aligned one. Copy once here, only the arrays that need it.
        for key, value in state.items():
            if isinstance(value, np.ndarray) and not value.flags.aligned:
                state[key] = np.require(value, requirements=["A", "C", "W"])
        self.__dict__.update(state)

    def __len__(self) -> int:
        return len(self.row_ids)

    @property
    def n_rows(self) -> int:
        """Number of rows."""
        return len(self.row_ids)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays (what a transfer of the shard costs)."""
        y_bytes = 0 if self.y is None else self.y.nbytes
        return self.X.nbytes + y_bytes + self.row_ids.nbytes + self.done.nbytes

    def __sizeof__(self) -> int:
        # dask.sizeof falls back to sys.getsizeof, which calls this: without it Dask
        # would see a ~50-byte object and its memory accounting and transfer byte
        # counters would ignore the arrays.
        return object.__sizeof__(self) + self.nbytes


def _shard_ids(seed: int, n_rows: int, start: int, stop: int) -> np.ndarray:
    """Row ids of the slice ``[start, stop)`` of the staging permutation (shard order)."""
    perm = np.random.default_rng(seed).permutation(n_rows)
    return perm[start:stop].astype(np.int64, copy=True)


def _permutation(seed: int, n_rows: int) -> np.ndarray:
    """The staging permutation (run on a worker for Dask collections)."""
    return np.random.default_rng(seed).permutation(n_rows).astype(np.int64, copy=False)


def _sorted_order(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ``order, ids[order]`` with ``ids[order]`` ascending (files are read in order)."""
    order = np.argsort(ids, kind="stable")
    return order, ids[order]


def _unsort(sorted_rows: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Put rows read in ascending-id order back into shard order."""
    out = np.empty_like(sorted_rows)
    out[order] = sorted_rows
    return out


def _as_features(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    a = np.asarray(a)
    a = a.reshape(len(a), -1)
    return np.ascontiguousarray(a, dtype=dtype)


# --------------------------------------------------------------------------------------
# Worker-side readers (module level so tasks pickle by reference)
# --------------------------------------------------------------------------------------


def _npz_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype] | None:
    """Read an ``.npy`` header from a stream; None when the format version is unknown."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(f)
    return None


def _npz_rows(
    path: str,
    key: str,
    sorted_ids: np.ndarray,
    n_rows: int,
    order: np.ndarray | None = None,
    chunk_bytes: int = _NPZ_CHUNK_BYTES,
) -> np.ndarray:
    """Rows ``sorted_ids`` (ascending) of member ``key`` of an ``.npz``, streamed.

    Row ``sorted_ids[i]`` lands at ``out[order[i]]`` (at ``out[i]`` when ``order`` is
    None), so the rows come out in shard order without a second copy.

    The member is decompressed chunk by chunk; only the wanted rows are kept. Members
    in Fortran order, with object dtype or an unknown header version fall back to
    loading the whole member on this worker and keeping the wanted rows.
    """
    with zipfile.ZipFile(path) as zf, zf.open(key + ".npy") as f:
        header = _npz_header(f)
        if header is not None:
            shape, fortran, dtype = header
        if header is None or fortran or dtype.hasobject or len(shape) == 0:
            with np.load(path, allow_pickle=False) as npz:
                rows = np.asarray(npz[key])[sorted_ids]
            return rows if order is None else _unsort(rows, order)
        if shape[0] != n_rows:
            raise ValueError(f"{path}: member {key!r} has {shape[0]} rows, expected {n_rows}")
        row_shape = tuple(shape[1:])
        row_bytes = max(1, int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize)
        chunk = max(1, chunk_bytes // row_bytes)
        out = np.empty((len(sorted_ids), *row_shape), dtype=dtype)
        done = 0
        for lo in range(0, n_rows, chunk):
            hi = min(n_rows, lo + chunk)
            buf = f.read((hi - lo) * row_bytes)
            if len(buf) != (hi - lo) * row_bytes:
                raise ValueError(f"{path}: member {key!r} is truncated")
            block = np.frombuffer(buf, dtype=dtype).reshape((hi - lo, *row_shape))
            upto = int(np.searchsorted(sorted_ids, hi, side="left"))
            dest = slice(done, upto) if order is None else order[done:upto]
            out[dest] = block[sorted_ids[done:upto] - lo]
            done = upto
        return out


def _read_npz_shard(
    path: str,
    x_key: str,
    y_key: str | None,
    seed: int,
    n_rows: int,
    start: int,
    stop: int,
    dtype: np.dtype,
) -> Shard:
    """Worker side of :func:`stage` for ``.npz`` files."""
    ids = _shard_ids(seed, n_rows, start, stop)
    order, sorted_ids = _sorted_order(ids)
    X = _as_features(_npz_rows(path, x_key, sorted_ids, n_rows, order), dtype)
    y = None
    if y_key is not None:
        y = np.ascontiguousarray(_npz_rows(path, y_key, sorted_ids, n_rows, order))
    return Shard(X=X, y=y, row_ids=ids)


def _table_matrix(table: Any, features: Sequence[str], dtype: np.dtype) -> np.ndarray:
    """Numeric columns of a pyarrow table as one C-contiguous ``(n, n_features)`` array."""
    out = np.empty((table.num_rows, len(features)), dtype=dtype)
    for j, name in enumerate(features):
        out[:, j] = table.column(name).to_numpy(zero_copy_only=False)
    return out


def _shard_from_blocks(
    blocks: Iterable[tuple[int, Callable[[np.ndarray], tuple[np.ndarray, Any]]]],
    features: Sequence[str],
    target: str | None,
    seed: int,
    n_rows: int,
    start: int,
    stop: int,
    dtype: np.dtype,
    source: str,
) -> Shard:
    """Assemble this worker's shard from a file read block by block, in file order.

    ``blocks`` yields ``(block_rows, take)`` where ``take(positions)`` returns the
    features and target of those rows of the block; ``take`` is only called for blocks
    holding rows of this shard, so readers may defer the actual read to it.
    """
    ids = _shard_ids(seed, n_rows, start, stop)
    order, sorted_ids = _sorted_order(ids)
    X = np.empty((len(ids), len(features)), dtype=dtype)
    y_parts: list[np.ndarray] = []
    done = 0
    offset = 0
    for block_rows, take in blocks:
        upto = int(np.searchsorted(sorted_ids, offset + block_rows, side="left"))
        if upto > done:
            features_part, target_part = take(sorted_ids[done:upto] - offset)
            # Written straight to shard order: no second full-size copy.
            X[order[done:upto]] = features_part
            if target is not None:
                y_parts.append(target_part)
            done = upto
        offset += block_rows
    if offset != n_rows or done != len(ids):
        raise ValueError(f"{source} changed since staging began: {offset} rows, not {n_rows}")
    y = _unsort(np.concatenate(y_parts), order) if target is not None else None
    return Shard(X=X, y=y, row_ids=ids)


def _read_parquet_shard(
    files: Sequence[str],
    features: Sequence[str],
    target: str | None,
    seed: int,
    n_rows: int,
    start: int,
    stop: int,
    dtype: np.dtype,
) -> Shard:
    """Worker side of :func:`stage` for parquet: one row group at a time, ``take`` of ids."""
    import pyarrow.parquet as pq

    columns = [*features, target] if target is not None else list(features)

    def row_groups():
        for path in files:
            pf = pq.ParquetFile(path)
            for g in range(pf.num_row_groups):

                def take(positions, pf=pf, g=g):
                    table = pf.read_row_group(g, columns=columns).take(positions)
                    y = None
                    if target is not None:
                        y = table.column(target).to_numpy(zero_copy_only=False)
                    return _table_matrix(table, features, dtype), y

                yield pf.metadata.row_group(g).num_rows, take

    return _shard_from_blocks(
        row_groups(), features, target, seed, n_rows, start, stop, dtype, "parquet data"
    )


def _read_csv_shard(
    path: str,
    features: Sequence[str],
    target: str | None,
    seed: int,
    n_rows: int,
    start: int,
    stop: int,
    dtype: np.dtype,
    chunksize: int,
) -> Shard:
    """Worker side of :func:`stage` for CSV: chunked reading, keeping only own rows."""
    columns = [*features, target] if target is not None else list(features)

    def chunks():
        reader = pd.read_csv(
            path, usecols=columns, dtype={c: dtype for c in features}, chunksize=chunksize
        )
        with reader:
            for chunk in reader:

                def take(positions, chunk=chunk):
                    part = chunk.iloc[positions]
                    y = part[target].to_numpy() if target is not None else None
                    return part[list(features)].to_numpy(dtype=dtype), y

                yield len(chunk), take

    return _shard_from_blocks(chunks(), features, target, seed, n_rows, start, stop, dtype, path)


def _take_block_rows(
    block: Any,
    perm: np.ndarray,
    start: int,
    stop: int,
    block_start: int,
    dtype: np.dtype | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of one block of a Dask collection that belong to shard ``perm[start:stop]``.

    Runs next to the block. Returns ``(positions in the shard, row ids, values)``;
    features are cast to ``dtype`` here so the smaller array is what travels.
    """
    ids = perm[start:stop]
    mask = (ids >= block_start) & (ids < block_start + len(block))
    pos = np.flatnonzero(mask)
    local = ids[pos] - block_start
    if hasattr(block, "iloc"):
        values = block.iloc[local].to_numpy()
    else:
        values = np.asarray(block)[local]
    if dtype is not None:
        values = _as_features(values, dtype)
    return pos, ids[pos], values


def _assemble_shard(
    x_parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    y_parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]] | None,
    n: int,
    n_features: int,
    dtype: np.dtype,
) -> Shard:
    """Worker side of :func:`stage` for Dask collections: put the block pieces together."""
    X = np.empty((n, n_features), dtype=dtype)
    row_ids = np.empty(n, dtype=np.int64)
    for pos, gids, values in x_parts:
        X[pos] = values.reshape(len(values), -1)
        row_ids[pos] = gids
    y = None
    if y_parts is not None:
        first = next(p[2] for p in y_parts if len(p[2])) if n else np.empty(0)
        y = np.empty((n, *first.shape[1:]), dtype=np.result_type(*(p[2] for p in y_parts)))
        for pos, _, values in y_parts:
            y[pos] = values
    return Shard(X=X, y=y, row_ids=row_ids)


# --------------------------------------------------------------------------------------
# Worker-side shard operations
# --------------------------------------------------------------------------------------


def _shard_head(shard: Shard, n_keep: int) -> Shard:
    """The first ``n_keep`` rows, copied so the old buffers can be freed."""
    y = None if shard.y is None else shard.y[:n_keep].copy()
    return Shard(
        X=shard.X[:n_keep].copy(),
        y=y,
        row_ids=shard.row_ids[:n_keep].copy(),
        done=shard.done[:n_keep].copy(),
    )


def _shard_tail(shard: Shard, n_move: int) -> Shard:
    """The last ``n_move`` rows (a random sample: shards are in shuffled order)."""
    lo = len(shard) - n_move
    y = None if shard.y is None else shard.y[lo:].copy()
    return Shard(
        X=shard.X[lo:].copy(), y=y, row_ids=shard.row_ids[lo:].copy(), done=shard.done[lo:].copy()
    )


def _concat_shards(base: Shard | None, *incoming: Shard) -> Shard:
    """Append incoming slices to ``base`` (None when the worker held nothing)."""
    parts = ([base] if base is not None else []) + list(incoming)
    if len(parts) == 1:
        return parts[0]
    ys = [s.y for s in parts]
    if any(v is None for v in ys) and not all(v is None for v in ys):
        raise ValueError("cannot concatenate labelled and unlabelled shards")
    return Shard(
        X=np.concatenate([s.X for s in parts]),
        y=None if ys[0] is None else np.concatenate(ys),
        row_ids=np.concatenate([s.row_ids for s in parts]),
        done=np.concatenate([s.done for s in parts]),
    )


def _unique_labels(shard: Shard) -> np.ndarray | None:
    return None if shard.y is None else np.unique(shard.y)


# --------------------------------------------------------------------------------------
# Driver side
# --------------------------------------------------------------------------------------


@dataclass(eq=False)
class StagedData:
    """Rows staged on workers: one pinned future per worker, and what describes them.

    Attributes
    ----------
    client : Client
        The client the futures belong to.
    futures : dict of str to Future
        Worker address -> future of that worker's :class:`Shard`. Only workers holding
        rows appear.
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
    """

    client: Client = field(repr=False)
    futures: dict[str, Future] = field(repr=False)
    counts: dict[str, int]
    n_features: int
    feature_names: list[str] | None = None
    has_labels: bool = True
    seed: int = 0
    source: str = ""

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

    def release(self) -> None:
        """Drop the shards from the workers' memory."""
        for fut in self.futures.values():
            fut.release()
        self.futures = {}
        self.counts = {}


def scheduler_workers(client: Client) -> dict[str, dict[str, Any]]:
    """The scheduler's current workers, by address, asked fresh.

    Not ``client.scheduler_info()``: it returns the client's cached identity, which the
    client's own periodic refresh overwrites with an identity that lists no workers.
    When that refresh lands between the fresh fetch and the return, the cluster looks
    empty (seen here: a re-balance failed with "the cluster has []"; a staging wait
    could have taken every worker for lost).

    Parameters
    ----------
    client : distributed.Client
        A synchronous client; objects without ``sync`` and ``scheduler`` (test doubles)
        fall back to ``scheduler_info()``.

    Returns
    -------
    workers : dict of str to dict
        Worker address to the scheduler's information on it (name, nthreads, memory...).
    """
    if hasattr(client, "sync") and hasattr(client, "scheduler"):
        return dict(client.sync(client.scheduler.identity, n_workers=-1)["workers"])
    return dict(client.scheduler_info()["workers"])


def _cluster_workers(client: Client) -> list[str]:
    return sorted(scheduler_workers(client))


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


class WorkerLostError(RuntimeError):
    """A worker left the cluster while staging tasks were waiting for it."""


def wait_some(
    futures: Iterable[Future], timeout: float, return_when: str = "ALL_COMPLETED"
) -> tuple[set[Future], set[Future]]:
    """``distributed.wait`` that returns ``(done, not_done)`` on timeout too.

    distributed's ``wait`` raises :class:`TimeoutError` where ``concurrent.futures``
    returns, and that exception, its traceback and the frames of the client's ``sync``
    call form a reference cycle: until the garbage collector runs, it keeps the callers'
    frames alive, the futures in their locals, and those futures' data on the workers
    (measured: a scattered intermediate still held 2 s later, released at once by
    ``gc.collect()``). Clearing the caught exception's traceback breaks the cycle.
    """
    futures = list(futures)
    try:
        done, not_done = wait(futures, timeout=timeout, return_when=return_when)
    except TimeoutError as exc:
        exc.__traceback__ = None
        return set(), set(futures)
    return set(done), set(not_done)


def _wait_ok(futures: Iterable[Future], workers: Iterable[str], poll_s: float = 0.5) -> None:
    """Wait for the futures and re-raise the first worker-side error, without gathering.

    ``workers`` are the addresses the tasks are pinned to (or depend on). A pinned task
    whose worker has left waits forever, so the wait is cut into short slices and each
    slice checks that every one of ``workers`` is still in the cluster, the first check
    before any waiting: a worker can leave between the caller's plan and this call, and
    comparing with a snapshot taken here would never see that one go (a fit hung so,
    in a re-balance planned just as a SLURM worker reached its ``--lifetime``).

    Raises
    ------
    WorkerLostError
        One of ``workers`` is not (or no longer) in the cluster.
    """
    futures = list(futures)
    needed = set(workers)
    if not futures:
        return
    client = futures[0].client
    pending = futures
    while True:
        gone = needed - set(scheduler_workers(client))
        if gone:
            raise WorkerLostError(
                f"worker {', '.join(sorted(gone))} left the cluster during staging"
            )
        if not pending:
            break
        try:
            _, pending = wait_some(pending, poll_s)
        except Exception:  # cancelled futures: reported below
            pending = [f for f in pending if f.status == "pending"]
    for fut in futures:
        if fut.status == "error":
            fut.result()  # raises the task's exception; an errored future carries no data
        elif fut.status != "finished":
            raise RuntimeError(f"staging task {fut.key} ended as {fut.status!r}")


def _wait_shards(futures: Mapping[str, Future], skip_lost: bool) -> dict[str, Future]:
    """Wait for the shards being built, each pinned to its worker (see :func:`stage`).

    With ``skip_lost`` the shards of workers that left are dropped and the others waited
    for; without it a worker that left raises :class:`WorkerLostError`. On any failure
    every shard is released, so nothing stays on the workers.
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
                gone = set(live) - set(scheduler_workers(next(iter(live.values())).client))
                if not gone:
                    raise
                for w in gone:
                    live.pop(w).release()
    except BaseException:
        for fut in live.values():
            fut.release()
        raise
    return live


def scatter_to(
    client: Client,
    data: Any,
    worker: str,
    timeout: float = 30.0,
    poll_s: float = 0.5,
    key: str | None = None,
) -> Future:
    """Scatter ``data`` straight to ``worker`` (no hashing); a future pinned there.

    ``key`` names the data's key (default: one that Dask makes up).

    distributed's direct scatter waits, for as long as its timeout, until the worker
    *runs*; one that is retiring or has left never will. Here each attempt waits
    ``poll_s`` and then checks that the worker is still in the cluster. A broken
    connection (the worker died mid-transfer, before the scheduler noticed) is one more
    failed attempt: the next look at the cluster tells a lost worker from a blip.

    Raises
    ------
    WorkerLostError
        ``worker`` left the cluster (or was never in it).
    TimeoutError
        ``worker`` stayed in the cluster for ``timeout`` seconds without taking the data
        (paused for memory, retiring without leaving, or unreachable).
    """
    deadline = time.monotonic() + timeout
    while True:
        broken: OSError | None = None
        try:
            if key is None:
                return client.scatter(
                    data, workers=[worker], direct=True, hash=False, timeout=poll_s
                )
            return client.scatter(
                {key: data}, workers=[worker], direct=True, hash=False, timeout=poll_s
            )[key]
        except TimeoutError as exc:  # before OSError: TimeoutError is one
            exc.__traceback__ = None  # see wait_some: the cycle would keep data alive
        except OSError as exc:  # CommClosedError, connection refused or reset
            exc.__traceback__ = None
            broken = exc
        info = scheduler_workers(client).get(worker)
        if info is None:
            raise WorkerLostError(f"worker {worker} left the cluster during staging")
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"worker {worker} took no data for {timeout:g} s: it is in the cluster but "
                f"not running tasks (status {info.get('status', 'unknown')!r}"
                + (f", last error {broken!r})" if broken is not None else ")")
            )
        if broken is not None:  # failed at once: give the scheduler time to notice
            time.sleep(min(poll_s, max(deadline - time.monotonic(), 0.0)))


def _is_dask(obj: Any) -> bool:
    return hasattr(obj, "__dask_graph__") and hasattr(obj, "to_delayed")


def _check_numeric(kinds: Mapping[str, bool], where: str) -> None:
    bad = [name for name, ok in kinds.items() if not ok]
    if bad:
        raise TypeError(
            f"{where}: feature columns must be numeric, but {bad} are not; name the label "
            "column with target= or encode these columns first"
        )


def _is_numeric_dtype(dtype: Any) -> bool:
    return pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype)


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


def _suffix_kind(path: str) -> str:
    if os.path.isdir(path):
        return "parquet"
    low = path.lower()
    if low.endswith(".npz"):
        return "npz"
    if low.endswith(_PARQUET_SUFFIXES):
        return "parquet"
    if low.endswith(_CSV_SUFFIXES):
        return "csv"
    raise ValueError(f"cannot stage {path!r}: unknown file type; accepted: {', '.join(_ACCEPTED)}")


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
        X key among :data:`NPZ_KEY_PAIRS` (``y`` for ``X``, ``y_train`` for
        ``X_train``; generally ``"y" + x_key[1:]``), or none when absent.
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
        raises :class:`WorkerLostError`; True leaves that worker out and stages the
        others' shards as planned. Its rows are then staged nowhere: the result's
        ``n_rows`` is short of the data's, and the caller re-stages them (see
        :func:`add_rows`). The result may hold no worker at all.
    key_name : callable, optional
        ``key_name(worker) -> key`` names the key of each shard scattered from memory
        (default: one Dask makes up). The trainer names them after its run
        (:func:`hmdspt.parallel.worker.run_key`), so that a worker frees what an
        interrupted scatter of an ended run left behind.

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
    return _stage_memory(client, X, y, counts, seed, target, dtype, skip_lost, key_name)


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
) -> StagedData:
    feature_names = None
    if isinstance(X, pd.DataFrame):
        X, y = _split_target(X, target, y, "DataFrame")
        _check_numeric({str(c): _is_numeric_dtype(t) for c, t in X.dtypes.items()}, "DataFrame")
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
        raise ValueError("no rows to stage")
    n_features = 1 if X.ndim == 1 else X.shape[1]
    counts = _resolve_counts(client, counts, n_rows, skip_lost)
    perm = _permutation(seed, n_rows)
    futures: dict[str, Future] = {}
    lost = set(counts) - set(scheduler_workers(client)) if skip_lost else set()
    # One shard is sent (a helper thread waits on the scatter) while the next is gathered:
    # the two overlap, at the cost of holding two shards instead of one on the driver.
    # Measured on KDD (494,021 x 41 float32, 3 shards; medians of interleaved runs):
    # 0.17 s instead of 0.19 s from a C-ordered X, as the estimator passes it (10 runs);
    # 0.22-0.26 s instead of 0.28-0.30 s from the Fortran-ordered X its npz holds, whose
    # strided rows make the gathers 0.18 s (6 and 8 runs). Gathering from a C-ordered
    # copy of such an X was faster again, but the copy tripled the staging benchmark's
    # driver peak, and X is the user's, in memory already.
    sending: tuple[str, Any] | None = None

    def sent() -> None:
        """Take the finished scatter's future; a worker that left is skipped or raised."""
        worker, job = sending
        try:
            futures[worker] = job.result()
        except WorkerLostError:
            if not skip_lost:
                raise
            lost.add(worker)

    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="hmdspt-stage") as sender:
            for w, (start, stop) in _bounds(counts).items():
                if w in lost:
                    continue
                ids = perm[start:stop].copy()
                rows = X.iloc[ids].to_numpy(dtype=dtype) if hasattr(X, "iloc") else X[ids]
                shard = Shard(
                    X=_as_features(rows, dtype),
                    y=None if y is None else np.ascontiguousarray(y[ids]),
                    row_ids=ids,
                )
                if sending is not None:
                    sent()
                # Driver -> worker, not through the scheduler, and without tokenising
                # (hashing) the whole shard.
                key = None if key_name is None else key_name(w)
                sending = (w, sender.submit(scatter_to, client, shard, w, key=key))
                del shard, rows
            if sending is not None:
                sent()
                sending = None
    except BaseException:
        # Nothing stays on the workers: the shards sent, and one still in flight.
        if sending is not None and sending[1].done() and sending[1].exception() is None:
            sending[1].result().release()
        for fut in futures.values():
            fut.release()
        raise
    staged_counts = {w: counts[w] for w in futures}
    return StagedData(
        client, futures, staged_counts, n_features, feature_names, y is not None, seed, "memory"
    )


def _dask_blocks(client: Client, obj: Any) -> tuple[list[Future], list[int]]:
    """Compute the row blocks of a Dask collection on the workers (or scatter a local one)."""
    if not _is_dask(obj):
        obj = obj.to_numpy() if hasattr(obj, "to_numpy") else np.asarray(obj)
        return [client.scatter(obj, direct=True, hash=False)], [len(obj)]
    if hasattr(obj, "chunks"):  # dask array: one block per row chunk
        if obj.ndim == 2 and len(obj.chunks[1]) > 1:
            obj = obj.rechunk({1: -1})
        delayed = list(obj.to_delayed().ravel())
        lengths = list(obj.chunks[0])
    else:
        delayed = list(obj.to_delayed())
        lengths = [np.nan] * len(delayed)
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
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    # No worker restriction: Dask runs each piece next to its block.
    return [
        client.submit(_take_block_rows, b, perm, start, stop, int(o), cast, pure=False)
        for b, o in zip(blocks, offsets)
    ]


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
            {str(c): _is_numeric_dtype(t) for c, t in X.dtypes.items()}, "Dask DataFrame"
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
        raise ValueError("no rows to stage")
    counts = _resolve_counts(client, counts, n_rows, skip_lost)
    perm = client.submit(_permutation, seed, n_rows, pure=False)
    futures: dict[str, Future] = {}
    lost = set(counts) - set(scheduler_workers(client)) if skip_lost else set()
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
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(2, f"cannot stage {path}: no such file or directory", path)
    kind = _suffix_kind(path)
    if kind != "npz" and x_key is not None:
        raise ValueError("x_key= applies to .npz paths only")
    if kind == "npz":
        meta = _npz_meta(path, x_key, target)
        names, has_y = None, meta["y_key"] is not None
    else:
        meta = _parquet_meta(path, target) if kind == "parquet" else _csv_meta(path, target)
        names, has_y = meta["features"], target is not None
        meta["n_features"] = len(names)
    n_rows, n_features = meta["n_rows"], meta["n_features"]
    if n_rows == 0:
        raise ValueError(f"{path} has no rows")
    counts = _resolve_counts(client, counts, n_rows, skip_lost)
    futures: dict[str, Future] = {}
    lost = set(counts) - set(scheduler_workers(client)) if skip_lost else set()
    for w, (start, stop) in _bounds(counts).items():
        if w in lost:
            continue
        if kind == "npz":
            args = (_read_npz_shard, path, meta["x_key"], meta["y_key"])
        elif kind == "parquet":
            args = (_read_parquet_shard, meta["files"], names, target)
        else:
            args = (_read_csv_shard, path, names, target)
        extra = (csv_chunksize,) if kind == "csv" else ()
        futures[w] = client.submit(
            *args,
            seed,
            n_rows,
            start,
            stop,
            dtype,
            *extra,
            workers=[w],
            allow_other_workers=False,
            pure=False,
        )
    futures = _wait_shards(futures, skip_lost)
    counts = {w: counts[w] for w in futures}
    return StagedData(client, futures, counts, n_features, names, has_y, seed, f"{kind}:{path}")


def _npz_meta(path: str, x_key: str | None, y_key: str | None) -> dict[str, Any]:
    """Keys, row count and width of an ``.npz``, from the member headers only."""
    with zipfile.ZipFile(path) as zf:
        keys = [n[: -len(".npy")] for n in zf.namelist() if n.endswith(".npy")]
        if x_key is None:
            x_key = next((xk for xk, _ in NPZ_KEY_PAIRS if xk in keys), None)
            if x_key is None:
                raise ValueError(
                    f"{path}: none of the feature keys {[p[0] for p in NPZ_KEY_PAIRS]} found "
                    f"(keys: {keys}); pass x_key="
                )
        elif x_key not in keys:
            raise ValueError(f"{path}: x_key {x_key!r} not found; keys are {keys}")
        if y_key is None:
            guesses = [yk for xk, yk in NPZ_KEY_PAIRS if xk == x_key] + ["y" + x_key[1:]]
            y_key = next((g for g in guesses if g in keys and g != x_key), None)
        elif y_key not in keys:
            raise ValueError(f"{path}: target key {y_key!r} not found; keys are {keys}")
        shapes = {}
        for key in (x_key, y_key):
            if key is None:
                continue
            with zf.open(key + ".npy") as f:
                header = _npz_header(f)
            if header is None:  # unknown header version: let numpy parse this member
                with np.load(path, allow_pickle=False) as npz:
                    shapes[key] = npz[key].shape
            else:
                shapes[key] = header[0]
    x_shape = shapes[x_key]
    if len(x_shape) == 0:
        raise ValueError(f"{path}: {x_key!r} is a scalar, not a data set")
    if y_key is not None and shapes[y_key][:1] != x_shape[:1]:
        raise ValueError(
            f"{path}: {x_key!r} has {x_shape[0]} rows but {y_key!r} has {shapes[y_key][0]}"
        )
    n_features = int(np.prod(x_shape[1:], dtype=np.int64)) if len(x_shape) > 1 else 1
    return {"x_key": x_key, "y_key": y_key, "n_rows": int(x_shape[0]), "n_features": n_features}


def _parquet_meta(path: str, target: str | None) -> dict[str, Any]:
    """Files, row count and feature columns of a parquet file or directory (metadata only)."""
    import pyarrow as pa
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    dataset = pads.dataset(path, format="parquet")
    files = list(dataset.files)
    if not files:
        raise ValueError(f"{path}: no parquet files found")
    schema = dataset.schema
    columns = list(schema.names)
    if target is not None and target not in columns:
        raise ValueError(f"{path}: target column {target!r} not found; columns are {columns}")
    features = [c for c in columns if c != target]

    def numeric(t: Any) -> bool:
        return (
            pa.types.is_integer(t)
            or pa.types.is_floating(t)
            or pa.types.is_boolean(t)
            or pa.types.is_decimal(t)
        )

    _check_numeric({c: numeric(schema.field(c).type) for c in features}, path)
    n_rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    return {"files": files, "features": features, "n_rows": n_rows}


def _csv_meta(path: str, target: str | None) -> dict[str, Any]:
    """Columns and row count of a CSV file, read in chunks (never the whole file at once)."""
    peek = pd.read_csv(path, nrows=1000)
    columns = [str(c) for c in peek.columns]
    if target is not None and target not in columns:
        raise ValueError(f"{path}: target column {target!r} not found; columns are {columns}")
    features = [c for c in columns if c != target]
    _check_numeric({c: _is_numeric_dtype(peek[c].dtype) for c in features}, path)
    # CSV has no row count in a header: count by parsing the first column chunk by chunk.
    with pd.read_csv(path, usecols=[0], chunksize=1 << 20) as reader:
        n_rows = sum(len(chunk) for chunk in reader)
    return {"features": features, "n_rows": n_rows}


# --------------------------------------------------------------------------------------
# Re-balancing
# --------------------------------------------------------------------------------------


def rebalance(client: Client, staged: StagedData, moves: Iterable[Any]) -> StagedData:
    """Carry out a move plan, worker to worker.

    For each move a task on the sender cuts ``rows`` rows off the end of its shard
    (shards are in shuffled order, so they are a random sample) and keeps the rest; a
    task pinned to the receiver depends on the cut-off slice and appends it to its own
    shard, so Dask ships the slice from sender to receiver directly. Slices bound for
    the same receiver are appended in one task. Nothing is gathered to the driver.

    Parameters
    ----------
    client : Client
        The client that staged the data.
    staged : StagedData
        Current placement. Its shards that the plan replaces are released: use the
        returned object from now on.
    moves : iterable of move
        Objects with attributes ``source`` and ``destination`` (worker addresses) and
        ``rows`` (int), e.g. :class:`hmdspt.core.partition.Move`, carried out in order. A
        destination may be a worker of the cluster that holds nothing yet.

    Returns
    -------
    staged : StagedData
        New placement; a worker whose rows all left is dropped.

    Raises
    ------
    ValueError
        A move from a worker that does not have the rows, to an unknown worker, to
        itself, or with a negative row count. The plan is checked before anything runs.
    WorkerLostError
        A worker the plan moves rows from or to is not, or is no longer, in the cluster
        (checked before anything runs and while the moves run). The old placement is
        untouched: its shards on the surviving workers are still valid.
    """
    moves = [(m.source, m.destination, m.rows) for m in moves]
    workers = set(_cluster_workers(client))
    avail = dict(staged.counts)
    for src, dst, rows in moves:  # check the whole plan first: never half-carry it out
        if int(rows) != rows or rows < 0:
            raise ValueError(f"move {src} -> {dst}: rows must be a non-negative int, not {rows}")
        if src == dst:
            raise ValueError(f"move {src} -> {dst}: source and destination are the same")
        if dst not in workers:
            raise ValueError(f"move to unknown worker {dst!r}; the cluster has {sorted(workers)}")
        if avail.get(src, 0) < rows:
            raise ValueError(
                f"move of {rows} rows from {src!r}, which holds {avail.get(src, 0)} at that point"
            )
        if rows and src not in workers:
            raise WorkerLostError(f"worker {src} left the cluster before its rows could move")
        avail[src] = avail.get(src, 0) - int(rows)
        avail[dst] = avail.get(dst, 0) + int(rows)

    def pinned(func: Callable[..., Any], *args: Any, where: str) -> Future:
        return client.submit(func, *args, workers=[where], allow_other_workers=False, pure=False)

    current: dict[str, Future | None] = dict(staged.futures)
    held = dict(staged.counts)
    incoming: dict[str, list[Future]] = defaultdict(list)
    for src, dst, rows in moves:
        rows = int(rows)
        if rows == 0:
            continue
        if incoming[src]:  # a worker sending after receiving: append first, then cut
            current[src] = pinned(_concat_shards, current.get(src), *incoming.pop(src), where=src)
        moving = pinned(_shard_tail, current[src], rows, where=src)
        keep = held[src] - rows
        current[src] = pinned(_shard_head, current[src], keep, where=src) if keep else None
        incoming[dst].append(moving)
        held[src] = keep
        held[dst] = held.get(dst, 0) + rows
    for dst, slices in incoming.items():
        if slices:
            current[dst] = pinned(_concat_shards, current.get(dst), *slices, where=dst)
    # Dropping our references now leaves the slices alive only as long as the receivers'
    # tasks need them; the driver never holds a slice's result.
    incoming.clear()
    futures = {w: f for w, f in current.items() if f is not None and held.get(w, 0) > 0}
    involved = {w for src, dst, rows in moves if rows for w in (src, dst)}
    _wait_ok(futures.values(), involved)
    for w, old in staged.futures.items():
        if futures.get(w) is not old:
            old.release()
    counts = {w: held[w] for w in futures}
    return StagedData(
        client,
        futures,
        counts,
        staged.n_features,
        staged.feature_names,
        staged.has_labels,
        staged.seed,
        staged.source,
    )


def _held_ids(shard: Shard) -> np.ndarray:
    return shard.row_ids


def held_row_ids(staged: StagedData) -> dict[str, np.ndarray]:
    """Source row ids each worker holds (only the ids travel to the driver)."""
    futures = staged.map_shards(_held_ids)
    _wait_ok(futures.values(), futures)  # a pinned task whose worker left: raise, not hang
    return dict(zip(futures, staged.client.gather(list(futures.values())), strict=True))


def drop_workers(staged: StagedData, workers: Iterable[str]) -> StagedData:
    """``staged`` without ``workers`` (lost ones: their shards are gone with them)."""
    gone = set(workers)
    futures = {w: f for w, f in staged.futures.items() if w not in gone}
    counts = {w: n for w, n in staged.counts.items() if w not in gone}
    return replace(staged, futures=futures, counts=counts)


def add_rows(
    client: Client,
    staged: StagedData,
    X: np.ndarray,
    y: np.ndarray | None,
    assignment: Mapping[str, np.ndarray],
    *,
    dtype: Any = np.float32,
    key_name: Callable[[str], str] | None = None,
) -> StagedData:
    """Append source rows to workers' shards: ``assignment[worker]`` holds row ids.

    ``dtype`` is the features' dtype on the workers (that of :func:`stage`); ``key_name``
    names the scattered rows' keys, as in :func:`stage`.

    Re-stages rows whose worker was lost: the rows go from the source (``X``, ``y``,
    indexed by row id) straight to their new worker and are appended there, so the
    exactly-one-worker-per-row invariant holds again. The appended rows arrive with
    ``done`` False (due again in the running epoch).

    Raises
    ------
    WorkerLostError
        A receiving worker left the cluster. ``staged`` is left whole (nothing of it
        was released), so the rows can be assigned again among the remaining workers.
    """
    dtype = np.dtype(dtype)
    futures = dict(staged.futures)
    counts = dict(staged.counts)
    # Released only once every merge is done: if a worker is lost midway, ``staged`` is
    # still whole and the caller can recover from it.
    replaced: list[Future] = []
    for worker, ids in assignment.items():
        ids = np.asarray(ids, dtype=np.int64)
        if not len(ids):
            continue
        rows = Shard(
            X=_as_features(np.asarray(X)[ids], dtype),
            y=None if y is None else np.ascontiguousarray(np.asarray(y)[ids]),
            row_ids=ids,
        )
        piece = scatter_to(client, rows, worker, key=None if key_name is None else key_name(worker))
        merged = client.submit(
            _concat_shards,
            futures.get(worker),
            piece,
            workers=[worker],
            allow_other_workers=False,
            pure=False,
        )
        if worker in futures:
            replaced.append(futures[worker])
        futures[worker] = merged
        counts[worker] = counts.get(worker, 0) + len(ids)
        _wait_ok([merged], [worker])
        piece.release()
    for old in replaced:
        old.release()
    return replace(staged, futures=futures, counts=counts)
