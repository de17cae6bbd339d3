"""Changing where rows live after staging: moves, lost workers, re-staged rows.

:func:`rebalance` carries out a move plan (see :mod:`hmdspt.core.partition`) worker
to worker: the sender cuts the moving rows off its shard, the receiver concatenates them
onto its own, and Dask ships the slice between the two workers; the rows never reach
the driver. :func:`drop_workers` forgets the shards of lost workers, :func:`held_row_ids`
tells which rows every worker holds, and :func:`add_rows` re-stages rows from the source
onto the survivors.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
from distributed import Client, Future

from hmdspt.core.shard import (
    Shard,
    _as_features,
    _concat_shards,
    _held_ids,
    _shard_head,
    _shard_tail,
    take_rows,
)
from hmdspt.parallel.client import WorkerLostError, _cluster_workers, _wait_ok, scatter_to
from hmdspt.parallel.shards import SecondWave, StagedData, _wait_shards

__all__ = ["add_rows", "drop_workers", "held_row_ids", "join_second_wave", "rebalance"]


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


def append_piece(client: Client, base: Future | None, piece: Future, worker: str) -> Future:
    """``piece``'s rows appended to ``base`` (None: the worker held none), on ``worker``."""
    return client.submit(
        _concat_shards, base, piece, workers=[worker], allow_other_workers=False, pure=False
    )


def join_second_wave(staged: StagedData, wave: SecondWave) -> set[str]:
    """Append each worker's second staging wave to its shard, on the worker, in ``staged``.

    Waits for the wave first. The first wave's rows keep their ``done`` marks; the second
    wave's arrive not done. Returns the workers of ``staged`` that left before their rows
    were one shard: ``staged`` still lists their first wave, and the caller recovers
    their rows.
    """
    landed, lost = wave.take()
    merged: dict[str, Future] = {}
    try:
        for worker, piece in landed.items():
            if worker in staged.futures:
                merged[worker] = append_piece(staged.client, staged.futures[worker], piece, worker)
        merged = _wait_shards(merged, skip_lost=True)
    finally:
        for piece in landed.values():
            piece.release()
    for worker, fut in merged.items():
        staged.futures[worker].release()
        staged.futures[worker] = fut
    return {w for w in (set(landed) | lost) - set(merged) if w in staged.futures}


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

    ``dtype`` is the features' dtype on the workers (that of
    :func:`~hmdspt.parallel.shards.stage`); ``key_name`` names the scattered rows' keys, as
    there.

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
            X=_as_features(take_rows(X, ids, dtype), dtype),
            y=None if y is None else np.ascontiguousarray(take_rows(y, ids)),
            row_ids=ids,
        )
        piece = scatter_to(client, rows, worker, key=None if key_name is None else key_name(worker))
        merged = append_piece(client, futures.get(worker), piece, worker)
        if worker in futures:
            replaced.append(futures[worker])
        futures[worker] = merged
        counts[worker] = counts.get(worker, 0) + len(ids)
        _wait_ok([merged], [worker])
        piece.release()
    for old in replaced:
        old.release()
    return replace(staged, futures=futures, counts=counts)
