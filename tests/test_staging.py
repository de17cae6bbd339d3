"""Tests of staging rows on workers and re-balancing them, on a real 3-process cluster."""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster
from hypothesis import given, settings
from hypothesis import strategies as st

from hmdspt.core.shard import (
    DataError,
    Shard,
    _concat_shards,
    _permutation,
    _shard_head,
    _shard_tail,
    take_rows,
)
from hmdspt.parallel.client import (
    WorkerLostError,
    _wait_ok,
    scatter_to,
    scheduler_workers,
    wait_some,
)
from hmdspt.parallel.readers import _npz_rows, read_frame_part
from hmdspt.parallel.rebalance import add_rows, drop_workers, held_row_ids, rebalance
from hmdspt.parallel.shards import (
    StagedData,
    equal_counts,
    stage,
)

pytestmark = pytest.mark.heavy(7)  # staging on clusters

N, F = 3000, 5
CLASS_P = (0.5, 0.3, 0.2)
# chi-square critical value, 4 degrees of freedom ((3 shards - 1) * (3 classes - 1)), p=0.001
CHI2_4DF_999 = 18.47


@dataclass
class Move:
    source: str
    destination: str
    rows: int


def _cluster(n_workers: int, processes: bool = True, **kwargs) -> LocalCluster:
    return LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=processes,
        dashboard_address=None,
        # the scheduler's HTTP endpoints would otherwise try port 8787 (shared machine)
        scheduler_kwargs={"dashboard_address": ":0"},
        silence_logs=logging.ERROR,
        **kwargs,
    )


@pytest.fixture(scope="module")
def client():
    with _cluster(3) as cluster, Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def workers(client):
    return sorted(scheduler_workers(client))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(42)
    X = rng.normal(size=(N, F)).astype(np.float32)
    y = rng.choice(3, size=N, p=CLASS_P).astype(np.int64)
    df = pd.DataFrame(X, columns=[f"f{i}" for i in range(F)])
    df["label"] = y
    return X, y, df


@pytest.fixture(scope="module")
def files(tmp_path_factory, data):
    X, y, df = data
    d = tmp_path_factory.mktemp("staging")
    np.savez_compressed(d / "xy.npz", X=X, y=y, other=np.zeros(3))
    np.savez(d / "train.npz", X_train=X, y_train=y, X_test=X[:10])  # stored, not deflated
    df.to_parquet(d / "one.parquet", row_group_size=700)
    (d / "dir").mkdir()
    df.iloc[:1200].to_parquet(d / "dir" / "part-0.parquet", row_group_size=500)
    df.iloc[1200:].to_parquet(d / "dir" / "part-1.parquet", row_group_size=500)
    df.to_csv(d / "xy.csv", index=False)
    return d


def shares(workers, n=N, weights=(4, 2, 1)):
    """Counts in proportion to ``weights`` (largest remainder), as the partitioner would."""
    raw = np.array(weights, float) / sum(weights) * n
    counts = np.floor(raw).astype(int)
    counts[np.argsort(raw - counts)[::-1][: n - counts.sum()]] += 1
    return dict(zip(workers, counts.tolist()))


def audit(client, staged: StagedData, X, y) -> dict[str, Shard]:
    """Fetch the shards (test only) and check ids, counts and contents against the source."""
    shards = {w: client.gather(f) for w, f in staged.futures.items()}
    # each shard lives on its own worker, and only there
    who_has = client.who_has(list(staged.futures.values()))
    assert {w: list(who_has[f.key]) for w, f in staged.futures.items()} == {
        w: [w] for w in staged.futures
    }
    ids = np.concatenate([s.row_ids for s in shards.values()])
    # sorted ids equal to 0..n-1: nothing lost, nothing duplicated
    np.testing.assert_array_equal(np.sort(ids), np.arange(len(X)))
    assert staged.n_rows == len(X)
    for w, s in shards.items():
        assert len(s) == staged.counts[w] > 0
        assert s.row_ids.dtype == np.int64
        assert s.X.dtype == np.float32 and s.X.flags.c_contiguous
        np.testing.assert_array_equal(s.X, X[s.row_ids])
        if y is not None:
            np.testing.assert_array_equal(s.y, y[s.row_ids])
    return shards


def chi2_homogeneity(shards: dict[str, Shard], n_classes: int = 3) -> float:
    table = np.array([np.bincount(s.y, minlength=n_classes) for s in shards.values()], float)
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    return float(((table - expected) ** 2 / expected).sum())


