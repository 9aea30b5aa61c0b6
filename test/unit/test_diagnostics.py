"""The diagnostics statuses built from counters (ROS-free): levels, messages and keys."""

from __future__ import annotations

import math

from fed_ros.core import diagnostics as D


def _adapter(**kw):
    base = dict(
        watchdog_trips=0,
        recent_trips=0,
        clipped_values=0,
        clipped_commands=0,
        workspace_limited=0,
        rejected=0,
        held_ticks=0,
        hold=False,
        missing=[],
        episode=1,
        step=3,
        done=False,
    )
    base.update(kw)
    return D.adapter_status("fed_ros/r/arm_adapter", "ur5e", D.AdapterReading(**base))


def test_adapter_ok_then_warn_on_a_recent_watchdog_trip_only():
    assert _adapter().level == D.OK and _adapter().message == "ok"
    tripped = _adapter(watchdog_trips=2, recent_trips=1)
    assert tripped.level == D.WARN and "watchdog tripped (2 so far)" in tripped.message
    assert tripped.values["watchdog_trips"] == "2"
    assert _adapter(watchdog_trips=2, recent_trips=0).level == D.OK  # an old trip is history
    assert (
        _adapter(watchdog_trips=2, watchdog_holding=True).level == D.WARN
    )  # still holding the episode


def test_adapter_warns_on_hold_and_missing_topics_naming_them():
    s = _adapter(hold=True, missing=["/joint_states: no publisher"])
    assert (
        s.level == D.WARN and "hold set" in s.message and "/joint_states: no publisher" in s.message
    )
    assert s.values["hold"] == "True" and s.values["missing_topics"] == "1"


def test_trip_window_counts_growth_since_the_last_report():
    w = D.TripWindow()
    assert w.grew("t", 5) == 0  # first report: nothing is "recent"
    assert w.grew("t", 7) == 2
    assert w.grew("t", 7) == 0


def _robot(**kw):
    base = dict(
        learning_enabled=True,
        registered=True,
        failed="",
        round_idx=2,
        stage="train",
        model_age_s=3.0,
        last_rejection="",
        transfer_errors=0,
        refused_control=0,
        train_steps=30,
        train_seconds=1.5,
        busy="",
    )
    base.update(kw)
    return D.robot_status("fed_ros/r/robot", "r", D.RobotReading(**base))


def test_robot_status_levels_and_throughput():
    ok = _robot()
    assert ok.level == D.OK and ok.message == "round 2 train, idle"
    assert float(ok.values["train_steps_per_s"]) == 20.0 and ok.values["last_model_age_s"] == "3"
    assert _robot(learning_enabled=False).level == D.WARN
    assert "last update rejected: stale" in _robot(last_rejection="stale").message
    failed = _robot(failed="startup failed: x", learning_enabled=False)
    assert (
        failed.level == D.ERROR and failed.message == "startup failed: x"
    )  # the worst reason only
    fresh = _robot(round_idx=None, model_age_s=None, train_seconds=0.0)
    assert fresh.values["round"] == "" and fresh.values["last_model_age_s"] == "nan"
    assert math.isnan(float(fresh.values["train_steps_per_s"]))


def test_server_status_warns_until_every_expected_robot_registered():
    s = D.server_status(
        "fed_ros/fleet/server",
        D.ServerReading(
            round_idx=1,
            stage="train",
            robots_registered=1,
            robots_expected=2,
            accepted=3,
            rejected=1,
            last_rejection="robot_1: stale",
            done=False,
        ),
    )
    assert s.level == D.WARN and "1/2 robots registered" in s.message
    assert s.values["updates_rejected"] == "1" and s.values["last_rejection"] == "robot_1: stale"
    done = D.server_status(
        "fed_ros/fleet/server",
        D.ServerReading(
            round_idx=3,
            stage="done",
            robots_registered=2,
            robots_expected=2,
            accepted=6,
            rejected=0,
            last_rejection="",
            done=True,
        ),
    )
    assert done.level == D.OK and done.message == "federation finished"


def test_server_status_warns_while_rounds_are_paused_or_the_fleet_is_ending():
    base = dict(
        robots_registered=2,
        robots_expected=2,
        accepted=2,
        rejected=0,
        last_rejection="",
        done=False,
    )
    running = D.server_status(
        "fed_ros/fleet/server", D.ServerReading(round_idx=1, stage="train", **base)
    )
    assert running.level == D.OK and running.values["rounds_enabled"] == "True"
    pausing = D.server_status(
        "fed_ros/fleet/server",
        D.ServerReading(round_idx=1, stage="train", rounds_enabled=False, **base),
    )
    assert pausing.level == D.WARN and "current round finishes" in pausing.message
    held = D.server_status(
        "fed_ros/fleet/server",
        D.ServerReading(round_idx=2, stage="paused", rounds_enabled=False, held=True, **base),
    )
    assert held.level == D.WARN and "round 2 waits for a resume" in held.message
    assert held.values["rounds_enabled"] == "False" and held.values["stage"] == "paused"
    ending = D.server_status(
        "fed_ros/fleet/server", D.ServerReading(round_idx=1, stage="train", ending=True, **base)
    )
    assert (
        ending.level == D.WARN
        and "end_fleet" in ending.message
        and ending.values["ending"] == "True"
    )


def test_robot_status_warns_while_it_waits_for_demonstrations():
    from fed_ros.core import diagnostics as D

    kw = dict(
        learning_enabled=True,
        registered=True,
        failed="",
        round_idx=0,
        stage="train",
        model_age_s=None,
        last_rejection="",
        transfer_errors=0,
        refused_control=0,
        train_steps=0,
        train_seconds=0.0,
        busy="",
    )
    waiting = "waiting for demonstrations (have 0 of 3)"
    status = D.robot_status(
        "fed_ros/robot_0/robot", "robot_0", D.RobotReading(waiting_for_demos=waiting, **kw)
    )
    assert status.level == D.WARN and waiting in status.message
    assert dict(status.values)["waiting_for_demonstrations"] == waiting
    assert D.robot_status("fed_ros/robot_0/robot", "robot_0", D.RobotReading(**kw)).level == D.OK
