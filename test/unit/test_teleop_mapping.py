"""Teleop mapping rules (fed_ros.core.arm.teleop), ROS-free: deadman, deadzone, scaling, bad and
stale input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from fed_ros.core.arm.teleop import (
    TeleopMapper,
    apply_deadzone,
    load_teleop_profile,
    profile_from_dict,
    teleop_profile_dir,
)


def _profile(**changes):
    data = {
        "name": "pad",
        "axes_count": 4,
        "buttons_count": 6,
        "deadzone": 0.2,
        "watchdog_timeout_s": 0.5,
        "axes": {
            "x": {"axis": 1, "scale": 1.0},
            "y": {"axis": 0, "scale": 2.0, "sign": -1},
            "z": 3,
        },
        "buttons": {
            "deadman": 0,
            "record_start": 1,
            "record_stop": 2,
            "label_success": 3,
            "label_failure": 4,
            "gripper_toggle": 5,
        },
    }
    data.update(changes)
    return profile_from_dict(data)


DEADMAN = [1, 0, 0, 0, 0, 0]
RELEASED = [0] * 6


@pytest.fixture
def mapper():
    return TeleopMapper(_profile())


def test_the_arm_moves_only_while_the_deadman_is_held(mapper):
    mapper.joy([0.0, 0.6, 0.0, 0.0], RELEASED, 0.0)
    out = mapper.command(0.01)
    assert out.action is None and out.reason == "deadman released"
    mapper.joy([0.0, 0.6, 0.0, 0.0], DEADMAN, 0.02)
    out = mapper.command(0.03)
    assert out.action is not None and out.reason == ""
    assert out.action[0] == pytest.approx(0.5)  # (0.6 - 0.2) / (1 - 0.2)
    mapper.joy([0.0, 0.6, 0.0, 0.0], RELEASED, 0.04)
    assert mapper.command(0.05).action is None


def test_no_joy_yet_holds(mapper):
    out = mapper.command(0.0)
    assert out.action is None and "no Joy" in out.reason


def test_deadzone_is_zero_inside_and_continuous_outside(mapper):
    mapper.joy([0.1, -0.19, 0.0, 0.2], DEADMAN, 0.0)
    np.testing.assert_array_equal(mapper.command(0.0).action, [0.0, 0.0, 0.0, -1.0])
    assert apply_deadzone(0.2, 0.2) == 0.0
    assert apply_deadzone(0.21, 0.2) == pytest.approx(0.0125)
    assert apply_deadzone(-1.0, 0.2) == -1.0
    assert apply_deadzone(0.5, 0.0) == 0.5


def test_scale_sign_and_clipping(mapper):
    # y = -1 * 2.0 * dz(axis 0); axis 0 = 0.6 -> -1.0 (clipped from -1.0); axis 0 = -0.4 -> +0.5
    mapper.joy([0.6, -1.0, 0.0, 1.0], DEADMAN, 0.0)
    action = mapper.command(0.0).action
    np.testing.assert_allclose(action, [-1.0, -1.0, 1.0, -1.0])
    mapper.joy([-0.4, 0.0, 0.0, 0.0], DEADMAN, 0.0)
    np.testing.assert_allclose(mapper.command(0.0).action, [0.0, 0.5, 0.0, -1.0])
    mapper.joy([1.0, 0.0, 0.0, 0.0], DEADMAN, 0.0)  # 2.0 scale saturates: clipped to the unit range
    assert mapper.command(0.0).action[1] == -1.0
    assert mapper.command(0.0).action.dtype == np.float32


def test_wrong_axis_or_button_count_holds_with_a_reason_until_a_valid_joy(mapper):
    mapper.joy([0.0, 0.6, 0.0, 0.0], DEADMAN, 0.0)
    assert mapper.command(0.0).action is not None
    assert mapper.joy([0.0, 0.6, 0.0], DEADMAN, 0.01) == []
    out = mapper.command(0.02)
    assert out.action is None and "3 axes" in out.reason and "expects 4 / 6" in out.reason
    mapper.joy([0.0, 0.6, 0.0, 0.0], DEADMAN + [1], 0.03)
    out = mapper.command(0.03)
    assert out.action is None and "7 buttons" in out.reason
    mapper.joy([0.0, 0.6, 0.0, 0.0], DEADMAN, 0.04)
    assert mapper.command(0.04).action is not None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_axes_hold(mapper, bad):
    mapper.joy([0.0, 0.6, 0.0, 0.0], DEADMAN, 0.0)
    mapper.joy([0.0, bad, 0.0, 0.0], DEADMAN, 0.01)
    out = mapper.command(0.02)
    assert out.action is None and "non-finite" in out.reason


def test_a_stale_device_holds_even_with_the_deadman_held(mapper):
    mapper.joy([0.0, 0.6, 0.0, 0.0], DEADMAN, 0.0)
    assert mapper.command(0.5).action is not None  # exactly at the timeout: still fresh
    out = mapper.command(0.51)  # the device died with the deadman held: no new Joy
    assert out.action is None and "device stale" in out.reason
    mapper.joy([0.0, 0.6, 0.0, 0.0], DEADMAN, 1.0)  # it came back
    assert mapper.command(1.0).action is not None


def test_twist_input_needs_a_fresh_twist_and_the_joys_deadman():
    m = TeleopMapper(_profile(input="twist", axes={"x": 0, "y": 1, "z": 5}))
    m.joy([0.0] * 4, DEADMAN, 0.0)
    assert "no Twist" in m.command(0.0).reason
    m.twist((0.6, -0.6, 0.0), (0.0, 0.0, 1.0), 0.0)
    np.testing.assert_allclose(m.command(0.1).action, [0.5, -0.5, 1.0, -1.0])
    m.joy([0.0] * 4, DEADMAN, 0.4)
    assert "no Twist" in m.command(0.6).reason  # Joy fresh, Twist stale
    m.twist((math.nan, 0.0, 0.0), (0.0, 0.0, 0.0), 0.6)
    assert "non-finite" in m.command(0.6).reason
    m.twist((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), 0.61)
    assert m.command(0.61).action is not None


def test_button_events_are_rising_edges_and_toggle_the_gripper(mapper):
    axes = [0.0] * 4
    assert mapper.joy(axes, [0, 1, 0, 0, 0, 0], 0.0) == ["record_start"]
    assert mapper.joy(axes, [0, 1, 0, 0, 0, 0], 0.1) == []  # held: fires once
    assert mapper.joy(axes, [0, 0, 0, 0, 0, 0], 0.2) == []
    assert mapper.gripper == -1.0
    assert mapper.joy(axes, [1, 0, 0, 0, 0, 1], 0.3) == ["deadman", "gripper_toggle"]
    assert mapper.gripper == 1.0
    assert mapper.command(0.3).action[3] == 1.0
    mapper.joy(axes, [1, 0, 0, 0, 0, 0], 0.4)
    mapper.joy(axes, [1, 0, 0, 0, 0, 1], 0.5)
    assert mapper.gripper == -1.0
    assert mapper.joy(axes, [0, 0, 1, 1, 1, 0], 0.6) == [
        "record_stop",
        "label_success",
        "label_failure",
    ]


def test_a_bad_joy_gives_no_button_events(mapper):
    assert mapper.joy([math.nan, 0.0, 0.0, 0.0], [0, 1, 0, 0, 0, 0], 0.0) == []
    assert mapper.joy([0.0] * 3, [0, 1, 0, 0, 0, 0], 0.0) == []


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"buttons": {"deadman": 0, "estop": 1}}, "unknown button 'estop'"),
        ({"axes": {"x": 0, "roll": 1}}, "unknown axis 'roll'"),
        ({"buttons": {"deadman": 0, "gripper_toggle": 6}}, "button 'gripper_toggle' index 6"),
        ({"buttons": {"record_start": 1}}, "no 'deadman' button"),
        ({"axes": {"z": 4}}, "axis 'z' index 4"),
        ({"axes": {"x": {"axis": 0, "sign": 2}}}, "sign must be 1 or -1"),
        ({"axes": {"x": {"axis": 0, "scale": 0}}}, "scale must be > 0"),
        ({"deadzone": 1.0}, "deadzone"),
        ({"watchdog_timeout_s": 0}, "watchdog_timeout_s"),
        ({"input": "wiimote"}, "input must be one of"),
        ({"axes_count": 0}, "axes_count"),
        ({"rate": 5}, "unknown key 'rate'"),
    ],
)
def test_a_bad_profile_is_refused_at_load_naming_the_entry(changes, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        _profile(**changes)


def test_load_from_yaml_refuses_an_unknown_button(tmp_path):
    path = tmp_path / "pad.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "pad",
                "axes_count": 2,
                "buttons_count": 2,
                "axes": {"x": 0},
                "buttons": {"deadman": 0, "turbo": 1},
            }
        )
    )
    with pytest.raises(ValueError, match="unknown button 'turbo'"):
        load_teleop_profile(str(path))


@pytest.mark.parametrize("name", ["xbox", "spacemouse"])
def test_shipped_profiles_load(name):
    profile = load_teleop_profile(name)
    assert profile.name == name and "deadman" in profile.buttons
    assert (teleop_profile_dir() / f"{name}.yaml").is_file()


def test_an_unknown_profile_name_is_refused():
    with pytest.raises(ValueError, match="unknown teleop profile 'nope'"):
        load_teleop_profile("nope")


def test_a_stale_device_is_one_kind_of_hold_while_its_reason_names_the_growing_time(mapper):
    from fed_ros.core.arm.teleop import HOLD_STALE_JOY, HoldLog

    mapper.joy([0.0, 0.6, 0.0, 0.0], DEADMAN, 0.0)
    outs = [mapper.command(0.55 + 0.05 * i) for i in range(30)]
    assert {o.kind for o in outs} == {HOLD_STALE_JOY} and len({o.reason for o in outs}) == 30
    log = HoldLog(period_s=1.0)
    logged = [o.reason for i, o in enumerate(outs) if log.should_log(o.kind, 0.55 + 0.05 * i)]
    assert len(logged) == 2 and "0.55 s" in logged[0] and "1.55 s" in logged[1], logged
    assert log.should_log("deadman released", 2.0)  # a new kind: at once


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan])
def test_a_bad_hold_log_period_is_refused_with_the_value(bad):
    from fed_ros.core.arm.teleop import HoldLog

    with pytest.raises(ValueError, match=str(bad)):
        HoldLog(bad)


def test_teleop_md_says_which_parameters_change_live():
    # Issue 36: teleop.md said "all read-only" while record_timeout_s and log_period_s are
    # applied live (test_node_params.py sets one on a running node).
    import re
    from pathlib import Path

    from fed_ros.ros.configuration.arm_params import TeleopParams

    text = (Path(__file__).resolve().parents[2] / "docs" / "teleop.md").read_text()
    paragraph = text[text.index("Parameters (") :].split("\n\n")[0]
    assert "all read-only" not in paragraph, paragraph
    for name, spec in TeleopParams.specs().items():
        described = re.search(rf"`{name}` \(([^)]*)\)", paragraph)
        assert described, f"{name} is not described in docs/teleop.md"
        assert ("live" in described.group(1)) == spec.live, (name, described.group(1))
