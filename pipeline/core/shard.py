"""The rows one worker holds, and the seeded permutation that deals the rows out.

A :class:`Shard` is plain numpy: features, labels, the rows' source ids and the epoch's
``done`` mask. :mod:`hmdspt.parallel.shards` puts one on every worker and
:mod:`hmdspt.parallel.rebalance` moves rows between them; the row ids come from the
staging permutation below (``perm[start:stop]`` for the worker's slice), so the same data,
seed and counts give the same shards whatever the source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

# Rows checked for NaN at a time by first_non_finite (bounds the check's temporary memory).
FINITE_CHUNK_ROWS = 65_536


class DataError(ValueError):
    """The rows a fit was given cannot be trained on (a NaN or infinite feature, target or
    sample weight), found where they were read. A ``ValueError``, as scikit-learn raises
    for bad input; a fit raises it as it is, not as a failure of the cluster."""


__all__ = ["DataError", "LabelColumns", "Shard", "as_rows", "first_non_finite", "take_rows"]


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
    weights : ndarray of shape (n_rows,), optional
        Sample weights read with raw labels, until :func:`_encode_shard` makes them the
        last column of the encoded targets (which then carry them); None otherwise.
    """

    X: np.ndarray
    y: np.ndarray | None
    row_ids: np.ndarray
    done: np.ndarray | None = None
    weights: np.ndarray | None = None

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
        # Dask's out-of-band frames can put arrays at odd addresses, where np.take is far
        # slower (docs/design.md, "Round loop"): copy once, only the arrays that need it.
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


def as_rows(a: Any) -> np.ndarray:
    """``a`` as a 2-d array of one row per entry of its first axis (1-d: one column).

    Not ``reshape(len(a), -1)``: numpy cannot infer the ``-1`` of an empty array, and a
    block a filter or a held-out split emptied is one (``cannot reshape array of size 0``).
    """
    a = np.asarray(a)
    if a.ndim == 2:
        return a
    return a.reshape(len(a), int(np.prod(a.shape[1:], dtype=np.int64)))


#: Rows gathered at a time when they change dtype on the way (:func:`take_rows`).
TAKE_CHUNK_ROWS = 65_536


def take_rows(a: Any, ids: np.ndarray, dtype: Any = None) -> np.ndarray:
    """Rows ``ids`` of array ``a``, C-contiguous, of ``dtype`` (None: ``a``'s).

    From a C-contiguous array ``np.take`` along the first axis, about 1.7x as fast as fancy
    indexing (860,000 random rows of a 1.6M x 40 float32 array: 0.05 against 0.09 s), which
    staging does for every row. From any other layout, fancy indexing: ``np.take`` first
    copies the whole array into C order, at every call (a 282,299-row shard of KDD's 81 MB
    Fortran-ordered ``X_train``: a traced peak of 127.3 MB against 46.3 MB). Rows of another
    dtype are gathered :data:`TAKE_CHUNK_ROWS` at a time into the result, so that the
    gather holds no whole copy in ``a``'s dtype beside it.
    """
    a = np.asarray(a)
    if dtype is None or a.dtype == np.dtype(dtype):
        if a.flags.c_contiguous:
            return np.take(a, ids, axis=0)
        return np.ascontiguousarray(a[ids])
    out = np.empty((len(ids), *a.shape[1:]), dtype=dtype)
    for start in range(0, len(ids), TAKE_CHUNK_ROWS):
        stop = start + TAKE_CHUNK_ROWS
        out[start:stop] = take_rows(a, ids[start:stop])
    return out