# --------------------------------------------------------------------------- no cluster
def test_equal_counts_hands_out_remainder_first():
    assert equal_counts(10, ["a", "b", "c"]) == {"a": 4, "b": 3, "c": 3}
    with pytest.raises(ValueError, match="no workers"):
        equal_counts(10, [])


def test_shard_rejects_arrays_of_different_lengths():
    with pytest.raises(ValueError, match="disagree"):
        Shard(X=np.zeros((3, 2)), y=np.zeros(2), row_ids=np.arange(3))


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 60),
    width=st.integers(1, 4),
    chunk_bytes=st.integers(1, 200),
    compressed=st.booleans(),
    data=st.data(),
)
def test_npz_streaming_keeps_exactly_the_wanted_rows(
    tmp_path_factory, n, width, chunk_bytes, compressed, data
):
    # The chunk boundary logic of the streamed reader, with chunks as small as one row.
    a = np.arange(n * width, dtype=np.float64).reshape(n, width)
    path = tmp_path_factory.mktemp("npz") / "a.npz"
    (np.savez_compressed if compressed else np.savez)(path, a=a)
    wanted = np.array(sorted(data.draw(st.sets(st.integers(0, n - 1)))), dtype=np.int64)
    got = _npz_rows(str(path), "a", wanted, n, None, chunk_bytes)
    np.testing.assert_array_equal(got, a[wanted])
    # With an order, row wanted[i] lands at position order[i] (shard order).
    order = np.random.default_rng(n).permutation(len(wanted))
    got = _npz_rows(str(path), "a", wanted, n, order, chunk_bytes)
    np.testing.assert_array_equal(got[order], a[wanted])


def test_split_and_concat_keep_every_row():
    s = Shard(
        X=np.arange(20, dtype=np.float32).reshape(10, 2), y=np.arange(10), row_ids=np.arange(10)
    )
    head, tail = _shard_head(s, 7), _shard_tail(s, 3)
    # The sender keeps its rows in place; what travels holds none of its buffers.
    for part in ("X", "y", "row_ids", "done"):
        assert np.shares_memory(getattr(head, part), getattr(s, part)), part
        assert not np.shares_memory(getattr(tail, part), getattr(s, part)), part
    joined = _concat_shards(None, head, tail)
    np.testing.assert_array_equal(joined.row_ids, np.arange(10))
    np.testing.assert_array_equal(joined.X, s.X)


# --------------------------------------------------------------------------- staging
SOURCES = [
    "numpy",
    "numpy-fortran",
    "numpy-float64-fortran",
    "pandas-target",
    "pandas-X-y",
    "dask-array",
    "dask-dataframe",
    "npz",
    "npz-train-keys",
    "parquet-file",
    "parquet-dir",
    "csv",
]


def make_source(kind, data, files):
    X, y, df = data
    if kind == "numpy":
        return (X, y), {}
    if kind == "numpy-fortran":  # gathered from a C-ordered copy
        return (np.asfortranarray(X), y), {}
    if kind == "numpy-float64-fortran":
        return (np.asfortranarray(X, dtype=np.float64), y), {}
    if kind == "pandas-target":
        return (df,), {"target": "label"}
    if kind == "pandas-X-y":
        return (df.drop(columns="label"), df["label"]), {}
    if kind == "dask-array":
        import dask.array as da

        return (da.from_array(X, chunks=(700, 2)), da.from_array(y, chunks=1100)), {}
    if kind == "dask-dataframe":
        import dask.dataframe as dd

        return (dd.from_pandas(df, npartitions=4),), {"target": "label"}
    if kind == "npz":
        return (files / "xy.npz",), {}
    if kind == "npz-train-keys":
        return (str(files / "train.npz"),), {}
    if kind == "parquet-file":
        return (files / "one.parquet",), {"target": "label"}
    if kind == "parquet-dir":
        return (files / "dir",), {"target": "label"}
    return (files / "xy.csv",), {"target": "label"}


