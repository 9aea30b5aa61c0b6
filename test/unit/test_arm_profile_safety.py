"""Arm profiles (validation, overrides) and the adapter's pure safety logic (no ROS)."""

from __future__ import annotations

import numpy as np
import pytest

from fed_ros.core.arm.profile import (
    ProfileError,
    available_profiles,
    load_profile,
    parse_overrides,
    profile_from_dict,
)
from fed_ros.core.arm.safety import (
    JointSelector,
    MODE_HOLD,
    MODE_JOINT_VELOCITY,
    MODE_OSC_POSE,
    MODE_OSC_POSITION,
    SafetyFilter,
    Watchdog,
    enforce_workspace,
    gripper_action,
    gripper_position,
)


def test_shipped_profiles_load_with_vendor_names():
    assert {"ur5e", "fr3", "kinova_gen3", "panda_sim"} <= set(available_profiles())
    ur5e = load_profile("ur5e")
    assert ur5e.joints.names[0] == "shoulder_pan_joint" and ur5e.joints.names[-1] == "wrist_3_joint"
    assert ur5e.topics.home_trajectory == "/scaled_joint_trajectory_controller/joint_trajectory"
    assert ur5e.topics.joint_command == "/forward_velocity_controller/commands"
    assert load_profile("fr3").topics.home_trajectory == "/fr3_arm_controller/joint_trajectory"
    gen3 = load_profile("kinova_gen3")
    assert gen3.joints.names == tuple(f"joint_{i}" for i in range(1, 8))
    assert gen3.topics.home_trajectory == "/joint_trajectory_controller/joint_trajectory"
    for name in ("ur5e", "fr3", "kinova_gen3", "panda_sim"):
        assert load_profile(name).topics.twist_command.endswith("servo_node/delta_twist_cmds")


def test_overrides_replace_nested_fields_and_keep_the_rest():
    p = load_profile("ur5e", {"limits": {"max_linear_speed": 0.05}, "topics": {"eef_pose": "/tcp"}})
    assert p.limits.max_linear_speed == 0.05 and p.topics.eef_pose == "/tcp"
    assert p.limits.max_angular_speed == load_profile("ur5e").limits.max_angular_speed
    assert parse_overrides("{limits: {max_angular_speed: 0.2}}") == {
        "limits": {"max_angular_speed": 0.2}
    }


@pytest.mark.parametrize(
    "override, words",
    [
        ({"limits": {"max_linear_speed": -1}}, ["limits.max_linear_speed", "-1"]),
        ({"limits": {"max_linear_speed": "fast"}}, ["limits.max_linear_speed", "fast"]),
        ({"joints": {"home": [0.0]}}, ["joints.home", "1 values for 6 joints"]),
        (
            {"joints": {"velocity_limits": [1, 1, 1, 1, 1, 0]}},
            ["velocity_limits[5]", "wrist_3_joint"],
        ),
        (
            {"limits": {"workspace_min": [0, 0, 1.0], "workspace_max": [1, 1, 0.5]}},
            ["workspace z", "1.0"],
        ),
        ({"topics": {"twist_comand": "/x"}}, ["twist_comand", "unknown field"]),
        ({"topics": {"joint_command_interface": "effort"}}, ["joint_command_interface", "effort"]),
        ({"cameras": {"top": {"topic": "/top"}}}, ["cameras.top"]),
        ({"watchdog_timeout_s": 0.01}, ["watchdog_timeout_s", "0.01"]),
    ],
)
def test_bad_profile_fields_are_named(override, words):
    with pytest.raises(ProfileError) as info:
        load_profile("ur5e", override)
    for word in words:
        assert word in str(info.value)


def test_missing_fields_and_unknown_profiles_are_named():
    with pytest.raises(ProfileError, match="missing required field.*limits"):
        profile_from_dict(
            {
                "name": "x",
                "joints": {"names": ["a"], "velocity_limits": [1], "home": [0]},
                "frames": {"base": "b", "eef": "e"},
                "topics": {"joint_states": "j", "eef_pose": "p", "twist_command": "t"},
            }
        )
    with pytest.raises(ProfileError, match="unknown arm profile 'ur6'"):
        load_profile("ur6")


def test_joint_selector_filters_and_orders_by_profile():
    sel = JointSelector(["b", "a"])
    pos, vel = sel.select(["finger", "a", "b", "extra"], [9.0, 1.0, 2.0, 7.0], [0.9, 0.1, 0.2, 0.7])
    assert pos.tolist() == [2.0, 1.0] and vel.tolist() == [0.2, 0.1]
    pos, vel = sel.select(["a", "b"], [3.0, 4.0])  # no velocities: zeros
    assert pos.tolist() == [4.0, 3.0] and vel.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match=r"lacks joint\(s\) \['b'\]"):
        sel.select(["a", "c"], [0.0, 0.0])


