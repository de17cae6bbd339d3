"""One source of truth for the options (issue 16, point 7).

:class:`~hmdspt.parallel.trainer.TrainerConfig` holds the round loop's settings and their
defaults. The estimators take the ones a user could want, as parameters of their own or
through ``trainer_options``, with the same defaults; the command line's flags for them have
the same defaults and choices. A new ``TrainerConfig`` field fails
``test_every_trainer_field_is_reachable_from_the_estimator_or_internal`` until it is decided.
"""

from __future__ import annotations

import argparse
import dataclasses
import warnings

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.utils._param_validation import Interval, StrOptions

import hmdspt.estimator as estimator_module
from hmdspt.cli import build_parser
from hmdspt.core.runlog import read_events
from hmdspt.estimator import BPNNClassifier, BPNNRegressor
from hmdspt.parallel.trainer import TrainerConfig

FIELDS = {f.name: f for f in dataclasses.fields(TrainerConfig)}

#: TrainerConfig fields the estimator fills in itself, so no user sets them:
INTERNAL = {
    # drawn from random_state, as every other random choice of a fit is
    "seed",
    # a description of the client's emulated cluster, read from that cluster
    "emulation",
    # fills Trainer.rows_seen, an audit of the Trainer object that the estimator never exposes
    "record_row_ids",
}

#: (sub-command, dest) of flags that map to a TrainerConfig field but keep a default of
#: their own, on purpose:
CLI_OWN_DEFAULTS = {
    # a comparison is time-boxed (every run gets the same budget); a fit is not by default
    ("compare", "max_seconds"),
}

#: A value other than the default for every key ``trainer_options`` accepts, each one a
#: fit can run with (test_every_trainer_option_reaches_the_trainer).
NON_DEFAULT_OPTIONS = {
    "sync_budget": 0.1,
    "max_local_steps": 64,
    "early_local_steps": 256,
    "block_lr": 0.9,
    "local_lr_scale": 1.1,
    "normalize_steps": False,
    "topk": 0.25,
    "warm_start_rows": 300,
    "warm_start_epochs": 1,
    "first_wave_fraction": 0.5,
    "ramp_rounds": 1,
    "ramp_first_round_s": 0.2,
    "max_ramp_rounds": 2,
    "probe_seconds": 0.2,
    "reuse_speeds_s": 0.0,
    "cost_window_s": 0.6,
    "rebalance_threshold": 0.1,
    "min_rows": 2,
    "quiet_workers": False,
    "broadcast_timeout_s": 30.0,
    "stall_warning_s": 5.0,
    "eval_resolution": 0.1,
}

ESTIMATORS = [BPNNClassifier, BPNNRegressor]


def _trainer_options() -> set[str]:
    # getattr: on code without trainer_options every such field counts as unreachable.
    return set(getattr(estimator_module, "TRAINER_OPTIONS", ()))


def _choices(constraints: list) -> set[str] | None:
    """The string choices of a parameter's constraints, None when it has none."""
    options = [c.options for c in constraints if isinstance(c, StrOptions)]
    return set(options[0]) if options else None


def _sub_commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return action.choices


# ---------------------------------------------------------------------- estimator
def test_every_trainer_field_is_reachable_from_the_estimator_or_internal():
    named = set(FIELDS) & set(BPNNClassifier().get_params())
    unreachable = set(FIELDS) - named - _trainer_options() - INTERNAL
    assert not unreachable, f"{len(unreachable)} fields unreachable: {sorted(unreachable)}"
    # Each field is decided once: a parameter, an option or internal.
    assert not named & _trainer_options() and not (named | _trainer_options()) & INTERNAL
    assert INTERNAL <= set(FIELDS), "INTERNAL names a field TrainerConfig no longer has"


@pytest.mark.parametrize("Estimator", ESTIMATORS)
def test_estimator_parameters_have_the_trainer_defaults_and_choices(Estimator):
    params = Estimator().get_params()
    named = set(FIELDS) & set(params)
    assert named >= {"sync", "partition", "rounds_per_epoch", "compression", "run_log"}
    for name in named:
        assert params[name] == FIELDS[name].default, name
        assert name in Estimator._parameter_constraints, name
    constraints = Estimator._parameter_constraints
    from hmdspt.core.strategies import PARTITION_POLICIES, SYNC_STRATEGIES
    from hmdspt.parallel.trainer import COMPRESSION_MODES

    assert _choices(constraints["sync"]) == set(SYNC_STRATEGIES)
    assert _choices(constraints["partition"]) == set(PARTITION_POLICIES)
    assert _choices(constraints["compression"]) == set(COMPRESSION_MODES)
    assert params["trainer_options"] is None