@pytest.mark.parametrize("kind", SOURCES)
def test_stage_every_source_gives_the_same_audited_shards(client, workers, data, files, kind):
    X, y, _ = data
    counts = shares(workers)
    args, kwargs = make_source(kind, data, files)
    staged = stage(client, *args, counts=counts, seed=7, **kwargs)
    try:
        assert staged.counts == counts and staged.n_features == F
        assert staged.has_labels
        shards = audit(client, staged, X, y)
        # Same seed and counts -> the same rows on the same workers, whatever the source.
        expected_ids = _permutation(7, N)
        start = 0
        for w, c in counts.items():
            np.testing.assert_array_equal(shards[w].row_ids, expected_ids[start : start + c])
            start += c
        if kind in ("pandas-target", "parquet-file", "parquet-dir", "csv", "dask-dataframe"):
            assert staged.feature_names == [f"f{i}" for i in range(F)]
        # Intermediate blocks, pieces and the permutation are gone: only the shards remain.
        expected = {f.key for f in staged.futures.values()}
        assert _wait_for_keys(client, expected) == expected
    finally:
        staged.release()


@pytest.mark.parametrize("kind", ["numpy", "dask-array", "npz"])
def test_skip_lost_stages_the_others_as_planned_and_leaves_the_lost_rows_out(
    client, workers, data, files, kind
):
    """A worker gone since the counts were planned: its rows are staged nowhere."""
    X, y, _ = data
    gone = "tcp://10.0.0.1:1"
    counts = {workers[0]: 1000, gone: 1200, workers[1]: 800}
    args, kwargs = make_source(kind, data, files)
    with pytest.raises(ValueError, match="unknown workers"):
        stage(client, *args, counts=counts, seed=7, **kwargs)
    staged = stage(client, *args, counts=counts, seed=7, skip_lost=True, **kwargs)
    try:
        assert staged.counts == {workers[0]: 1000, workers[1]: 800}
        shards = {w: client.gather(f) for w, f in staged.futures.items()}
        ids = _permutation(7, N)  # each survivor has the rows it was planned
        np.testing.assert_array_equal(shards[workers[0]].row_ids, ids[:1000])
        np.testing.assert_array_equal(shards[workers[1]].row_ids, ids[2200:])
        for shard in shards.values():
            np.testing.assert_array_equal(shard.X, X[shard.row_ids])
    finally:
        staged.release()


