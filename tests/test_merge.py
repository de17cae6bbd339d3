"""Tests of hmdspt.core.merge: merging, block momentum, compression, error feedback."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hmdspt.core.merge import (
    BlockMomentum,
    CompressedDelta,
    ErrorFeedback,
    compress,
    decompress,
    merge_deltas,
    merge_weights,
    topk_count,
)

ROOT = Path(__file__).resolve().parents[1]


def _rng(seed=0):
    return np.random.default_rng(seed)


def test_module_does_not_import_dask():
    # The core layer must stay importable without Dask; a fresh interpreter shows it.
    code = "import sys, hmdspt.core.merge; assert 'dask' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ----------------------------------------------------------------------------- merging


@settings(max_examples=50, deadline=None)
@given(
    rows=st.lists(st.integers(1, 10_000), min_size=1, max_size=6),
    data=st.data(),
)
def test_identical_deltas_merge_to_themselves(rows, data):
    delta = _rng(len(rows)).standard_normal(50).astype(np.float32)
    deltas = [delta.copy() for _ in rows]
    # Any rows and any steps without normalisation ...
    steps = data.draw(st.lists(st.integers(1, 500), min_size=len(rows), max_size=len(rows)))
    merged = merge_deltas(deltas, rows, steps, normalize_steps=False)
    np.testing.assert_allclose(merged, delta, rtol=1e-5, atol=1e-6)
    # ... and any rows with equal steps when normalised.
    tau = data.draw(st.integers(1, 500))
    merged = merge_deltas(deltas, rows, [tau] * len(rows))
    np.testing.assert_allclose(merged, delta, rtol=1e-5, atol=1e-6)


def test_identical_deltas_unequal_steps_are_rescaled():
    # Equal deltas from unequal step counts are unequal progress per step: FedNova scales
    # them by τ_eff Σ p_i/τ_i (≥ 1 by the AM-HM inequality), here 1.5 * 0.75 = 1.125.
    delta = np.ones(4, dtype=np.float32)
    merged = merge_deltas([delta, delta], [1, 1], [1, 2])
    np.testing.assert_allclose(merged, 1.125 * delta, rtol=1e-6)


def test_row_weights_3_to_1():
    a = np.full(5, 1.0, dtype=np.float32)
    b = np.full(5, 5.0, dtype=np.float32)
    np.testing.assert_allclose(merge_weights([3, 1], [7, 7]), [0.75, 0.25])
    merged = merge_deltas([a, b], [300, 100], [7, 7])
    np.testing.assert_allclose(merged, 0.75 * 1.0 + 0.25 * 5.0, rtol=1e-6)
    merged = merge_deltas([a, b], [300, 100], [3, 9], normalize_steps=False)
    np.testing.assert_allclose(merged, 2.0, rtol=1e-6)


def test_normalisation_counts_progress_per_step():
    rng = _rng(1)
    per_step = rng.standard_normal(20).astype(np.float32)
    # Worker 0 took 2x the steps and moved 2x as far: the same progress per step.
    fast, slow = 2 * per_step, per_step
    merged = merge_deltas([fast, slow], [200, 100], [20, 10])
    # p = (2/3, 1/3), τ_eff = 2/3*20 + 1/3*10 = 50/3, per-step mean = per_step / 10.
    np.testing.assert_allclose(merged, (50 / 3) * per_step / 10, rtol=1e-5)
    # Unnormalised, the worker with more steps dominates: (2/3)*2 + 1/3 = 5/3.
    plain = merge_deltas([fast, slow], [200, 100], [20, 10], normalize_steps=False)
    np.testing.assert_allclose(plain, (5 / 3) * per_step, rtol=1e-5)


def test_normalised_matches_formula_and_weights():
    rng = _rng(2)
    deltas = [rng.standard_normal(100).astype(np.float32) for _ in range(4)]
    rows, steps = [10, 250, 40, 7], [3, 60, 11, 1]
    p = np.array(rows) / sum(rows)
    tau = np.array(steps, dtype=float)
    tau_eff = float(p @ tau)
    expected = tau_eff * sum(pi * d.astype(np.float64) / ti for pi, d, ti in zip(p, deltas, tau))
    merged = merge_deltas(deltas, rows, steps)
    assert merged.dtype == np.float32
    np.testing.assert_allclose(merged, expected, rtol=2e-5, atol=1e-6)
    w = merge_weights(rows, steps)
    np.testing.assert_allclose(w, tau_eff * p / tau)


def test_skips_workers_without_rows_or_steps():
    a = np.full(3, 2.0, dtype=np.float32)
    junk = np.full(3, 1e6, dtype=np.float32)
    merged = merge_deltas([a, junk, junk], [5, 0, 9], [4, 3, 0])
    np.testing.assert_allclose(merged, a)
    np.testing.assert_array_equal(merge_weights([5, 0, 9], [4, 3, 0]), [1.0, 0.0, 0.0])


def test_out_buffer_is_used_and_deltas_untouched():
    rng = _rng(3)
    deltas = [rng.standard_normal(30).astype(np.float32) for _ in range(3)]
    copies = [d.copy() for d in deltas]
    out = np.empty(30, dtype=np.float32)
    result = merge_deltas(deltas, [1, 2, 3], [5, 6, 7], out=out)
    assert result is out
    for d, c in zip(deltas, copies):
        np.testing.assert_array_equal(d, c)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(deltas=[], rows=[], steps=[]), "empty"),
        (dict(deltas=[np.zeros(3)], rows=[1, 2], steps=[1]), "one of each"),
        (dict(deltas=[np.zeros(3), np.zeros(4)], rows=[1, 1], steps=[1, 1]), "shape"),
        (dict(deltas=[np.zeros(3)], rows=[0], steps=[1]), "no worker contributed"),
        (dict(deltas=[np.zeros(3)], rows=[-1], steps=[1]), "non-negative"),
        (dict(deltas=[np.zeros(3)], rows=[1], steps=[np.nan]), "finite"),
    ],
)
def test_merge_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        merge_deltas(**kwargs)


def test_out_errors():
    d = np.zeros(3, dtype=np.float32)
    with pytest.raises(ValueError, match="shape"):
        merge_deltas([d], [1], [1], out=np.empty(4, dtype=np.float32))
    with pytest.raises(ValueError, match="overlap"):
        merge_deltas([d], [1], [1], out=d)
    with pytest.raises(ValueError, match="floating"):
        merge_deltas([d], [1], [1], out=np.empty(3, dtype=np.int64))


def test_extreme_weight_ratio_no_overflow():
    # A worker with one row next to one with a billion: nested scaling must stay finite.
    a = np.full(4, 3e30, dtype=np.float32)
    b = np.full(4, 1.0, dtype=np.float32)
    merged = merge_deltas([a, b], [1, 10**9], [1, 1])
    assert np.all(np.isfinite(merged))
    np.testing.assert_allclose(merged, 3e30 * 1e-9 + 1.0, rtol=1e-5)


# ------------------------------------------------------------------------ block momentum


def test_block_momentum_recurrence_by_hand():
    bm = BlockMomentum(momentum=0.5, lr=2.0)
    w = np.zeros(2, dtype=np.float32)
    deltas = [np.array([1.0, -2.0]), np.array([1.0, 0.0]), np.array([0.0, 4.0])]
    # v1 = (1, -2)           w1 = 0 + 2 v1 = (2, -4)
    # v2 = 0.5 v1 + (1, 0) = (1.5, -1)   w2 = (2, -4) + (3, -2) = (5, -6)
    # v3 = 0.5 v2 + (0, 4) = (0.75, 3.5) w3 = (5, -6) + (1.5, 7) = (6.5, 1)
    expected_v = [(1, -2), (1.5, -1), (0.75, 3.5)]
    expected_w = [(2, -4), (5, -6), (6.5, 1)]
    for d, ev, ew in zip(deltas, expected_v, expected_w):
        out = bm.step(w, d.astype(np.float32))
        assert out is w
        np.testing.assert_allclose(bm.velocity, ev)
        np.testing.assert_allclose(w, ew)
    assert w.dtype == np.float32 and bm.velocity.dtype == np.float32


def test_block_momentum_off_is_plain_update():
    rng = _rng(4)
    bm = BlockMomentum(momentum=0.0, lr=1.0)
    w = rng.standard_normal(10).astype(np.float32)
    ref = w.copy()
    for _ in range(3):
        d = rng.standard_normal(10).astype(np.float32)
        bm.step(w, d)
        ref += d
        np.testing.assert_array_equal(w, ref)


def test_block_momentum_state_dict_round_trip():
    bm = BlockMomentum(0.9, 0.5)
    w = np.zeros(3, dtype=np.float32)
    bm.step(w, np.ones(3, dtype=np.float32))
    state = bm.state_dict()
    other = BlockMomentum()
    other.load_state_dict(state)
    assert (other.momentum, other.lr) == (0.9, 0.5)
    np.testing.assert_array_equal(other.velocity, bm.velocity)
    w2 = w.copy()
    bm.step(w, np.ones(3, dtype=np.float32))
    other.step(w2, np.ones(3, dtype=np.float32))
    np.testing.assert_array_equal(w, w2)
    # The saved state is a copy, not a view of the live velocity.
    assert not np.shares_memory(state["velocity"], bm.velocity)


@pytest.mark.parametrize("momentum, lr", [(1.0, 1.0), (-0.1, 1.0), (0.5, 0.0), (0.5, np.inf)])
def test_block_momentum_validation(momentum, lr):
    with pytest.raises(ValueError):
        BlockMomentum(momentum, lr)


# --------------------------------------------------------------------------- compression


def test_none_round_trip_is_exact_and_dense():
    d = _rng(5).standard_normal(1000).astype(np.float32)
    payload = compress(d, "none")
    assert payload.nbytes == d.nbytes
    np.testing.assert_array_equal(decompress(payload, 1000), d)


@pytest.mark.parametrize("magnitude", [1e-7, 1e-4, 1.0, 1e4, 1e6])
def test_float16_round_trip_error_bound(magnitude):
    d = (_rng(6).standard_normal(10_000) * magnitude).astype(np.float32)
    payload = compress(d, "float16")
    assert payload.values.dtype == np.float16
    assert payload.nbytes == 2 * d.size + 4
    restored = decompress(payload, d.size)
    assert restored.dtype == np.float32
    # Half a float16 ulp relative (2**-11) for entries within 29 binades of the maximum,
    # plus an absolute floor of half a subnormal spacing of the scaled vector.
    amax = np.abs(d).max()
    bound = 2.0**-11 * np.abs(d) + amax * 2.0**-39
    assert np.all(np.abs(restored.astype(np.float64) - d) <= bound)
    # Values beyond the float16 range survive thanks to the scale.
    assert np.all(np.isfinite(restored))


def test_float16_zero_vector():
    d = np.zeros(7, dtype=np.float32)
    np.testing.assert_array_equal(decompress(compress(d, "float16")), d)


def test_topk_keeps_exactly_k_largest():
    rng = _rng(7)
    d = rng.standard_normal(1000).astype(np.float32)
    payload = compress(d, "topk", k=0.1)
    assert payload.indices.dtype == np.int32
    assert payload.indices.size == payload.values.size == 100
    assert np.unique(payload.indices).size == 100
    np.testing.assert_array_equal(payload.values, d[payload.indices])
    kept = np.zeros(d.size, dtype=bool)
    kept[payload.indices] = True
    assert np.abs(d[kept]).min() >= np.abs(d[~kept]).max()
    restored = decompress(payload, 1000)
    np.testing.assert_array_equal(restored[kept], d[kept])
    assert np.all(restored[~kept] == 0)


def test_topk_bytes_at_ten_percent():
    d = _rng(8).standard_normal(100_000).astype(np.float32)
    payload = compress(d, "topk", k=0.1)
    assert payload.nbytes <= 0.3 * compress(d, "none").nbytes


def test_topk_counts_and_errors():
    assert topk_count(1000, 0.1) == 100
    assert topk_count(30, 0.1) == 3
    assert topk_count(5, 0.01) == 1
    assert topk_count(5, 1.0) == 5
    assert topk_count(0, 0.5) == 0
    with pytest.raises(ValueError):
        topk_count(10, 0.0)
    with pytest.raises(ValueError):
        compress(np.zeros(3), "gzip")
    with pytest.raises(ValueError, match="length"):
        decompress(compress(np.zeros(3), "topk", k=0.5), 4)


def test_payload_is_a_plain_dataclass():
    p = compress(np.arange(4, dtype=np.float32), "topk", k=0.5)
    assert isinstance(p, CompressedDelta) and p.method == "topk" and p.size == 4
    np.testing.assert_array_equal(p.indices, [2, 3])


# ------------------------------------------------------------------------ error feedback


@pytest.mark.parametrize("method, k", [("topk", 0.1), ("topk", 0.01), ("float16", 0.1)])
def test_error_feedback_loses_nothing(method, k):
    rng = _rng(9)
    n, rounds = 2000, 25
    ef = ErrorFeedback(method, k=k)
    true_sum = np.zeros(n)
    sent_sum = np.zeros(n)
    for _ in range(rounds):
        d = (rng.standard_normal(n) * rng.uniform(1e-4, 1e-2)).astype(np.float32)
        d_before = d.copy()
        payload = ef.compress(d)
        np.testing.assert_array_equal(d, d_before)  # the caller's delta is not touched
        true_sum += d
        sent_sum += decompress(payload, n)
    np.testing.assert_allclose(sent_sum + ef.residual, true_sum, rtol=1e-5, atol=1e-7)
    if method == "topk":
        # Without feedback most of the mass would be gone; with it the residual holds it.
        assert np.abs(ef.residual).sum() > 0


def test_error_feedback_state_dict():
    ef = ErrorFeedback("topk", 0.2)
    ef.compress(np.arange(10, dtype=np.float32))
    other = ErrorFeedback("float16")
    other.load_state_dict(ef.state_dict())
    assert other.method == "topk" and other.k == 0.2
    np.testing.assert_array_equal(other.residual, ef.residual)
    ef.reset()
    assert ef.residual is None


def test_merge_and_momentum_allocate_no_vector_temporaries():
    # numpy reports its buffers to tracemalloc: with out= given, the merge and the
    # momentum step must not allocate anything of the vectors' size.
    import tracemalloc

    n = 1_000_000
    rng = _rng(10)
    deltas = [rng.standard_normal(n).astype(np.float32) for _ in range(4)]
    out = np.empty(n, dtype=np.float32)
    params = np.zeros(n, dtype=np.float32)
    bm = BlockMomentum(0.5, 0.7)
    bm.step(params, deltas[0])  # allocates the velocity and scratch once
    tracemalloc.start()
    try:
        merge_deltas(deltas, [1, 2, 3, 4], [4, 3, 2, 1], out=out)
        bm.step(params, out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 0.25 * out.nbytes
