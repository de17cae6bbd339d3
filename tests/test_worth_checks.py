"""The checks of ``python -m benchmarks worth`` (issue 17's acceptance), on made-up logs."""

import pytest

from benchmarks.bench_worth import judge, prediction_check, share_deviation
from hmdspt.compare import RunResult


def _round(number, epoch, rows, busy, wall=1.0):
    return {
        "event": "round",
        "run_id": "r",
        "round": number,
        "epoch": epoch,
        "wall_s": wall,
        "workers": {
            name: {"rows": rows[name], "busy_s": busy[name], "comm_s": 0.0, "idle_s": 0.0}
            for name in rows
        },
    }


def test_share_deviation_compares_the_last_rounds_rows_with_the_regular_rounds_speeds():
    events = [
        # Epoch 1 (a probe-sized ramp, speeds that are off): not counted.
        _round(1, 1, {"a": 50, "b": 50}, {"a": 1.0, "b": 0.1}),
        # Epoch 2 on: a does 300 rows/s, b 100 rows/s.
        _round(2, 2, {"a": 300, "b": 100}, {"a": 1.0, "b": 1.0}),
        _round(3, 2, {"a": 600, "b": 100}, {"a": 2.0, "b": 1.0}),
    ]
    deviation, speeds, last = share_deviation(events)
    assert speeds == pytest.approx({"a": 300.0, "b": 100.0})
    assert last == {"a": 600, "b": 100}
    # b holds 1/7 of the rows where its speed is 1/4: 43 % short.
    assert deviation == pytest.approx(1 - (1 / 7) / (1 / 4))
    balanced = [*events[:2], _round(3, 2, {"a": 300, "b": 100}, {"a": 1.0, "b": 1.0})]
    assert share_deviation(balanced)[0] == pytest.approx(0.0)
    assert share_deviation([])[0] is None


def test_prediction_check_measures_from_the_predicted_epoch_on():
    prediction = {"event": "prediction", "run_id": "r", "epoch": 2, "efficiency": 0.9,
                  "speedup": 1.4}  # fmt: skip
    events = [
        _round(1, 1, {"a": 100, "b": 100}, {"a": 0.5, "b": 1.0}, wall=1.0),  # not counted
        prediction,
        _round(2, 2, {"a": 200, "b": 100}, {"a": 1.0, "b": 1.0}, wall=1.25),
    ]
    check = prediction_check(events)
    assert check["predicted"] == 0.9 and check["speedup"] == 1.4
    assert check["measured"] == pytest.approx(0.8)  # ideal 1 s over a 1.25 s wall
    assert prediction_check(events[:1])["predicted"] is None


def _result(name, curve, wall_s=10.0, final=0.95):
    return RunResult(name, wall_s, wall_s, final, curve, epochs=3)


def test_judge_passes_and_fails_each_check_on_its_own_numbers():
    prediction = {"event": "prediction", "run_id": "r", "epoch": 2, "efficiency": 0.8,
                  "speedup": 1.2}  # fmt: skip
    events = [
        _round(1, 1, {"a": 100, "b": 100}, {"a": 1.0, "b": 1.0}),
        prediction,
        _round(2, 2, {"a": 200, "b": 100}, {"a": 1.0, "b": 1.0}, wall=1.25),
    ]
    results = [
        _result("bpnn-in-process", [(1.0, 0.96)], final=0.96),
        _result("hmdspt", [(2.0, 0.90), (3.0, 0.955)]),
        _result("local-equal", [(4.0, 0.951)]),
        _result("bsp-equal", [], wall_s=60.0),  # its time box ran out short of the target
    ]
    j = judge(results, 0.95, 60.0, events)
    assert j["to_target"]["hmdspt"] == 3.0 and not j["bsp_reached"]
    # Shares follow the speeds; the cluster is worth it (1.2x) but 0.8 < 0.85 efficient;
    # the prediction is right; 3 s is under local's 4 s and half of bsp's 60 s box.
    assert j["checks"] == {"share": True, "eff": False, "pred": True, "time": True}
    slower = [*results[:2], _result("local-equal", [(2.5, 0.951)]), results[3]]
    assert judge(slower, 0.95, 60.0, events)["checks"]["time"] is False
    not_worth = [{**prediction, "speedup": 0.5}, *events[2:]]
    assert judge(results, 0.95, 60.0, [events[0], *not_worth])["checks"]["eff"] is None