def _as_features(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.ascontiguousarray(as_rows(a), dtype=dtype)


# Run on the workers (re-balancing, recovery, the label check): numpy only, so a worker
# imports nothing heavy for them (the parallel layer's staging module pulls in pandas and
# pyarrow, seconds on a throttled worker).
def _shard_head(shard: Shard, n_keep: int) -> Shard:
    """The first ``n_keep`` rows, as views of the shard's arrays: nothing is copied.

    A sender keeps its rows in place, so a re-balance costs it no copy and no fresh memory
    (copying a sender's 0.5-0.8M kept rows into fresh memory took 0.2-0.5 s on the testbed,
    docs/design.md, "Re-balancing that pays"). The cut-off rows' memory is freed with the
    kept rows.
    """
    return Shard(
        X=shard.X[:n_keep],
        y=None if shard.y is None else shard.y[:n_keep],
        row_ids=shard.row_ids[:n_keep],
        done=shard.done[:n_keep],
    )


def _shard_tail(shard: Shard, n_move: int) -> Shard:
    """The last ``n_move`` rows (a random sample: shards are in shuffled order), copied:
    what travels to the receiver holds none of the sender's buffers."""
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


def first_non_finite(X: np.ndarray, row_ids: np.ndarray) -> tuple[int, int, float] | None:
    """``(row id, column, value)`` of the NaN or infinite feature of the lowest row id.

    Checked in chunks of rows, so the check's temporary memory stays small.
    """
    if X.dtype.kind not in "fc":
        return None
    first: tuple[int, int, float] | None = None  # (row id, column, value)
    for lo in range(0, len(X), FINITE_CHUNK_ROWS):
        block = X[lo : lo + FINITE_CHUNK_ROWS]
        bad = ~np.isfinite(block)
        if not bad.any():
            continue
        rows, cols = np.nonzero(bad)  # row-major: within a row, the first column first
        i = int(np.argmin(row_ids[lo + rows]))
        row = int(row_ids[lo + rows[i]])
        if first is None or row < first[0]:
            first = (row, int(cols[i]), float(block[rows[i], cols[i]]))
    return first


def _shard_non_finite(shard: Shard, part: str = "X") -> tuple[int, int, float] | None:
    """:func:`first_non_finite` of a shard's features (``part="X"``) or targets (``"y"``,
    as training reads them: a regression target, a sample weight) (a task on its worker)."""
    if part == "X":
        return first_non_finite(shard.X, shard.row_ids)
    if shard.y is None:
        return None
    return first_non_finite(as_rows(shard.y), shard.row_ids)


def _held_ids(shard: Shard) -> np.ndarray:
    return shard.row_ids


@dataclass(frozen=True, eq=False)
class LabelColumns:
    """A fitted ``LabelBinarizer``'s ``transform`` and ``inverse_transform``, in numpy
    alone, for the workers.

    Labels the workers read are encoded there, shard by shard; with the estimator's
    binarizer itself, every fresh worker process imported scikit-learn inside a fit's
    first staging (docs/design.md, the row on what the workers import).

    Parameters
    ----------
    classes : ndarray of shape (n_classes,)
        The binarizer's ``classes_``, sorted.
    kind : {"binary", "multiclass", "multilabel-indicator"}
        The binarizer's ``y_type_``.

    Examples
    --------
    >>> encode = LabelColumns(np.array(["cat", "dog", "eel"]), "multiclass")
    >>> encode(np.array(["eel", "cat"]))
    array([[0, 0, 1],
           [1, 0, 0]])
    >>> LabelColumns(np.array([3, 7]), "binary")(np.array([7, 3, 7]))
    array([[1],
           [0],
           [1]])
    >>> encode.inverse(np.array([[0.1, 0.7, 0.2]]))
    array(['dog'], dtype='<U3')
    """

    classes: np.ndarray
    kind: str

    def __call__(self, y: np.ndarray, dtype: DTypeLike = np.int64) -> np.ndarray:
        """The 0/1 columns of the labels ``y``, of type ``dtype`` (the binarizer's int64
        by default; the model's dtype saves the estimator a conversion)."""
        y = np.asarray(y)
        if self.kind == "multilabel-indicator":  # one 0/1 column per label already
            if y.ndim != 2 or y.shape[1] != len(self.classes):
                raise ValueError(
                    f"a label indicator of {len(self.classes)} columns was fitted, got shape "
                    f"{y.shape}"
                )
            return y.astype(dtype)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        at = np.minimum(np.searchsorted(self.classes, y), len(self.classes) - 1)
        unseen = self.classes[at] != y
        if unseen.any():
            raise ValueError(f"y has labels the fit did not find: {np.unique(y[unseen])[:5]}")
        if self.kind == "binary":
            return (at == 1).astype(dtype).reshape(-1, 1)
        Y = np.zeros((len(y), len(self.classes)), dtype=dtype)
        Y[np.arange(len(y)), at] = 1
        return Y

    def inverse(self, Y: np.ndarray) -> np.ndarray:
        """The labels of the network's outputs ``Y``: the binarizer's
        ``inverse_transform`` (a logistic output over 0.5 is the second class, a softmax
        row its largest column, an indicator's outputs over 0.5 are 1)."""
        Y = np.asarray(Y)
        if self.kind == "multiclass":
            return self.classes.take(Y.argmax(axis=1), mode="clip")
        hits = (Y > 0.5).astype(np.int64)
        if self.kind == "multilabel-indicator":
            return hits
        return self.classes[hits.ravel()]


def _encode_shard(shard: Shard, encode: Callable[[np.ndarray], np.ndarray], dtype) -> Shard:
    """The shard with its labels encoded into the model's targets (``encode(y)``).

    Sample weights read with the labels become the targets' last column (weighted
    targets, as :func:`hmdspt.core.nn.weighted_targets` makes them).
    """
    Y = as_rows(encode(shard.y))
    if shard.weights is not None:
        if (shard.weights < 0).any():
            raise ValueError("Negative values in data passed to `sample_weight`.")
        bad = first_non_finite(shard.weights.reshape(-1, 1), shard.row_ids)
        if bad is not None:  # a weight is not a target: named here, before the targets' check
            raise DataError(
                f"sample_weight has NaN/infinite value(s), e.g. at row {bad[0]}; drop or "
                "impute them first"
            )
        Y = np.column_stack([Y, shard.weights])
    Y = np.ascontiguousarray(Y, dtype=dtype)
    return Shard(X=shard.X, y=Y, row_ids=shard.row_ids, done=shard.done)


def _rows_with_ids(shard: Shard, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(row ids, X, y)`` of the shard's rows whose ids are in ``ids`` (a sample)."""
    keep = np.isin(shard.row_ids, ids)
    y = np.empty((int(keep.sum()), 0)) if shard.y is None else shard.y[keep]
    return shard.row_ids[keep], shard.X[keep], y


def held_out_rows(seed: int, start: int, stop: int, fraction: float) -> np.ndarray:
    """Whether each of the rows ``start..stop`` (source positions) is held out.

    A row's draw depends on its position and ``seed`` only (a splitmix64 hash), not on
    how the source is cut into blocks: every block, read again or cut otherwise, gives
    the same split, with no pass over the rows before it.
    """
    with np.errstate(over="ignore"):
        z = np.arange(start, stop, dtype=np.uint64) + np.uint64(seed & (2**63 - 1))
        z = (z + np.uint64(0x9E3779B97F4A7C15)) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(27))
        z = z * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(2**53) < fraction


def held_out_counts(
    seed: int, lengths: list[int], fraction: float, step: int = 1 << 20
) -> list[int]:
    """Rows :func:`held_out_rows` holds out of each block of ``lengths`` (consecutive
    source positions), found from the positions alone, ``step`` rows at a time: the
    parts' block lengths are known without reading a row.

    >>> lengths = [700, 0, 300]
    >>> counts = held_out_counts(5, lengths, 0.2, step=256)
    >>> counts == [int(held_out_rows(5, 0, 700, 0.2).sum()), 0,
    ...            int(held_out_rows(5, 700, 1000, 0.2).sum())]
    True
    """
    counts, start = [], 0
    for n in lengths:
        counts.append(
            sum(
                int(held_out_rows(seed, lo, min(lo + step, start + n), fraction).sum())
                for lo in range(start, start + n, step)
            )
        )
        start += n
    return counts
