"""Strategies as objects (issue 16, point 3): the sync strategies and partition policies are
classes looked up by name, the trainer, the worker and the simulator call them, and no
module branches on a strategy's name. A new strategy is one class and one registration."""

from __future__ import annotations

import ast
import importlib.util
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning

from hmdspt.cli import build_parser
from hmdspt.core import merge, partition
from hmdspt.core.costs import MoveCost
from hmdspt.core.nn import MLP, make_optimizer
from hmdspt.core.runlog import read_events
from hmdspt.core.strategies import (
    PARTITION_POLICIES,
    SYNC_STRATEGIES,
    WORKER_MODES,
    BSPSync,
    EqualPartition,
    HMDSPTSync,
    LocalSync,
    ProportionalPartition,
    _worth_their_shards,
    get_partition,
    get_sync,
)
from hmdspt.estimator import BPNNClassifier
from hmdspt.parallel.trainer import TrainerConfig
from hmdspt.parallel.worker import ROUND_WORK
from hmdspt.simulate import NetworkModel, simulate_run

BUILT_IN_SYNC = ("hmdspt", "local", "bsp")
BUILT_IN_PARTITION = ("proportional", "equal")


# --- the toy strategies of docs/design.md, "Strategies": one class each ------------------
class MomentumLocalSync(LocalSync):
    """Plain row-weighted average, then block momentum."""

    def make_momentum(self, config):
        return merge.BlockMomentum(config.block_momentum, config.block_lr)


class ProbedOncePartition(ProportionalPartition):
    """Rows by the probed speeds, never moved afterwards."""

    rebalances = False


@pytest.fixture
def toys():
    """Register the toys (one line each), and take them out again after the test."""
    SYNC_STRATEGIES["local-momentum"] = MomentumLocalSync
    PARTITION_POLICIES["probed-once"] = ProbedOncePartition
    yield
    del SYNC_STRATEGIES["local-momentum"], PARTITION_POLICIES["probed-once"]


@pytest.fixture(scope="module")
def data():
    X, y = make_classification(
        n_samples=1200, n_features=10, n_informative=6, n_classes=3, random_state=0
    )
    return X.astype(np.float32), y


# --- look-ups ---------------------------------------------------------------------------
def test_names_look_up_their_classes():
    assert list(SYNC_STRATEGIES) == list(BUILT_IN_SYNC)
    assert list(PARTITION_POLICIES) == list(BUILT_IN_PARTITION)
    for name, cls in [("hmdspt", HMDSPTSync), ("local", LocalSync), ("bsp", BSPSync)]:
        assert type(get_sync(name)) is cls
    policy = get_partition("proportional", threshold=0.2, min_rows=3)
    assert type(policy) is ProportionalPartition
    assert policy.rebalancer == partition.RebalancePolicy(threshold=0.2, min_rows=3)
    assert type(get_partition("equal")) is EqualPartition


@pytest.mark.parametrize(
    "lookup, what, bad",
    [
        (get_sync, "sync", "async"),
        (get_sync, "sync", None),
        (get_sync, "sync", ["bsp"]),
        (get_partition, "partition", "random"),
        (get_partition, "partition", "Equal"),
    ],
)
def test_bad_names_give_one_line_naming_the_value_and_the_choices(lookup, what, bad):
    with pytest.raises(ValueError) as excinfo:
        lookup(bad)
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith(f"{what} must be one of ") and message.endswith(f"got {bad!r}")
    registry = SYNC_STRATEGIES if what == "sync" else PARTITION_POLICIES
    assert all(repr(name) in message for name in registry)


def test_every_consumer_takes_its_choices_from_the_registries(toys):
    # TrainerConfig, the simulator, the estimator and the CLI all accept the registered toys
    TrainerConfig(sync="local-momentum", partition="probed-once").validate()
    with pytest.raises(ValueError, match=r"^sync must be one of 'hmdspt', .*got 'async'$"):
        TrainerConfig(sync="async").validate()
    with pytest.raises(ValueError, match=r"^partition must be one of .*'probed-once', got 'x'$"):
        simulate_run(3, partition="x")
    constraints = BPNNClassifier._parameter_constraints
    assert constraints["sync"][0].is_satisfied_by("local-momentum")
    assert constraints["partition"][0].is_satisfied_by("probed-once")
    args = build_parser().parse_args(["train", "--sync", "local-momentum"])
    assert args.sync == "local-momentum"
    train = next(
        p
        for a in build_parser()._subparsers._group_actions
        for n, p in a.choices.items()
        if n == "train"
    )
    choices = {a.dest: a.choices for a in train._actions if a.dest in ("sync", "partition")}
    assert choices == {"sync": tuple(SYNC_STRATEGIES), "partition": tuple(PARTITION_POLICIES)}