def test_default_counts_are_equal_and_classes_balanced(client, workers, data):
    X, y, _ = data
    staged = stage(client, X, y)
    try:
        assert staged.counts == {w: N // 3 for w in workers}
        shards = audit(client, staged, X, y)
        assert chi2_homogeneity(shards) < CHI2_4DF_999
        np.testing.assert_array_equal(staged.unique_labels(), [0, 1, 2])
    finally:
        staged.release()


def test_seed_decides_the_assignment(client, workers, data):
    X, y, _ = data
    a = stage(client, X, y, seed=1)
    b = stage(client, X, y, seed=None)
    try:
        w = workers[0]
        ids_a = client.gather(a.futures[w]).row_ids
        ids_b = client.gather(b.futures[w]).row_ids
        assert not np.array_equal(np.sort(ids_a), np.sort(ids_b))
        assert isinstance(b.seed, int)
    finally:
        a.release()
        b.release()


def test_string_labels_from_csv(client, tmp_path):
    df = pd.DataFrame({"a": np.arange(30.0), "cls": np.array(["x", "y", "z"] * 10)})
    df.to_csv(tmp_path / "s.csv", index=False)
    staged = stage(client, tmp_path / "s.csv", target="cls", seed=0)
    try:
        assert list(staged.unique_labels()) == ["x", "y", "z"]
    finally:
        staged.release()


@pytest.mark.parametrize("name", ["one.parquet", "xy.npz", "xy.csv"])
def test_shards_stay_in_memory_between_rounds(client, workers, data, files, tmp_path, name):
    X, y, _ = data
    path = tmp_path / name
    path.write_bytes((files / name).read_bytes())
    target = None if name.endswith(".npz") else "label"
    staged = stage(client, path, counts=shares(workers), target=target)
    try:
        keys = {w: f.key for w, f in staged.futures.items()}
        first = client.gather(staged.map_shards(_checksum))
        os.remove(path)  # a task that re-read the file would now fail
        for _ in range(2):
            assert client.gather(staged.map_shards(_checksum)) == first
        assert {w: f.key for w, f in staged.futures.items()} == keys
    finally:
        staged.release()


def _checksum(shard: Shard) -> tuple[int, float]:
    return len(shard), float(shard.X.sum(dtype=np.float64))


# --------------------------------------------------------------------------- re-balancing
def _transfer_snapshot(dask_worker):
    return dask_worker.transfer_outgoing_bytes_total


def _clear_incoming_log(dask_worker):
    dask_worker.transfer_incoming_log.clear()


def _incoming(dask_worker):
    return [(e["who"], e["total"], list(e["keys"])) for e in dask_worker.transfer_incoming_log]


def _cluster_keys(client) -> set:
    return {k for keys in client.has_what().values() for k in keys}


def _wait_for_keys(client, expected: set, may_vanish: set = frozenset(), timeout=10) -> set:
    """The cluster's keys once they are ``expected``, give or take keys in ``may_vanish``
    (an earlier test's data, released asynchronously, may disappear at any moment)."""
    must = expected - may_vanish
    deadline = time.monotonic() + timeout
    while not (must <= (keys := _cluster_keys(client)) <= expected):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return keys


def test_rebalance_moves_rows_worker_to_worker(client, workers, data, monkeypatch):
    X, y, _ = data
    a, b, c = workers
    row_bytes = F * 4 + 8 + 8  # X float32 + y int64 + row id int64
    staged = stage(client, X, y, counts={a: 2000, b: 1000, c: 0})  # c holds nothing
    assert set(staged.futures) == {a, b}
    audit(client, staged, X, y)
    baseline = _cluster_keys(client) - {f.key for f in staged.futures.values()}

    # 1. to a worker that held nothing, from two senders; the driver must not gather.
    client.run(_clear_incoming_log)
    out_before = client.run(_transfer_snapshot)

    def no_gather(*args, **kwargs):
        raise AssertionError("rebalance gathered data to the driver")

    with monkeypatch.context() as m:
        m.setattr(client, "gather", no_gather)
        m.setattr(client, "_gather", no_gather)
        old = staged
        staged = rebalance(client, staged, [Move(a, c, 600), Move(b, c, 200)])
    assert staged.counts == {a: 1400, b: 800, c: 800}
    incoming = client.run(_incoming)
    out_after = client.run(_transfer_snapshot)
    from_a = sum(total for who, total, _ in incoming[c] if who == a)
    from_b = sum(total for who, total, _ in incoming[c] if who == b)
    # Each slice arrives at c straight from its sender (a Shard's sizeof is its arrays'
    # bytes plus a few dozen bytes of object).
    assert 600 * row_bytes <= from_a < 600 * row_bytes + 1024
    assert 200 * row_bytes <= from_b < 200 * row_bytes + 1024
    assert out_after[a] - out_before[a] == from_a
    assert out_after[b] - out_before[b] == from_b
    assert incoming[a] == [] and incoming[b] == []  # nothing else moved
    assert all(f.status == "finished" for f in staged.futures.values())
    del old
    # Old shards and the moved slices are gone from the workers: only the new shards remain.
    expected = baseline | {f.key for f in staged.futures.values()}
    keys = _wait_for_keys(client, expected, may_vanish=baseline)
    assert expected - baseline <= keys <= expected
    shards = audit(client, staged, X, y)
    assert chi2_homogeneity(shards) < CHI2_4DF_999

    # 2. empty b entirely, and a worker that receives then sends in the same plan.
    staged = rebalance(client, staged, [Move(b, a, 800), Move(a, c, 1000), Move(c, b, 300)])
    assert staged.counts == {a: 1200, c: 1500, b: 300}
    audit(client, staged, X, y)

    # 3. empty b again; b disappears from the placement.
    staged = rebalance(client, staged, [Move(b, c, 300)])
    assert staged.counts == {a: 1200, c: 1800}
    assert b not in staged.futures
    shards = audit(client, staged, X, y)
    expected = baseline | {f.key for f in staged.futures.values()}
    keys = _wait_for_keys(client, expected, may_vanish=baseline)
    assert expected - baseline <= keys <= expected
    staged.release()


def test_rebalance_checks_the_whole_plan_before_running(client, workers, data):
    X, y, _ = data
    a, b, c = workers
    staged = stage(client, X, y, counts={a: 2000, b: 1000})
    try:
        with pytest.raises(ValueError, match="holds 1000"):
            rebalance(client, staged, [Move(a, c, 10), Move(b, c, 1001)])
        with pytest.raises(ValueError, match="unknown worker"):
            rebalance(client, staged, [Move(a, "tcp://10.0.0.1:1", 10)])
        with pytest.raises(ValueError, match="same"):
            rebalance(client, staged, [Move(a, a, 10)])
        with pytest.raises(ValueError, match="holds 0"):
            rebalance(client, staged, [Move(c, a, 1)])
        with pytest.raises(ValueError, match="non-negative"):
            rebalance(client, staged, [Move(a, b, -1)])
        audit(client, staged, X, y)  # nothing ran: the placement is intact
        assert staged.counts == {a: 2000, b: 1000}
    finally:
        staged.release()


@pytest.mark.timeout(90)
def test_a_worker_that_left_before_the_wait_is_reported_not_waited_for(data):
    """A worker that leaves between a plan and its staging wait ends the wait at once.

    The trainer plans a re-balance from the workers it knew at the start of the round;
    a SLURM worker reaching its ``--lifetime`` can retire in between. Tasks pinned to it
    then never run, and a wait that only watched for workers leaving *during* it hung.
    Own cluster: the module's workers must stay.
    """
    X, y, _ = data
    with _cluster(2) as cluster, Client(cluster) as client:
        a, b = sorted(scheduler_workers(client))
        staged = stage(client, X, y, counts={a: 2000, b: 1000})
        # A graceful retirement, as --lifetime does: b's shard is copied to a, b leaves.
        client.retire_workers([b], close_workers=True)
        while b in scheduler_workers(client):
            time.sleep(0.1)

        with pytest.raises(WorkerLostError, match="left the cluster"):
            rebalance(client, staged, [Move(b, a, 500)])
        assert staged.counts == {a: 2000, b: 1000}  # the old placement is not replaced
        assert staged.futures[a].status == "finished"

        # The wait itself, for a task already pinned to the departed worker.
        stuck = client.submit(len, [1], workers=[b], allow_other_workers=False, pure=False)
        with pytest.raises(WorkerLostError, match=b):
            _wait_ok([stuck], [b])
        stuck.cancel()

        # Re-staging onto a departed worker fails without spoiling the placement it
        # started from: a's shard, already merged with new rows, is still there as it was.
        survivors = drop_workers(staged, [b])
        before = held_row_ids(survivors)[a]
        with pytest.raises(WorkerLostError, match=b):
            add_rows(client, survivors, X, y, {a: np.arange(10), b: np.arange(10, 20)})
        gc.collect()
        np.testing.assert_array_equal(held_row_ids(survivors)[a], before)
        staged.release()


def test_from_memory_two_shards_go_at_once_the_largest_first(client, workers, data, monkeypatch):
    """Each worker's link carries its own shard: two are sent at once, the largest first,
    and the driver never holds more than two."""
    import hmdspt.parallel.shards as shards_module

    X, y, _ = data
    counts = dict(zip(workers, (400, 1700, 900)))
    lock, in_flight, most, sent = threading.Lock(), [0], [0], []

    def slow_scatter(client, shard, worker, **kwargs):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            sent.append(len(shard.row_ids))
        time.sleep(0.1)  # a slow link: the next shard is gathered meanwhile
        try:
            return scatter_to(client, shard, worker, **kwargs)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(shards_module, "scatter_to", slow_scatter)
    staged = stage(client, X, y, counts=counts, seed=3)
    try:
        assert sent == [1700, 900, 400] and most[0] == 2
        assert list(staged.futures) == workers  # the workers' order, not the sending order
        held = held_row_ids(staged)
        assert {w: len(ids) for w, ids in held.items()} == counts
        assert sorted(np.concatenate(list(held.values())).tolist()) == list(range(N))
    finally:
        staged.release()


@pytest.mark.timeout(60)
def test_a_scatter_to_a_paused_worker_names_its_status_after_the_timeout():
    """A worker that stays but runs nothing (paused for memory) ends the wait, named."""
    # In-process: the worker's memory manager is reachable from here.
    with _cluster(1, processes=False, memory_limit="1GiB") as cluster, Client(cluster) as client:
        worker = next(iter(cluster.workers.values()))
        memory = worker.memory_manager
        usual = memory.memory_pause_fraction
        memory.memory_pause_fraction = 1e-6  # any process is over it: the worker pauses
        while scheduler_workers(client)[worker.address]["status"] != "paused":
            time.sleep(0.05)
        with pytest.raises(TimeoutError, match="status 'paused'"):
            scatter_to(client, np.arange(3), worker.address, timeout=1.0)
        memory.memory_pause_fraction = usual
        while scheduler_workers(client)[worker.address]["status"] != "running":
            time.sleep(0.05)
        sent = scatter_to(client, np.arange(3), worker.address, timeout=1.0)
        np.testing.assert_array_equal(sent.result(), np.arange(3))


# --------------------------------------------------------------------------- errors
def test_missing_path_is_named_as_the_cli_names_it(client, tmp_path):
    from hmdspt.parallel.readers import read_file

    missing = tmp_path / "nope.parquet"
    with pytest.raises(FileNotFoundError) as staged:
        stage(client, missing, target="label")
    with pytest.raises(FileNotFoundError) as read:
        read_file(missing, target="label")
    assert str(staged.value) == str(read.value) == f"data file not found: {missing}"


def test_unknown_extension(client, tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("1,2\n")
    with pytest.raises(ValueError, match=r"unknown file type.*\.npz.*\.parquet.*\.csv"):
        stage(client, path)


@pytest.mark.parametrize("where", ["csv", "parquet", "dataframe"])
def test_missing_target_column_names_it_and_lists_columns(client, data, files, where):
    _, _, df = data
    source = {"csv": files / "xy.csv", "parquet": files / "one.parquet", "dataframe": df}[where]
    with pytest.raises(ValueError, match=r"'lbl' not found.*\['f0', 'f1'.*'label'\]"):
        stage(client, source, target="lbl")


def test_npz_missing_key_lists_keys(client, files):
    with pytest.raises(ValueError, match=r"'Z' not found.*'X'"):
        stage(client, files / "xy.npz", x_key="Z")


def test_non_numeric_feature_column(client, tmp_path):
    """A ValueError, as scikit-learn's and the estimator's for a data frame in memory; naming
    the label column is suggested only where none was named."""
    frame = pd.DataFrame({"a": [1.0, 2.0], "s": ["u", "v"], "label": ["no", "yes"]})
    frame.to_csv(tmp_path / "s.csv", index=False)
    with pytest.raises(ValueError, match=r"\['s', 'label'\]; name the label column with target="):
        stage(client, tmp_path / "s.csv")
    for source in (tmp_path / "s.csv", frame):
        with pytest.raises(ValueError, match=r"\['s'\]; encode or drop these columns first$"):
            stage(client, source, target="label")


def test_a_frame_part_with_a_bool_column_is_checked_for_nan_as_floats(tmp_path):
    """The CLI's cluster reads parts of a file with read_frame_part: beside a bool column
    the features were an object array, which the NaN check passed."""
    frame = pd.DataFrame({"a": [1.0, 2.0, 3.0], "flag": [True, False, True], "n": [1, 2, 3]})
    frame["n"] = frame["n"].astype("Int64")
    frame.loc[1, "n"] = pd.NA
    frame.to_parquet(tmp_path / "typed.parquet")
    part = (str(tmp_path / "typed.parquet"), 0, 3)
    columns = ["a", "flag", "n"]
    with pytest.raises(DataError, match=r"e\.g\. a NaN at row 1, column 2"):
        read_frame_part(part, "parquet", columns, features=columns)


def test_length_mismatch(client, data):
    X, y, _ = data
    with pytest.raises(ValueError, match="3000 rows but y has 2999"):
        stage(client, X, y[:-1])
    import dask.array as da

    with pytest.raises(ValueError, match="3000 rows but y has 2999"):
        stage(client, da.from_array(X, chunks=1000), da.from_array(y[:-1], chunks=1000))


def test_bad_counts(client, workers, data):
    X, y, _ = data
    with pytest.raises(ValueError, match="sum to 2999 but the data has 3000"):
        stage(client, X, y, counts={workers[0]: 2999})
    with pytest.raises(ValueError, match=r"unknown workers \['tcp://10.0.0.1:1'\]"):
        stage(client, X, y, counts={workers[0]: 2000, "tcp://10.0.0.1:1": 1000})
    with pytest.raises(ValueError, match="non-negative"):
        stage(client, X, y, counts={workers[0]: 3001, workers[1]: -1})


def test_labels_of_a_path_come_from_the_file(client, files, data):
    _, y, _ = data
    with pytest.raises(ValueError, match="target="):
        stage(client, files / "xy.csv", y)


def test_shards_arrive_aligned_on_workers():
    """Shards unpickled from misaligned out-of-band frames (as Dask delivers them) are
    re-aligned: numpy's gather on misaligned float32 data is far slower."""
    import pickle

    from hmdspt.core.shard import Shard

    shard = Shard(
        X=np.random.default_rng(0).random((100, 40), dtype=np.float32),
        y=np.zeros(100, np.float32),
        row_ids=np.arange(100),
    )
    buffers: list = []
    payload = pickle.dumps(shard, protocol=5, buffer_callback=buffers.append)
    misaligned = []
    for buf in buffers:
        raw = buf.raw()
        holder = bytearray(len(raw) + 3)
        holder[3:] = raw
        misaligned.append(memoryview(holder)[3:])
    clone = pickle.loads(payload, buffers=misaligned)
    assert clone.X.flags.aligned and clone.X.flags.writeable
    np.testing.assert_array_equal(clone.X, shard.X)
    np.testing.assert_array_equal(clone.row_ids, shard.row_ids)


def _sleep_then(x, seconds):
    time.sleep(seconds)
    return x


def test_wait_some_returns_on_timeout_and_holds_no_futures_after(client):
    """A timed-out wait must not keep the caller's futures (and their data) alive."""

    def caller():
        held = client.scatter(np.arange(10), hash=False)  # only this frame refers to it
        slow = client.submit(_sleep_then, held, 1.0, pure=False)
        done, not_done = wait_some([slow], 0.05)
        assert done == set() and not_done == {slow}
        done, not_done = wait_some([slow], 30)
        assert done == {slow} and not_done == set()
        return held.key

    was_enabled = gc.isenabled()
    gc.disable()  # only reference counting may free the caller's frame
    try:
        key = caller()
        deadline = time.monotonic() + 10
        while key in _cluster_keys(client) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert key not in _cluster_keys(client)
    finally:
        if was_enabled:
            gc.enable()


@pytest.mark.parametrize("order", ["C", "F"])
def test_rows_are_taken_without_copying_the_whole_array_whatever_its_memory_order(order):
    """A Fortran-ordered X (as ``np.load`` gives KDD's) is gathered by fancy indexing:
    ``np.take`` copies the whole array into C order first, at every call, which doubled the
    driver's peak in the staging benchmark (160.7 against 81.2 MB traced)."""
    import tracemalloc

    X = np.asarray(np.random.default_rng(0).normal(size=(20_000, 25)), order=order)
    ids = np.random.default_rng(1).permutation(len(X))[:2_000]
    tracemalloc.start()
    try:
        rows = take_rows(X, ids)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(rows, X[ids])
    assert rows.flags.c_contiguous
    assert peak < 0.25 * X.nbytes, (peak, rows.nbytes, X.nbytes)


@pytest.mark.parametrize("order", ["C", "F"])
def test_rows_change_dtype_on_the_way_without_a_whole_copy_in_the_old_one(order, monkeypatch):
    """A cluster fit hands staging the user's X (float64 from most of scikit-learn's
    generators): each shard's rows are gathered straight into the model's dtype, a chunk at
    a time, never all of them in float64 first."""
    import tracemalloc

    from hmdspt.core import shard

    monkeypatch.setattr(shard, "TAKE_CHUNK_ROWS", 1_000)
    X = np.asarray(np.random.default_rng(0).normal(size=(20_000, 25)), order=order)
    ids = np.random.default_rng(1).permutation(len(X))[:12_000]
    tracemalloc.start()
    try:
        rows = take_rows(X, ids, np.float32)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(rows, X[ids].astype(np.float32))
    assert rows.dtype == np.float32 and rows.flags.c_contiguous
    # The float32 rows and one chunk in float64: far below the rows in float64.
    assert peak < rows.nbytes + 0.25 * len(ids) * X.itemsize * X.shape[1], (peak, rows.nbytes)


def test_a_cluster_fit_of_float64_rows_keeps_no_float32_copy_of_them_on_the_driver():
    """The estimator hands a C-ordered X to the cluster fit as it is; staging converts each
    shard's rows. Converting all of X first held a second X, in float32, on the driver for
    the whole fit. In-process workers, so that their shards count too: a traced peak of
    1.61-1.64 times X's bytes before, 1.11 after."""
    import tracemalloc

    from hmdspt import BPNNClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(100_000, 40))
    y = (X[:, 0] > 0).astype(int)
    with _cluster(2, processes=False) as cluster, Client(cluster) as client:
        tracemalloc.start()
        try:
            clf = BPNNClassifier(
                (8,), max_iter=2, batch_size=500, learning_rate_init=0.01, client=client
            ).fit(X, y)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert clf.score(X[:2000], y[:2000]) > 0.8
    assert peak < 1.35 * X.nbytes, peak / X.nbytes
