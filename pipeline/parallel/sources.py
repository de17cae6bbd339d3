"""Where a fit's rows come from: arrays on the driver, or data the workers read themselves.

The trainer asks its source for three things: stage the rows on the workers in the counts
it plans, stage given rows again onto given workers (those of a worker that was lost),
and hand over a small sample of rows by id (the warm start's pilot on the driver).

- :class:`InMemory` holds arrays the driver already has (numpy, pandas).
- :class:`WorkerRead` names data the workers read: a Dask array or DataFrame (its blocks
  are computed on the workers), or a path (``.npz``, parquet file or folder, CSV). The
  driver reads metadata only; every staging, and every re-staging of a lost worker's rows,
  reads the rows from the source again on the worker that keeps them. Its labels are
  encoded into the model's targets on the workers by ``encode`` (the estimator gives
  :class:`hmdspt.core.shard.LabelColumns`: a fitted binarizer in numpy alone, so that the
  workers do not import scikit-learn).

Both are plain objects with the same methods: a new kind of source is one more class.
:func:`split_held_out` cuts Dask data into a training part and a held-out part (the
early-stopping validation rows) lazily, on the workers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
from distributed import Client, Future

from hmdspt.core.shard import (
    _encode_shard,
    _rows_with_ids,
    held_out_counts,
    held_out_rows,
    take_rows,
)
from hmdspt.parallel import rebalance, shards
from hmdspt.parallel.client import WorkerLostError, _gone_workers, _wait_ok
from hmdspt.parallel.readers import non_finite_error
from hmdspt.parallel.rebalance import append_piece
from hmdspt.parallel.shards import StagedData

__all__ = ["InMemory", "WorkerRead", "known_rows", "known_rows_of", "split_held_out"]


class InMemory:
    """Rows the driver holds: ``X`` (n, n_features) and encoded targets ``Y``."""

    def __init__(self, X: Any, Y: np.ndarray) -> None:
        self.X = np.asarray(X)
        self.Y = Y
        self.n_rows = len(Y)
        self.n_features = int(self.X.shape[1])

    def stage(
        self,
        client: Client,
        counts: Mapping[str, int],
        *,
        seed: int,
        dtype: Any,
        skip_lost: bool,
        key_name: Callable[[str], str] | None,
        head_fraction: float | None = None,
    ) -> StagedData:
        """The rows on the workers, ``counts[worker]`` each (:func:`shards.stage`)."""
        return shards.stage(
            client,
            self.X,
            self.Y,
            counts=counts,
            seed=seed,
            dtype=dtype,
            skip_lost=skip_lost,
            key_name=key_name,
            head_fraction=head_fraction,
        )

    def add_rows(
        self,
        client: Client,
        staged: StagedData,
        assignment: Mapping[str, np.ndarray],
        *,
        dtype: Any,
        key_name: Callable[[str], str] | None,
    ) -> StagedData:
        """Rows ``assignment[worker]`` sent to their workers (:func:`rebalance.add_rows`)."""
        return rebalance.add_rows(
            client, staged, self.X, self.Y, assignment, dtype=dtype, key_name=key_name
        )

    def sample(
        self, client: Client, staged: StagedData, ids: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``ids`` (sorted) as ``(X, Y)`` on the driver."""
        return take_rows(self.X, ids), take_rows(self.Y, ids)