def test_every_sync_strategy_picks_a_kind_of_work_the_worker_has():
    assert set(ROUND_WORK) == set(WORKER_MODES)
    assert {get_sync(n).worker_mode for n in SYNC_STRATEGIES} == set(WORKER_MODES)


# --- what the objects do ----------------------------------------------------------------
def test_sync_strategies_differ_where_the_trainer_branched():
    cfg = TrainerConfig(block_momentum=0.7, block_lr=0.9, rounds_per_epoch=3)
    hmdspt, local, bsp = get_sync("hmdspt"), get_sync("local"), get_sync("bsp")
    assert (hmdspt.warm_starts, local.warm_starts, bsp.warm_starts) == (True, False, False)
    assert (hmdspt.ramps, local.ramps, bsp.ramps) == (True, False, False)
    assert (hmdspt.remembers_speed, local.remembers_speed, bsp.remembers_speed) == (
        True,
        True,
        False,
    )
    assert [s.rounds_per_epoch(1000, 128, cfg) for s in (hmdspt, local, bsp)] == [3, 3, 8]
    assert [s.worker_alpha(1e-3) for s in (hmdspt, local, bsp)] == [1e-3, 1e-3, 0.0]
    adam = make_optimizer("adam", 1, learning_rate_init=1e-3)
    scales = [s.local_lr_scale(cfg, adam) for s in (hmdspt, local, bsp)]
    assert scales == [cfg.local_lr_scale, 1, 1]
    with pytest.raises(ValueError, match="local_lr_scale must be > 0, got 0"):
        TrainerConfig(local_lr_scale=0).validate()
    m = hmdspt.make_momentum(cfg)
    assert (m.momentum, m.lr) == (0.7, 0.9)
    for plain in (local.make_momentum(cfg), bsp.make_momentum(cfg)):
        assert (plain.momentum, plain.lr) == (0.0, 1.0)
    assert hmdspt.normalize_steps(cfg) and not local.normalize_steps(cfg)
    assert not hmdspt.normalize_steps(TrainerConfig(normalize_steps=False))


def test_delta_strategies_merge_as_merge_deltas_says():
    rng = np.random.default_rng(0)
    n_params = MLP((4, 6, 2)).n_params
    deltas = [rng.normal(size=n_params).astype(np.float32) for _ in range(3)]
    rows, steps = [30, 20, 10], [3, 2, 2]
    cfg = TrainerConfig(block_momentum=0.0)
    for sync, normalize in [(get_sync("hmdspt"), True), (get_sync("local"), False)]:
        model = MLP((4, 6, 2))
        start = model.params.copy()
        sync.combine(
            model,
            deltas,
            rows,
            steps,
            optimizer=None,
            momentum=sync.make_momentum(cfg),
            config=cfg,
        )
        expected = start + merge.merge_deltas(deltas, rows, steps, normalize_steps=normalize)
        np.testing.assert_array_equal(model.params, expected)


def test_bsp_round_is_one_step_on_the_union_batch():
    X = np.random.default_rng(1).normal(size=(40, 4)).astype(np.float32)
    Y = np.eye(2, dtype=np.float32)[np.arange(40) % 2]
    whole = MLP((4, 6, 2), alpha=0.01)
    whole.initialize(np.random.RandomState(0))
    split = MLP((4, 6, 2), alpha=0.01)
    split.params[...] = whole.params
    opt_kwargs = dict(solver="sgd", learning_rate_init=0.1, momentum=0.0)
    whole.loss_and_grad(X, Y)
    make_optimizer(n_params=whole.n_params, dtype=whole.dtype, **opt_kwargs).update(
        whole.params, whole.grad
    )
    bsp = get_sync("bsp")
    worker = MLP((4, 6, 2), alpha=bsp.worker_alpha(0.01))
    payloads = []
    for part in (slice(0, 25), slice(25, 40)):
        worker.params[...] = split.params
        worker.loss_and_grad(X[part], Y[part], n_total=1)
        payloads.append(worker.grad.copy())
    bsp.combine(
        split,
        payloads,
        [25, 15],
        [1, 1],
        optimizer=make_optimizer(n_params=split.n_params, dtype=split.dtype, **opt_kwargs),
        momentum=bsp.make_momentum(TrainerConfig()),
        config=TrainerConfig(),
    )
    np.testing.assert_allclose(split.params, whole.params, rtol=1e-5, atol=1e-7)


