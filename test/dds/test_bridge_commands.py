"""Bad ArmCommands are rejected with a logged reason and the arm holds still; a fixed-rate
bridge applies the latest valid command and reports what it applied."""

from __future__ import annotations

import math
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from fed_ros.ros.arm import topics as at


def _command(action, gripper=0.0, mode=0, stamp_ns=0):
    header = SimpleNamespace(stamp=at.ns_to_stamp(stamp_ns))
    return SimpleNamespace(
        action=list(action), gripper=gripper, mode=mode, header=header, source="t"
    )


@pytest.mark.parametrize(
    "msg, reason",
    [
        (_command([0.1, 0.2]), "2 values, expected 3"),
        (_command([0.1, 0.2, 0.3, 0.4]), "4 values, expected 3"),
        (_command([0.1, math.nan, 0.3]), "NaN"),
        (_command([0.1, 1.5, 0.3]), r"outside \[-1, 1\]"),
        (_command([0.1, 0.2, 0.3], gripper=2.0), "gripper"),
        (_command([0.1, 0.2, 0.3], gripper=math.inf), "gripper"),
        (_command([0.1, 0.2, 0.3], mode=1), "OSC_POSE"),
        (_command([0.1, 0.2, 0.3], mode=9), "unknown"),
    ],
)
def test_validate_command_names_the_problem(msg, reason):
    from fed_ros.ros.nodes.sim_bridge.command_validation import validate_command

    with pytest.raises(ValueError, match=reason):
        validate_command(msg)


def test_validate_command_accepts_position_and_hold():
    from fed_ros.ros.nodes.sim_bridge.command_validation import validate_command

    ok = validate_command(_command([1.0, -1.0, 0.0], gripper=1.0, stamp_ns=7))
    assert not ok.hold and ok.gripper == 1.0 and ok.stamp_ns == 7
    assert validate_command(_command([], mode=3)).hold


def test_bad_commands_rejected_and_arm_holds_still(ros_env, processes, tmp_path):
    import rclpy
    from fed_ros.msg import ArmCommand
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import JointState

    log = tmp_path / "bridge.log"
    bridge = processes.python(
        [
            "-m",
            "fed_ros.ros.nodes.sim_bridge.sim_bridge_node",
            "--ros-args",
            "-p",
            "task:=lift",
            "-p",
            "cameras:=false",
            "-p",
            "control_rate_hz:=20.0",
            "-p",
            "command_timeout_s:=30.0",
        ],
        ros_env,
        log_path=log,
    )
    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node("commander", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    applied: list[tuple[float, object]] = []
    joints: list[tuple[float, np.ndarray]] = []
    node.create_subscription(
        ArmCommand,
        at.APPLIED_COMMAND_TOPIC,
        lambda m: applied.append((time.monotonic(), m)),
        at.qos_for(at.APPLIED_COMMAND_TOPIC),
    )
    node.create_subscription(
        JointState,
        at.JOINT_STATES_TOPIC,
        lambda m: joints.append((time.monotonic(), np.array(m.position))),
        at.qos_for(at.JOINT_STATES_TOPIC),
    )
    pub = node.create_publisher(ArmCommand, at.COMMAND_TOPIC, at.qos_for(at.COMMAND_TOPIC, False))
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()

    def wait_for(predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while not predicate():
            assert bridge.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, (
                f"timed out waiting for {what}\n{log.read_text()[-3000:]}"
            )
            time.sleep(0.02)

    def send(action, gripper, mode=0, source="test"):
        msg = ArmCommand()
        msg.action, msg.gripper, msg.mode, msg.source = list(action), float(gripper), mode, source
        pub.publish(msg)

    try:
        wait_for(lambda: pub.get_subscription_count() > 0 and len(applied) > 3, 60, "the bridge")
        bad_commands = [
            ([0.2, 0.1], 1.0, 0, "2 values, expected 3"),
            ([0.2, float("nan"), 0.0], 1.0, 0, "NaN"),
            ([0.2, 3.0, 0.0], 1.0, 0, "outside"),
            ([0.2, 0.0, 0.0], 1.0, 1, "OSC_POSE"),
        ]
        for i, (action, gripper, mode, reason) in enumerate(bad_commands):
            # A valid command: moving, gripper closing. With a 30 s timeout it keeps applying.
            send([0.6, 0.0, -0.4], 1.0, source=f"valid{i}")
            wait_for(
                lambda: applied and applied[-1][1].source == f"valid{i}", 10, f"valid{i} applied"
            )
            applied_valid = applied[-1][1]
            assert applied_valid.mode == 0 and applied_valid.gripper == 1.0
            np.testing.assert_allclose(applied_valid.action, [0.6, 0.0, -0.4], rtol=1e-6)
            sent_at = time.monotonic()
            send(action, gripper, mode, source=f"bad{i}")
            wait_for(lambda: applied[-1][1].source == "hold", 5, f"hold after bad{i}")
            hold_from = applied[-1][0]
            # Twelve control ticks (0.6 s at 20 Hz) of holding, counted, not slept for.
            wait_for(
                lambda: sum(1 for t, _ in applied if t >= hold_from) >= 12,
                10,
                f"12 hold ticks after bad{i}",
            )
            after = [m for t, m in applied if t >= hold_from]
            # Holding still: zero motion, gripper as it was; never the bad command.
            assert after and all(m.mode == 3 and m.source == "hold" for m in after)
            assert all(list(m.action) == [0.0, 0.0, 0.0] and m.gripper == 1.0 for m in after)
            assert not any(m.source == f"bad{i}" for t, m in applied if t >= sent_at)
        # The arm settled: joint positions barely change over the last ticks of holding (the
        # joint states that arrived after the twelfth hold tick above).
        settled_from = applied[-1][0]
        wait_for(
            lambda: sum(1 for t, _ in joints if t >= settled_from) >= 3,
            10,
            "3 joint states while holding",
        )
        recent = [q for t, q in joints if t >= settled_from]
        assert np.abs(recent[-1] - recent[0]).max() < 5e-3
        text = log.read_text()
        for _, _, _, reason in bad_commands:
            assert reason in text, f"no logged reason {reason!r}"
        assert text.count("ArmCommand rejected") >= len(bad_commands)
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown(context=context)
        spinner.join(timeout=5)