def test_gripper_mapping_round_trips():
    cfg = load_profile("panda_sim").gripper
    assert gripper_position(-1.0, cfg) == pytest.approx(0.04)
    assert gripper_position(1.0, cfg) == pytest.approx(0.0)
    for g in (-1.0, -0.3, 0.0, 1.0):
        assert gripper_action(gripper_position(g, cfg), cfg) == pytest.approx(g)


# --- safety -------------------------------------------------------------------------------

INSIDE = np.array([-0.45, 0.0, 0.3])  # inside the ur5e box


def test_scaling_is_delta_times_max_speed():
    f = SafetyFilter(load_profile("ur5e"))
    assert f.command([0.5, -1.0, 0.0], 1.0, MODE_OSC_POSITION, 0.0) == ""
    out = f.tick(0.0, INSIDE)
    assert out.kind == "twist"
    np.testing.assert_allclose(out.linear, [0.05, -0.10, 0.0])
    f.command([0, 0, 0, 0.5, 0, -0.5], 1.0, MODE_OSC_POSE, 0.0)
    np.testing.assert_allclose(f.tick(0.0, INSIDE).angular, [0.2, 0.0, -0.2])


def test_out_of_limit_commands_are_clipped_and_counted():
    profile = load_profile("ur5e")
    f = SafetyFilter(profile)
    f.command([3.0, -2.0, 0.5], 1.7, MODE_OSC_POSITION, 0.0)
    out = f.tick(0.0, INSIDE)
    np.testing.assert_allclose(out.linear, [0.10, -0.10, 0.05])
    assert out.gripper == 1.0
    assert (f.counters.clipped_values, f.counters.clipped_commands) == (3, 1)
    f.command([5.0] * 6, 0.0, MODE_JOINT_VELOCITY, 0.0)
    out = f.tick(0.0, INSIDE)
    np.testing.assert_allclose(out.joint_velocities, profile.joints.velocity_limits)
    assert f.counters.clipped_values == 9


def test_bad_commands_are_refused_and_the_arm_holds():
    f = SafetyFilter(load_profile("ur5e"))
    f.command([0.1, 0.1, 0.1], 0.0, MODE_OSC_POSITION, 0.0)
    assert "non-finite" in f.command([np.nan, 0, 0], 0.0, MODE_OSC_POSITION, 0.0)
    assert f.tick(0.0, INSIDE).kind == "hold"
    assert "needs 6 action values" in f.command([0.1] * 3, 0.0, MODE_JOINT_VELOCITY, 0.0)
    assert "mode 9" in f.command([0.1] * 3, 0.0, 9, 0.0)
    assert f.counters.rejected == 3


def test_workspace_box_stops_motion_out_of_the_box_but_allows_back_in():
    profile = load_profile("ur5e")
    lo, hi = np.array(profile.limits.workspace_min), np.array(profile.limits.workspace_max)
    at_top = np.array([-0.45, 0.0, hi[2] - 0.001])
    f = SafetyFilter(profile)
    f.command([0.0, 0.0, 1.0], 0.0, MODE_OSC_POSITION, 0.0)
    out = f.tick(0.0, at_top)
    # One period may only reach the face of the box: 1 mm at 20 Hz = 0.02 m/s, not 0.10.
    assert out.linear[2] == pytest.approx(0.001 * profile.control_rate_hz)
    assert at_top[2] + out.linear[2] * profile.period_s <= hi[2] + 1e-12
    assert out.applied_action[2] == pytest.approx(0.2)  # recorded as what was really sent
    assert f.counters.workspace_limited == 1
    outside = np.array([-0.45, 0.0, hi[2] + 0.05])
    assert f.tick(0.0, outside).linear[2] == 0.0
    f.command([0.0, 0.0, -1.0], 0.0, MODE_OSC_POSITION, 0.0)
    assert f.tick(0.0, outside).linear[2] == pytest.approx(-0.10)  # back in: allowed
    below = lo - 0.01
    v, limited = enforce_workspace(below, np.array([-0.1, -0.1, -0.1]), 0.05, lo, hi)
    assert limited and v.tolist() == [0.0, 0.0, 0.0]