def test_partition_policies_share_and_plan():
    scores = {"a": 4.0, "b": 2.0, "c": 1.0}
    proportional, equal = get_partition("proportional"), get_partition("equal")
    assert proportional.uses_speeds and proportional.rebalances
    assert not (equal.uses_speeds or equal.rebalances)
    assert proportional.shares(70, scores) == {"a": 40, "b": 20, "c": 10}
    assert equal.shares(70, scores) == {"a": 24, "b": 23, "c": 23}
    assert proportional.shares(2, scores) == {"a": 1, "b": 1}  # fewer rows than workers
    current = {"a": 24, "b": 23, "c": 23}
    moves = proportional.plan(current, scores, 70)
    assert partition.apply_moves(current, moves) == {"a": 40, "b": 20, "c": 10}
    assert equal.plan(current, scores, 70) is None  # equal shares never re-balance...
    joined = {"a": 35, "b": 35, "c": 0}
    # ... but for a worker that joined
    assert partition.apply_moves(joined, equal.plan(joined, scores, 70, force=True)) == current
    # fewer rows than workers: the holders keep them while the scores' ranking changes
    held = {"a": 1, "b": 0, "c": 1}
    assert proportional.plan(held, scores, 2) is None
    assert partition.apply_moves(held, proportional.plan(held, scores, 2, force=True)) == {
        "a": 1,
        "b": 1,
        "c": 0,
    }


def test_with_fixed_costs_the_plan_aims_at_equal_finish_times():
    speeds = {"a": 1000.0, "b": 1000.0}
    policy = get_partition("proportional")
    current = {"a": 500, "b": 500}
    assert policy.plan(current, speeds, 1000) is None  # proportional: nothing to move
    moves = policy.plan(current, speeds, 1000, fixed_s={"a": 0.0, "b": 0.1})
    # 0 + n_a / 1000 = 0.1 + n_b / 1000: a takes 550, b 450
    assert partition.apply_moves(current, moves) == {"a": 550, "b": 450}


def test_rows_move_only_when_the_saving_over_the_epochs_left_pays_for_the_move():
    speeds = {"a": 1000.0, "b": 500.0}
    policy = get_partition("proportional")
    current = {"a": 500, "b": 500}  # epoch 1.0 s; balanced (667 / 333) 0.667 s
    # 167 rows move, and both shards are rebuilt: 1,000 rows, 1.67 s
    kwargs = dict(fixed_s={}, move_cost=lambda rows: 0.00167 * rows)
    assert policy.plan(current, speeds, 1000, epochs_left=4.0, **kwargs) is None  # 1.33 s
    moves = policy.plan(current, speeds, 1000, epochs_left=6.0, **kwargs)  # 2.0 s saved
    assert partition.apply_moves(current, moves) == {"a": 667, "b": 333}
    # a join moves rows whatever they cost; so does a member below min_rows
    joined = {"a": 1000, "b": 0}
    assert policy.plan(joined, speeds, 1000, epochs_left=0.1, **kwargs)
    assert policy.plan(joined, speeds, 1000, force=True, epochs_left=0.0, **kwargs)
    # the threshold still holds back a gain within the noise, however cheap the move
    near = {"a": 660, "b": 340}
    assert policy.plan(near, speeds, 1000, fixed_s={}, epochs_left=100.0) is None