def test_trainer_options_name_what_they_set():
    assert _trainer_options() == set(NON_DEFAULT_OPTIONS)
    for name, value in NON_DEFAULT_OPTIONS.items():
        assert value != FIELDS[name].default, name


def _fit(Estimator=BPNNClassifier, **params):
    X, y = make_classification(n_samples=200, n_features=5, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Estimator(hidden_layer_sizes=(4,), max_iter=1, **params).fit(X, y)


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"topK": 0.2},
            r"^trainer_options: unknown key 'topK'; accepted: sync_budget, max_local_steps, ",
        ),
        ({"sync": "bsp"}, r"^trainer_options: 'sync' is a parameter of its own: sync=\.\.\.$"),
        ({"seed": 1}, r"^trainer_options: unknown key 'seed'; accepted: "),
        ({"topk": 2.0}, r"'topk' parameter of BPNNClassifier\.trainer_options must be"),
        # a fraction, as the partition policy takes it (it refuses 1.0 or more)
        (
            {"rebalance_threshold": 1.0},
            r"'rebalance_threshold' parameter of BPNNClassifier\.trainer_options must be a "
            r"float in the range \[0\.0, 1\.0\)",
        ),
        ({"ramp_rounds": 9}, r"^max_ramp_rounds must be >= ramp_rounds, got 5 < 9$"),
        ([("topk", 0.2)], r"'trainer_options' parameter of BPNNClassifier must be"),
    ],
)
def test_a_bad_trainer_option_fails_the_fit_with_one_line(options, message):
    # In-process too: a typo is caught whether or not the fit would use the option.
    with pytest.raises(ValueError, match=message) as raised:
        _fit(trainer_options=options)
    assert len(str(raised.value).splitlines()) == 1


def test_trainer_options_are_stored_verbatim():
    options = {"topk": 0.2}
    clf = BPNNClassifier(trainer_options=options)
    assert clf.get_params()["trainer_options"] is options
    _fit(trainer_options=options)
    assert options == {"topk": 0.2}


def test_every_trainer_option_reaches_the_trainer(client, tmp_path):
    clf = _fit(
        client=client,
        sync="hmdspt",
        compression="topk",
        run_log=tmp_path,
        random_state=0,
        trainer_options=NON_DEFAULT_OPTIONS,
    )
    (start,) = [e for e in read_events(clf.run_log_path_) if e["event"] == "run_start"]
    config = start["config"]
    for name, value in NON_DEFAULT_OPTIONS.items():
        assert config[name] == value, name
    assert config["compression"] == "topk" and np.isfinite(clf.loss_)


# ---------------------------------------------------------------------- command line
def test_cli_flags_have_the_trainer_defaults_and_the_estimators_choices():
    constraints = BPNNClassifier._parameter_constraints
    mapped = []
    for command, sub in _sub_commands().items():
        for action in sub._actions:
            # --seed is the estimator's random_state (and the data split's), not a field's.
            if action.dest not in set(FIELDS) - INTERNAL or (command, action.dest) in (
                CLI_OWN_DEFAULTS
            ):
                continue
            mapped.append((command, action.dest))
            assert action.default == FIELDS[action.dest].default, (command, action.dest)
            choices = None if action.choices is None else set(action.choices)
            expected = _choices(constraints[action.dest])
            if expected and any(isinstance(c, Interval) for c in constraints[action.dest]):
                # A number or a word ("auto"): the flag's type takes both, not a choice list.
                assert choices is None and all(action.type(w) == w for w in expected)
            else:
                assert choices == expected, (command, action.dest)
            assert f"(default: {action.default})" in action.help % vars(action)
    assert {("train", "sync"), ("train", "partition"), ("train", "rounds_per_epoch")} <= set(mapped)
    assert ("compare", "rounds_per_epoch") in mapped


@pytest.mark.parametrize("Estimator", ESTIMATORS)
def test_the_docstring_lists_every_trainer_option(Estimator):
    doc = Estimator.__doc__.split("trainer_options : dict")[1].split("Attributes")[0]
    assert [name for name in _trainer_options() if f"``{name}``" not in doc] == []