def test_unknown_pose_holds_end_effector_motion():
    f = SafetyFilter(load_profile("ur5e"))
    f.command([0.5, 0.0, 0.0], 0.0, MODE_OSC_POSITION, 0.0)
    out = f.tick(0.0, None)
    assert out.kind == "hold" and "pose unknown" in out.reason


def test_watchdog_holds_when_commands_stop_and_counts_trips():
    profile = load_profile("ur5e")
    f = SafetyFilter(profile)
    assert f.tick(0.0, INSIDE).kind == "hold"  # nothing received yet
    f.command([0.5, 0.0, 0.0], -1.0, MODE_OSC_POSITION, 1.0)
    assert f.tick(1.0 + profile.watchdog_timeout_s * 0.9, INSIDE).kind == "twist"
    out = f.tick(1.0 + profile.watchdog_timeout_s * 1.1, INSIDE)
    assert out.kind == "hold" and "watchdog" in out.reason
    assert out.linear.tolist() == [0.0, 0.0, 0.0] and out.gripper is None
    f.tick(2.0, INSIDE)
    assert f.watchdog.trips == 1  # one silence, one trip
    f.command([0.5, 0.0, 0.0], -1.0, MODE_OSC_POSITION, 3.0)
    assert f.tick(3.0, INSIDE).kind == "twist"
    w = Watchdog(0.1)
    w.feed(0.0)
    assert not w.expired(0.1) and w.expired(0.2) and w.trips == 1


def test_hold_latch_stops_at_once_and_needs_a_new_command_after_release():
    f = SafetyFilter(load_profile("ur5e"))
    f.command([0.5, 0.0, 0.0], 1.0, MODE_OSC_POSITION, 0.0)
    f.hold(True)
    out = f.tick(0.0, INSIDE)
    assert out.kind == "hold" and out.reason == "hold requested" and out.applied_mode == MODE_HOLD
    assert f.command([0.5, 0.0, 0.0], 1.0, MODE_OSC_POSITION, 0.0) == "hold requested"
    assert f.tick(0.0, INSIDE).kind == "hold"  # commands during a hold do nothing
    f.hold(False)
    assert f.tick(0.0, INSIDE).kind == "hold"  # nothing from before or during the hold resumes
    f.command([0.5, 0.0, 0.0], 1.0, MODE_OSC_POSITION, 0.0)
    assert f.tick(0.0, INSIDE).kind == "twist"
    assert f.counters.rejected == 0


# --- fleet files pick a profile per robot ---------------------------------------------------


def _fleet(**robot):
    from support.fleets import fleet_config

    return fleet_config(name="lab", robots=[robot])


def test_fleet_profile_plans_an_adapter_and_a_ros2_control_bridge():
    from fed_ros.ros.fleet.plan import plan_fleet

    real = plan_fleet(
        _fleet(
            id="ur_1",
            task="wipe",
            sim=False,
            profile="ur5e",
            arm={"limits": {"max_linear_speed": 0.05}},
        ),
        include_server=False,
    )
    assert [(n.executable, n.fqn) for n in real] == [
        ("arm_adapter_node", "/ur_1/arm_adapter"),
        ("robot_node", "/ur_1/robot"),
    ]
    overrides = parse_overrides(real[0].parameters["profile_overrides"])
    assert load_profile(real[0].parameters["profile"], overrides).limits.max_linear_speed == 0.05
    sim = plan_fleet(_fleet(id="sim_0", task="lift", profile="panda_sim"), include_server=False)
    assert [n.executable for n in sim] == ["sim_bridge_node", "arm_adapter_node", "robot_node"]
    assert sim[0].parameters["interface"] == "ros2_control"
    assert (
        "interface"
        not in plan_fleet(_fleet(id="d", task="lift"), include_server=False)[0].parameters
    )


@pytest.mark.parametrize(
    "robot, words",
    [
        (
            dict(
                id="ur_1",
                task="wipe",
                sim=False,
                profile="ur5e",
                arm={"limits": {"max_linear_speed": 0}},
            ),
            ["robot 'ur_1'", "limits.max_linear_speed", "0"],
        ),
        (dict(id="ur_1", task="lift", profile="ur5e"), ["simulator is a Panda", "sim: false"]),
        (dict(id="ur_1", task="lift", arm={"limits": {}}), ["'arm' overrides need a 'profile'"]),
        (dict(id="ur_1", task="lift", sim=False, profile="ur9"), ["unknown arm profile 'ur9'"]),
    ],
)
def test_fleet_profile_errors_name_robot_and_field(robot, words):
    with pytest.raises(ValueError) as info:
        _fleet(**robot)
    for word in words:
        assert word in str(info.value)