def test_a_move_is_priced_by_the_shards_it_rebuilds_not_the_rows_it_moves():
    """A few rows between large shards rebuild both shards. On the testbed a move of
    13,057 rows of the 1.6M-row job took 0.98 s, as long as staging every row (0.96 s);
    priced by the rows moved, the staging's rate had predicted 8 ms."""
    move_cost = MoveCost()
    move_cost.observe(1_600_000, 0.96)  # the staging: every row built into a shard
    policy = get_partition("proportional")
    current = {"a": 885_000, "b": 490_000, "c": 225_000}
    slightly_off = {"a": 600_000.0, "b": 340_000.0, "c": 140_000.0}  # c: 8 % too many rows
    kwargs = dict(fixed_s={}, epochs_left=2.5, move_cost=move_cost.seconds)
    assert policy.plan(current, slightly_off, 1_600_000, **kwargs) is None
    # The same few rows priced by themselves would have moved.
    moves = policy.plan(
        current, slightly_off, 1_600_000, fixed_s={}, epochs_left=2.5, move_cost=lambda r: 0.0
    )
    assert moves and sum(m.rows for m in moves) < 20_000
    # A worker that turned three times slower is worth rebuilding every shard for.
    straggler = {"a": 600_000.0, "b": 340_000.0, "c": 50_000.0}
    moves = policy.plan(current, straggler, 1_600_000, **kwargs)
    assert moves and partition.apply_moves(current, moves)["c"] < 100_000


def test_a_move_that_rebuilds_a_shard_for_a_few_rows_is_left_out():
    """On the testbed (1.6M-row job, 10 ms, 2026-12-07) a re-balance sent 15,396 rows to the
    1-core worker and 491 to the 0.5-core one, rebuilding the latter's 461,645 rows for
    them; the re-balance took 0.79 s where staging all 1.6M rows had taken 0.54 s."""
    move_cost = MoveCost()
    move_cost.observe(1_600_000, 0.544)  # the fit's staging
    policy = get_partition("proportional")
    speeds = {"a": 330_000.0, "b": 165_000.0, "c": 70_000.0}
    target = policy.target(1_600_000, policy.weights(speeds))
    current = {"a": target["a"] - 15_396, "b": target["b"] - 491, "c": target["c"] + 15_887}
    kwargs = dict(fixed_s={}, epochs_left=2.57, move_cost=move_cost.seconds)
    full = policy.plan(current, speeds, 1_600_000, fixed_s={})  # priced by nothing
    assert sorted(m.rows for m in full) == [491, 15_396]
    (move,) = policy.plan(current, speeds, 1_600_000, **kwargs)
    assert (move.source, move.destination, move.rows) == ("c", "a", 15_396)
    # Where rebuilding costs nothing, every move stays.
    assert (
        policy.plan(
            current, speeds, 1_600_000, fixed_s={}, epochs_left=2.57, move_cost=lambda rows: 0.0
        )
        == full
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(1e3, 1e6), min_size=2, max_size=6),
    st.lists(st.integers(0, 200_000), min_size=2, max_size=6),
    st.floats(0.1, 20.0),
    st.floats(0.0, 5e-6),
    st.floats(0.0, 0.5),
)
def test_no_move_of_a_plan_costs_more_to_build_than_it_saves(
    speed_list, count_list, epochs_left, per_row_s, fixed_move_s
):
    """Whatever the speeds, layout and price of building shards: in a plan of several
    moves, leaving any one out would lose at least the building it saves."""
    n = min(len(speed_list), len(count_list))
    speeds = {f"w{i}": speed_list[i] for i in range(n)}
    current = {f"w{i}": count_list[i] + 1 for i in range(n)}  # every worker holds rows
    n_rows = sum(current.values())

    def move_cost(rows: int) -> float:
        return fixed_move_s + per_row_s * rows if rows else 0.0

    policy = get_partition("proportional")
    moves = policy.plan(
        current, speeds, n_rows, fixed_s={}, epochs_left=epochs_left, move_cost=move_cost
    )
    if not moves:
        return
    after = partition.apply_moves(current, moves)
    assert sum(after.values()) == n_rows and min(after.values()) >= 0

    def epoch_s(layout):
        return max(n / speeds[w] for w, n in layout.items() if n)

    if len(moves) > 1:
        for move in moves:
            rest = [m for m in moves if m is not move]
            lost = epochs_left * (epoch_s(partition.apply_moves(current, rest)) - epoch_s(after))
            saved = move_cost(partition.rows_rebuilt(current, moves)) - move_cost(
                partition.rows_rebuilt(current, rest)
            )
            assert lost >= saved - 1e-9, (move, lost, saved)