class WorkerRead:
    """Data the workers read: a Dask array or DataFrame, or a path.

    Parameters
    ----------
    client : Client
        The cluster's client: block lengths the source does not know are counted there.
    X : Dask array, Dask DataFrame, str or os.PathLike
        The features (with the labels, for a data frame or a file named by ``target``).
    y : Dask array or Series, optional
        The labels, when not a column of ``X``.
    target : str, optional
        Label column of a data frame, parquet or CSV file; label key of an ``.npz``.
    x_key : str, optional
        Feature key of an ``.npz`` file.
    encode : callable, optional
        ``encode(labels) -> targets``, run on the workers after every read: the labels
        as the model trains on them (float, 2-D).
    csv_chunksize : int, default=65536
        Rows a worker parses at a time from a CSV file.
    sample_weight : Dask array or Series, or array, optional
        Non-negative row weights of a Dask collection (not of a path), read beside its
        rows and made the targets' last column by the encoding (``encode`` required).
    feature_names : list of str, optional
        Names of the features when ``X`` is an array cut from a data frame (e.g. by
        :func:`split_held_out`); else the source's own (None for arrays and ``.npz``).
    """

    def __init__(
        self,
        client: Client,
        X: Any,
        y: Any = None,
        *,
        target: str | None = None,
        x_key: str | None = None,
        encode: Callable[[np.ndarray], np.ndarray] | None = None,
        csv_chunksize: int = 65_536,
        sample_weight: Any = None,
        feature_names: list[str] | None = None,
    ) -> None:
        self.X, self.y, self.target, self.x_key = X, y, target, x_key
        self.encode = encode
        self.csv_chunksize = csv_chunksize
        self.reader = shards.SourceReader.of(
            client, X, y, target=target, x_key=x_key, sample_weight=sample_weight
        )
        self.n_rows = self.reader.n_rows
        self.n_features = self.reader.n_features
        self.feature_names = (
            self.reader.feature_names if feature_names is None else list(feature_names)
        )
        self.n_targets = self.reader.n_targets

    def unique_labels(self, client: Client) -> np.ndarray:
        """Sorted distinct labels, found on the workers."""
        return self.reader.unique_labels(client)

    def stage(
        self,
        client: Client,
        counts: Mapping[str, int],
        *,
        seed: int,
        dtype: Any,
        skip_lost: bool,
        key_name: Callable[[str], str] | None = None,
    ) -> StagedData:
        """Every worker reads its ``counts[worker]`` rows (the staging permutation's)."""
        del key_name  # nothing is scattered: each shard is a task's result on its worker
        staged = shards.stage_from(
            client,
            self.reader,
            counts,
            seed,
            dtype,
            skip_lost,
            then=lambda futures: self._encoded(client, futures, dtype),
            csv_chunksize=self.csv_chunksize,
        )
        # What the driver refuses in data it reads (scikit-learn's check, the CLI's reader),
        # looked for where these rows are: a NaN would train to a NaN loss, and the fit
        # would blame the learning rate. (shards.stage itself keeps NaN, data/README.md.)
        try:
            for part in ("X", "y"):  # y as training reads it: a class's one-hot row is finite
                found = staged.first_non_finite(part)
                if found is not None:
                    raise non_finite_error(self.reader.name, found, whole=True, part=part)
        except BaseException:
            staged.release()
            raise
        return staged

    def add_rows(
        self,
        client: Client,
        staged: StagedData,
        assignment: Mapping[str, np.ndarray],
        *,
        dtype: Any,
        key_name: Callable[[str], str] | None = None,
    ) -> StagedData:
        """Rows ``assignment[worker]`` read from the source on their workers and appended.

        As :func:`rebalance.add_rows`: ``staged`` stays whole until every worker has its
        rows, so a worker lost meanwhile leaves it usable for another assignment.
        """
        del key_name
        wanted = {w: np.asarray(ids, dtype=np.int64) for w, ids in assignment.items() if len(ids)}
        pieces = self._encoded(
            client,
            self.reader.read_ids(client, wanted, dtype=dtype, csv_chunksize=self.csv_chunksize),
            dtype,
        )
        futures, counts = dict(staged.futures), dict(staged.counts)
        merged = {w: append_piece(client, futures.get(w), piece, w) for w, piece in pieces.items()}
        _wait_ok(merged.values(), merged)
        for w, fut in merged.items():
            if w in futures:
                futures[w].release()
            futures[w] = fut
            counts[w] = counts.get(w, 0) + len(wanted[w])
        return replace(staged, futures=futures, counts=counts)

    def sample(
        self, client: Client, staged: StagedData, ids: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``ids`` (sorted) gathered from the shards that hold them: a small sample.

        A worker that has left since staging is left out, its rows with it (the round
        loop finds it gone and re-stages them); a pinned task of it would never end.
        """
        futures = staged.map_shards(_rows_with_ids, ids)
        while True:
            try:
                _wait_ok(futures.values(), futures)
                break
            except WorkerLostError:
                gone = _gone_workers(client, futures)
                client.cancel([futures.pop(w) for w in gone])
                if not futures:
                    raise
        parts = client.gather(list(futures.values()))
        row_ids = np.concatenate([p[0] for p in parts])
        order = np.argsort(row_ids)
        X = np.concatenate([p[1] for p in parts])[order]
        Y = np.concatenate([p[2] for p in parts])[order]
        return X, Y

    def _encoded(self, client: Client, futures: dict[str, Future], dtype: Any) -> dict[str, Future]:
        if self.encode is None:
            return futures
        return {
            w: client.submit(
                _encode_shard,
                fut,
                self.encode,
                np.dtype(dtype),
                workers=[w],
                allow_other_workers=False,
                pure=False,
            )
            for w, fut in futures.items()
        }


def known_rows(client: Client | None, part: Any) -> Any:
    """Dask ``part`` (array, DataFrame or Series) as a Dask array whose row blocks have
    known lengths, counted by ``client``'s workers (only counts travel), or with None by
    Dask's current scheduler.

    A data frame's blocks are taken as the workers compute them (``to_delayed``): Dask
    may fuse a few columns' partitions, so neither ``npartitions`` nor
    ``to_dask_array(lengths=)``, which count the unfused ones, can be trusted with them.
    """
    return known_rows_of(client, [part])[0]


def known_rows_of(client: Client | None, parts: list[Any]) -> list[Any]:
    """:func:`known_rows` of each Dask collection of ``parts``, counted in one call."""
    import dask
    import dask.array as da

    out = []
    for part, (delayed, lengths) in zip(parts, shards.blocks_and_lengths(client, parts)):
        if hasattr(part, "chunks"):
            out.append(
                da.Array(part.dask, part.name, (tuple(lengths), *part.chunks[1:]), meta=part._meta)
            )
            continue
        meta = part._meta.to_numpy()
        blocks = [
            da.from_delayed(dask.delayed(np.asarray)(block), (n, *meta.shape[1:]), meta.dtype)
            for block, n in zip(delayed, lengths)
        ]
        out.append(da.concatenate(blocks) if blocks else da.from_array(meta))
    return out


def _rows_kept(
    block: np.ndarray, seed: int, fraction: float, held: bool, block_info: dict | None = None
) -> np.ndarray:
    """The rows of one block in the held-out part (``held``) or in the rest."""
    start = int(block_info[0]["array-location"][0][0])
    mask = held_out_rows(seed, start, start + len(block), fraction)
    return block[mask if held else ~mask]


def split_held_out(
    client: Client, parts: list[Any], fraction: float, seed: int
) -> tuple[list[Any], list[Any]]:
    """The training and held-out parts of Dask data, lazily: only block lengths are read.

    ``parts`` are X, its labels and weights: Dask collections or arrays (None and a
    column name pass through). Each becomes a Dask array of known row blocks
    (:func:`known_rows`; a data frame's feature names are the caller's to keep), and each
    row is held out by its position and ``seed``
    (:func:`~hmdspt.core.shard.held_out_rows`), so the parts split alike whatever their
    blocks, and a block read again gives the same rows. Random, not stratified. The
    parts' block lengths are known too (:func:`~hmdspt.core.shard.held_out_counts`).
    """
    import dask.array as da

    lazy = [p for p in parts if hasattr(p, "__dask_graph__")]
    counted = dict(zip(map(id, lazy), known_rows_of(client, lazy)))
    train, held = [], []
    for part in parts:
        if part is None or isinstance(part, str):
            train.append(part)
            held.append(part)
            continue
        if hasattr(part, "__dask_graph__"):
            part = counted[id(part)]
        else:
            part = da.from_array(np.asarray(part))
        if part.ndim == 2:
            part = part.rechunk({1: -1})
        # Each part's block lengths follow from the positions: no one counts them again.
        n_held = held_out_counts(seed, list(part.chunks[0]), fraction)
        n_kept = [n - h for n, h in zip(part.chunks[0], n_held)]
        for out, keep, lengths in ((train, False, n_kept), (held, True, n_held)):
            out.append(
                part.map_blocks(
                    _rows_kept,
                    seed,
                    fraction,
                    keep,
                    chunks=(tuple(lengths), *part.chunks[1:]),
                    dtype=part.dtype,
                    meta=part._meta,
                )  # fmt: skip
            )
    return train, held
