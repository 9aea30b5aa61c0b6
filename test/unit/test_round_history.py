"""The live view's per-round history (no ROS): success and training loss per round, per robot
and per cluster, from the round reports a monitor hears; bounded in rounds."""

from __future__ import annotations

import json
import math

import pytest

from fed_ros.ros.operator.round_history import RoundHistory


def _line(rid: str, clusters: list[int], samples: int, loss: float, success: float) -> dict:
    return {
        "robot_id": rid,
        "cluster_ids": clusters,
        "num_samples": samples,
        "train_loss": loss,
        "success_rate": success,
        "accepted": True,
        "reason": "",
    }


def _report(round_idx: int, lines: list[dict], status: str = "completed") -> dict:
    return {
        "round": round_idx,
        "status": status,
        "completed": status == "completed",
        "robots": lines,
    }


def test_each_robot_has_one_value_per_round_and_null_where_not_measured():
    history = RoundHistory()
    history.add(_report(0, [_line("r0", [0], 10, 2.0, 0.1), _line("r1", [0], 30, 4.0, math.nan)]))
    history.add(_report(1, [_line("r0", [0], 10, 1.0, 0.5)]))  # r1 sat round 1 out
    series = history.series()
    assert series["rounds"] == [0, 1]
    robots = {s["id"]: s for s in series["robots"]}
    assert robots["r0"]["success"] == [0.1, 0.5] and robots["r0"]["train_loss"] == [2.0, 1.0]
    assert robots["r1"]["success"] == [None, None] and robots["r1"]["train_loss"] == [4.0, None]
    json.dumps(series, allow_nan=False)  # what the page polls: NaN is null


def test_a_cluster_has_its_members_sample_weighted_loss_and_mean_success():
    history = RoundHistory()
    history.add(
        _report(
            0,
            [
                _line("r0", [0], 10, 2.0, 0.2),
                _line("r1", [0], 30, 4.0, 0.6),
                _line("r2", [1], 5, 1.0, math.nan),
            ],
        )
    )
    clusters = {c["id"]: c for c in history.series()["clusters"]}
    assert clusters[0]["train_loss"] == [pytest.approx((10 * 2.0 + 30 * 4.0) / 40)]
    assert clusters[0]["success"] == [pytest.approx(0.4)]
    assert clusters[0]["members"] == [["r0", "r1"]]
    assert clusters[1]["train_loss"] == [1.0] and clusters[1]["success"] == [None]


def test_a_cluster_of_robots_that_report_no_samples_averages_their_losses():
    history = RoundHistory()
    history.add(_report(0, [_line("r0", [0], 0, 2.0, 1.0), _line("r1", [0], 0, 4.0, 0.0)]))
    (cluster,) = history.series()["clusters"]
    assert cluster["train_loss"] == [3.0] and cluster["success"] == [0.5]


def test_a_retried_round_replaces_its_abandoned_attempt_and_never_the_reverse():
    history = RoundHistory()
    history.add(_report(0, [_line("r0", [0], 10, 9.0, math.nan)], status="abandoned: quorum"))
    history.add(_report(0, [_line("r0", [0], 10, 1.0, 0.5)]))
    history.add(_report(0, [_line("r0", [0], 10, 7.0, math.nan)], status="abandoned: late"))
    series = history.series()
    assert series["rounds"] == [0] and series["completed"] == [True]
    assert series["robots"][0]["train_loss"] == [1.0]


def test_history_keeps_only_the_newest_rounds():
    history = RoundHistory(max_rounds=3)
    for r in range(5):
        history.add(_report(r, [_line("r0", [0], 10, float(r), 0.0)]))
    history.add(_report(0, [_line("r0", [0], 10, 0.0, 0.0)]))  # a late copy of a dropped round
    series = history.series()
    assert series["rounds"] == [2, 3, 4] and series["robots"][0]["train_loss"] == [2.0, 3.0, 4.0]
    assert len(history) == 3


def test_a_robot_no_kept_round_names_is_dropped_from_the_series():
    history = RoundHistory(max_rounds=1)
    history.add(_report(0, [_line("gone", [0], 1, 1.0, 1.0)]))
    history.add(_report(1, [_line("r0", [0], 1, 1.0, 1.0)]))
    assert [s["id"] for s in history.series()["robots"]] == ["r0"]


@pytest.mark.parametrize("bad", [0, -1, 2.5, "10"])
def test_history_bound_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match=repr(bad).replace(".", r"\.")):
        RoundHistory(max_rounds=bad)


def test_empty_history_has_no_rounds():
    assert RoundHistory().series() == {"rounds": [], "completed": [], "robots": [], "clusters": []}