def _worth_their_shards_by_brute_force(current, moves, scores, fixed, epochs_left, move_cost):
    """The rule of ``_worth_their_shards`` written out: every candidate priced from scratch."""
    kept = list(moves)
    fixed = fixed or {}

    def cost(plan):
        layout = partition.apply_moves(current, plan)
        epoch_s = max(
            (fixed.get(w, 0.0) + n / scores[w] for w, n in layout.items() if n), default=0.0
        )
        return epochs_left * epoch_s, move_cost(partition.rows_rebuilt(current, plan))

    while len(kept) > 1:
        fit_s, build_s = cost(kept)
        for move in sorted(kept, key=lambda m: m.rows):
            rest = [m for m in kept if m is not move]
            rest_fit_s, rest_build_s = cost(rest)
            if rest_fit_s - fit_s < build_s - rest_build_s:
                kept = rest
                break
        else:
            return kept
    return kept


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(1e3, 1e6), st.integers(0, 50_000)), min_size=2, max_size=40),
    st.floats(0.1, 20.0),
    st.floats(0.0, 5e-5),
    st.floats(0.0, 0.5),
    st.one_of(st.none(), st.lists(st.floats(0.0, 2.0), min_size=40, max_size=40)),
)
def test_the_moves_left_out_are_those_the_rule_leaves_out_priced_one_by_one(
    workers, epochs_left, per_row_s, fixed_move_s, fixed_costs
):
    """The plan prices a dropped move from the plan's totals (the simulator plans for
    thousands of workers); it must keep exactly the moves that pricing every candidate
    from scratch keeps."""
    scores = {f"w{i}": speed for i, (speed, _) in enumerate(workers)}
    current = {f"w{i}": rows for i, (_, rows) in enumerate(workers)}
    n_rows = sum(current.values())
    if n_rows < len(workers):
        return
    policy = get_partition("proportional")
    moves = partition.plan_moves(current, policy.target(n_rows, policy.weights(scores)))

    def move_cost(rows: int) -> float:
        return fixed_move_s + per_row_s * rows if rows else 0.0

    fixed = None if fixed_costs is None else dict(zip(scores, fixed_costs))
    expected = _worth_their_shards_by_brute_force(
        current, moves, scores, fixed, epochs_left, move_cost
    )
    assert _worth_their_shards(current, moves, scores, fixed, epochs_left, move_cost) == expected


def test_rows_rebuilt_counts_every_sender_and_receiver_after_the_moves():
    current = {"a": 600, "b": 300, "c": 100, "d": 50}
    moves = [partition.Move("c", "a", 50), partition.Move("b", "a", 20)]
    assert partition.rows_rebuilt(current, moves) == 670 + 280 + 50  # d is untouched
    assert partition.rows_rebuilt(current, []) == 0
    assert partition.rows_rebuilt([5, 0], [partition.Move(0, 1, 2)]) == 5


# --- the grep rule, as a test -----------------------------------------------------------
STRATEGY_NAMES = set(BUILT_IN_SYNC) | set(BUILT_IN_PARTITION)
#: What a strategy's name (or its worker mode) is held in.
STRATEGY_FIELDS = {"sync", "partition", "mode"}
#: Other things named "local" or "equal": cluster kinds, speed distributions.
UNRELATED = {"kind"}
STRATEGIES_MODULE = "core/strategies.py"


def _package_files() -> dict[str, Path]:
    files = {}
    for name in ("hmdspt", "hmdspt.app"):
        spec = importlib.util.find_spec(name)
        folder = Path(list(spec.submodule_search_locations)[0])
        for path in sorted(folder.rglob("*.py")):
            files[f"{name}/{path.relative_to(folder).as_posix()}"] = path
    return files


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_strings(e) for e in node.elts)) if node.elts else set()
    return set()


def _name_branches(source: str) -> list[tuple[int, str]]:
    """Comparisons and ``match`` cases that test a strategy's name (or worker mode)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            names = {_name(o) for o in operands} - {None}
            literals = set().union(*(_strings(o) for o in operands))
            if (names & STRATEGY_FIELDS and literals) or (
                literals & STRATEGY_NAMES and not names & UNRELATED
            ):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.MatchValue) and _strings(node.value) & STRATEGY_NAMES:
            found.append((node.lineno, f"case {ast.unparse(node.value)}"))
    return found


def test_the_rule_catches_the_branches_it_forbids():
    caught = _name_branches(
        "a = cfg.sync == 'bsp'\n"
        "if self.config.partition != 'proportional': pass\n"
        "if partition not in ('proportional', 'equal'): pass\n"
        "if spec.mode == 'gradient': pass\n"
        "x = 'hmdspt' == name\n"
        "match s:\n    case 'local': pass\n"
        "if kind == 'local': pass\n"  # a cluster kind: not a strategy
        "if sync is None: pass\n"
    )
    assert [line for line, _ in caught] == [1, 2, 3, 4, 5, 7]


def test_no_module_branches_on_a_strategy_name_outside_the_strategies():
    files = _package_files()
    assert f"hmdspt/{STRATEGIES_MODULE}" in files and "hmdspt/parallel/trainer.py" in files
    found = [
        f"{where}:{line}: {code}"
        for where, path in files.items()
        if where != f"hmdspt/{STRATEGIES_MODULE}"
        for line, code in _name_branches(path.read_text())
    ]
    assert not found, "\n".join(found)


# --- a new strategy is one class and one registration -----------------------------------
def _fit(client, data, **params):
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return BPNNClassifier(
            **{
                "hidden_layer_sizes": (16,),
                "client": client,
                "max_iter": 3,
                "random_state": 0,
                "batch_size": 100,
                "rounds_per_epoch": 2,
                "learning_rate_init": 0.003,
                **params,
            }
        ).fit(X[:1000], y[:1000])


def test_a_registered_toy_sync_strategy_trains(client, data, toys):
    # Equal shares do not depend on timings: equal settings give equal numbers.
    local = _fit(client, data, sync="local", partition="equal")
    toy_without_momentum = _fit(
        client, data, sync="local-momentum", partition="equal", block_momentum=0.0
    )
    toy = _fit(client, data, sync="local-momentum", partition="equal", block_momentum=0.5)
    for a, b in zip(local.coefs_, toy_without_momentum.coefs_):
        np.testing.assert_array_equal(a, b)  # the toy is local + momentum, nothing else
    assert not np.array_equal(local.coefs_[0], toy.coefs_[0])  # its momentum is used
    assert toy.loss_curve_[-1] < toy.loss_curve_[0]
    assert toy.score(data[0][1000:], data[1][1000:]) > 0.5


def test_hmdspt_workers_step_at_the_models_learning_rate_times_local_lr_scale(client, data):
    # Equal shares, no warm start (the driver's pilot fit steps at the model's own rate) and
    # no ramp (its rounds are sized by time): nothing depends on timings.
    def fit(sync, learning_rate, scale, solver="adam"):
        options = {"warm_start_rows": 0, "ramp_rounds": 0, "local_lr_scale": scale}
        return _fit(
            client,
            data,
            sync=sync,
            partition="equal",
            solver=solver,
            learning_rate_init=learning_rate,
            trainer_options=options,
        ).coefs_[0]

    scaled = fit("hmdspt", 0.003, 2.0)
    np.testing.assert_array_equal(scaled, fit("hmdspt", 0.006, 1.0))
    assert not np.array_equal(scaled, fit("hmdspt", 0.003, 1.0))
    # Local averaging, a baseline, keeps the model's rate.
    np.testing.assert_array_equal(fit("local", 0.003, 2.0), fit("local", 0.003, 1.0))
    # SGD keeps it too: its step grows with the gradient and the momentum, not bounded by
    # the rate as Adam's is.
    sgd = fit("hmdspt", 0.01, 2.0, solver="sgd")
    np.testing.assert_array_equal(sgd, fit("hmdspt", 0.01, 1.0, solver="sgd"))
    assert not np.array_equal(sgd, fit("hmdspt", 0.02, 1.0, solver="sgd"))


def test_a_registered_toy_partition_policy_trains_and_simulates(client, data, toys, tmp_path):
    log = tmp_path / "toy.jsonl"
    clf = _fit(client, data, partition="probed-once", run_log=log)
    assert clf.loss_curve_[-1] < clf.loss_curve_[0]
    events = read_events(log)
    assert events[0]["config"]["partition"] == "probed-once"
    sources = {e["source"] for e in events if e["event"] == "score"}
    assert sources & {"probe", "remembered"}  # it uses the measured speeds
    partitions = [e for e in events if e["event"] == "partition"]
    assert partitions and all(e["rows_moved"] == 0 for e in partitions)  # never re-balances
    # The simulator drives the same object: shares by the probe, never moved.
    free = NetworkModel.free()
    sim = simulate_run(
        3, speeds=[4.0, 2.0, 1.0], partition="probed-once", n_rows=7000, rounds=5, network=free
    )
    assert sim.rows_moved.sum() == 0
    np.testing.assert_array_equal(sim.rows[-1], [4000, 2000, 1000])
